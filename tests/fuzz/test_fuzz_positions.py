"""Fuzzing the cursor and position code: LSP positions in UTF-8/16/32 units
(``editors.positions``) and the shell's 1-based (line, column) (``cursor_offset``).

Properties: an offset maps to a position and back to itself; a position maps to an
offset within the text or raises the documented error (``PositionError``,
``InputError``), nothing else; a position past the end is never clamped silently.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from lsprotocol import types

from assistd.ground.errors import InputError
from assistd.runtime.session import cursor_offset
from editors.positions import PositionError, offset_at, position_at, split_lines

ENCODINGS = ["utf-8", "utf-16", "utf-32"]
# Documents: line breaks of every kind, astral characters (2 UTF-16 units, 4 UTF-8
# bytes), form feed and U+2028 (line breaks to str.splitlines, not to LSP).
PIECES = st.sampled_from(["a", " ", "\n", "\r", "\r\n", "\t", "\x0c", "\u2028", "\x85", "μ",
                          "中", "😋", "\U0010ffff", "\x00", "\ufeff", "é"])
DOC = st.one_of(st.lists(PIECES, max_size=30).map("".join), st.text(max_size=30))
# Any code unit count an LSP client may send (uinteger: 0 .. 2**31 - 1).
UINT = st.one_of(st.integers(0, 40), st.integers(0, 2**31 - 1))


def units(s: str, encoding: str) -> int:
    return {"utf-8": len(s.encode("utf-8")), "utf-16": len(s.encode("utf-16-le")) // 2,
            "utf-32": len(s)}[encoding]


def in_line_break(text: str, offset: int) -> bool:
    """Between the \\r and \\n of a CRLF: no position names that offset."""
    return 0 < offset < len(text) and text[offset - 1] == "\r" and text[offset] == "\n"


@pytest.mark.parametrize("encoding", ENCODINGS)
@given(text=DOC, data=st.data())
def test_offset_position_offset_round_trip(encoding, text, data):
    """In each encoding, offset -> position -> offset is the identity, except inside a CRLF,
    which maps to the end of its line."""
    offset = data.draw(st.integers(0, len(text)))
    pos = position_at(text, offset, encoding)
    back = offset_at(text, pos, encoding)
    if in_line_break(text, offset):
        assert back == offset - 1  # the end of that line
    else:
        assert back == offset


@pytest.mark.parametrize("encoding", ENCODINGS)
@given(text=DOC, line=UINT, character=UINT)
@example(text="😋", line=0, character=1)  # inside a surrogate pair (UTF-16)
@example(text="a\r\nb", line=0, character=2)  # the line break itself
@example(text="", line=0, character=0)
def test_any_position_is_an_offset_or_a_position_error(encoding, text, line, character):
    """Any position maps to an offset within its line, or raises PositionError exactly when it
    lies outside the document (never clamped)."""
    lines = split_lines(text)
    try:
        off = offset_at(text, types.Position(line, character), encoding)
    except PositionError:
        # Only for what is really outside: never clamped, never refused when inside.
        assert line >= len(lines) or character > units(lines[line].rstrip("\r\n"), encoding)
        return
    assert line < len(lines) and character <= units(lines[line].rstrip("\r\n"), encoding)
    start = sum(len(x) for x in lines[:line])
    assert start <= off <= start + len(lines[line].rstrip("\r\n"))


@given(offset=st.integers(), text=DOC)
def test_offset_outside_the_text_is_a_position_error(offset, text):
    """position_at takes offsets 0..len(text) and raises PositionError for any other."""
    if 0 <= offset <= len(text):
        position_at(text, offset)
    else:
        with pytest.raises(PositionError):
            position_at(text, offset)


@pytest.mark.parametrize("encoding", ENCODINGS)
@given(text=st.text(st.characters(exclude_categories=()), max_size=20), line=UINT,
       character=UINT)
def test_text_with_lone_surrogates_raises_nothing_undocumented(encoding, text, line, character):
    """A client may send lone surrogates (the server turns them into U+FFFD first, but
    the function alone must not crash on them either)."""
    try:
        off = offset_at(text, types.Position(line, character), encoding)
    except PositionError:
        return
    assert 0 <= off <= len(text)


# -- the shell's (line, column): 1-based, None = end ---------------------------------------

POSITIVE = st.one_of(st.none(), st.integers(1, 40), st.integers(1, 2**63))


@given(text=DOC, line=POSITIVE, column=POSITIVE)
def test_cursor_offset_is_inside_the_text_or_an_input_error(text, line, column):
    """cursor_offset gives an offset within the text or an InputError; no line means the end of
    the text."""
    try:
        off = cursor_offset(text, line, column)
    except InputError:
        return
    assert 0 <= off <= len(text)
    if line is None:
        assert off == len(text)


@given(text=DOC, data=st.data())
def test_cursor_offset_agrees_with_the_lsp_position(text, data):
    """Line l, column c (1-based, in characters) is LSP position (l-1, c-1) in UTF-32."""
    lines = split_lines(text)
    line = data.draw(st.integers(1, len(lines)))
    content = lines[line - 1].rstrip("\r\n")
    column = data.draw(st.integers(1, len(content) + 1))
    assert cursor_offset(text, line, column) == offset_at(
        text, types.Position(line - 1, column - 1), "utf-32")


# Finding 2 in fuzz_findings (fixed in 1696615): line 0 gave the last line, column 0 the
# line before, column 0 of an empty file -1.
@given(text=DOC, line=st.integers(max_value=0) | st.integers(1, 5),
       column=st.integers(max_value=0) | st.none())
@example(text="ab\ncd", line=0, column=None)  # -> 5: the end of the LAST line
@example(text="ab\ncd", line=2, column=0)  # -> 2: the end of line 1
@example(text="", line=1, column=0)  # -> -1: a negative offset
def test_cursor_offset_refuses_positions_before_the_start(text, line, column):
    """Line or column 0 or below is refused with InputError (never the end of the last line or a
    negative offset)."""
    if line >= 1 and column is None:
        return
    with pytest.raises(InputError):
        cursor_offset(text, line, column)
