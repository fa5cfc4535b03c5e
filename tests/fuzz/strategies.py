"""Hypothesis strategies shared by the fuzz tests: JSON values with the nasty cases
(lone surrogates, NUL, huge strings, deep nesting), mutations of a valid record, and
raw lines (non-UTF-8 bytes included)."""

from __future__ import annotations

import json

from hypothesis import strategies as st

# Text that is legal in JSON but not in UTF-8 (lone surrogates), NUL and friends.
# Paths the OS or pathlib refuse outright ("~nosuchuser" made Path.expanduser raise
# RuntimeError: findings 5, 6, 7 in fuzz_findings); every property meets them too.
NASTY_PATHS = ["~nosuchuser/x", "a" * 5000, "/" + "a/" * 3000, "x\x00y"]
NASTY_TEXT = st.sampled_from(NASTY_PATHS + [
    "", " ", "\x00", "\ud800", "\udfff", "a\ud83dz", "\ufeff", "\u2028", "\r", "\r\n",
    "\x1b[31m", "😋", "\ufffd", "x" * 100_000, "null", "[]", "{}",
])
# Any code point, lone surrogates included (st.text leaves category Cs out by default).
TEXT = st.one_of(st.text(st.characters(exclude_categories=()), max_size=40), NASTY_TEXT)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63, max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False), TEXT)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12)


def nested(depth: int, leaf="x"):
    """A value nested ``depth`` lists deep (built iteratively: no recursion here)."""
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


# Deep, but within what json.dumps (recursive) can write and json.loads can read back.
DEEP = st.integers(min_value=50, max_value=200).map(nested)
JSON_OR_DEEP = st.one_of(JSON, DEEP)


def paths(value, prefix=()):
    """Every path (tuple of keys / indices) into a JSON value, the root included."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, prefix + (i,))
    return out


def replaced(value, path, new):
    """A copy of ``value`` with the subtree at ``path`` replaced by ``new``."""
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


@st.composite
def mutated(draw, template):
    """``template`` (a JSON value) with one to three of its fields (any depth) replaced by
    an arbitrary JSON value: structurally plausible, wrong in one place."""
    value = template
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(value)))
        value = replaced(value, path, draw(JSON_OR_DEEP))
    return value


# Raw lines for the line formats: JSON text that is wrong, not JSON at all, bytes that
# are not UTF-8, nesting past any recursion limit. No newline inside (one line each).
DEEP_LINE = st.integers(min_value=1_000, max_value=30_000).flatmap(
    lambda n: st.sampled_from([b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n,
                               b"[" * n]))
RAW_LINE = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
    JSON.map(lambda v: json.dumps(v).encode()),
    DEEP_LINE,
    st.sampled_from([b"\xff\xfe", b"\x00" * 10, b"\xed\xa0\x80", b"{", b'{"type":', b"\r",
                     b'{"type": "assistant"}', b'{"role": "assistant"}', b"}" * 3]),
).map(lambda b: b.replace(b"\n", b" "))
