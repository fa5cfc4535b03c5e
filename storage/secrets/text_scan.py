"""C-speed scans over a whole text: runs of token characters, and a lowered copy whose
offsets are the text's own.

The provider rules and the base64 rule look only at long runs of token characters, found
with ``bytes.translate`` and ``bytes.find``; the gated and next-line rules look for their
gate words in a lowered copy of the text and slice the original at the same offsets.
"""

from __future__ import annotations

from collections.abc import Iterator

_RUN_MIN_CHARS = 24  # no provider token is shorter (sk_live_ + 20, hvs. + 24, ...)
_RUN_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.+/="
_RUN_TABLE = bytes(ord("a") if b in _RUN_CHARS else ord(" ") for b in range(256))


def long_runs(text: str) -> str:
    """The runs of :data:`_RUN_MIN_CHARS` or more token characters (letters, digits,
    ``_-.+/=``) in ``text``, one per line (``bytes.translate`` and ``find``: C speed).

    >>> long_runs("x = 'ghp_" + "a1" * 12 + "' # not_a_long_word")
    'ghp_a1a1a1a1a1a1a1a1a1a1a1a1'
    """
    data = text.encode("utf-8", "surrogatepass")
    runs = char_runs(data.translate(_RUN_TABLE), _RUN_MIN_CHARS)
    return b"\n".join(data[i:e] for i, e in runs).decode("ascii")


def char_runs(marks: bytes, min_len: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` byte offsets of the runs of at least ``min_len`` ``a`` in
    ``marks`` (a text translated to ``a`` for run characters, a space for the rest)."""
    needle = b"a" * min_len
    i = marks.find(needle)
    while i >= 0:
        e = marks.find(b" ", i)
        e = len(marks) if e < 0 else e
        yield i, e
        i = marks.find(needle, e)


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def lower_same_offsets(text: str) -> str:
    """``text.lower()``, or only its ASCII letters lowered when lowering would change the
    length (a few characters lengthen: U+0130 becomes two), so offsets match ``text``'s.

    >>> lower_same_offsets("Token"), len(lower_same_offsets("\u0130 Token"))
    ('token', 7)
    """
    low = text.lower()
    if len(low) != len(text):  # a few characters lengthen when lowered: ASCII only then
        low = text.translate(_ASCII_LOWER)
    return low
