"""editors.prompting: cursor context, stop rules and postprocessing (pure functions, no model).

Every expected value is written out literally; the end-to-end cases drive the stop rule the
way the decoding loop does (one call per committed token) and then postprocess the cut.
"""

from __future__ import annotations

import doctest

import pytest

import editors.prompting
from editors.prompting import (context_at, detect_eol, detect_indent, postprocess, split_lines,
                               stop_at)


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
    assert split_lines("a\r\nb\rc\nd") == ["a", "b", "c", "d"]
    assert split_lines("a\n") == ["a", ""]
    assert split_lines("") == [""]
    assert split_lines("\r\n\r\n") == ["", "", ""]
    # str.splitlines would split every one of these; LSP does not.
    inside = "x\x0cy\x0bz\x1c\x1d\x1e\x85\u2028\u2029w"
    assert split_lines(inside + "\nnext") == [inside, "next"]
    assert len(inside.splitlines()) > 1  # the trap this function avoids


def test_detect_eol_majority():
    assert detect_eol("a\r\nb\r\nc\n") == "\r\n"
    assert detect_eol("a\nb\nc\r\n") == "\n"
    assert detect_eol("a\rb\rc\r\n") == "\r"
    assert detect_eol("a\r\n") == "\r\n"
    assert detect_eol("no line ending") == "\n"
    assert detect_eol("") == "\n"
    assert detect_eol("a\r\nb\n") == "\n"  # a tie goes to LF


def test_detect_indent():
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
    text = "def f(x):\r\n    y = g(x)\r\n    return y\r\n"
    c = context_at(text, text.index("g(") + 2)
    assert c.prefix == "def f(x):\n    y = g("
    assert c.suffix == "x)\n    return y\n"
    assert (c.eol, c.indent) == ("\r\n", "    ")
    assert (c.line_prefix, c.line_suffix, c.mode) == ("    y = g(", "x)", "line")


def test_offset_inside_a_crlf_is_the_end_of_that_line():
    text = "ab\r\ncd"
    assert context_at(text, 3) == context_at(text, 2)
    c = context_at(text, 3)
    assert (c.prefix, c.suffix, c.line_prefix, c.line_suffix) == ("ab", "\ncd", "ab", "")


def test_bad_offsets_raise_value_error():
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
    text = "first\n" + line.replace("|", "") + "\nlast\n"
    assert context_at(text, 6 + line.index("|")).mode == mode


# -- stop_at, line mode --------------------------------------------------------------------


def test_line_mode_ends_at_the_first_newline_after_content():
    stop = stop_at(context_at("x = \n", 4))
    assert stop("foo(1)") is None
    assert stop("foo(1)\nbar") == 6
    assert stop("  foo(1)  \n") == 10
    assert stop("foo(1)\r\nbar") == 6  # never inside a CRLF


def test_leading_newline_at_end_of_line_continues_onto_the_next_line():
    stop = stop_at(context_at("def f(x):\n    y = g(x)", 22))
    assert stop("\n") is None
    assert stop("\n    return y") is None
    assert stop("\n    return y\n\n") == 13
    assert stop("  \n\n  z\n") == 7  # whitespace and blank lines before content continue too


def test_leading_newline_mid_line_is_empty():
    stop = stop_at(context_at("f(a, b)", 2))
    assert stop("\nz") == 0
    assert stop("  \n") == 0
    assert stop("x") is None
    assert stop("x, \ny") == 3


def test_stop_is_stable_once_it_fires():
    stop = stop_at(context_at("total = ", 8))
    output = "a + b\nc = 1\nd = 2\n"
    first = next(n for n in range(len(output) + 1) if stop(output[:n]) is not None)
    assert first == 6
    assert {stop(output[:n]) for n in range(first, len(output) + 1)} == {5}


# -- stop_at, block mode --------------------------------------------------------------------


def test_block_ends_at_dedent():
    ctx = context_at("def f(x):\n", 9)
    out = "\n    y = x\n    return y\ndef g():\n"
    assert stop_at(ctx)(out) == len("\n    y = x\n    return y")
    # A deeper line is part of the block.
    out = "\n    if x:\n        y = 1\n    return y\nz = 1\n"
    assert stop_at(ctx)(out) == len("\n    if x:\n        y = 1\n    return y")


def test_block_ends_at_blank_line_after_content():
    ctx = context_at("class A:\n    ", 13)
    stop = stop_at(ctx)
    assert stop("x = 1\n    y = 2\n") is None
    assert stop("x = 1\n    y = 2\n\n    z = 3") == len("x = 1\n    y = 2")
    assert stop("x = 1\n    y = 2\n   \n") == len("x = 1\n    y = 2")
    # The first line continues the cursor's 4 spaces, so "    y" is not a dedent; "z" is.
    assert stop("x = 1\nz = 2\n") == 5


def test_blank_lines_before_content_do_not_end_the_block():
    stop = stop_at(context_at("if x:", 5))
    assert stop("\n\n    a()\n    b()\n\n") == len("\n\n    a()\n    b()")


def test_block_max_lines():
    ctx = context_at("data = [\n", 8)
    out = "".join(f"\n    {i}," for i in range(20))
    assert stop_at(ctx)(out) == len("".join(f"\n    {i}," for i in range(12)))
    assert stop_at(ctx, max_lines=3)(out) == len("\n    0,\n    1,\n    2,")
    assert stop_at(ctx, max_lines=3)("\n    0,\n    1,\n    2,") is None  # last line not complete


def test_block_stop_never_cuts_inside_crlf():
    stop = stop_at(context_at("if x:", 5))
    assert stop("\r\n    a()\r\nb()") == len("\r\n    a()")


# -- postprocess ----------------------------------------------------------------------------


def test_crlf_document_gets_crlf_suggestion():
    text = "def f(x):\r\n    y = x\r\n"
    ctx = context_at(text, 9)
    assert ctx.prefix == "def f(x):" and ctx.suffix == "\n    y = x\n"
    assert postprocess("\n    y = x * 2\n    return y", ctx) == "\r\n    y = x * 2\r\n    return y"
    out = "\n    z = x * 2\n    return z\n\ndef g"
    assert suggest(text, 9, out) == "\r\n    z = x * 2\r\n    return z"
    assert suggest(text, 9, out, chunk=4) == "\r\n    z = x * 2\r\n    return z"  # longer tokens


def test_trailing_whitespace_and_newline_only():
    ctx = context_at("x = ", 4)
    assert postprocess("1  \t", ctx) == "1"
    assert postprocess("\n    ", ctx) == ""
    assert postprocess("", ctx) == ""
    assert postprocess("\n    \n", context_at("if x:\n", 5)) == ""


def test_output_starting_with_newline_at_end_of_line_is_the_next_line():
    text = "def f(x):\n    y = g(x)\n"
    assert suggest(text, 22, "\n    return y\n\ndef h():\n") == "\n    return y"


def test_retyped_closing_bracket_in_line_mode():
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
    text = "def f(x):\n    return x\n"
    assert postprocess("\n    return x", context_at(text, 9)) == ""
    assert suggest(text, 9, "\n    return x\n\n") == ""
    text = "def f(x):\n    \n\n    return x\n"
    assert postprocess("return  x", context_at(text, 14)) == "return  x"  # not equal: kept
    assert postprocess("return x", context_at(text, 14)) == ""            # blank lines skipped


def test_block_mode_drops_only_the_repeated_tail():
    text = "def f(x):\n    \n    return y\nprint(f(1))\n"
    ctx = context_at(text, 14)
    assert postprocess("y = x + 1\n    return y", ctx) == "y = x + 1"
    assert postprocess("y = x + 1\n    return y\nprint(f(1))", ctx) == "y = x + 1"
    assert postprocess("y = x + 1\n    return y + 1", ctx) == "y = x + 1\n    return y + 1"


def test_tab_document_gets_tabs():
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
    text = "function f() {\n  if (x) {\n    y();\n  }\n}\n"
    ctx = context_at(text, text.index("y();") + 4)
    assert ctx.indent == "  " and ctx.mode == "line"
    assert postprocess("\n\tz();", ctx) == "\n  z();"
    ctx = context_at(text, text.index("{") + 1)
    out = "\n\tconst a = 1;\n\tif (a) {\n\t\tb();"
    assert postprocess(out, ctx) == "\n  const a = 1;\n  if (a) {\n    b();"
    assert postprocess("\n\t  x", ctx) == "\n    x"  # only tabs change


def test_first_line_is_left_as_is():
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
