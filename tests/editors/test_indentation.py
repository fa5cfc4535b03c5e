"""Accepted suggestions are indented as the code needs, whatever the editor's auto-indent
put before the cursor (issue 22, item 3): `assistd lsp` driven by pytest-lsp's real client,
the real embedded Target, a real SQLite history. Each item is accepted here as the editors
do: the inline item's range replaced by its insertText (VS Code, Neovim 0.12), the
completion item's textEdit with its lines after the first indented by the line's leading
whitespace (insertTextMode adjustIndentation in VS Code, vim.snippet.expand in Neovim)."""

from __future__ import annotations

import pytest
from lsprotocol import types

from editors.positions import offset_at
from harness.lsp import inline_item, lsp_session, open_doc
from tests.conftest import make_repo

SQUARE = "def square(x):\n    return x * x\n\ndef area(side):\n"
SHAPE = "class Shape:\n\tdef __init__(self, side):\n\t\tself.side = side\n\n\tdef area(self):\n"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return tmp_path_factory.mktemp("indent") / "history.db"


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo", {"README.md": "a test repository\n"})


def apply(text: str, rng: types.Range, new: str) -> str:
    start, end = offset_at(text, rng.start, "utf-16"), offset_at(text, rng.end, "utf-16")
    return text[:start] + new + text[end:]


def accept_inline(text: str, item: types.InlineCompletionItem) -> str:
    return apply(text, item.range, item.insert_text)


def accept_completion(text: str, item: types.CompletionItem) -> str:
    assert item.insert_text_mode == types.InsertTextMode.AdjustIndentation
    edit = item.text_edit
    line = text.split("\n")[edit.range.start.line][: edit.range.start.character]
    base = line[: len(line) - len(line.lstrip(" \t"))]
    return apply(text, edit.range, edit.new_text.replace("\n", "\n" + base))


async def both(client, uri: str, text: str, line: int, char: int):
    """The inline item, the document after accepting it, and after accepting the
    completion item instead."""
    item = await inline_item(client, uri, line, char)
    assert item is not None, (text, line, char)
    res = await client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line, char)))
    assert len(res.items) == 1
    return item, accept_inline(text, item), accept_completion(text, res.items[0])


@pytest.mark.parametrize(("auto", "replaced"), [
    ("    ", 0),      # VS Code and Neovim's auto-indent after `def area(side):` + Enter
    ("", 0),          # no auto-indent: the cursor at column 0
    ("        ", 4),  # an editor that indented deeper than the code needs
    ("\t", 1),        # a tab in a document indented with spaces
])
async def test_spaces_after_enter(db, repo, auto, replaced):
    """After def area(side): and Enter, whatever indentation the editor put (4 spaces, none, 8,
    a tab), inline and completion items both give the body at 4 spaces, replacing what the
    editor put beyond, and the result compiles."""
    text = SQUARE + auto
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "area.py", text)
        item, inline, completion = await both(client, uri, text, 4, len(auto))
    assert item.range.end == types.Position(4, len(auto))
    assert item.range.start == types.Position(4, len(auto) - replaced)
    want = SQUARE + "    return side * side"
    assert inline == completion == want  # was "     return side * side" (5 spaces)
    compile(inline, "area.py", "exec")


async def test_tabs_after_enter(db, repo):
    """In a tab-indented file, whatever the editor's auto-indent, inline and completion items
    give the line two tabs and no spaces, and the result compiles."""
    async with lsp_session(db, root=repo) as (client, _):
        for auto in ["\t\t", "\t", ""]:
            text = SHAPE + auto
            uri = open_doc(client, repo / f"shape{len(auto)}.py", text)
            _, inline, completion = await both(client, uri, text, 5, len(auto))
            assert inline == completion, auto
            body = inline[len(SHAPE):]
            assert body.startswith("\t\treturn ") and body[2:].strip() == body[2:].lstrip(), auto
            assert "\n" not in body and " " * 4 not in body, auto
            compile(inline, "shape.py", "exec")


async def test_typing_through_the_indentation_keeps_it(db, repo):
    """Typing the suggestion's first letter is served from the same suggestion: the rest, at the
    cursor, with no extra space."""
    # After Enter the editor asks at column 4; the user types the first letter of the
    # suggestion: the rest is served from the same suggestion (no 5th space either).
    text = SQUARE + "    "
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "typed.py", text)
        first = await inline_item(client, uri, 4, 4)
        assert first.insert_text == "return side * side"
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(4, 4), types.Position(4, 4)), text="r")]))
        rest = await inline_item(client, uri, 4, 5)
    assert rest.insert_text == "eturn side * side"
    assert rest.range == types.Range(types.Position(4, 5), types.Position(4, 5))


async def test_continuation_lines_of_a_completion_item_are_relative_to_the_line(db, repo):
    """At the end of an indented def, the inline suggestion holds the body at its own depth and
    the completion item one level less (the editor adds the line's indentation); both compile to
    the same text."""
    # The cursor at the end of an indented `def m2(self):`: the suggestion goes on with
    # the method's body on the next lines. The inline text holds them at their own depth;
    # the completion item one level less, since the editor adds the line's 4 spaces back
    # (it was doubled to 12 before).
    text = "class K:\n    def m1(self):\n        return 1\n\n    def m2(self):\n"
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "k.py", text)
        item, inline, completion = await both(client, uri, text, 4, 17)
        res = await client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(4, 17)))
    assert inline == completion
    assert item.insert_text.startswith("\n        ") and item.range.start == item.range.end
    new = res.items[0].text_edit.new_text
    assert new == item.insert_text.replace("\n    ", "\n")
    compile(inline, "k.py", "exec")


async def test_through_the_daemon(tmp_path):
    """Through `assistd lsp` piped to a daemon, suggestions after Enter get the same indentation
    as in-process, and the session is the daemon's."""
    # `assistd lsp` as a pipe to a running daemon: the same server code on the daemon's
    # Runtime (serve_hosted), the same edits.
    from harness.daemon import start_daemon

    repo = make_repo(tmp_path / "repo", {"README.md": "a test repository\n"})
    d = start_daemon(tmp_path, "--repo", str(repo))
    try:
        async with lsp_session(d.db, env={"ASSISTD_SOCKET": str(d.socket)}) as (client, _):
            for auto, line in [("        ", 4), ("    ", 4)]:
                text = SQUARE + auto
                uri = open_doc(client, repo / f"d{len(auto)}.py", text)
                item, inline, completion = await both(client, uri, text, line, len(auto))
                assert inline == completion == SQUARE + "    return side * side", auto
                assert item.range.start.character == 4
    finally:
        assert d.stop() == 0
    assert "editor session 1 closed" in d.log.read_text()  # it was the daemon's server
