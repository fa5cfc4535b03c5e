"""Document + cursor -> what the engine needs; raw Target output -> the suggestion to show.

The model always sees LF text; :func:`postprocess` puts the document's line endings back
(docs/design.md, 'Editors'). Offsets are ``str`` indices (code points): LSP positions
are the server's job.
The heuristics follow what editor completion clients do:

* single-line vs multi-line: Copilot asks the model to stop at ``"\\n"`` for a single-line
  completion and lets it run on (trimmed by indentation, ``trim_by_indentation`` /
  ``next_indent``) for a multi-line one (the request bodies quoted in copilot.el issue #94);
* a block ends where the indentation drops below the block's own, as llama.cpp's
  ``n_indent`` request field ("minimum line indentation for the generated text") that
  llama.vim sends;
* text duplicating what follows the cursor is trimmed: the common suffix with the rest of the
  line (copilot.el PR #116) and lines repeating the next lines (llama.vim's ``fim_render``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

# LSP line breaks are exactly these three; str.splitlines also splits on \f, \v, \x1c-\x1e,
# \x85, U+2028 and U+2029, which would shift line numbers against the editor's.
_BREAK = re.compile(r"\r\n|\r|\n")
# Text after the cursor that still counts as "end of line": closers an editor auto-inserts.
_CLOSERS = frozenset(")]}>\"';,")
_OPENER = re.compile(r"(?:[:{(\[]|=>|(?:^|\s)(?:do|then))\s*$")


def _midline(line_suffix: str) -> bool:
    return any(not c.isspace() and c not in _CLOSERS for c in line_suffix)


@dataclass(frozen=True)
class CursorContext:
    """The cursor in a document, as the prompt builder and the output trimming need it."""

    prefix: str       # the text before the cursor, line endings normalised to "\n"
    suffix: str       # the text after the cursor, normalised to "\n"
    eol: str          # the document's line ending: "\r\n", "\n" or "\r"
    indent: str       # the document's indentation unit: "\t" or n spaces
    line_prefix: str  # the cursor's line before the cursor
    line_suffix: str  # the cursor's line after the cursor (no line ending)
    mode: str         # "line" (complete this line) or "block" (several lines may follow)
    cut: str = ""     # whitespace left out of the prompt (:func:`prompt_context`)


def split_lines(text: str) -> list[str]:
    """Lines as LSP counts them (breaks: ``\\r\\n``, ``\\r``, ``\\n``), without their endings.

    n breaks give n + 1 lines, so a final newline yields a last empty line, as in the editor.

    >>> split_lines("a\\r\\nb\\rc\\nd\\x0ce\\u2028f\\n")
    ['a', 'b', 'c', 'd\\x0ce\\u2028f', '']
    """
    return _BREAK.split(text)


def _lf(text: str) -> str:
    return _BREAK.sub("\n", text)


def detect_eol(text: str) -> str:
    """The majority line ending of ``text``: ``"\\r\\n"``, ``"\\n"`` or ``"\\r"``.

    ``"\\n"`` when there is none; a tie goes to ``"\\n"``, then ``"\\r\\n"``.

    >>> detect_eol("a\\r\\nb\\r\\nc\\n"), detect_eol("a\\rb"), detect_eol("one line")
    ('\\r\\n', '\\r', '\\n')
    """
    crlf = text.count("\r\n")
    counts = {"\n": text.count("\n") - crlf, "\r\n": crlf, "\r": text.count("\r") - crlf}
    return max(counts, key=counts.__getitem__)  # max keeps the first of equals: the tie order


def _space_step(widths: list[int]) -> int | None:
    """Most common increase of indentation between consecutive non-blank lines, or None.

    Only increases count: code indents one level at a time but may dedent several at once.
    Steps of 1 are alignment (JSDoc `` * `` lines), not a unit. A tie goes to the smaller step.
    """
    steps = Counter(b - a for a, b in zip(widths, widths[1:]) if b - a >= 2)
    return max(steps, key=lambda s: (steps[s], -s)) if steps else None


def detect_indent(text: str, default: str = "    ") -> str:
    """The indentation unit: ``"\\t"`` if most indented lines start with a tab, else n spaces.

    n is the most common indentation step between consecutive non-blank lines (the approach
    of editors' indentation guessers, e.g. the detect-indent package); 4 when undecided;
    ``default`` when no non-blank line is indented.

    >>> detect_indent("if x:\\n\\ty\\n"), detect_indent("a {\\n  b {\\n    c\\n  }\\n}\\n")
    ('\\t', '  ')
    >>> detect_indent("no indentation")
    '    '
    """
    lines = [ln for ln in split_lines(text) if ln.strip()]
    indented = [ln for ln in lines if ln[0] in " \t"]
    if not indented:
        return default
    if 2 * sum(ln[0] == "\t" for ln in indented) > len(indented):
        return "\t"
    widths = [len(ln) - len(ln.lstrip(" ")) for ln in lines if ln[0] != "\t"]
    return " " * (_space_step(widths) or 4)


def context_at(text: str, offset: int) -> CursorContext:
    """The cursor context at ``offset`` (a ``str`` index into the original, possibly CRLF, text).

    An offset between the ``\\r`` and ``\\n`` of a CRLF is the end of that line. Invariant:
    ``prefix + suffix`` is ``text`` with its line endings normalised to ``"\\n"``.
    Raises ValueError if ``offset`` is outside ``0..len(text)``.

    >>> c = context_at("def f(x):\\r\\n    return x\\r\\n", 11)
    >>> c.prefix, c.suffix, c.eol, c.indent, c.line_prefix, c.line_suffix, c.mode
    ('def f(x):\\n', '    return x\\n', '\\r\\n', '    ', '', '    return x', 'line')
    >>> context_at("def f(x):\\r\\n", 10) == context_at("def f(x):\\r\\n", 9)
    True
    """
    if not 0 <= offset <= len(text):
        raise ValueError(f"offset {offset} is outside 0..{len(text)}")
    if 0 < offset < len(text) and text[offset - 1] == "\r" and text[offset] == "\n":
        offset -= 1  # never split a CRLF: text[:offset] would end in a lone "\r" = a newline
    prefix, suffix = _lf(text[:offset]), _lf(text[offset:])
    line_prefix = prefix.rpartition("\n")[2]
    line_suffix = suffix.partition("\n")[0]
    block = not _midline(line_suffix) and (not line_prefix.strip() or _OPENER.search(line_prefix))
    # Nothing indented yet: the editor's auto-indent on the cursor's line tells tabs or spaces.
    auto = _lead(line_prefix) if not line_prefix.strip() else ""
    default = "\t" if "\t" in auto else " " * len(auto) if len(auto) >= 2 else "    "
    return CursorContext(prefix, suffix, detect_eol(text), detect_indent(text, default),
                         line_prefix, line_suffix, "block" if block else "line")


def prompt_context(ctx: CursorContext) -> CursorContext:
    """The context the Target is prompted in and its output is cut and postprocessed in.

    When the cursor's line holds only whitespace before the cursor (the editor's auto-indent
    after Enter), or nothing after a line that opens a block (``def f(x):`` then Enter in an
    editor that does not indent), the prompt ends where the text before it ends, and
    ``cut`` holds the whitespace left out (line breaks and indentation). A BPE tokenizer
    merges a line break with the indentation after it (SmolLM2: ``"\\n    "`` is one token and
    ``"):\\n    return"`` is ``"):" "\\n   " " return"``), so a prompt ending in that whitespace
    is a token sequence the model rarely saw: it goes on with ``" return"`` (5 columns) or a
    second tab, and after an opener and a lone ``"\\n"`` with anything (a lone ``"\\n"`` before
    a line at column 0 is common: there the prompt stays). Cut, the model writes the line
    break and the indentation itself; output that goes on with the line before instead
    gives no suggestion. :func:`stop_at` and :func:`postprocess` drop the line
    breaks it re-wrote, so the text starts at column 0 of the cursor's line (``line_prefix``
    is ""); :func:`fit` then places it at the cursor. Otherwise ``ctx`` itself.

    >>> p = prompt_context(context_at("def f(x):\\n    ", 14))
    >>> p.prefix, p.cut, p.line_prefix
    ('def f(x):', '\\n    ', '')
    >>> prompt_context(context_at("x = f(", 6)) == context_at("x = f(", 6)
    True
    """
    if ctx.line_prefix.strip():
        return ctx
    if not ctx.line_prefix and not _OPENER.search(ctx.prefix[:-1].rpartition("\n")[2]):
        return ctx
    head = ctx.prefix.rstrip(" \t\n")
    if len(head) == len(ctx.prefix):
        return ctx
    return replace(ctx, prefix=head, line_prefix="", cut=ctx.prefix[len(head):])


def _after_cut(output: str, cut: str) -> int | None:
    """Where the cursor's line starts in the output of a cut prompt: after the line breaks
    of ``cut`` that the output re-wrote (the extra ones are blank lines it adds). -1: the
    output goes on with the line the prompt ends on, which is not the cursor's (it had to
    break the line first); None while it is only whitespace."""
    body = output.lstrip(" \t\r\n")
    if not body:
        return None
    breaks = [i for i, c in enumerate(output[: len(output) - len(body)]) if c == "\n"]
    wanted = cut.count("\n")
    if not wanted:  # the cursor is on the document's first line: no break to re-write
        return 0
    return breaks[min(wanted, len(breaks)) - 1] + 1 if breaks else -1


def _width(ws: str, tab: int) -> int:
    return len(ws.expandtabs(tab))


def _lead(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _cut(output: str, i: int) -> int:
    """``i`` moved before a "\\r" it follows, so a cut never leaves half a CRLF."""
    return i - 1 if i > 0 and output[i - 1] == "\r" else i


def stop_at(ctx: CursorContext, *, max_lines: int = 12) -> Callable[[str], int | None]:
    """The decoding loop's stop rule: ``f(output)`` -> keep ``output[:index]``, or None to go on.

    ``output`` is the model's LF text so far; ``f`` is pure, so calling it on every longer
    output returns the same index once it has one. Line mode ends at the first newline after
    non-whitespace output: a leading newline at the end of a line continues onto the next
    line (the suggestion is ``"\\n<next line>"``), mid-line it gives 0 (a line break is never a
    good inline suggestion). Block mode ends at the first blank line after content, before a
    line shallower than the block's first content line, or after ``max_lines`` content lines.
    After a cut prompt (:func:`prompt_context`) the rules apply from the cursor's line on,
    and output that does not break the line first gives 0.

    >>> stop_at(context_at("x = ", 4))("foo(1)\\nbar")
    6
    >>> stop_at(context_at("return x", 8))("\\nprint(x)\\nmore")
    9
    >>> stop_at(context_at("f(a, b)", 2))("\\nz")
    0
    >>> stop_at(context_at("def f():", 8))("\\n    a = 1\\n    return a\\ndef g")
    23
    """
    tab = 4 if ctx.indent == "\t" else len(ctx.indent)
    midline = _midline(ctx.line_suffix)
    blank_line = not ctx.line_prefix.strip()

    def width(line: str, first: bool) -> int:
        if not first:
            return _width(_lead(line), tab)
        if blank_line:  # the first output line continues the cursor's whitespace
            return _width(ctx.line_prefix + _lead(line), tab)
        # The model went on with the opener's own line (`foo(|)` -> `a, b)`): that line is
        # then the block's first, and only lines deeper than it (its continuation) follow;
        # otherwise nothing would end `x = foo(a, b)` but a blank line or max_lines.
        return _width(_lead(ctx.line_prefix), tab) + 1

    def line_stop(output: str) -> int | None:
        seen = False
        for i, c in enumerate(output):
            if c == "\n":
                if seen:
                    return _cut(output, i)
                if midline:
                    return 0
            elif not c.isspace():
                seen = True
        return None

    def block_stop(output: str) -> int | None:
        base, n, pos = None, 0, 0
        while True:
            nl = output.find("\n", pos)
            line = output[pos:] if nl < 0 else output[pos:nl]
            if line.strip():
                w = width(line, pos == 0)
                if base is None:
                    base = w
                elif w < base:  # dedent: the block ended on the previous line
                    return _cut(output, pos - 1)
                n += 1
                if n >= max_lines and nl >= 0:
                    return _cut(output, nl)
            elif nl >= 0 and base is not None:  # a complete blank line after content
                return _cut(output, pos - 1)
            if nl < 0:
                return None
            pos = nl + 1

    stop = line_stop if ctx.mode == "line" else block_stop
    if not ctx.cut:
        return stop

    def after_cut(output: str) -> int | None:  # the rules apply from the cursor's line
        start = _after_cut(output, ctx.cut)
        if start is None or start < 0:
            return None if start is None else 0
        end = stop(output[start:])
        return None if end is None else start + end

    return after_cut


def _trim_line(output: str, line_suffix: str) -> str:
    """Drop the longest end of ``output`` that the rest of the line already starts with."""
    if output in (line_suffix, line_suffix.strip()):
        return ""
    for k in range(min(len(output), len(line_suffix)), 0, -1):
        if line_suffix.startswith(output[-k:]):
            return output[:-k]
    return output


def _trim_block(output: str, suffix: str) -> str:
    """Drop the output's last non-empty lines where they repeat the document's next ones."""
    lines = output.split("\n")
    mine = [i for i, ln in enumerate(lines) if ln.strip()]
    after = [ln.strip() for ln in suffix.split("\n")[1:] if ln.strip()]
    for k in range(min(len(mine), len(after)), 0, -1):
        if [lines[i].strip() for i in mine[-k:]] == after[:k]:
            return "\n".join(lines[: mine[-k]]).rstrip()
    return output


def _reindent(line: str, ctx: CursorContext, step: int) -> str:
    lead = _lead(line)
    if ctx.indent == "\t":
        tabs, spaces = divmod(_width(lead, step), step)
        new = "\t" * tabs + " " * spaces  # a remainder is alignment: it stays spaces
    else:
        new = lead.replace("\t", ctx.indent)
    return new + line[len(lead):]


def postprocess(output: str, ctx: CursorContext) -> str:
    """The model's (already cut) output -> the text to insert at the cursor, in the document's
    conventions: trailing whitespace removed; text duplicating what follows the cursor trimmed
    (the end of the output that the rest of the line starts with; in block mode also the last
    lines where they repeat the next lines); indentation of the lines after the first in the
    document's unit (tabs, or n spaces), the first line's too when it starts at column 0;
    ``"\\n"`` turned into ``ctx.eol``. After a cut prompt (``ctx.cut``,
    :func:`prompt_context`) the text starts at column 0 of the cursor's line ("" when the
    output did not break the line first).

    >>> ctx = context_at("print(x)\\r\\n", 7)
    >>> postprocess(", y)  ", ctx)
    ', y'
    >>> postprocess(")", context_at("f(x)", 3))
    ''
    >>> tabs = context_at("if a:\\n\\tb()\\nif x:\\n", 16)
    >>> postprocess("\\n    y = 1\\n    if y:\\n        z()", tabs)
    '\\n\\ty = 1\\n\\tif y:\\n\\t\\tz()'
    """
    if ctx.cut:
        start = _after_cut(output, ctx.cut)
        if start is None or start < 0:
            return ""
        output = output[start:]
    out = _lf(output).rstrip()
    # Block mode too: there line_suffix can hold the closer an editor auto-inserted (`foo(|)`).
    # Line mode keeps a trailing space this leaves ("return " before "a + b" is "return a + b").
    out = _trim_line(out, ctx.line_suffix)
    if ctx.mode == "block":
        out = _trim_block(out.rstrip(), ctx.suffix)
    if not out.strip():  # nothing but a line break and indentation: nothing to show
        return ""
    lines = out.split("\n")
    keep = 0 if ctx.line_prefix == "" else 1  # a first line after text keeps its spacing
    widths = [len(_lead(ln).expandtabs(4)) for ln in lines[keep:] if ln.strip()]
    step = _space_step(widths) or 4
    lines[keep:] = [_reindent(ln, ctx, step) for ln in lines[keep:]]
    return ctx.eol.join(lines)


def fit(text: str, ctx: CursorContext) -> tuple[int, str]:
    """The suggestion (:func:`postprocess`, in the cursor's context ``ctx``, not the prompt's)
    -> ``(n, insert)``: replace the ``n`` characters before the cursor, whitespace on its
    line, with ``insert``. ``n`` is 0 unless the cursor's line holds only whitespace before
    it, where the text starts at column 0 (:func:`prompt_context`): the editor's indentation
    is kept as far as it matches the text's, ``n`` counts the rest (deeper, or tabs for
    spaces). A first line that is blank replaces all of it (no indentation left trailing).

    >>> fit("    return x", context_at("def f(x):\\n    ", 14))   # auto-indented
    (0, 'return x')
    >>> fit("    return x", context_at("def f(x):\\n", 10))      # no auto-indent
    (0, '    return x')
    >>> fit("def g():", context_at("    return 1\\n    ", 17))   # a dedent
    (4, 'def g():')
    >>> fit(" + 1", context_at("x = y", 5))
    (0, ' + 1')
    """
    ws = ctx.line_prefix
    if not text or ws.strip():
        return 0, text
    first = text.split(ctx.eol, 1)[0]
    if not first.strip():
        return len(ws), text
    common = 0
    for a, b in zip(ws, _lead(first)):
        if a != b:
            break
        common += 1
    return len(ws) - common, text[common:]


def item_text(insert: str, n: int, ctx: CursorContext) -> str:
    """``insert`` (:func:`fit`) as a completion item's text. The editors indent each line
    after the first by the whitespace its line starts with before the edit (VS Code's
    default insert mode, adjustIndentation; ``vim.snippet.expand`` in Neovim), so those
    lines lose that much here. A line shallower than it cannot be written so: the text ends
    before it ("" when nothing is left).

    >>> item_text("a,\\n        b)", 0, context_at("    x = f(", 10))
    'a,\\n    b)'
    >>> item_text("\\ndef g():", 0, context_at("    return 1", 12))
    ''
    """
    line = ctx.line_prefix[: len(ctx.line_prefix) - n]
    base = _lead(line)
    if not base:
        return insert
    first, *rest = insert.split(ctx.eol)
    out = [first]
    for ln in rest:
        if ln.startswith(base) or not ln.strip():
            out.append(ln[len(base):])
        else:
            break
    return ctx.eol.join(out).rstrip()
