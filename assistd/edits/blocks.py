"""SEARCH/REPLACE blocks (aider's edit format), applied deterministically, and lazy snippets.

The grammar, as aider's editblock coder reads it (its docs and ``editblock_coder.py``),
one block after an optional filename line::

    path/to/file.py
    ```python
    <<<<<<< SEARCH
    lines to find
    =======
    lines to put there
    (the closing marker line: 7 '>' then " REPLACE")
    ```

The markers: 5 to 9 '<' then " SEARCH" (an optional '>' after it); 5 to 9 '='; 5 to 9
'>' then " REPLACE". The filename line may be up to 3 lines above the block with only
fence lines between them, decorated as models write it (``**a.py**``, ``# a.py:``).
Text between blocks (prose, fences) is ignored; a block without a filename line takes the
previous block's. Marker lines are recognised with surrounding whitespace stripped.

Applying, block by block on the result of the previous one: the SEARCH lines must equal
exactly one run of whole lines of the file; failing that, exactly one run that equals
them with each line's leading and trailing whitespace ignored ("whitespace" match; the
REPLACE lines are re-indented by the uniform offset found, if there is one). None or
several runs is a :class:`BlockError` naming the block, the count and the lines. An empty
SEARCH (blank lines only) fills an empty file ("create"); on a file with text it is an
error (nothing says where the text goes). A CRLF file is matched on LF lines and keeps
its CRLF; a file without a final newline keeps none.

A "lazy" snippet is the other way agents write edits (Cursor's, Morph's and Continue's
apply models take it): the changed code with the unchanged parts elided by comments such
as ``// ... existing code ...`` or ``# ... rest of file``. :func:`lazy_markers` finds
those lines; merging such a snippet needs a model (:mod:`assistd.edits.merge`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from assistd.ground.errors import InputError

HEAD_RE = re.compile(r"^<{5,9} SEARCH>?$")
DIVIDER_RE = re.compile(r"^={5,9}$")
UPDATED_RE = re.compile(r"^>{5,9} REPLACE$")
FENCE_RE = re.compile(r"^(`{3,}|~{3,})")
# What a filename line may hold once its decorations (#, **, `, a trailing colon) are gone.
FILENAME_RE = re.compile(r"^[\w.@+/\\-]+$")
LOOKBACK = 3  # lines above a block searched for its filename (aider's)


class BlockError(InputError):
    """A SEARCH/REPLACE block that cannot be parsed or applied. ``index``: the block's
    1-based number in the edit (0: the edit as a whole); ``matches``: how many places its
    SEARCH matched (None for a parse error)."""

    def __init__(self, message: str, index: int = 0, matches: int | None = None):
        super().__init__(message)
        self.index, self.matches = index, matches


@dataclass(frozen=True)
class Block:
    """One parsed block. ``index``: 1-based number in the edit; ``line``: 1-based line of
    its SEARCH marker in the edit; ``filename``: the line above it, or the previous
    block's (None: none given); ``search``/``replace``: the lines between the markers,
    each ending in a newline (``""`` when there are none)."""

    index: int
    line: int
    filename: str | None
    search: str
    replace: str

    @property
    def where(self) -> str:
        """``"block 2 (line 14 of the edit)"``, how errors name the block."""
        return f"SEARCH/REPLACE block {self.index} (line {self.line} of the edit)"


@dataclass(frozen=True)
class BlockResult:
    """How one block applied. ``match``: "exact", "whitespace" or "create"; ``line``:
    1-based first line of the matched run in the text the block applied to (1 for
    "create"); ``indent``: for a whitespace match, the re-indentation done to the REPLACE
    lines ("+4 spaces" style, "" when none was needed or the offset was not uniform)."""

    index: int
    match: str
    line: int
    indent: str = ""

    def as_dict(self) -> dict:
        return {"index": self.index, "match": self.match, "line": self.line,
                "indent": self.indent}


def _marker(line: str) -> str | None:
    s = line.strip()
    if HEAD_RE.match(s):
        return "head"
    if DIVIDER_RE.match(s):
        return "divider"
    if UPDATED_RE.match(s):
        return "updated"
    return None


def has_blocks(edit: str) -> bool:
    """Whether ``edit`` is meant as SEARCH/REPLACE: it has a SEARCH or a REPLACE marker
    line (a lone ``=======`` is not enough: reStructuredText underlines look the same)."""
    return any(_marker(line) in ("head", "updated") for line in edit.splitlines())


def clean_filename(line: str) -> str | None:
    """The filename a line names, decorations (``#``, ``**``, backticks, a trailing colon)
    stripped, or None when it is not one (spaces, ``...``, a fence)."""
    name = line.strip().rstrip(":").lstrip("#").strip().strip("`").strip("*")
    name = name.replace("\\_", "_").strip()
    if not name or name == "..." or not FILENAME_RE.match(name):
        return None
    return name


def _filename_above(lines: list[str], head: int, floor: int) -> str | None:
    """The filename in the few lines above ``lines[head]`` (not above ``floor``): the
    nearest one, looking past fence lines only (aider's rule)."""
    for j in range(head - 1, max(floor, head - LOOKBACK) - 1, -1):
        s = lines[j].strip()
        if FENCE_RE.match(s):
            continue
        return clean_filename(s)
    return None


def parse_blocks(edit: str) -> list[Block]:
    """The SEARCH/REPLACE blocks of ``edit`` in order (CRLF read as LF).

    Raises :class:`BlockError` (an InputError) for a block left open (no ``=======`` or
    no ``>>>>>>> REPLACE`` before the next SEARCH or the end), a marker out of place, or
    an edit with no block at all."""
    lines = edit.replace("\r\n", "\n").split("\n")
    blocks: list[Block] = []
    filename, i, floor = None, 0, 0
    while i < len(lines):
        kind = _marker(lines[i])
        if kind == "updated":
            raise BlockError(f"line {i + 1} of the edit: '>>>>>>> REPLACE' without a"
                             " '<<<<<<< SEARCH' and '=======' before it")
        if kind != "head":
            i += 1
            continue
        index, head = len(blocks) + 1, i
        filename = _filename_above(lines, head, floor) or filename
        where = f"SEARCH/REPLACE block {index} (line {head + 1} of the edit)"
        parts: list[list[str]] = [[], []]
        part, i = 0, i + 1
        while True:
            if i >= len(lines):
                want = "=======" if part == 0 else ">>>>>>> REPLACE"
                raise BlockError(f"{where}: the edit ends before its '{want}' line", index)
            kind = _marker(lines[i])
            if kind == "head":
                raise BlockError(f"{where}: a new '<<<<<<< SEARCH' at line {i + 1} before"
                                 " this block's '>>>>>>> REPLACE'", index)
            if part == 0 and kind == "updated":
                raise BlockError(f"{where}: '>>>>>>> REPLACE' at line {i + 1} before its"
                                 " '=======' line", index)
            if part == 0 and kind == "divider":
                part = 1
            elif part == 1 and kind == "updated":
                break
            else:  # a '=======' inside REPLACE is text (aider reads it so too)
                parts[part].append(lines[i] + "\n")
            i += 1
        blocks.append(Block(index, head + 1, filename, "".join(parts[0]), "".join(parts[1])))
        i += 1
        floor = i
    if not blocks:
        raise BlockError("the edit has no '<<<<<<< SEARCH' / '=======' / '>>>>>>> REPLACE'"
                         " block")
    return blocks


def check_filenames(blocks: list[Block], rel: str) -> None:
    """Raise :class:`BlockError` for a block whose filename line names another file than
    ``rel`` (POSIX, relative to the scope): one call edits one file. A filename matches
    when the shorter of its path components and ``rel``'s ends the other ("io.py",
    "/home/u/repo/src/io.py" and "repo/src/io.py" all match src/io.py). A bare word
    without '.' or '/' (a prose line such as "Change:") is not taken as a filename."""
    target = rel.split("/")
    for b in blocks:
        if b.filename is None or not ("." in b.filename or "/" in b.filename):
            continue
        parts = [p for p in b.filename.replace("\\", "/").split("/") if p not in ("", ".")]
        n = min(len(parts), len(target))  # "io.py", "/abs/repo/src/io.py" for src/io.py
        if parts and parts[-n:] != target[-n:]:
            raise BlockError(f"{b.where} is for {b.filename}, but this edit applies to {rel};"
                             " send each file's blocks in its own call", b.index)


def _lines(text: str) -> tuple[list[str], bool]:
    """``text`` (LF) as lines without their newlines, and whether it ends in one."""
    if not text:
        return [], False
    final = text.endswith("\n")
    lines = text.split("\n")
    if final:
        lines.pop()
    return lines, final


def _leading(s: str) -> str:
    return s[: len(s) - len(s.lstrip())]


def _runs(lines: list[str], want: list[str], key) -> list[int]:
    n, keyed = len(want), [key(w) for w in want]
    return [i for i in range(len(lines) - n + 1)
            if all(key(lines[i + k]) == keyed[k] for k in range(n))]


def _reindent(found: list[str], search: list[str], replace: list[str]) -> tuple[list[str], str]:
    """REPLACE shifted by the uniform indentation offset between the file's matched lines
    and the SEARCH lines (non-blank pairs), with a word on what was done; unchanged when
    there is no single offset (mixed tabs and spaces, uneven)."""
    pairs = [(_leading(f), _leading(s)) for f, s in zip(found, search) if f.strip()]
    if not pairs:
        return replace, ""
    if all(f.endswith(s) for f, s in pairs):
        extra = {f[: len(f) - len(s)] for f, s in pairs}
        if len(extra) == 1 and (add := extra.pop()):
            return [add + r if r.strip() else r for r in replace], f"+{_width(add)}"
    if all(s.endswith(f) for f, s in pairs):
        extra = {s[: len(s) - len(f)] for f, s in pairs}
        if len(extra) == 1 and (cut := extra.pop()):
            return [r[len(cut):] if r.startswith(cut) else r for r in replace], f"-{_width(cut)}"
    return replace, ""


def _width(ws: str) -> str:
    if set(ws) == {" "}:
        return f"{len(ws)} spaces"
    if set(ws) == {"\t"}:
        return f"{len(ws)} tabs"
    return f"{len(ws)} whitespace characters"


def _lines_named(starts: list[int], n: int = 5) -> str:
    shown = ", ".join(str(s + 1) for s in starts[:n])
    return shown + (", ..." if len(starts) > n else "")


def apply_block(text: str, block: Block, label: str) -> tuple[str, BlockResult]:
    """``text`` (LF) with ``block`` applied, and how it matched. ``label`` names the file
    in errors. Raises :class:`BlockError` (the block, the number of matches, where)."""
    lines, final = _lines(text)
    search, _ = _lines(block.search)
    replace, _ = _lines(block.replace)
    if not block.search.strip():
        if text.strip():
            raise BlockError(f"{block.where}: its SEARCH is empty, but {label} is not; an empty"
                             " SEARCH only fills an empty file: quote the lines to replace",
                             block.index, 0)
        return block.replace, BlockResult(block.index, "create", 1)
    match, starts, indent = "exact", _runs(lines, search, lambda s: s), ""
    if not starts:
        match, starts = "whitespace", _runs(lines, search, str.strip)
    if len(starts) != 1:
        how = "" if match == "exact" else ", ignoring leading and trailing whitespace,"
        if starts:
            raise BlockError(
                f"{block.where}: its SEARCH text{how} matches {len(starts)} places in {label}"
                f" (lines {_lines_named(starts)}); add surrounding lines so that it matches"
                " exactly one", block.index, len(starts))
        first = next(s for s in search if s.strip())
        seen = [i for i, line in enumerate(lines) if line.strip() == first.strip()]
        hint = (f"its first line {first.strip()[:60]!r} is at line(s) {_lines_named(seen)},"
                " so a later line differs" if seen else
                f"its first line {first.strip()[:60]!r} is not in the file")
        raise BlockError(f"{block.where}: its SEARCH text matches nothing in {label} ({hint});"
                         " copy the lines exactly as they are in the file", block.index, 0)
    start = starts[0]
    if match == "whitespace":
        replace, indent = _reindent(lines[start:start + len(search)], search, replace)
    out = lines[:start] + replace + lines[start + len(search):]
    new = "\n".join(out) + ("\n" if out and final else "")  # the last line keeps its EOF
    return new, BlockResult(block.index, match, start + 1, indent)


def apply_blocks(text: str, blocks: list[Block], label: str = "the file"
                 ) -> tuple[str, list[BlockResult]]:
    """``text`` with every block applied in order (each to the previous one's result),
    and one :class:`BlockResult` per block. A CRLF file is matched as LF and given back
    as CRLF. Raises :class:`BlockError` at the first block that does not apply."""
    crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")
    work = text.replace("\r\n", "\n") if crlf else text
    results = []
    for block in blocks:
        work, result = apply_block(work, block, label)
        results.append(result)
    return (work.replace("\n", "\r\n") if crlf else work), results


# -- lazy snippets -----------------------------------------------------------------------

# Line-comment and block-comment openers of the common languages (#, //, /*, *, <!--, --,
# ;, %, a docstring's quotes) and an ellipsis: "# ...", "// ... existing code ...".
_LEADER = r"(?:#|//|/\*+|\*|<!--|--|;+|%|\"\"\"|''')"
_ELLIPSIS = r"(?:\.\.\.|\u2026)"
_DOTS_RE = re.compile(rf"^{_LEADER}\s*{_ELLIPSIS}")
_WORDS_RE = re.compile(
    rf"^{_LEADER}\s*{_ELLIPSIS}?\s*("
    r"existing code|(the )?rest of (the )?(file|code|function|class|method|module|body)"
    r"|(the )?(other|remaining) (code|methods|functions|imports|lines)"
    r"|(code|everything else) (remains|stays|is) (the same|unchanged)"
    r"|(code )?(omitted|elided)|same as (before|above|the original)"
    rf"|unchanged( code)?\s*{_ELLIPSIS}?\s*(\*/|-->)?$"  # only the word: "# unchanged"
    r")(?!\w)", re.IGNORECASE)
_MAX_WORDS = 10  # a longer comment is prose about the code, not an elision


def lazy_markers(snippet: str, language: str = "plaintext") -> list[tuple[int, str]]:
    """The elision lines of ``snippet``: ``[(1-based line, stripped text)]``.

    A marker is a whole line that is a comment starting with an ellipsis
    (``# ...``, ``// ... existing code ...``, ``/* ... */``, ``<!-- ... -->``), or a short
    comment saying so in words (``# rest of the file unchanged``, ``// existing code``),
    or, outside Python, a bare ``...`` (in Python that is the Ellipsis, a valid stub
    body). ``language``: the LSP language id of the file.

    >>> lazy_markers("def f():\\n    # ... existing code ...\\n    return 2\\n", "python")
    [(2, '# ... existing code ...')]
    >>> lazy_markers("class P:\\n    def f(self): ...\\n    ...\\n", "python")
    []
    """
    out = []
    for n, line in enumerate(snippet.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        bare = s in ("...", "\u2026") and language != "python"
        if bare or _DOTS_RE.match(s) or (_WORDS_RE.match(s) and len(s.split()) <= _MAX_WORDS):
            out.append((n, s))
    return out
