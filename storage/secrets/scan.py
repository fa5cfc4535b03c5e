"""One round of the detect-secrets plugins over a text: the byte spans of what they find.

The plugins see one candidate line at a time (:func:`.prefilter.candidate_lines`) and report
values, not places: a token-like value is then located everywhere in the text, a short one
on its own line only, and a value found in a line's JSON-unescaped copy is mapped back onto
its escaped form.
"""

from __future__ import annotations

import re

from .detector import detector
from .prefilter import all_lines, candidate_lines
from .private_keys import private_key_spans
from .spans import token_like


def find_spans(data: bytes, mode, prefilter: bool) -> list[tuple[int, int, int, str]]:
    """One round: the byte spans ``(start, end, rank, kind)`` of every secret value.

    >>> from storage.secrets.detector import keyword_mode
    >>> find_spans(b'x = 1\\napi_key = "Wq7hunter2Zr9"\\n', keyword_mode(""), True)
    [(17, 30, 2, 'Secret Keyword')]
    """
    if not data:
        return []
    low = data.lower()
    det = detector()
    spans: list[tuple[int, int, int, str]] = []
    spans.extend(private_key_spans(data, low))
    global_values: dict[str, tuple[int, str, int, int]] = {}  # value -> rank, kind, its line
    for start, end in candidate_lines(data, low) if prefilter else all_lines(data):
        line = data[start:end].decode("utf-8", "surrogatepass")
        found = det.scan_line(line, mode)
        for value, (rank, kind) in found.items():
            if token_like(value):
                old = global_values.get(value)
                if old is None or rank < old[0]:
                    global_values[value] = (rank, kind, start, end)
                continue
            located = _locate_short(value, data, start, end)
            # Never seen: found values are substrings of the line or of its unescaped copy,
            # which _raw_pattern maps back. Should it fail, the whole line goes.
            for s, e in located or [(start, end)]:
                spans.append((s, e, rank, kind))
    for value, (rank, kind, start, end) in global_values.items():
        for s, e in _locate_all(value, data) or [(start, end)]:
            spans.append((s, e, rank, kind))
    return spans


def _raw_pattern(value: str) -> re.Pattern | None:
    """Bytes regex for ``value`` as it may appear JSON-escaped (any backslashes before quotes,
    slashes and backslashes; ``\\t`` for tab); None when the value has none of those."""
    if not any(c in value for c in "\"'\\/\t"):
        return None
    parts = []
    for c in value:
        if c in "\"'\\/":
            parts.append(rb"\\*" + re.escape(c.encode()))
        elif c == "\t":
            parts.append(rb"(?:\t|\\+t)")
        else:
            parts.append(re.escape(c.encode("utf-8", "surrogatepass")))
    return re.compile(b"".join(parts))


def _occurrences(value: str, data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    rx = _raw_pattern(value)
    if rx is not None:
        return [m.span() for m in rx.finditer(data, start, end)]
    needle = value.encode("utf-8", "surrogatepass")
    out = []
    pos = data.find(needle, start, end)
    while pos >= 0:
        out.append((pos, pos + len(needle)))
        pos = data.find(needle, pos + len(needle), end)
    return out


def _locate_all(value: str, data: bytes) -> list[tuple[int, int]]:
    return _occurrences(value, data, 0, len(data))


def _locate_short(value: str, data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """A short value on its own line: the occurrences not inside a longer word, else all."""
    spans = _occurrences(value, data, start, end)

    def alnum(i: int) -> bool:
        return 0 <= i < len(data) and (chr(data[i]).isalnum() if data[i] < 128 else True)

    bounded = [(s, e) for s, e in spans if not alnum(s - 1) and not alnum(e)]
    return bounded or spans
