"""Longer suggestions within the time budget: a suggestion the budget cut goes on
growing on the engine while the user reads it (Completer.grow), and the next request at
the same place, or typing through it, gets the longer text: exactly what a generation
without a budget gives. The real server process, the real embedded Target."""

from __future__ import annotations

import sqlite3

import pytest
from lsprotocol import types

from harness.lsp import inline_item, insert, lsp_session, open_doc, stats
from tests.conftest import make_repo, on_llama_server

# A body long enough that a 1 ms budget cuts its first line (the model writes the
# pattern's next function: "def f4():\n    return 4" and more).
DOC = "".join(f"def f{i}(x):\n    return x * {i} + {i} - {i}\n\n" for i in range(1, 6))
LINE = DOC.count("\n")


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo", {"README.md": "a test repository\n"})


@pytest.mark.skipif(on_llama_server(), reason=(
    "llama.cpp's llama-server is not batch-invariant: greedy from a prompt and its own"
    " first 3 tokens in one prefill gives another text than one request ('+ 6 - 6' against"
    " '+ 6' here), so no client's grown text can equal the uncut one there"))
async def test_a_cut_suggestion_grows_to_what_no_budget_gives(tmp_path, repo):
    """A suggestion cut by maxLatencyMs grows afterwards: asked again at the same place it is
    longer, with the same id and no Target call, served by type-through as typed, and equal to
    what no budget gives; accepting the short answer counts only what it inserted."""
    async with lsp_session(tmp_path / "h.db", root=repo, settings={"maxLatencyMs": 1}) as (client, _):
        uri = open_doc(client, repo / "g.py", DOC)
        first = await inline_item(client, uri, LINE, 0)
        assert first is not None
        # stats queue behind the growth on the one engine thread: it has ended.
        server = (await stats(client))["server"]
        assert server["budget_cuts"] == 1 and server["grown"] == 1
        again = await inline_item(client, uri, LINE, 0)
        # Same place: the grown suggestion, the same id, no Target call.
        assert again.command.arguments[0]["id"] == first.command.arguments[0]["id"]
        assert again.insert_text.startswith(first.insert_text)
        assert len(again.insert_text) > len(first.insert_text)
        # Typing its first character: the rest of the grown text (type-through).
        typed = again.insert_text[0]
        insert(client, uri, 2, LINE, 0, typed)
        rest = await inline_item(client, uri, *((LINE + 1, 0) if typed == "\n" else (LINE, 1)))
        assert rest.insert_text == again.insert_text[1:]
        served = (await stats(client))["server"]
        assert served["generations"] == 1 and served["type_through"] == 2
        # Accepting the first, short answer counts what it inserted, not the grown text.
        await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command=first.command.command, arguments=first.command.arguments))
        sid = first.command.arguments[0]["id"]
        assert first.command.arguments[0]["length"] == len(first.insert_text)
        await stats(client)  # behind the accept on the engine thread
        with sqlite3.connect(tmp_path / "h.db") as conn:
            (chars,) = conn.execute("select accepted_chars from suggestions where id = ?",
                                    [sid]).fetchone()
            (text,) = conn.execute("select text from documents where path like ?",
                                   [f"%#suggestion-{sid}"]).fetchone()
        assert chars == len(first.insert_text) and text == first.insert_text
        # Without a budget, in another document with the same text: the same text.
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"assistd": {"maxLatencyMs": 0}}))
        other = open_doc(client, repo / "h.py", DOC)
        uncut = await inline_item(client, other, LINE, 0)
    assert uncut.insert_text == again.insert_text


async def test_a_new_request_stops_the_growth(tmp_path, repo):
    """A new request elsewhere stops a growing suggestion within a round and is served; the
    growth is counted at most once."""
    async with lsp_session(tmp_path / "h.db", root=repo, settings={"maxLatencyMs": 1}) as (client, _):
        uri = open_doc(client, repo / "g.py", DOC)
        first = await inline_item(client, uri, LINE, 0)
        assert first is not None
        # At once, elsewhere: the growth ends within a round and this request is served.
        elsewhere = await inline_item(client, uri, 3, 0)
        server = (await stats(client))["server"]
    assert elsewhere is None or elsewhere.insert_text
    # The growth was stopped before it finished, or had finished: never both counted.
    assert server["grown"] <= 1 and server["generations"] == 2
