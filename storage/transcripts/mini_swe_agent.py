"""mini-swe-agent trajectories (``*.traj.json``), rewritten whole.

Source: SWE-agent/mini-swe-agent ``src/minisweagent/run/utils/save.py`` (``save_traj``):
``{info: {exit_status, submission, model_stats, mini_version, config}, messages[],
trajectory_format: "mini-swe-agent-1"}``; ``messages`` is the agent's chat (system, user,
assistant, and in tool-calling versions ``tool``). Model output: every ``assistant``
message -> kind assistant, key ``msg<i>`` (its content is the whole response, e.g.
``THOUGHT: ...`` followed by a fenced bash action); ``tool_calls[]`` (tool-calling models,
format ``mini-swe-agent-1.1``) -> kind tool_input, key ``msg<i>/<call id>``, the command text
when the arguments hold one. ``extra`` (raw provider response, reasoning) is not indexed.
``cwd``: ``info.config.environment.cwd`` (a path inside the agent's container).
With ``context_turns`` on (offline replay), system, user and tool messages are emitted too,
as kinds system, user and tool_result (key ``ctx:msg<i>``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from storage.transcripts.base import (
    ASSISTANT, SYSTEM, TOOL_INPUT, TOOL_RESULT, USER, Head, ParseStats, Put, TranscriptError,
    WholeParser, WrongType, register,
)

# Context turns (a parser's ``context_turns``): the kind of a non-model chat role.
SHOWN_KINDS = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "tool": TOOL_RESULT,
               "function": TOOL_RESULT}
from storage.transcripts.codex import render_function_call


def content_text(content, stats: ParseStats) -> str:
    """Text of an OpenAI-style ``content``: a string, or parts ``{type: text, text}``;
    image parts are counted as dropped blobs.

    >>> content_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], ParseStats())
    'a\\nb'
    """
    if isinstance(content, str):
        return content
    texts = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict):
            if part.get("type") in ("text", "output_text") and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") in ("image_url", "image", "input_image"):
                stats.dropped_blobs += 1
    return "\n".join(texts)


def tool_call_puts(prefix: str, calls, cwd: str | None, stats: ParseStats) -> list[Put]:
    """Records of OpenAI-style ``tool_calls[]`` (``{id, function: {name, arguments}}``)."""
    puts = []
    for j, call in enumerate(calls if isinstance(calls, list) else []):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            stats.skipped_malformed += 1
            continue
        try:
            text, lang = render_function_call(str(fn.get("name", "")), fn.get("arguments", ""))
        except WrongType:  # this call only
            stats.skipped_malformed += 1
            continue
        if text.strip():
            puts.append(Put(f"{prefix}/{call.get('id') or j}", text, TOOL_INPUT, cwd, lang))
    return puts


@register
class MiniSweAgentParser(WholeParser):
    """mini-swe-agent ``.traj.json`` (see module docstring)."""
    format = "mini_swe_agent"
    name_patterns = ("*.traj.json",)

    @classmethod
    def sniff(cls, head: Head) -> int:
        whole = head.whole
        if isinstance(whole, dict) and isinstance(whole.get("messages"), list) and (
                str(whole.get("trajectory_format", "")).startswith("mini-swe-agent")
                or isinstance(whole.get("info"), dict) and "mini_version" in whole["info"]):
            return 3
        if re.search(r'"mini_version"\s*:|"trajectory_format"\s*:\s*"mini-swe-agent', head.text):
            return 2
        # save_traj writes info.exit_status first, then the submission patch, which can push
        # everything else out of a small head.
        if re.match(r'\s*\{\s*"info"\s*:\s*\{\s*"exit_status"\s*:', head.text):
            return 1
        return 0

    def _parse(self, doc) -> Iterable[Put]:
        if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
            raise TranscriptError("not a mini-swe-agent trajectory: expected an object with "
                                  "messages[]; check the file or pick another format")
        info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
        config = info.get("config") if isinstance(info.get("config"), dict) else {}
        env = config.get("environment") if isinstance(config.get("environment"), dict) else {}
        cwd = env.get("cwd") if isinstance(env.get("cwd"), str) else None
        puts: list[Put] = []
        for i, msg in enumerate(doc["messages"]):
            puts.extend(self._guarded(self._message, msg, i, cwd))
        return puts

    def _message(self, msg, i: int, cwd: str | None) -> list[Put]:
        """Records of ``messages[i]``."""
        if not isinstance(msg, dict):
            self.stats.skipped_malformed += 1
            return []
        if msg.get("role") != "assistant":
            kind = SHOWN_KINDS.get(msg.get("role")) if self.context_turns else None
            text = content_text(msg.get("content"), self.stats) if kind else ""
            return [Put(f"ctx:msg{i}", text, kind, cwd)] if text.strip() else []
        text = content_text(msg.get("content"), self.stats)
        puts = [Put(f"msg{i}", text, ASSISTANT, cwd)] if text.strip() else []
        return puts + tool_call_puts(f"msg{i}", msg.get("tool_calls"), cwd, self.stats)
