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
With ``context_turns`` on (offline replay), what the model was shown is emitted too
(see ``_shown``).
"""

from __future__ import annotations

from collections.abc import Iterable

from storage.transcripts.base import (
    ASSISTANT, SYSTEM, TOOL_INPUT, TOOL_RESULT, USER, Head, Put, TranscriptError, WholeParser,
    loads, register, shown_text,
)


def _working_dir(step: dict) -> str | None:
    state = step.get("state")
    if isinstance(state, str):  # older versions stored the state as a JSON string
        try:
            state = loads(state)
        except ValueError:  # TooDeep included
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
        if head.opens_with("{", r'"trajectory"\s*:\s*\[', r'"(thought|action|observation)"\s*:'):
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
                    puts.extend(self._guarded(self._run, attempt, f"attempt{j}/"))
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
        self._cwd = None  # the last step's working_dir, inherited by the steps after it
        shown = self._shown(history, label, prefix) if self.context_turns else None
        if shown is not None:
            puts.extend(shown[0])
        for i, step in enumerate(source):
            if shown is not None and i > 0:
                puts.extend(shown[i] if label == "history" and i < len(shown) else [])
            puts.extend(self._guarded(self._step, step, i, label, prefix, shown is not None))
        if shown is not None and label == "history" and 0 < len(source) < len(shown):
            puts.extend(shown[len(source)])  # after the last assistant entry
        return puts

    def _step(self, step, i: int, label: str, prefix: str, shown: bool) -> list[Put]:
        """Records of one ``trajectory[]`` step (or assistant ``history[]`` entry)."""
        if not isinstance(step, dict):
            self.stats.skipped_malformed += 1
            return []
        cwd = self._cwd = _working_dir(step) or self._cwd
        puts = []
        thought = step.get("thought")
        if not isinstance(thought, str) and label == "history":
            thought = step.get("content") if isinstance(step.get("content"), str) else None
        action = step.get("action")
        if isinstance(thought, str) and thought.strip():
            puts.append(Put(f"{prefix}{label}{i}/thought", thought, ASSISTANT, cwd))
        if isinstance(action, str) and action.strip():
            puts.append(Put(f"{prefix}{label}{i}/action", action, TOOL_INPUT, cwd))
        observation = step.get("observation")
        if shown and label == "step" and isinstance(observation, str) and observation.strip():
            puts.append(Put(f"ctx:{prefix}step{i}/observation", observation, TOOL_RESULT, cwd))
        return puts

    @staticmethod
    def _shown(history: list, label: str, prefix: str) -> list[list[Put]]:
        """Context turns (``context_turns`` only), from ``history[]``: ``groups[0]`` holds
        the entries before the first assistant entry (system prompt, the issue), and with
        the history fallback ``groups[n]`` those after the n-th assistant entry (the
        observations; with ``trajectory[]`` each step's ``observation`` is used instead)."""
        groups: list[list[Put]] = [[]]
        kinds = {"system": SYSTEM, "user": USER, "tool": TOOL_RESULT}
        for j, h in enumerate(history):
            if not isinstance(h, dict):
                continue
            if h.get("role") == "assistant":
                if label == "step":
                    break
                groups.append([])
                continue
            text = shown_text(h.get("content"))
            role = h.get("role")
            kind = kinds.get(role, USER) if isinstance(role, str) else USER
            if len(groups) > 1 and kind == USER and h.get("message_type") == "observation":
                kind = TOOL_RESULT
            if text.strip():
                groups[-1].append(Put(f"ctx:{prefix}history{j}", text, kind, None))
        return groups
