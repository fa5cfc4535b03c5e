"""JSON nesting bounded before it is parsed.

``json.loads`` (its C decoder recurses once per level) and any code that walks the result
recursively fail on JSON nested tens of thousands deep: a RecursionError, or a stack
overflow. Untrusted JSON (transcripts, request bodies) is measured first by a linear scan
of its brackets outside strings, and refused, or cut, past a limit chosen by its reader.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

# A JSON string (an unterminated one runs to the end, so the scan stays linear), or a bracket.
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)'
_STRINGS = re.compile(_STRING, re.S)
_TOKENS = re.compile(_STRING + r"|[\[\]{}]", re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class TooDeep(ValueError):
    """JSON nested deeper than a reader's limit (a ValueError: invalid JSON for callers)."""


def _text(data: str | bytes) -> str:
    # latin-1 maps bytes one to one, and brackets, quotes and backslashes are ASCII.
    return data.decode("latin-1") if isinstance(data, (bytes, bytearray)) else data


def json_too_deep(data: str | bytes, limit: int) -> bool:
    """Whether ``data`` nests arrays/objects (outside strings) deeper than ``limit``.
    Linear; text with at most ``limit`` opening brackets in all is answered by counting.

    >>> json_too_deep('{"a": [[1]], "s": "[[[["}', limit=3), json_too_deep(b"[[[[]]]]", limit=3)
    (False, True)
    """
    text = _text(data)
    if text.count("[") + text.count("{") <= limit:
        return False
    brackets = _NOT_BRACKET.sub("", _STRINGS.sub("", text))
    return any(depth > limit for depth in accumulate(map(_STEP.__getitem__, brackets)))


def prune_deep(text: str, limit: int) -> tuple[str, int]:
    """``text`` with every array/object nested deeper than ``limit`` replaced by ``null``,
    and how many were replaced (a whole document keeps its other entries).

    >>> prune_deep('{"a": [[[1]], 2], "b": "[[[["}', limit=2)
    ('{"a": [null, 2], "b": "[[[["}', 1)
    """
    if not json_too_deep(text, limit):
        return text, 0
    out, kept, depth, start, pruned = [], 0, 0, None, 0
    for m in _TOKENS.finditer(text):
        step = _STEP.get(m.group())
        if step is None:
            continue  # a string
        depth += step
        if step > 0 and depth == limit + 1:
            start = m.start()
        elif step < 0 and depth == limit and start is not None:
            out += (text[kept:start], "null")
            kept, start, pruned = m.end(), None, pruned + 1
    if start is not None:  # unterminated: invalid JSON whatever follows
        out += (text[kept:start], "null")
        kept, pruned = len(text), pruned + 1
    out.append(text[kept:])
    return "".join(out), pruned


def loads(data: str | bytes, limit: int, **kwargs) -> Any:
    """``json.loads(data, **kwargs)``, refused first (:class:`TooDeep`) when nested deeper
    than ``limit``. Raises ValueError (TooDeep and JSONDecodeError included) for anything
    that is not JSON."""
    if json_too_deep(data, limit):
        raise TooDeep(f"JSON nested deeper than {limit} levels")
    return json.loads(data, **kwargs)
