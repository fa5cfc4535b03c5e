"""Coding-agent transcript parsers: model output as records, no database.

Every module of this package is imported here so that its ``@register``-ed parsers join
``FORMATS``: a new format is one new file.

>>> from storage.transcripts import detect_format, parser_for, parse_all, apply_ops
>>> p = parser_for("generic_jsonl")
>>> ops = parse_all(p, b'{"role":"user","content":"hi"}\\n{"role":"assistant","content":"hello"}\\n')
>>> [(k, r.text, r.kind) for k, r in apply_ops(ops).items()]
[('line:2', 'hello', 'assistant')]
"""

import importlib
import pkgutil

from storage.transcripts.base import (
    ASSISTANT, FORMATS, MODEL_KINDS, SYSTEM, TOOL_INPUT, TOOL_RESULT, USER, Append, LineParser,
    Op, ParseStats, Put, Rewind, TranscriptError, WholeParser, apply_ops, parse_all,
)
from storage.transcripts.detect import HEAD_BYTES, detect_format, open_bytes, parser_for

# Registration order is detection's last tie-breaker: specific formats first, generic last.
for _name in ("claude_code", "codex", "gemini", "aider", "swe_agent", "mini_swe_agent",
              "openhands", "generic"):
    importlib.import_module(f"{__name__}.{_name}")
for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = [
    "ASSISTANT", "FORMATS", "HEAD_BYTES", "MODEL_KINDS", "SYSTEM", "TOOL_INPUT", "TOOL_RESULT",
    "USER", "Append", "LineParser", "Op",
    "ParseStats", "Put", "Rewind", "TranscriptError", "WholeParser", "apply_ops",
    "detect_format", "open_bytes", "parse_all", "parser_for",
]
