"""Replacing found spans with :data:`REDACTED`: the one place where overlapping spans merge.

Every rule of the filter reports spans; :func:`merge_spans` sorts them and merges the ones
that overlap, and :func:`splice` puts one :data:`REDACTED` in place of each merged span. The
detect-secrets round works on UTF-8 bytes (:func:`replace_byte_spans`), the extra rules on
characters (:func:`replace_text_spans`); both go through the same two functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

REDACTED = "[REDACTED]"
MIN_GLOBAL_CHARS = 8  # token-like values this long are replaced everywhere in the text
TextSpan = tuple[int, int, str, str]  # a rule's finding: start, end (characters), kind, value

# The kind of a merged span is the kind of its lowest rank.
RANK_PRIVATE_KEY = 0
RANK_SPECIFIC = 1  # token-format plugins (AWS, GitHub, Slack, JWT, basic auth, ...)
RANK_KEYWORD = 2
RANK_ENTROPY = 3


@dataclass(frozen=True)
class Redaction:
    """The text with every detected secret value replaced by :data:`REDACTED`.

    ``count`` is the number of replaced spans; ``kinds`` maps the detect-secrets plugin
    ``secret_type`` (e.g. ``"AWS Access Key"``, ``"Secret Keyword"``) to its share of ``count``.
    """

    text: str
    count: int
    kinds: dict[str, int]


def merge_spans(spans: Iterable[tuple[int, int, int, str]]) -> list[tuple[int, int, str]]:
    """``(start, end, rank, kind)`` spans, sorted, overlapping ones merged: ``(start, end,
    kind)``. Spans that only touch stay apart. A merged span takes the kind of its lowest
    rank (of the first span in sorted order on a tie).

    >>> merge_spans([(4, 9, 2, "Keyword"), (0, 5, 3, "Entropy"), (9, 12, 1, "AWS")])
    [(0, 9, 'Keyword'), (9, 12, 'AWS')]
    """
    merged: list[list] = []  # [start, end, rank, kind]
    for s, e, rank, kind in sorted(spans):
        if merged and s < merged[-1][1]:
            last = merged[-1]
            last[1] = max(last[1], e)
            if rank < last[2]:
                last[2], last[3] = rank, kind
        else:
            merged.append([s, e, rank, kind])
    return [(s, e, kind) for s, e, _, kind in merged]


def splice(buf, merged: list[tuple[int, int, str]], token):
    """``buf`` (str or bytes) with ``token`` in place of each of the ``merged`` spans (sorted,
    disjoint: :func:`merge_spans`). Returns (new buf, number of spans, spans per kind).

    >>> splice("a=xyz b=uv", [(2, 5, "K"), (8, 10, "K")], "*")
    ('a=* b=*', 2, {'K': 2})
    """
    out = []
    kinds: dict[str, int] = {}
    pos = 0
    for s, e, kind in merged:
        out.append(buf[pos:s])
        out.append(token)
        pos = e
        kinds[kind] = kinds.get(kind, 0) + 1
    out.append(buf[pos:])
    return buf[:0].join(out), len(merged), kinds


def replace_byte_spans(data: bytes,
                       spans: list[tuple[int, int, int, str]]) -> tuple[str, int, dict]:
    """The byte spans ``(start, end, rank, kind)`` of ``data`` (UTF-8, ``surrogatepass``)
    replaced: (text, number of replacements, replacements per kind)."""
    out, count, kinds = splice(data, merge_spans(spans), REDACTED.encode())
    return out.decode("utf-8", "surrogatepass"), count, kinds


def replace_text_spans(text: str, spans: list[TextSpan]) -> tuple[str, int, dict[str, int]]:
    """``spans`` (start, end, kind, value) replaced by :data:`REDACTED`, merged where they
    overlap; a token-like value everywhere it appears. Returns (text, count, kinds); ``text``
    itself when there are no spans.

    >>> replace_text_spans("pw=Summer2024-db; old=Summer2024-db", [(3, 16, "K", "Summer2024-db")])
    ('pw=[REDACTED]; old=[REDACTED]', 2, {'K': 2})
    """
    if not spans:
        return text, 0, {}
    # Token-like values go wherever they appear; short ones only where they were found.
    # One rank for all: a merged span takes the kind of its first span.
    found = [(s, e, 0, kind) for s, e, kind, _ in spans]
    for value, kind in {v: k for _, _, k, v in spans if token_like(v)}.items():
        i = text.find(value)
        while i >= 0:
            found.append((i, i + len(value), 0, kind))
            i = text.find(value, i + len(value))
    return splice(text, merge_spans(found), REDACTED)


def token_like(value: str) -> bool:
    """Replace this value wherever it appears? Long, no spaces (those are artefacts of greedy
    patterns, "pw rest-of-line"), and two character classes: ``hunter2-x9`` yes, a plain word
    like ``password`` (a keyword false positive) only on its own line.

    >>> [token_like(v) for v in ("Summer2024-db", "password", "hunter2 and more")]
    [True, False, False]
    """
    if len(value) < MIN_GLOBAL_CHARS or any(c.isspace() for c in value):
        return False
    classes = (any(c.islower() for c in value) + any(c.isupper() for c in value)
               + any(c.isdigit() for c in value) + any(not c.isalnum() for c in value))
    return classes >= 2
