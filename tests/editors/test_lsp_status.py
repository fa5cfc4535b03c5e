"""What an editor shows besides the ghost text: the server's state (``assistd/status``)
and the places where the user dismissed a suggestion. The real server process, the real
embedded Target, a real SQLite history."""

from __future__ import annotations


import pytest
from lsprotocol import types

from harness.lsp import inline_item, inline_params, lsp_session, open_doc, stats
from tests.conftest import make_repo
from tests.lsp_helpers import until

DOC = "def f1():\n    return 1\n\ndef f2():\n    return 2\n\ndef f3():\n    return 3\n\n"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return tmp_path_factory.mktemp("status") / "history.db"


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo", {"README.md": "a test repository\n"})


async def test_status_goes_loading_ready_disabled_ready(db, repo):
    """The server's status notifications go loading, ready, then disabled and ready again as
    enabled is toggled, each sent only when it changes."""
    async with lsp_session(db, root=repo) as (client, _):
        await until(lambda: client.statuses and client.statuses[-1][0] == "ready")
        assert client.statuses[0][0] == "loading"  # sent once initialize is answered
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"assistd": {"enabled": False}}))
        await until(lambda: client.statuses[-1][0] == "disabled")
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"assistd": {"enabled": True}}))
        await until(lambda: client.statuses[-1][0] == "ready")
    # Only changes are sent (loading's message names its stage: model, calibration).
    sent = client.statuses
    assert all(a != b for a, b in zip(sent, sent[1:]))
    assert [s for s, _ in sent if s != "loading"] == ["ready", "disabled", "ready"]


async def test_a_model_that_fails_to_open_is_the_error_state(db, repo, tmp_path):
    """A model file that does not exist puts the status in error, its message naming the
    file."""
    missing = tmp_path / "none.gguf"
    async with lsp_session(db, root=repo, settings={"model": str(missing)}) as (client, _):
        await until(lambda: client.statuses and client.statuses[-1][0] == "error")
    assert "none.gguf" in client.statuses[-1][1]


def _invoked(uri, line, char):
    p = inline_params(uri, line, char)
    p.context = types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)
    return p


@pytest.mark.parametrize("telemetry", [True, False])
async def test_a_dismissed_suggestion_is_not_shown_again_at_that_place(tmp_path, repo, telemetry):
    """A dismissed suggestion is not offered again automatically at that place (elsewhere it
    is), but is when the user invokes completion; the dismissal is stored only with telemetry
    on."""
    async with lsp_session(tmp_path / "own.db", root=repo, settings={"telemetry": telemetry}) as (client, _):
        uri = open_doc(client, repo / "d.py", DOC)
        first = await inline_item(client, uri, 9, 0)
        assert first is not None and first.insert_text
        sid = first.command.arguments[0]["id"]
        client.protocol.notify("assistd/didShowCompletion", {"id": sid})
        client.protocol.notify("assistd/didDismissCompletion", {"id": sid})
        # Automatic requests at the same place get nothing; the same document elsewhere
        # still gets suggestions (the end of line 7 is another place).
        assert await inline_item(client, uri, 9, 0) is None
        assert await inline_item(client, uri, 7, 12) is not None
        # The user asking (Invoked) gets it again, the same text (greedy).
        res = await client.text_document_inline_completion_async(_invoked(uri, 9, 0))
        assert res.items and res.items[0].insert_text == first.insert_text
        server = (await stats(client))["server"]
        report = await stats(client)
    assert server["dismissed_places"] == 1
    stored = report["user_acceptance"].get("python", {}).get("dismissed", 0)
    assert stored == (1 if telemetry else 0)  # telemetry off: nothing stored, still not shown


async def test_closing_the_document_forgets_its_dismissals(db, repo):
    """Closing and reopening a document forgets its dismissals: the same suggestion is offered
    again."""
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "c.py", DOC)
        first = await inline_item(client, uri, 9, 0)
        client.protocol.notify("assistd/didDismissCompletion",
                               {"id": first.command.arguments[0]["id"]})
        assert await inline_item(client, uri, 9, 0) is None
        client.text_document_did_close(types.DidCloseTextDocumentParams(
            types.TextDocumentIdentifier(uri)))
        uri = open_doc(client, repo / "c.py", DOC, version=2)
        again = await inline_item(client, uri, 9, 0)
    assert again is not None and again.insert_text == first.insert_text
