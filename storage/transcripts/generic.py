"""Generic chat JSONL: one ``{"role": ..., "content": ...}`` object per line.

The lowest common denominator of chat exports (OpenAI chat-completions message shape).
``content`` is a string or a list of parts ``{"type": "text", "text": ...}``. Only lines
with ``role: "assistant"`` are model output -> kind assistant, key ``line:<n>``; their
``tool_calls[]`` (``{id, function: {name, arguments}}``) -> kind tool_input, key
``line:<n>/<call id>``. Other roles (user, system, developer, tool, function) are not.
An optional top-level ``cwd`` string is taken as the project directory.
With ``context_turns`` on (offline replay), the other roles are emitted too, as kinds
system (system, developer), user and tool_result (tool, function), key ``ctx:line:<n>``.
"""

from __future__ import annotations

from storage.transcripts.base import ASSISTANT, Head, LineParser, Op, Put, register
from storage.transcripts.mini_swe_agent import SHOWN_KINDS, content_text, tool_call_puts

ROLES = frozenset({"assistant", "user", "system", "developer", "tool", "function"})


@register
class GenericJsonlParser(LineParser):
    """``{role, content}`` JSONL (see module docstring)."""
    format = "generic_jsonl"
    name_patterns = ("*.jsonl",)
    state_fields = ("line_no",)

    @classmethod
    def sniff(cls, head: Head) -> int:
        chat = [o for o in head.objects if o.get("role") in ROLES and "content" in o]
        return 1 if chat and len(chat) * 2 >= len(head.objects) else 0

    def _feed(self, line: str) -> list[Op]:
        rec = self._known(line, "role", ROLES)
        if rec is None:
            return []
        role = rec["role"]
        cwd = rec.get("cwd") if isinstance(rec.get("cwd"), str) else None
        if role != "assistant":
            if not self.context_turns:
                return []
            text = content_text(rec.get("content"), self.stats)
            return [Put(f"ctx:line:{self.line_no}", text, SHOWN_KINDS[role], cwd)] \
                if text.strip() else []
        key = f"line:{self.line_no}"
        ops: list[Op] = []
        text = content_text(rec.get("content"), self.stats)
        if text.strip():
            ops.append(Put(key, text, ASSISTANT, cwd))
        ops.extend(tool_call_puts(key, rec.get("tool_calls"), cwd, self.stats))
        return ops
