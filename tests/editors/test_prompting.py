"""editors.prompting: cursor context, stop rules and postprocessing (pure functions, no model).

Every expected value is written out literally; the end-to-end cases drive the stop rule the
way the decoding loop does (one call per committed token) and then postprocess the cut.
"""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import editors.prompting
from editors.prompting import (context_at, detect_eol, detect_indent, fit, item_text, postprocess,
                               prompt_context, split_lines, stop_at)


def suggest(text: str, offset: int, output: str, *, max_lines: int = 12, chunk: int = 1) -> str:
    """What the server shows: ``output`` fed ``chunk`` characters per token, cut, postprocessed."""
    ctx = context_at(text, offset)
    stop = stop_at(ctx, max_lines=max_lines)
    so_far = ""
    for i in range(0, len(output), chunk):
        so_far = output[: i + chunk]
        end = stop(so_far)
        if end is not None:
            so_far = so_far[:end]
            break
    return postprocess(so_far, ctx)


def test_doctests_pass():
    """pyproject's testpaths leave out editors/, so the module's examples run from here."""
    result = doctest.testmod(editors.prompting)
    assert result.attempted >= 10 and result.failed == 0


# -- lines, line endings, indentation ---------------------------------------------------


def test_split_lines_breaks_only_where_lsp_does():
    """split_lines breaks at CRLF, CR and LF only, as LSP counts lines; form feed, vertical tab,
    file/group/record separators, NEL and the Unicode line and paragraph separators stay inside
    a line (str.splitlines would split them)."""
    assert split_lines("a\r\nb\rc\nd") == ["a", "b", "c", "d"]
    assert split_lines("a\n") == ["a", ""]
    assert split_lines("") == [""]
    assert split_lines("\r\n\r\n") == ["", "", ""]
    # str.splitlines would split every one of these; LSP does not.
    inside = "x\x0cy\x0bz\x1c\x1d\x1e\x85\u2028\u2029w"
    assert split_lines(inside + "\nnext") == [inside, "next"]
    assert len(inside.splitlines()) > 1  # the trap this function avoids


def test_detect_eol_majority():
    """detect_eol returns the document's most common line ending (CRLF, LF or CR); a tie, no
    ending or an empty text gives LF."""
    assert detect_eol("a\r\nb\r\nc\n") == "\r\n"
    assert detect_eol("a\nb\nc\r\n") == "\n"
    assert detect_eol("a\rb\rc\r\n") == "\r"
    assert detect_eol("a\r\n") == "\r\n"
    assert detect_eol("no line ending") == "\n"
    assert detect_eol("") == "\n"
    assert detect_eol("a\r\nb\n") == "\n"  # a tie goes to LF


def test_detect_indent():
    """detect_indent finds the document's indentation unit (a tab, 2, 4 or 8 spaces) from
    indented lines, ignoring multi-level dedents and 1-column JSDoc alignment; tabs only when
    most indented lines start with one; 4 spaces when nothing is indented."""
    assert detect_indent("def f():\n\tif x:\n\t\treturn 1\n") == "\t"
    assert detect_indent("a:\n  b:\n    c: 1\n  d: 2\n") == "  "
    assert detect_indent("def f():\n    if x:\n        return 1\n    return 2\n") == "    "
    assert detect_indent("a\n        b\nc\n        d\n") == " " * 8
    assert detect_indent("x = 1\ny = 2\n") == "    "  # nothing indented: the default
    assert detect_indent("") == "    "
    # Dedents of several levels at once and 1-column JSDoc alignment are not the unit.
    js = "class A {\n  /**\n   * doc\n   */\n  f() {\n    if (x) {\n      y();\n    }\n  }\n}\n"
    assert detect_indent(js) == "  "
    # Tabs win only when most indented lines start with one.
    assert detect_indent("a\n\tb\n    c\n    d\n") == "    "
    assert detect_indent("a\r\n\tb\r\n\tc\r\n    d\r\n") == "\t"


# -- context_at ---------------------------------------------------------------------------


def test_context_in_a_crlf_document():
    """In a CRLF document the context's prefix and suffix are LF-normalised, with eol CRLF,
    indent 4 spaces, the cursor line's halves, and line mode mid-line."""
    text = "def f(x):\r\n    y = g(x)\r\n    return y\r\n"
    c = context_at(text, text.index("g(") + 2)
    assert c.prefix == "def f(x):\n    y = g("
    assert c.suffix == "x)\n    return y\n"
    assert (c.eol, c.indent) == ("\r\n", "    ")
    assert (c.line_prefix, c.line_suffix, c.mode) == ("    y = g(", "x)", "line")


def test_offset_inside_a_crlf_is_the_end_of_that_line():
    """An offset between CR and LF is the end of that line: the same context as the offset
    before the CR."""
    text = "ab\r\ncd"
    assert context_at(text, 3) == context_at(text, 2)
    c = context_at(text, 3)
    assert (c.prefix, c.suffix, c.line_prefix, c.line_suffix) == ("ab", "\ncd", "ab", "")


def test_bad_offsets_raise_value_error():
    """Offsets below 0 or past the text raise ValueError ('outside'); the text's end and 0 in an
    empty text are valid."""
    for text, offset in [("abc", -1), ("abc", 4), ("", 1), ("a\r\n", 99)]:
        with pytest.raises(ValueError, match="outside"):
            context_at(text, offset)
    assert context_at("abc", 3).prefix == "abc" and context_at("", 0).suffix == ""


DOCUMENTS = [
    "",
    "x",
    "def f():\n    return 1\n",
    "a\r\nb\r\n\r\nc",
    "a\rb\r\rc\r",
    "mixed\r\nlf\ncr\rend\r\n",
    "\r\n\n\r\r\n",
    "emoji = '😀🐍'\r\nnext = '𝔘'\n",
    "名前 = '漢字かな'\r\n\t值 = 1\r",
    "form\x0cfeed\u2028in\x85line\r\nx",
]


@pytest.mark.parametrize("text", DOCUMENTS, ids=range(len(DOCUMENTS)))
def test_prefix_plus_suffix_is_the_normalised_document_at_every_offset(text):
    """At every offset of each test document, prefix + suffix is the LF-normalised document, the
    line halves join to the cursor's line without a newline, and the mode is line or block."""
    normalised = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = normalised.split("\n")
    for offset in range(len(text) + 1):
        c = context_at(text, offset)
        assert c.prefix + c.suffix == normalised, offset
        assert "\r" not in c.prefix + c.suffix
        assert "\n" not in c.line_prefix + c.line_suffix
        row = c.prefix.count("\n")
        assert c.line_prefix + c.line_suffix == lines[row], offset
        assert c.mode in ("line", "block")


@pytest.mark.parametrize(("line", "mode"), [
    ("    |", "block"),          # whitespace-only line
    ("|", "block"),              # empty line
    ("def f(x):|", "block"),     # opener
    ("if (x) {|", "block"),
    ("f = (x) =>|", "block"),
    ("items.each do|", "block"),
    ("if x then  |", "block"),   # opener, then trailing spaces
    ("foo(|)", "block"),         # only a closer after an opener
    ("    |)", "block"),
    ("x = foo(|", "block"),
    ("x = |", "line"),           # end of line, text before
    ("return x|", "line"),
    ("f(a|);", "line"),          # only closers and ; after the cursor: end of line
    ("s = 'ab|'", "line"),
    ("f(|a)", "line"),           # mid-line, even after an opener
    ("|foo()", "line"),          # text after the cursor on an otherwise empty line
    ("undo|", "line"),           # "do" only as a word
])
def test_mode(line, mode):
    """The mode is block on an empty or whitespace-only line, after an opener (:, {, =>, do,
    then, an open bracket) or before a lone closer; line at the end of a line with text or
    mid-line."""
    text = "first\n" + line.replace("|", "") + "\nlast\n"
    assert context_at(text, 6 + line.index("|")).mode == mode


# -- stop_at, line mode --------------------------------------------------------------------


def test_line_mode_ends_at_the_first_newline_after_content():
    """In line mode the suggestion stops at the first newline after content (undecided until
    then), never inside a CRLF."""
    stop = stop_at(context_at("x = \n", 4))
    assert stop("foo(1)") is None
    assert stop("foo(1)\nbar") == 6
    assert stop("  foo(1)  \n") == 10
    assert stop("foo(1)\r\nbar") == 6  # never inside a CRLF


def test_leading_newline_at_end_of_line_continues_onto_the_next_line():
    """At the end of a line, leading newlines and blank lines continue onto the next line; the
    stop comes after the next line's content."""
    stop = stop_at(context_at("def f(x):\n    y = g(x)", 22))
    assert stop("\n") is None
    assert stop("\n    return y") is None
    assert stop("\n    return y\n\n") == 13
    assert stop("  \n\n  z\n") == 7  # whitespace and blank lines before content continue too


def test_leading_newline_mid_line_is_empty():
    """Mid-line, output that starts with a newline (after optional spaces) stops at 0: nothing
    to insert; otherwise the stop is the line's end."""
    stop = stop_at(context_at("f(a, b)", 2))
    assert stop("\nz") == 0
    assert stop("  \n") == 0
    assert stop("x") is None
    assert stop("x, \ny") == 3


def test_stop_is_stable_once_it_fires():
    """Once stop_at fires on a prefix of the output it returns the same cut for every longer
    prefix."""
    stop = stop_at(context_at("total = ", 8))
    output = "a + b\nc = 1\nd = 2\n"
    first = next(n for n in range(len(output) + 1) if stop(output[:n]) is not None)
    assert first == 6
    assert {stop(output[:n]) for n in range(first, len(output) + 1)} == {5}


# -- stop_at, block mode --------------------------------------------------------------------


def test_block_ends_at_dedent():
    """A block suggestion ends before the first line shallower than the block; deeper lines
    belong to it."""
    ctx = context_at("def f(x):\n", 9)
    out = "\n    y = x\n    return y\ndef g():\n"
    assert stop_at(ctx)(out) == len("\n    y = x\n    return y")
    # A deeper line is part of the block.
    out = "\n    if x:\n        y = 1\n    return y\nz = 1\n"
    assert stop_at(ctx)(out) == len("\n    if x:\n        y = 1\n    return y")


def test_block_ends_at_blank_line_after_content():
    """A block suggestion ends at a blank (or whitespace-only) line after content, or at a line
    dedented below the cursor's indentation."""
    ctx = context_at("class A:\n    ", 13)
    stop = stop_at(ctx)
    assert stop("x = 1\n    y = 2\n") is None
    assert stop("x = 1\n    y = 2\n\n    z = 3") == len("x = 1\n    y = 2")
    assert stop("x = 1\n    y = 2\n   \n") == len("x = 1\n    y = 2")
    # The first line continues the cursor's 4 spaces, so "    y" is not a dedent; "z" is.
    assert stop("x = 1\nz = 2\n") == 5


def test_blank_lines_before_content_do_not_end_the_block():
    """Blank lines before any content do not end a block suggestion; the blank line after it
    does."""
    stop = stop_at(context_at("if x:", 5))
    assert stop("\n\n    a()\n    b()\n\n") == len("\n\n    a()\n    b()")


def test_block_max_lines():
    """A block suggestion stops after max_lines complete lines (12 by default); an incomplete
    last line leaves it undecided."""
    ctx = context_at("data = [\n", 8)
    out = "".join(f"\n    {i}," for i in range(20))
    assert stop_at(ctx)(out) == len("".join(f"\n    {i}," for i in range(12)))
    assert stop_at(ctx, max_lines=3)(out) == len("\n    0,\n    1,\n    2,")
    assert stop_at(ctx, max_lines=3)("\n    0,\n    1,\n    2,") is None  # last line not complete


def test_block_stop_never_cuts_inside_crlf():
    """A block stop in CRLF output falls before the CR, never between CR and LF."""
    stop = stop_at(context_at("if x:", 5))
    assert stop("\r\n    a()\r\nb()") == len("\r\n    a()")


# -- postprocess ----------------------------------------------------------------------------


def test_crlf_document_gets_crlf_suggestion():
    """In a CRLF document the suggestion's line breaks are CRLF, whatever the model's token
    boundaries."""
    text = "def f(x):\r\n    y = x\r\n"
    ctx = context_at(text, 9)
    assert ctx.prefix == "def f(x):" and ctx.suffix == "\n    y = x\n"
    assert postprocess("\n    y = x * 2\n    return y", ctx) == "\r\n    y = x * 2\r\n    return y"
    out = "\n    z = x * 2\n    return z\n\ndef g"
    assert suggest(text, 9, out) == "\r\n    z = x * 2\r\n    return z"
    assert suggest(text, 9, out, chunk=4) == "\r\n    z = x * 2\r\n    return z"  # longer tokens


def test_trailing_whitespace_and_newline_only():
    """Trailing spaces and tabs are trimmed; output that is only newlines and whitespace
    suggests nothing."""
    ctx = context_at("x = ", 4)
    assert postprocess("1  \t", ctx) == "1"
    assert postprocess("\n    ", ctx) == ""
    assert postprocess("", ctx) == ""
    assert postprocess("\n    \n", context_at("if x:\n", 5)) == ""


def test_output_starting_with_newline_at_end_of_line_is_the_next_line():
    """At the end of a line, output starting with a newline is suggested as the next line
    (stopping at the blank line)."""
    text = "def f(x):\n    y = g(x)\n"
    assert suggest(text, 22, "\n    return y\n\ndef h():\n") == "\n    return y"


def test_retyped_closing_bracket_in_line_mode():
    """In line mode closers and ; the line already has after the cursor are not suggested again;
    mid-line only the overlap at the end is trimmed."""
    text = "total = add(x, )\nprint(total)\n"
    assert context_at(text, 15).mode == "line"
    assert suggest(text, 15, "y)\nprint(total)\n") == "y"
    assert postprocess('x")', context_at('f("")', 3)) == "x"   # both closers re-typed
    assert postprocess(")", context_at("f(x)", 3)) == ""
    assert postprocess(");", context_at("f(x );", 3)) == ""      # equals line_suffix.strip()
    assert postprocess(" );", context_at("f(x );", 3)) == ""     # equals line_suffix
    # Mid-line: only the overlap at the end goes, the rest is inserted before it.
    assert postprocess("1, 2]", context_at("x = [2]", 5)) == "1, "
    assert postprocess("abc", context_at("f(x)", 3)) == "abc"  # no overlap, nothing trimmed


def test_output_duplicating_the_next_line_is_empty_in_block_mode():
    """In block mode output equal to the next non-blank line suggests nothing; output differing
    from it (even by spacing) is kept."""
    text = "def f(x):\n    return x\n"
    assert postprocess("\n    return x", context_at(text, 9)) == ""
    assert suggest(text, 9, "\n    return x\n\n") == ""
    text = "def f(x):\n    \n\n    return x\n"
    assert postprocess("return  x", context_at(text, 14)) == "return  x"  # not equal: kept
    assert postprocess("return x", context_at(text, 14)) == ""            # blank lines skipped


def test_block_mode_drops_only_the_repeated_tail():
    """In block mode only the tail that repeats the following lines is dropped; a changed line
    is kept."""
    text = "def f(x):\n    \n    return y\nprint(f(1))\n"
    ctx = context_at(text, 14)
    assert postprocess("y = x + 1\n    return y", ctx) == "y = x + 1"
    assert postprocess("y = x + 1\n    return y\nprint(f(1))", ctx) == "y = x + 1"
    assert postprocess("y = x + 1\n    return y + 1", ctx) == "y = x + 1\n    return y + 1"


def test_tab_document_gets_tabs():
    """In a tab-indented document the model's space indentation becomes tabs (its own step, 4 or
    2, decides the levels); alignment spaces after the tabs stay."""
    text = "class A:\n\tdef f(self):\n\t\tpass\n\tdef g(self):\n"
    ctx = context_at(text, len(text) - 1)
    assert ctx.indent == "\t" and ctx.mode == "block"
    assert postprocess("\n        return 1", ctx) == "\n\t\treturn 1"  # default step: 4 spaces
    out = "\n  if x:\n    y()\n  return 1"  # the output's own step is 2
    assert postprocess(out, ctx) == "\n\tif x:\n\t\ty()\n\treturn 1"
    assert postprocess("\n    x = (1,\n     2)", ctx) == "\n\tx = (1,\n\t 2)"  # alignment stays
    out = "\n        y = 1\n        return y\n\n"
    assert suggest(text, len(text) - 1, out) == "\n\t\ty = 1\n\t\treturn y"


def test_two_space_document_gets_two_spaces_for_a_tab():
    """In a 2-space document each tab of the model's output becomes 2 spaces; other spaces are
    unchanged."""
    text = "function f() {\n  if (x) {\n    y();\n  }\n}\n"
    ctx = context_at(text, text.index("y();") + 4)
    assert ctx.indent == "  " and ctx.mode == "line"
    assert postprocess("\n\tz();", ctx) == "\n  z();"
    ctx = context_at(text, text.index("{") + 1)
    out = "\n\tconst a = 1;\n\tif (a) {\n\t\tb();"
    assert postprocess(out, ctx) == "\n  const a = 1;\n  if (a) {\n    b();"
    assert postprocess("\n\t  x", ctx) == "\n    x"  # only tabs change


def test_first_line_is_left_as_is():
    """The first line of a suggestion is left as is; only later lines are re-indented to the
    document's tabs."""
    ctx = context_at("a:\n\tb\n\tc:", 8)
    assert postprocess("    x\n    y", ctx) == "    x\n\ty"


def test_opener_with_autoclosed_bracket():
    """`foo(|)`: block mode; the model may finish on this line or break it."""
    text = "result = compute()\nprint(result)\n"
    assert context_at(text, 17).mode == "block"
    # Finishing on the same line: the next line at the same depth is not part of it.
    assert suggest(text, 17, "a, b)\nprint(result)\n") == "a, b"
    assert suggest(text, 17, "a,\n        b)\nx = 1\n") == "a,\n        b"
    # Breaking the line: the arguments, then ")" is already in the document.
    assert suggest(text, 17, "\n    a,\n    b,\n)\nprint(result)") == "\n    a,\n    b,"
    assert suggest(text, 17, "\n    a,\n    b)\n") == "\n    a,\n    b"


# -- the cursor's column: auto-indent, prompt cut, fit -------------------------------------


def accept(doc: str, output: str, *, offset: int | None = None, chunk: int = 1) -> str:
    """The document after accepting what the server makes of ``output`` (the model's text
    after the prompt :func:`prompt_context` gives), at ``offset`` (default: the end): the
    stop rule run as the decoding loop does, postprocess, fit, then the edit applied."""
    offset = len(doc) if offset is None else offset
    ctx = context_at(doc, offset)
    pctx = prompt_context(ctx)
    stop = stop_at(pctx)
    so_far = ""
    for i in range(0, len(output), chunk):
        so_far = output[: i + chunk]
        end = stop(so_far)
        if end is not None:
            so_far = so_far[:end]
            break
    n, insert = fit(postprocess(so_far, pctx), ctx)
    assert doc[offset - n : offset].strip(" \t") == ""  # only whitespace is ever replaced
    return doc[: offset - n] + insert + doc[offset:]


def test_prompt_ends_before_the_whitespace_of_an_auto_indented_line():
    """When the cursor sits on an auto-indented (or empty) line after an opener or trailing
    blanks, the prompt ends before that whitespace (the cut); with text before the cursor, or no
    opener, the context is unchanged."""
    for doc, head, cut in [
        ("def f(x):\n    ", "def f(x):", "\n    "),
        ("def f(x):\n\t", "def f(x):", "\n\t"),
        ("def f(x):\n", "def f(x):", "\n"),             # column 0, no auto-indent
        ("x = 1  \n\n  ", "x = 1", "  \n\n  "),          # trailing spaces, blank lines
        ("    ", "", "    "),                            # the first line
    ]:
        p = prompt_context(context_at(doc, len(doc)))
        assert (p.prefix, p.cut, p.line_prefix, p.suffix) == (head, cut, "", ""), doc
    for doc in ["x = ", "def f(x):", "", "a\n  b", "a\n"]:  # text before the cursor, or no opener
        ctx = context_at(doc, len(doc))
        assert prompt_context(ctx) is ctx
    ctx = context_at("if x:\n    foo()\n", 10)  # whitespace before text: cut, line mode
    p = prompt_context(ctx)
    assert (p.prefix, p.cut, p.suffix, p.mode) == ("if x:", "\n    ", "foo()\n", "line")


SQUARE = "def area(side):\n"


@pytest.mark.parametrize("auto", ["    ", "", "  ", "        ", "\t", "   "])
@pytest.mark.parametrize("output", [
    "\n    return side * side\n\nprint(area(2))\n",
    "\n    return side * side",
    "\n\n    return side * side\n\n",  # a blank line first: kept, without indentation
])
def test_accepted_line_has_the_model_indentation_whatever_the_editor_put(auto, output):
    """After def area(side): and Enter, whatever indentation the editor put (none, 2, 4, 8
    spaces, a tab), accepting the suggestion gives the line the model's indentation (4 spaces,
    or a tab where the editor's tab decides)."""
    unit = "\t" if auto == "\t" else "    "  # nothing else indented: the editor's tab decides
    want = SQUARE + ("\n" if output.startswith("\n\n") else "") + unit + "return side * side"
    assert accept(SQUARE + auto, output) == want
    assert accept(SQUARE + auto, output, chunk=5) == want  # longer tokens


def test_tab_document():
    """In a tab document, whatever the editor's auto-indent, the accepted line gets two tabs,
    the model's spaces turned to tabs; in a new file the editor's tab decides."""
    doc = "class A:\n\tdef f(self):\n\t\tpass\n\tdef area(self, side):\n"
    for auto in ["\t\t", "\t", "", "        ", "\t  "]:
        assert accept(doc + auto, "\n\t\treturn side * side\n\n") == doc + "\t\treturn side * side"
        # Spaces from the model become tabs, the editor's spaces give way.
        assert accept(doc + auto, "\n        return side\n") == doc + "\t\treturn side"
    # A new file: the editor's auto-indent tells tabs.
    ctx = context_at(SQUARE + "\t", len(SQUARE) + 1)
    assert ctx.indent == "\t"
    assert accept(SQUARE + "\t", "\n    if side:\n        return side\n") \
        == SQUARE + "\tif side:\n\t\treturn side"


def test_multi_line_block_keeps_its_shape():
    """A multi-line block suggestion keeps its nesting whatever indentation the editor put on
    the cursor's line."""
    out = "\n    if side < 0:\n        raise ValueError(side)\n    return side * side\n\ndef g"
    want = SQUARE + "    if side < 0:\n        raise ValueError(side)\n    return side * side"
    for auto in ["    ", "", "        ", "  "]:
        assert accept(SQUARE + auto, out) == want


def test_dedent_replaces_the_editor_indentation():
    """A suggestion that dedents (a new def) replaces the editor's indentation on the cursor's
    line, keeping the model's blank lines."""
    doc = "def f(x):\n    return x\n    "
    assert accept(doc, "\n\ndef g(y):\n    return y\n") == \
        "def f(x):\n    return x\n\ndef g(y):\n    return y"
    assert accept(doc, "\ndef g(y):\n    return y\n") == \
        "def f(x):\n    return x\ndef g(y):\n    return y"


def test_output_continuing_the_line_before_shows_nothing():
    """Output that continues the line before the cursor (a comment after the colon) cannot be
    inserted at the cursor: nothing is suggested and generation stops at once."""
    # The prompt ends at "):" and the cursor is on the next line: text for that earlier
    # line cannot be inserted at the cursor, and the generation stops at once.
    assert stop_at(prompt_context(context_at(SQUARE + "    ", 20)))(" #") == 0
    assert accept(SQUARE + "    ", " # area\n    return side\n") == SQUARE + "    "
    assert accept(SQUARE, "  \n    return 1\n") == SQUARE + "    return 1"  # spaces, then the break


def test_whitespace_only_output_is_undecided_then_nothing():
    """Whitespace-only output leaves the stop undecided and suggests nothing."""
    stop = stop_at(prompt_context(context_at(SQUARE + "    ", 20)))
    assert stop("\n") is None and stop("\n    ") is None and stop("\n\n  \n") is None
    assert postprocess("\n    ", prompt_context(context_at(SQUARE + "    ", 20))) == ""


def test_blank_lines_above_the_cursor():
    """After a blank line the accepted text keeps as many blank lines as the model wrote; at
    column 0 after a blank line or a line that opens nothing, the prompt is unchanged."""
    doc = "def f():\n    return 1\n\n  "  # auto-indent after a blank line: cut to "1"
    assert accept(doc, "\n\n\ndef g():\n    return 2\n\n") == \
        "def f():\n    return 1\n\n\ndef g():\n    return 2"  # the model's second blank line
    assert accept(doc, "\ndef g():\n    return 2\n\n") == \
        "def f():\n    return 1\n\ndef g():\n    return 2"  # fewer breaks: the cursor's line
    # Column 0 after a blank line, or after a line that opens nothing: a lone "\n" is what
    # the model saw before such lines; the prompt stays.
    for doc in ["def f():\n    return 1\n\n", "import os\n", "x = 1\n"]:
        ctx = context_at(doc, len(doc))
        assert prompt_context(ctx) is ctx
    assert accept("import os\n", "import sys\n") == "import os\nimport sys"


def test_crlf_document_with_auto_indent():
    """In a CRLF document with an auto-indented cursor the insert replaces nothing and uses CRLF
    between lines."""
    doc = "def area(side):\r\n    "
    ctx = context_at(doc, len(doc))
    pctx = prompt_context(ctx)
    n, insert = fit(postprocess("\n    y = side\n    return y\n\n", pctx), ctx)
    assert (n, insert) == (0, "y = side\r\n    return y")


def test_cursor_with_text_before_it_is_untouched():
    """With text before the cursor on its line the insert replaces nothing: the model's text is
    inserted as is (an exact repeat of what follows suggests nothing)."""
    doc = "x = compute("
    assert fit("a, b", context_at(doc, len(doc))) == (0, "a, b")
    assert accept("total = ", "a + b\n") == "total = a + b"
    assert accept("if x:\n    foo()\n", "\n    bar()\n", offset=10) == "if x:\n    bar()foo()\n"
    assert accept("if x:\n    foo()\n", "\n    foo()\n", offset=10) == "if x:\n    foo()\n"


@pytest.mark.parametrize(("line_prefix", "insert", "n", "want"), [
    ("    x = f(", "a,\n        b)", 0, "a,\n    b)"),          # relative to the line's 4
    ("", "    return 1\n    return 2", 0, "    return 1\n    return 2"),
    ("    ", "return 1\n    return 2", 0, "return 1\nreturn 2"),
    ("        ", "return 1\n    return 2", 4, "return 1\nreturn 2"),  # 4 kept, 4 replaced
    ("\t", "if x:\n\t\ty()", 0, "if x:\n\ty()"),
    ("    ", "a\n\n    b", 0, "a\n\nb"),                         # a blank line stays blank
    ("    x = 1", "\nprint(x)", 0, ""),                          # shallower than the line
    ("    x = f(", "a,\n    b,\nc)", 0, "a,\nb,"),               # cut before the shallower line
])
def test_item_text_is_relative_to_the_line_indentation(line_prefix, insert, n, want):
    """A completion item's continuation lines are made relative to the cursor line's indentation
    (the editor adds it back); blank lines stay blank; the text is cut before a line shallower
    than the cursor's."""
    ctx = context_at("def f():\n" + line_prefix, 9 + len(line_prefix))
    assert item_text(insert, n, ctx) == want


@settings(max_examples=300, deadline=None)
@given(auto=st.text(" \t", max_size=12), depth=st.integers(0, 3), blank=st.integers(0, 2),
       tabs=st.booleans(), body=st.sampled_from(["x = 1", "return (a,", "pass  "]))
def test_any_auto_indent_gives_the_model_indentation(auto, depth, blank, tabs, body):
    """Whatever whitespace the editor put before the cursor, and whatever depth the model
    chose after the cut prompt: the line is the model's, in the document's unit."""
    unit = "\t" if tabs else "    "
    doc = f"def f():\n{unit}if a:\n{unit * 2}b()\n{unit}else:\n" + auto
    model_lead = "    " * depth  # the model writes spaces; a tab document gets tabs back
    out = "\n" * (1 + blank) + model_lead + body + "\n\nz"
    result = accept(doc, out)
    head = doc[: len(doc) - len(auto)]
    assert result.startswith(head)  # nothing before the cursor's line changed
    assert result[len(head):] == "\n" * blank + unit * depth + body.rstrip()
