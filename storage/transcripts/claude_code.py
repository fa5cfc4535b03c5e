"""Claude Code session JSONL: ``~/.claude/projects/<dir>/<session>.jsonl`` and
``<session>/subagents/*.jsonl`` (same format, records carry ``isSidechain``).

Format: one JSON record per line, ``type`` in user/assistant/system/summary/
file-history-snapshot/... (community schema: oneryalcin/agent-schemas
``claude-code/v2.1.144/session.schema.json`` and its README's type table).

Model output lives only in ``assistant`` records' ``message.content`` blocks:

- ``text`` -> kind assistant, one record per model response: a response is split over
  several lines sharing ``message.id`` (one content block per line), so the first text
  block is a Put under key ``message.id`` and later ones are Appends joined with "\\n";
- ``tool_use`` (and ``server_tool_use``) -> kind tool_input, key ``<message.id>/<block id>``:
  Edit ``new_string``, MultiEdit each edit's ``new_string`` (joined with "\\n"), Write
  ``content``, NotebookEdit ``new_source``; any other tool the JSON of ``input``.
  ``language_id`` is set only when the text is file content (Edit/MultiEdit/Write).
- ``thinking`` blocks are skipped (not output the Target reproduces); their ``signature``,
  ``redacted_thinking`` and image blocks are counted as dropped blobs.

Records whose ``message.model`` is ``<synthetic>`` are written by the client (API error
notices, "No response requested."), not by a model: skipped. User records (tool results,
``toolUseResult`` with ``originalFile``, pasted images) are never model output, and
``progress`` records only repeat subagent messages that their own ``subagents/*.jsonl``
files hold: both ignored. Unknown ``type`` values are counted and skipped.

With ``context_turns`` on (offline replay), user prompts, tool results and system notices
are emitted too (see ``_shown``).
"""

from __future__ import annotations

import re

from storage.transcripts.base import (
    ASSISTANT, SYSTEM, TOOL_INPUT, TOOL_RESULT, USER, Append, Head, LineParser, Op, Put,
    WrongType, expect, json_text, register, remember, shown_text, text_hash,
)
from assistd.ground.languages import language_id

KNOWN_TYPES = frozenset({
    "user", "assistant", "system", "summary", "file-history-snapshot", "queue-operation",
    "progress", "pr-link", "agent-name", "custom-title", "last-prompt", "attachment",
    "permission-mode", "ai-title", "agent-setting", "bridge-session", "worktree-state",
})
BLOB_BLOCKS = frozenset({"image", "document", "redacted_thinking"})
MAX_MESSAGES = 64  # message ids remembered for grouping/dedup (responses are contiguous)


# The field holding the file text each editing tool writes (a string when present).
TEXT_FIELDS = {"Edit": "new_string", "Write": "content", "NotebookEdit": "new_source"}


def render_tool_use(name: str, tool_input) -> tuple[str, str | None]:
    """(text, language_id) of one tool call's input. Raises :class:`WrongType` when the
    input is not an object or an editing tool's text field is not a string.

    >>> render_tool_use("Write", {"file_path": "a/b.py", "content": "x = 1\\n"})
    ('x = 1\\n', 'python')
    >>> render_tool_use("Bash", {"command": "ls"})
    ('{"command": "ls"}', None)
    """
    expect(tool_input, dict, f"the input of {name or 'a tool call'}")
    path = tool_input.get("file_path")
    lang = language_id(path) if isinstance(path, str) and path else None
    field = TEXT_FIELDS.get(name)
    if field in tool_input:
        text = expect(tool_input[field], str, f"{name}'s {field}")
        return text, None if name == "NotebookEdit" else lang
    if name == "MultiEdit" and "edits" in tool_input:
        edits = expect(tool_input["edits"], list, "MultiEdit's edits")
        return "\n".join(expect(expect(e, dict, "a MultiEdit edit").get("new_string"), str,
                                "a MultiEdit new_string") for e in edits), lang
    return json_text(tool_input), None


@register
class ClaudeCodeParser(LineParser):
    """Claude Code JSONL (see module docstring)."""
    format = "claude_code"
    name_patterns = ("*.jsonl",)
    state_fields = ("line_no", "messages")

    def __init__(self) -> None:
        super().__init__()
        # message id -> {"text": bool (a text record exists), "seen": [hashes of emitted blocks]}
        self.messages: dict[str, dict] = {}

    @classmethod
    def sniff(cls, head: Head) -> int:
        for obj in head.objects:
            if obj.get("type") in KNOWN_TYPES and any(
                    k in obj for k in ("uuid", "sessionId", "leafUuid", "messageId")):
                return 3
        # A first line longer than the head (e.g. a pasted image): its prefix still shows
        # the record header, written before "message".
        m = re.search(r'"type"\s*:\s*"([a-z-]+)"', head.first_line)
        if head.first_line.startswith("{") and m and m.group(1) in KNOWN_TYPES \
                and re.search(r'"(uuid|sessionId|parentUuid)"\s*:', head.first_line):
            return 2
        return 0

    def _feed(self, line: str) -> list[Op]:
        rec = self._known(line, "type", KNOWN_TYPES)
        if rec is None:
            return []
        kind = rec["type"]
        if kind != "assistant":
            return self._shown(rec, kind) if self.context_turns else []
        message = rec.get("message")
        if not isinstance(message, dict):
            self.stats.skipped_malformed += 1
            return []
        if message.get("model") == "<synthetic>":
            return []
        msg_id = str(message.get("id") or rec.get("uuid") or f"line:{self.line_no}")
        cwd = rec.get("cwd") if isinstance(rec.get("cwd"), str) else None
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            self.stats.skipped_malformed += 1
            return []

        state = self.messages.get(msg_id) or {"text": False, "seen": []}
        ops: list[Op] = []
        for i, block in enumerate(content):
            if not isinstance(block, dict):
                self.stats.skipped_malformed += 1
                continue
            btype = block.get("type")
            if btype == "text":
                text = block.get("text")
                if not isinstance(text, str) or not text.strip():
                    continue
                if self._seen(state, text_hash("text", text)):
                    continue
                if state["text"]:
                    ops.append(Append(msg_id, text, ASSISTANT, cwd))
                else:
                    ops.append(Put(msg_id, text, ASSISTANT, cwd))
                    state["text"] = True
            elif btype in ("tool_use", "server_tool_use"):
                tool_id = block.get("id") or f"line{self.line_no}.{i}"
                try:
                    text, lang = render_tool_use(str(block.get("name", "")), block.get("input"))
                except WrongType as e:  # this call only: the line's other blocks stay
                    self._bad_record(e)
                    continue
                if not text.strip() or self._seen(state, text_hash("tool", str(tool_id), text)):
                    continue
                ops.append(Put(f"{msg_id}/{tool_id}", text, TOOL_INPUT, cwd, lang))
            elif btype == "thinking":
                if block.get("signature"):
                    self.stats.dropped_blobs += 1
            elif btype in BLOB_BLOCKS:
                self.stats.dropped_blobs += 1
        remember(self.messages, msg_id, state, MAX_MESSAGES)
        return ops

    def _shown(self, rec: dict, kind: str) -> list[Op]:
        """Context turns (``context_turns`` only): a user record's prompt text (kind user)
        and each ``tool_result`` block (kind tool_result; ``toolUseResult`` repeats it and
        is not read); a system record's ``content`` (kind system)."""
        cwd = rec.get("cwd") if isinstance(rec.get("cwd"), str) else None
        key = f"ctx:{rec.get('uuid') or f'line:{self.line_no}'}"
        if kind == "system":
            text = rec.get("content")
            return [Put(key, text, SYSTEM, cwd)] if isinstance(text, str) and text.strip() else []
        if kind != "user" or not isinstance(rec.get("message"), dict):
            return []
        content = rec["message"].get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        ops: list[Op] = []
        prompt = []
        for i, block in enumerate(blocks if isinstance(blocks, list) else []):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                prompt.append(block["text"])
            elif block.get("type") == "tool_result":
                text = shown_text(block.get("content"))
                if text.strip():
                    call = block.get("tool_use_id") or i
                    ops.append(Put(f"{key}/{call}", text, TOOL_RESULT, cwd))
        text = "\n".join(t for t in prompt if t.strip())
        if text:
            ops.insert(0, Put(key, text, USER, cwd))
        return ops

    def _seen(self, state: dict, h: str) -> bool:
        if h in state["seen"]:
            self.stats.skipped_duplicate += 1
            return True
        state["seen"].append(h)
        return False
