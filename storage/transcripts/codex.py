"""Codex CLI rollouts: ``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`` (newer archives
``.jsonl.zst``, decompressed by the caller, see ``detect.open_bytes``).

Format (openai/codex ``codex-rs/protocol/src/protocol.rs`` ``RolloutItem`` and
``models.rs`` ``ResponseItem``): one ``{timestamp, type, payload}`` per line, ``type`` in
session_meta/response_item/event_msg/turn_context/compacted.

Model output, all in ``response_item`` payloads:

- ``message`` with role assistant: its ``output_text`` parts -> kind assistant, key
  ``payload.id`` or ``line:<n>`` (rollout messages usually carry no id);
- ``function_call`` -> kind tool_input, key ``call_id``. ``arguments`` is a JSON string;
  when it holds a ``cmd``/``command`` (a string, or an argv list) the command text is
  indexed instead (``["bash", "-lc", script]`` -> the script), language ``shellscript``;
  ``apply_patch``'s ``input`` -> the patch, language ``diff``; otherwise the raw string;
- ``custom_tool_call`` -> its ``input`` (apply_patch diffs: language ``diff``);
- ``local_shell_call`` -> its ``action.command``.

Ignored: ``event_msg`` (``agent_message`` repeats the assistant text), ``compacted``
(a replacement copy of earlier history), tool outputs, user/developer messages.
``reasoning`` items are encrypted: dropped, counted as blobs. The project directory
comes from ``session_meta``/``turn_context`` ``payload.cwd`` and is kept in the state.
With ``context_turns`` on (offline replay), what the model was shown is emitted too
(see ``_shown_item``).
"""

from __future__ import annotations

import json
import re
import shlex

from storage.transcripts.base import (
    ASSISTANT, SYSTEM, TOOL_INPUT, TOOL_RESULT, USER, Head, LineParser, Op, Put, expect,
    loads, register, remember, shown_text, text_hash,
)

KNOWN_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})
KNOWN_ITEMS = frozenset({
    "message", "reasoning", "function_call", "function_call_output", "custom_tool_call",
    "custom_tool_call_output", "local_shell_call", "web_search_call", "ghost_snapshot",
    "compaction", "compaction_summary", "image_generation_call", "tool_search_call",
    "tool_search_output", "other",
})
SHELLS = frozenset({"bash", "sh", "zsh", "/bin/bash", "/bin/sh", "/bin/zsh", "/usr/bin/bash"})
MAX_CALLS = 64


def render_command(cmd) -> str | None:
    """The command text of a ``cmd``/``command`` argument, or None.

    >>> render_command(["bash", "-lc", "ls -la"])
    'ls -la'
    >>> render_command(["rg", "-n", "two words"])
    "rg -n 'two words'"
    >>> render_command("git status")
    'git status'
    """
    if isinstance(cmd, str):
        return cmd
    if isinstance(cmd, list) and cmd and all(isinstance(c, str) for c in cmd):
        if len(cmd) == 3 and cmd[0] in SHELLS and cmd[1] in ("-c", "-lc"):
            return cmd[2]
        return shlex.join(cmd)
    return None


def render_function_call(name: str, arguments) -> tuple[str, str | None]:
    """(text, language_id) of a function call's ``arguments`` (a JSON object, or a string
    holding one or free text). Raises :class:`WrongType` for any other JSON value (null,
    a number, a list), given as such or inside the string."""
    expect(arguments, (str, dict), f"the arguments of {name or 'a function call'}")
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    try:
        args = loads(raw)
    except ValueError:  # TooDeep included
        return raw, None
    expect(args, dict, f"the arguments of {name or 'a function call'}")
    if isinstance(args, dict):
        command = render_command(args.get("cmd", args.get("command")))
        if command is not None:
            return command, "shellscript"
        if name == "apply_patch" and isinstance(args.get("input"), str):
            return args["input"], "diff"
    return raw, None


@register
class CodexParser(LineParser):
    """Codex rollout JSONL (see module docstring)."""
    format = "codex"
    name_patterns = ("rollout-*.jsonl", "rollout-*.jsonl.zst")
    state_fields = ("line_no", "cwd", "calls")

    def __init__(self) -> None:
        super().__init__()
        self.cwd: str | None = None
        self.calls: dict[str, str] = {}  # recent call ids -> text hash, for dedup
        self.user_items = False  # context_turns: a response_item user message was seen

    @classmethod
    def sniff(cls, head: Head) -> int:
        for obj in head.objects:
            if obj.get("type") in KNOWN_TYPES and "payload" in obj and "timestamp" in obj:
                return 3
        # A first line longer than the head (session_meta embeds the base instructions).
        if re.match(r'\{\s*"timestamp"\s*:\s*"[^"]*"\s*,\s*"type"\s*:\s*"(%s)"\s*,\s*"payload"'
                    % "|".join(sorted(KNOWN_TYPES)), head.first_line):
            return 2
        return 0

    def _feed(self, line: str) -> list[Op]:
        rec = self._known(line, "type", KNOWN_TYPES)
        if rec is None:
            return []
        rtype, payload = rec["type"], rec.get("payload")
        if not isinstance(payload, dict):
            self.stats.skipped_malformed += 1
            return []
        if rtype in ("session_meta", "turn_context"):
            if isinstance(payload.get("cwd"), str):
                self.cwd = payload["cwd"]
            if self.context_turns and rtype == "session_meta":
                return self._shown_meta(payload)
            return []
        if rtype == "event_msg" and self.context_turns:
            return self._shown_event(payload)
        if rtype != "response_item":
            return []
        return self._item(payload)

    # Context turns (``context_turns`` only): base instructions (system), user and developer
    # messages (user / system), tool outputs (tool_result). Older rollouts record the user's
    # prompt only as ``event_msg/user_message``: taken while no user response_item was seen.
    def _shown_meta(self, payload: dict) -> list[Op]:
        text = shown_text(payload.get("base_instructions") or payload.get("instructions"))
        return [Put("ctx:instructions", text, SYSTEM, self.cwd)] if text.strip() else []

    def _shown_event(self, payload: dict) -> list[Op]:
        text = payload.get("message")
        if payload.get("type") != "user_message" or self.user_items or not isinstance(text, str) \
                or not text.strip():
            return []
        return [Put(f"ctx:line:{self.line_no}", text, USER, self.cwd)]

    def _shown_item(self, item: dict) -> list[Op]:
        itype, key = item.get("type"), f"ctx:line:{self.line_no}"
        if itype == "message" and item.get("role") in ("user", "developer", "system"):
            text = shown_text(item.get("content"))
            if item["role"] == "user":
                self.user_items = True
            kind = USER if item["role"] == "user" else SYSTEM
            return [Put(key, text, kind, self.cwd)] if text.strip() else []
        if itype in ("function_call_output", "custom_tool_call_output"):
            text = shown_text(item.get("output"))
            return [Put(key, text, TOOL_RESULT, self.cwd)] if text.strip() else []
        return []

    def _item(self, item: dict) -> list[Op]:
        itype = item.get("type")
        if itype not in KNOWN_ITEMS:
            self.stats.skipped_unknown += 1
            return []
        if self.context_turns and itype in ("message", "function_call_output",
                                            "custom_tool_call_output") \
                and item.get("role") != "assistant":
            return self._shown_item(item)
        if itype == "message":
            if item.get("role") != "assistant":
                return []
            parts = item.get("content")
            if isinstance(parts, str):
                parts = [{"type": "output_text", "text": parts}]
            if not isinstance(parts, list):
                self.stats.skipped_malformed += 1
                return []
            texts = [p.get("text") for p in parts if isinstance(p, dict)
                     and p.get("type") in ("output_text", "text") and isinstance(p.get("text"), str)]
            text = "\n".join(t for t in texts if t.strip())
            if not text:
                return []
            return [Put(str(item.get("id") or f"line:{self.line_no}"), text, ASSISTANT, self.cwd)]
        if itype == "reasoning":
            if item.get("encrypted_content"):
                self.stats.dropped_blobs += 1
            return []
        if itype == "function_call":
            text, lang = render_function_call(str(item.get("name", "")), item.get("arguments", ""))
        elif itype == "custom_tool_call":
            text = item.get("input") if isinstance(item.get("input"), str) else ""
            lang = "diff" if item.get("name") == "apply_patch" else None
        elif itype == "local_shell_call":
            action = item.get("action") if isinstance(item.get("action"), dict) else {}
            text, lang = render_command(action.get("command")) or "", "shellscript"
        else:
            return []
        if not text.strip():
            return []
        key = str(item.get("call_id") or item.get("id") or f"line:{self.line_no}")
        h = text_hash(text)
        if self.calls.get(key) == h:
            self.stats.skipped_duplicate += 1
            return []
        remember(self.calls, key, h, MAX_CALLS)
        return [Put(key, text, TOOL_INPUT, self.cwd, lang)]
