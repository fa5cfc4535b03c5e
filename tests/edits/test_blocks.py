"""SEARCH/REPLACE blocks parsed and applied by rule, and lazy snippets told apart (no files)."""

from __future__ import annotations

import pytest

from assistd.edits.blocks import (
    BlockError, apply_blocks, check_filenames, has_blocks, lazy_markers, parse_blocks,
)

SRC = '''\
import os


def load(path):
    with open(path) as f:
        return f.read()


def save(path, text):
    with open(path, "w") as f:
        f.write(text)
'''


def block(search: str, replace: str, filename: str | None = None) -> str:
    head = f"{filename}\n" if filename else ""
    return f"{head}<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def test_an_exact_block_replaces_its_lines_and_says_where():
    """One exact block: the run of lines is replaced, the rest of the text is untouched,
    and the result names the 1-based line where the match began."""
    edit = block("def save(path, text):\n", "def save(path, text, mode=\"w\"):\n")
    new, results = apply_blocks(SRC, parse_blocks(edit))
    assert new == SRC.replace("def save(path, text):", 'def save(path, text, mode="w"):')
    assert [(r.index, r.match, r.line) for r in results] == [(1, "exact", 9)]


def test_several_blocks_apply_in_order_each_on_the_previous_result():
    """The second block's SEARCH quotes text the first block wrote: it must see it."""
    edit = (block("import os\n", "import os\nimport sys\n")
            + "Then use it:\n\n"
            + block("import sys\n", "import sys  # for argv\n"))
    new, results = apply_blocks(SRC, parse_blocks(edit))
    assert new.startswith("import os\nimport sys  # for argv\n\n\ndef load")
    assert [r.index for r in results] == [1, 2]


def test_whitespace_fallback_matches_and_reindents_and_reports_it():
    """A SEARCH whose indentation was lost matches whole lines with whitespace ignored;
    the REPLACE lines get the file's uniform offset back; the match is reported as
    "whitespace", not passed off as exact."""
    edit = block("with open(path) as f:\n    return f.read()\n",
                 "with open(path, encoding=\"utf-8\") as f:\n    return f.read()\n")
    new, results = apply_blocks(SRC, parse_blocks(edit))
    assert '    with open(path, encoding="utf-8") as f:\n        return f.read()\n' in new
    assert (results[0].match, results[0].line, results[0].indent) == ("whitespace", 5,
                                                                       "+4 spaces")


def test_ambiguous_search_error_names_block_count_and_lines():
    """A SEARCH that matches twice: the error says block 2, "matches 2 places" and the
    lines 2 and 4, although block 1 applied; nothing is returned."""
    twice = "import a\nx = 1\nprint(x)\nx = 1\n"
    edit = block("import a\n", "import b\n") + block("x = 1\n", "x = 2\n")
    with pytest.raises(BlockError) as e:
        apply_blocks(twice, parse_blocks(edit), "t.py")
    assert e.value.index == 2 and e.value.matches == 2
    msg = str(e.value)
    assert msg.startswith("SEARCH/REPLACE block 2 (line 6 of the edit): its SEARCH text")
    assert "matches 2 places in t.py (lines 2, 4)" in msg


def test_ambiguity_under_the_whitespace_fallback_is_an_error_too():
    """No exact match, two matches with whitespace ignored: an error that says the
    whitespace was ignored, never a guess between the two."""
    text = "if a:\n    go()\nif b:\n        go()\n"
    with pytest.raises(BlockError) as e:
        apply_blocks(text, parse_blocks(block("  go()\n", "  stop()\n")))
    assert e.value.matches == 2
    assert "ignoring leading and trailing whitespace, matches 2 places" in str(e.value)


def test_a_missing_search_is_an_error_naming_the_block_and_the_first_line():
    """Zero matches: the error names the block, says it matches nothing, and tells
    whether its first line is in the file at all."""
    edit = block("import os\n", "import re\n") + block("def load(path):\n    pass\n", "")
    with pytest.raises(BlockError) as e:
        apply_blocks(SRC, parse_blocks(edit), "src/io.py")
    assert e.value.index == 2 and e.value.matches == 0
    msg = str(e.value)
    assert "SEARCH/REPLACE block 2" in msg and "matches nothing in src/io.py" in msg
    assert "'def load(path):' is at line(s) 4" in msg
    with pytest.raises(BlockError, match="'nope' is not in the file"):
        apply_blocks(SRC, parse_blocks(block("nope\n", "")))


def test_an_empty_search_fills_an_empty_file_and_nothing_else():
    """An empty SEARCH on an empty file creates its content ("create"); on a file with
    text it is an error (nothing says where the text would go)."""
    new, results = apply_blocks("", parse_blocks(block("", "print('hi')\n")))
    assert new == "print('hi')\n" and results[0].match == "create"
    with pytest.raises(BlockError, match="SEARCH is empty"):
        apply_blocks(SRC, parse_blocks(block("", "x = 1\n")))


def test_fences_and_filename_lines_are_read_as_aider_writes_them():
    """A filename line above an opening fence, prose between blocks, a second block
    without a filename (it takes the previous one's), and decorated names (``**a.py**``,
    ``# a.py:``) all parse; a bare name, an absolute path and a longer relative path that
    end in the file match it, another file does not."""
    edit = ("Here is the change.\n\nsrc/io.py\n```python\n" + block("import os\n", "import re\n")
            + "```\n\nAnd:\n\n```python\n" + block("def load(path):\n", "def load(p):\n")
            + "```\n**src/io.py**\n" + block("x\n", "y\n") + "# src/io.py:\n"
            + block("y\n", "z\n"))
    blocks = parse_blocks(edit)
    assert [(b.index, b.filename) for b in blocks] == [
        (1, "src/io.py"), (2, "src/io.py"), (3, "src/io.py"), (4, "src/io.py")]
    assert blocks[0].search == "import os\n" and blocks[0].replace == "import re\n"
    check_filenames(blocks, "src/io.py")  # matches: no error
    for name in ("io.py", "/home/u/repo/src/io.py", "repo/src/io.py"):
        check_filenames(parse_blocks(f"{name}\n" + block("a\n", "b\n")), "src/io.py")
    with pytest.raises(BlockError, match="block 1 .* is for src/io.py, but this edit applies"
                                         " to lib/io.py"):
        check_filenames(blocks, "lib/io.py")


def test_a_prose_line_above_a_block_is_not_taken_for_a_filename():
    """"Change:" right above a block is a word, not a path: no filename check fails."""
    blocks = parse_blocks("Change:\n" + block("a\n", "b\n"))
    check_filenames(blocks, "x.py")
    assert blocks[0].filename == "Change"


def test_markers_tolerate_aider_variants_and_crlf():
    """5 to 9 marker characters, an optional '>' after SEARCH, trailing blanks and CRLF
    edits parse; a CRLF file keeps its CRLF after the edit."""
    edit = "<<<<<<<<< SEARCH>  \r\nb\r\n=====\r\nB\r\n>>>>> REPLACE\r\n"
    new, results = apply_blocks("a\r\nb\r\nc\r\n", parse_blocks(edit))
    assert new == "a\r\nB\r\nc\r\n" and results[0].match == "exact"


def test_a_file_without_final_newline_keeps_none():
    """Replacing the last line of a file that has no final newline adds none."""
    new, _ = apply_blocks("a\nb", parse_blocks(block("b\n", "c\n")))
    assert new == "a\nc"


def test_malformed_blocks_are_errors_naming_the_block():
    """A block left open, a REPLACE before its divider, a stray REPLACE and an edit
    without blocks are each a BlockError that says what is missing and where."""
    with pytest.raises(BlockError, match=r"block 1 \(line 1 of the edit\): the edit ends"
                                         r" before its '>>>>>>> REPLACE'"):
        parse_blocks("<<<<<<< SEARCH\na\n=======\nb\n")
    with pytest.raises(BlockError, match="block 2 .*before its '=======' line"):
        parse_blocks(block("a\n", "b\n") + "<<<<<<< SEARCH\na\n>>>>>>> REPLACE\n")
    with pytest.raises(BlockError, match="line 2 of the edit: '>>>>>>> REPLACE' without"):
        parse_blocks("x\n>>>>>>> REPLACE\n")
    with pytest.raises(BlockError, match="block 1 .*a new '<<<<<<< SEARCH' at line 3"):
        parse_blocks("<<<<<<< SEARCH\na\n<<<<<<< SEARCH\n")
    with pytest.raises(BlockError, match="has no"):
        parse_blocks("just text\n")


def test_has_blocks_needs_a_search_or_replace_marker():
    """An RST underline (=======) alone is not a block; a SEARCH marker is."""
    assert not has_blocks("Title\n=======\n\ntext\n")
    assert has_blocks("  <<<<<<< SEARCH\n")


@pytest.mark.parametrize("snippet,language,lines", [
    ("// ... existing code ...\nfunction f() { return 2 }\n// ... existing code ...\n",
     "javascript", [1, 3]),
    ("def f():\n    # ... rest of the function unchanged\n", "python", [2]),
    ("# ...\nx = 2\n", "python", [1]),
    ("/* ... */\nint x = 2;\n", "c", [1]),
    ("<!-- ... -->\n<p>hi</p>\n", "html", [1]),
    ("-- ... existing code ...\nSELECT 1;\n", "sql", [1]),
    ("class A {\n  // existing code here\n  m() {}\n}\n", "typescript", [2]),
    ("x = 1\n# rest of file\n", "python", [2]),
    ("fn main() {\n    ...\n}\n", "rust", [2]),
    ("x = 1\n# unchanged\n", "python", [2]),
])
def test_lazy_markers_found(snippet, language, lines):
    """Elision comments in the forms Cursor, Morph and Continue describe, in several
    comment syntaxes, and a bare "..." outside Python."""
    assert [n for n, _ in lazy_markers(snippet, language)] == lines


@pytest.mark.parametrize("snippet,language", [
    ("class P(Protocol):\n    def f(self) -> int: ...\n    ...\n", "python"),
    ('print("...")\nx = f(...)\n', "python"),
    ("function f(...args) {\n  return g(...args)\n}\n", "javascript"),
    ("# TODO: handle ... later\n# see the rest of the docs for the options we keep here\n",
     "python"),
    ("# unchanged behaviour when the cache is empty\nx = 1\n", "python"),
    ("def f():\n    return 1\n", "python"),
])
def test_lazy_markers_not_found_in_ordinary_code(snippet, language):
    """Ellipsis as Python's stub body and as arguments, JS spread, comments that mention
    "..." or "rest of" in passing, and plain code: none is an elision."""
    assert lazy_markers(snippet, language) == []
