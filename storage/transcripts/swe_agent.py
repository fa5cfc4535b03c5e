"""SWE-agent trajectories (``*.traj``), rewritten whole after every step.

Source: SWE-agent/SWE-agent ``sweagent/agent/agents.py`` (``save_trajectory``/
``get_trajectory_data``) and ``sweagent/types.py`` (``TrajectoryStep``, ``HistoryItem``).
The file is ``{environment, trajectory[], history[], info, replay_config}``; a retry run
wraps several of those in ``attempts[]``.

``trajectory[]`` holds one entry per step with the model's ``response`` already split into
``thought`` and ``action``; ``history[]`` is the chat sent to the model and repeats the same
text (plus prompts and observations). We index ``trajectory[]`` only — ``thought`` -> kind
assistant (key ``step<i>/thought``), ``action`` -> kind tool_input (key ``step<i>/action``) —
and fall back to the assistant entries of ``history[]`` only when ``trajectory[]`` is empty,
never both. ``response`` is not indexed beside them: it is thought + action again.
``cwd`` is the step's ``state.working_dir`` (a path inside the agent's container).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from storage.transcripts.base import (
    ASSISTANT, TOOL_INPUT, Head, Put, TranscriptError, WholeParser, register,
)


def _working_dir(step: dict) -> str | None:
    state = step.get("state")
    if isinstance(state, str):  # older versions stored the state as a JSON string
        try:
            state = json.loads(state)
        except ValueError:
            return None
    wd = state.get("working_dir") if isinstance(state, dict) else None
    return wd if isinstance(wd, str) and wd else None


@register
class SweAgentParser(WholeParser):
    """SWE-agent ``.traj`` (see module docstring)."""
    format = "swe_agent"
    name_patterns = ("*.traj",)

    @classmethod
    def sniff(cls, head: Head) -> int:
        whole = head.whole
        if isinstance(whole, dict) and (isinstance(whole.get("trajectory"), list)
                                        or isinstance(whole.get("attempts"), list)):
            return 3
        if head.text.lstrip().startswith("{") and re.search(r'"trajectory"\s*:\s*\[', head.text) \
                and re.search(r'"(thought|action|observation)"\s*:', head.text):
            return 2
        return 0

    def _parse(self, doc) -> Iterable[Put]:
        if not isinstance(doc, dict):
            raise TranscriptError("not a SWE-agent trajectory: expected a JSON object; "
                                  "check the file or pick another format")
        if isinstance(doc.get("attempts"), list):
            puts = []
            for j, attempt in enumerate(doc["attempts"]):
                if isinstance(attempt, dict):
                    puts.extend(self._run(attempt, f"attempt{j}/"))
                else:
                    self.stats.skipped_malformed += 1
            return puts
        if not isinstance(doc.get("trajectory"), list) and not isinstance(doc.get("history"), list):
            raise TranscriptError("not a SWE-agent trajectory: no trajectory[] or history[]; "
                                  "check the file or pick another format")
        return self._run(doc, "")

    def _run(self, run: dict, prefix: str) -> list[Put]:
        puts: list[Put] = []
        steps = run.get("trajectory") if isinstance(run.get("trajectory"), list) else []
        history = run.get("history") if isinstance(run.get("history"), list) else []
        source, label = (steps, "step") if steps else (
            [h for h in history if isinstance(h, dict) and h.get("role") == "assistant"], "history")
        cwd = None
        for i, step in enumerate(source):
            if not isinstance(step, dict):
                self.stats.skipped_malformed += 1
                continue
            cwd = _working_dir(step) or cwd
            thought = step.get("thought")
            if not isinstance(thought, str) and label == "history":
                thought = step.get("content") if isinstance(step.get("content"), str) else None
            action = step.get("action")
            if isinstance(thought, str) and thought.strip():
                puts.append(Put(f"{prefix}{label}{i}/thought", thought, ASSISTANT, cwd))
            if isinstance(action, str) and action.strip():
                puts.append(Put(f"{prefix}{label}{i}/action", action, TOOL_INPUT, cwd))
        return puts
