"""JSON escapes: transcripts and tool calls store text JSON-escaped (``\\"password\\":
\\"...\\"``, ``\\n``), and a rule must see the text as it was written.

:func:`views` gives the detect-secrets scan a line's unescaped copies; :func:`unescaped_spans`
runs a rule on the unescaped text and maps its spans back onto the stored one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .spans import TextSpan

_ESCAPE = re.compile(r"\\([\"'\\/nrt])")  # views(): quotes of both kinds
_UNESCAPE = re.compile(r'\\(["\\/nrt])')  # unescaped_spans(): JSON's own escapes
_ESCAPED = {"n": "\n", "r": "\r", "t": "\t"}
ESCAPE_SPLIT = re.compile(r"\\(?:u[0-9a-fA-F]{4}|[\"'\\/nrtbf])")  # where a value ends


def views(line: str) -> list[str]:
    """The line's sub-lines, raw and JSON-unescaped (up to three levels), without duplicates.

    >>> views('{"content": "A=1\\\\nB=\\\\"2\\\\""}')
    ['{"content": "A=1\\\\nB=\\\\"2\\\\""}', '{"content": "A=1', 'B="2""}']
    """
    parts = line.splitlines() or [line]
    level = line
    for _ in range(3):  # JSON in JSON in JSON at most
        if "\\" not in level:
            break
        nxt = _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), m.group(1)), level)
        if nxt == level:
            break
        parts.extend(nxt.splitlines())
        level = nxt
    out: list[str] = []
    seen: set[str] = set()
    for part in parts:
        part = part.rstrip()
        if part and part not in seen:
            seen.add(part)
            out.append(part)
    return out



def unescaped_spans(rule: Callable[[str], list[TextSpan]], text: str, needs: str) -> list[TextSpan]:
    """``rule``'s spans in ``text`` and, when it holds JSON escapes (a tool call's input
    stored as JSON, a .jsonl file) and ``needs``, in its unescaped copy, mapped back onto
    ``text``."""
    out = rule(text)
    if "\\" not in text or needs not in text or not ("\\n" in text or '\\"' in text):
        return out
    parts, starts, pos = [], [], 0  # starts[i]: where the i-th unescaped character came from
    for m in _UNESCAPE.finditer(text):
        parts.append(text[pos:m.start()])
        starts.extend(range(pos, m.start()))
        parts.append(_ESCAPED.get(m.group(1), m.group(1)))
        starts.append(m.start())
        pos = m.end()
    if not starts:
        return out
    parts.append(text[pos:])
    starts.extend(range(pos, len(text)))
    starts.append(len(text))
    plain = "".join(parts)
    for s, e, kind, value in rule(plain):
        out.append((starts[s], starts[e], kind, text[starts[s]:starts[e]]))
    return out
