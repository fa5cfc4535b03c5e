"""1-based (line, column) -> character offset, as `assistd complete --line --column` uses it."""

import pytest

from assistd.ground.errors import InputError
from assistd.runtime.session import cursor_offset


def test_positions_in_lf_text():
    """cursor_offset maps 1-based line and column to a character offset in LF text; the line
    after a final newline exists, and no line or column means the end of the text."""
    text = "ab\ncd\n"
    assert cursor_offset(text, 1, 1) == 0
    assert cursor_offset(text, 2, 2) == 4
    assert cursor_offset(text, 2, 3) == 5  # end of line 2
    assert cursor_offset(text, 3, 1) == 6  # the empty line after the final newline
    assert cursor_offset(text, None, None) == 6


def test_crlf_line_endings_are_not_columns():
    """In CRLF text the CR is not a column: line 1 ends at column 3 (offset 2), line 2 starts at
    offset 4, and column 4 of line 1 is refused as past its end."""
    text = "ab\r\ncd"
    assert cursor_offset(text, 1, 3) == 2
    assert cursor_offset(text, 2, 1) == 4
    assert cursor_offset(text, 1, None) == 2
    with pytest.raises(InputError, match="column 4 is past the end of line 1"):
        cursor_offset(text, 1, 4)


def test_columns_count_characters_not_bytes():
    """Columns count characters, not UTF-8 bytes: column 3 of 'héllo' is offset 2."""
    assert cursor_offset("héllo\nx", 1, 3) == 2


def test_past_the_end_and_column_without_line():
    """A line past the end, and a column without a line, raise InputError naming the fault
    ('--column needs --line')."""
    with pytest.raises(InputError, match="line 3 is past the end"):
        cursor_offset("a\nb", 3, 1)
    with pytest.raises(InputError, match="--column needs --line"):
        cursor_offset("a", None, 1)


def test_empty_text_has_one_empty_line():
    """Empty text has one empty line: line 1 column 1 is offset 0, line 2 is refused."""
    assert cursor_offset("", 1, 1) == 0
    with pytest.raises(InputError):
        cursor_offset("", 2, 1)


def test_form_feed_and_unicode_separators_do_not_split_lines():
    """Only LF, CRLF and CR end lines (as in LSP); str.splitlines would also split on these."""
    text = "a = 1\x0c\nb = 2\u2028x\nc = 3\n"
    assert cursor_offset(text, 2, None) == text.index("\nc")
    assert cursor_offset(text, 4, 1) == len(text)
    with pytest.raises(InputError, match=r"\(4 lines\)"):
        cursor_offset(text, 5, None)
