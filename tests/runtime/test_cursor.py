"""1-based (line, column) -> character offset, as `assistd complete --line --column` uses it."""

import pytest

from assistd.ground.errors import InputError
from assistd.runtime.session import cursor_offset


def test_positions_in_lf_text():
    text = "ab\ncd\n"
    assert cursor_offset(text, 1, 1) == 0
    assert cursor_offset(text, 2, 2) == 4
    assert cursor_offset(text, 2, 3) == 5  # end of line 2
    assert cursor_offset(text, 3, 1) == 6  # the empty line after the final newline
    assert cursor_offset(text, None, None) == 6


def test_crlf_line_endings_are_not_columns():
    text = "ab\r\ncd"
    assert cursor_offset(text, 1, 3) == 2
    assert cursor_offset(text, 2, 1) == 4
    assert cursor_offset(text, 1, None) == 2
    with pytest.raises(InputError, match="column 4 is past the end of line 1"):
        cursor_offset(text, 1, 4)


def test_columns_count_characters_not_bytes():
    assert cursor_offset("héllo\nx", 1, 3) == 2


def test_past_the_end_and_column_without_line():
    with pytest.raises(InputError, match="line 3 is past the end"):
        cursor_offset("a\nb", 3, 1)
    with pytest.raises(InputError, match="--column needs --line"):
        cursor_offset("a", None, 1)


def test_empty_text_has_one_empty_line():
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
