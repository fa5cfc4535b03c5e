"""`assistd lsp` end to end: pytest-lsp's LanguageClient against the real server process,
the real embedded Target and a real SQLite history (one file per module, so the Target's
t(n) is calibrated once)."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcRequestCancelled

from editors.positions import offset_at, position_at, split_lines
from editors.prompting import context_at
from harness.lsp import inline, inline_item, inline_params, insert, lsp_session, open_doc, stats
from tests.conftest import make_repo, on_remote_target

PATTERN = "def f1():\n    return 1\n\ndef f2():\n    return 2\n\ndef f3():\n    return 3\n\n"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return tmp_path_factory.mktemp("lsp") / "history.db"


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo", {"README.md": "a test repository\n"})


# -- positions ---------------------------------------------------------------

LINE = 'x = "aμ中😋" + y'  # μ: 2 UTF-8 bytes; 中: 3; 😋: astral, 4 bytes, 2 UTF-16 units


@pytest.mark.parametrize("encoding,units", [("utf-16", 15), ("utf-8", 20), ("utf-32", 14)])
async def test_position_encoding_negotiated_and_checked(db, repo, encoding, units):
    """The server negotiates the client's position encoding (utf-16, utf-8, utf-32): the line
    end in those units is a valid cursor; one unit past it, a line past the document or a
    document not open is a JSON-RPC invalid-params error naming it, and the server keeps
    serving."""
    text = LINE + "\nz = 1\n"
    (repo / "p.py").write_text(text)
    async with lsp_session(db, encodings=[encoding], root=repo) as (client, init):
        assert init.capabilities.position_encoding == encoding
        assert init.capabilities.inline_completion_provider is not None
        uri = open_doc(client, repo / "p.py", text)
        # The end of the line, counted in the negotiated units, is a valid cursor ...
        await inline(client, uri, 0, units)
        # ... one unit further is past the end: a JSON-RPC error naming it, not a crash.
        with pytest.raises(JsonRpcInvalidParams, match=f"past the end of line 0 .{units} {encoding}"):
            await inline(client, uri, 0, units + 1)
        with pytest.raises(JsonRpcInvalidParams, match="past the end of the document"):
            await inline(client, uri, 3, 0)
        with pytest.raises(JsonRpcInvalidParams, match="not open"):
            await inline(client, (repo / "nope.py").as_uri(), 0, 0)
        assert await inline(client, uri, 1, 0) is not None or True  # the server still serves
        assert client.error is None


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32"])
def test_prefix_plus_suffix_is_the_document_at_every_position(encoding):
    """In each encoding every position of a text with CRLF, CR, astral characters, a form feed
    and U+2028 maps to an offset whose context rebuilds the LF-normalised document; every
    boundary outside a CRLF is reachable and the text has 3 LSP lines."""
    text = "aμ中😋\r\n\tb\x0cc\u2028d\rlast 😋"
    lf = text.replace("\r\n", "\n").replace("\r", "\n")
    seen = set()
    for i, line in enumerate(split_lines(text)):
        content = line.rstrip("\r\n")
        width = position_at(text, len(text), encoding).character if i == len(split_lines(text)) - 1 \
            else {"utf-8": len(content.encode()), "utf-16": len(content.encode("utf-16-le")) // 2,
                  "utf-32": len(content)}[encoding]
        for ch in range(width + 1):
            off = offset_at(text, types.Position(i, ch), encoding)
            ctx = context_at(text, off)
            assert ctx.prefix + ctx.suffix == lf
            seen.add(off)
    # Every character boundary outside a CRLF is reachable; the form feed and U+2028
    # stay inside their line (LSP counts only \n, \r\n and \r).
    assert seen == {o for o in range(len(text) + 1) if not (text[o - 1 : o + 1] == "\r\n")}
    assert len(split_lines(text)) == 3


# -- prompting in the document's conventions ----------------------------------

async def test_crlf_document_gets_crlf_suggestion(db, repo):
    """Over LSP a CRLF document gets a suggestion whose line breaks are all CRLF."""
    text = PATTERN.replace("\n", "\r\n")
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "crlf.py", text)
        s = await inline(client, uri, 9, 0)
    assert s is not None and "def f4():\r\n    return 4" in s
    assert "\n" not in s.replace("\r\n", "")


async def test_output_starting_with_newline_is_not_empty(db, repo):
    """At the end of def f3(): the suggestion is the next line, newline first: return 3 at 4
    spaces."""
    # The cursor at the end of "def f3():": the model's output starts with "\n".
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "nl.py", PATTERN[: PATTERN.index("    return 3")])
        s = await inline(client, uri, 6, 9)
    assert s == "\n    return 3"


async def test_output_duplicating_the_next_line_is_trimmed(db, repo):
    """When the next line already holds return 4, the suggestion does not repeat it."""
    # The next line already holds what the model would write: nothing to suggest.
    text = PATTERN + "def f4():\n\n    return 4\n"
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "dup.py", text)
        s = await inline(client, uri, 10, 0)
    assert s is None or "return 4" not in s


@pytest.mark.parametrize("indent", ["\t", "  "])
async def test_indentation_follows_the_document(db, repo, indent):
    """In tab- and 2-space-indented documents every line of the suggestion is indented in whole
    units of the document's indentation."""
    text = PATTERN.replace("    ", indent) + "class K:\n" + indent + "def m1(self):\n" \
        + indent * 2 + "return 1\n\n" + indent + "def m2(self):\n"
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "ind.py", text)
        n = len(split_lines(text)) - 1
        s = await inline(client, uri, n - 1, len(indent + "def m2(self):"))
    assert s is not None and s.startswith("\n")
    for line in s.split("\n")[1:]:
        lead = line[: len(line) - len(line.lstrip())]
        assert lead and lead == indent * (len(lead) // len(indent)), (s, indent)


# -- cancellation, supersession, responsiveness ------------------------------

def _items(res) -> list:
    return res.items if isinstance(res, types.InlineCompletionList) else list(res or [])


async def test_burst_of_requests_only_the_last_runs(db, repo):
    """20 requests sent between 20 edits are all answered, the superseded ones empty; only the
    last runs to completion and 19 are cancelled before or during their run."""
    text = PATTERN
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "burst.py", text)
        await inline(client, uri, 9, 0)  # warm: the model is loaded and the repo indexed
        before = (await stats(client))["server"]
        futures = []
        for i in range(20):
            insert(client, uri, i + 2, 9, i, "x")
            futures.append(asyncio.ensure_future(
                client.text_document_inline_completion_async(inline_params(uri, 9, i + 1))))
            await asyncio.sleep(0)  # send it now, before the next edit
        results = await asyncio.gather(*futures, return_exceptions=True)
        after = (await stats(client))["server"]
    assert len(results) == 20 and not any(isinstance(r, Exception) for r in results)
    # Superseded: answered, empty (the last one may be empty too: "x" * 20 is no code).
    assert [i for i, r in enumerate(results) if _items(r)] in ([], [19])
    assert after["requests"] - before["requests"] == 20
    ran = after["generations"] - before["generations"] - (after["cancelled_during"] - before["cancelled_during"])
    assert ran == 1  # only the last ran to completion
    skipped = (after["cancelled_before_start"] - before["cancelled_before_start"]) \
        + (after["cancelled_during"] - before["cancelled_during"])
    assert skipped == 19


async def test_cancel_request_stops_the_generation(db, repo):
    """$/cancelRequest during a long generation answers the request as cancelled, counts one
    cancellation, and stops before the 200 tokens it would write."""
    # A long block to generate: 64 tokens of a numbered list take many rounds.
    text = "".join(f"{i}. item number {i}\n" for i in range(1, 9))
    async with lsp_session(db, root=repo, settings={"maxTokens": 200, "k": 0}) as (client, _):
        uri = open_doc(client, repo / "list.md", text, language="markdown")
        full = await inline(client, uri, 8, 0)
        assert full.count("\n") >= 6  # uncancelled, the same request writes many lines
        before = (await stats(client))["server"]
        fut = asyncio.ensure_future(client.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, 8, 0), msg_id="cancel-me"))
        await asyncio.sleep(0.1)
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="cancel-me"))
        with pytest.raises(JsonRpcRequestCancelled):
            await fut
        after = (await stats(client))["server"]
    assert after["cancelled_during"] - before["cancelled_during"] == 1
    # Stopped short of the 200 it would write. (Not "> 0": on a busy machine a remote
    # server's first chunk may come after the cancel, 0.1 s in.)
    assert 0 <= after["tokens_cancelled"] - before["tokens_cancelled"] < 200


async def test_did_change_is_handled_while_generating(db, repo):
    """A didChange sent during a long generation is applied at once: the next request is checked
    against the new text (its error names the new line length) while the generation is still
    running."""
    text = "".join(f"{i}. item number {i}\n" for i in range(1, 9))
    async with lsp_session(db, root=repo, settings={"maxTokens": 200, "k": 0}) as (client, _):
        uri = open_doc(client, repo / "busy.md", text, language="markdown")
        await inline(client, uri, 8, 0)
        slow = asyncio.ensure_future(inline(client, uri, 8, 0))
        await asyncio.sleep(0.2)
        insert(client, uri, 2, 8, 0, "xyz")
        t0 = time.perf_counter()
        # Valid only after the change: the error names the new line length (3).
        with pytest.raises(JsonRpcInvalidParams, match=r"line 8 \(3 utf-16"):
            await inline(client, uri, 8, 9)
        answered_ms = (time.perf_counter() - t0) * 1000
        assert not slow.done(), "the generation finished before the loop answered"
        await slow
    print(f"didChange + request answered in {answered_ms:.1f} ms during a generation")


# -- caches ---------------------------------------------------------------------

@pytest.mark.local_target("the local Target's KV cache; a server keeps its own")
async def test_second_request_reuses_the_prefix_cache(db, repo):
    """Asking again at the same place reuses the whole prompt from the KV cache: 25+ tokens
    reused, none evaluated."""
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "again.py", PATTERN)
        await inline(client, uri, 9, 0)
        before = (await stats(client))["server"]
        await inline(client, uri, 9, 0)
        after = (await stats(client))["server"]
    reused = after["prompt_tokens_reused"] - before["prompt_tokens_reused"]
    evaluated = after["prompt_tokens_evaluated"] - before["prompt_tokens_evaluated"]
    assert reused >= 25 and evaluated == 0  # the whole prompt (all but its last token) reused


async def test_type_through_serves_the_rest_without_the_target(db, repo):
    """Typing the start of a suggestion serves the rest of it without asking the Target: one
    type-through, no new generation."""
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "tt.py", PATTERN)
        first = await inline(client, uri, 9, 0)
        assert first and first.startswith("\ndef")
        before = (await stats(client))["server"]
        insert(client, uri, 2, 9, 0, "\nde")
        rest = await inline(client, uri, 10, 2)
        after = (await stats(client))["server"]
    assert rest == first[3:]
    assert after["type_through"] - before["type_through"] == 1
    assert after["generations"] == before["generations"]


async def test_open_close_1000_documents_keeps_state_bounded(db, repo):
    """Opening and closing 1,000 documents leaves no indexed buffers, prompt windows or
    type-through entries, and the live history under 100 tokens."""
    async with lsp_session(db, root=repo) as (client, _):
        for i in range(1000):
            uri = open_doc(client, repo / f"m{i}.py", f"# module {i}\n" + PATTERN)
            if i % 250 == 0:
                await inline(client, uri, 10, 0)
            client.text_document_did_close(types.DidCloseTextDocumentParams(
                types.TextDocumentIdentifier(uri=uri)))
        state = (await stats(client))["server"]
    assert state["requests"] == 4
    assert state["buffers_indexed"] == 0 and state["prompt_windows"] == 0
    assert state["type_through_entries"] == 0
    assert state["history_tokens"] < 100  # the closed buffers left the live history


# -- telemetry, stats, settings, errors ----------------------------------------------

async def test_acceptance_is_user_telemetry_and_history(db, repo):
    """Shown, accepted and dismissed suggestions are counted as user acceptance per language,
    apart from draft acceptance; an accepted suggestion is stored as a generated document with
    outcome accepted."""
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "acc.py", PATTERN)
        item = await inline_item(client, uri, 9, 0)
        assert item is not None and item.command.command == "assistd.accepted"
        sid = item.command.arguments[0]["id"]
        client.protocol.notify("assistd/didShowCompletion", {"id": sid})
        await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="assistd.accepted", arguments=[{"id": sid}]))
        # A second suggestion, shown then dismissed.
        insert(client, uri, 2, 9, 0, "\n# x\n")
        other = await inline_item(client, uri, 11, 0)
        if other is not None:
            oid = other.command.arguments[0]["id"]
            client.protocol.notify("assistd/didShowCompletion", {"id": oid})
            client.protocol.notify("assistd/didDismissCompletion", {"id": oid})
        report = await stats(client)
    ua = report["user_acceptance"]["python"]
    assert ua["accepted"] >= 1 and ua["shown"] >= 1
    assert ua["dismissed"] == (1 if other is not None else 0)
    if on_remote_target():  # the server decoded: no draft acceptance measured here
        assert report["ledger"]["entries"] == []
    else:
        assert any(e["language"] == "python" for e in report["ledger"]["entries"])  # draft acceptance, apart
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute(
            "select text from documents where source_kind = 'generated' and path = ?",
            [f"acc.py#suggestion-{sid}"]).fetchone()
        (outcome,) = conn.execute("select outcome from suggestions where id = ?", [sid]).fetchone()
    assert text == item.insert_text and outcome == "accepted"


async def test_bad_settings_warn_and_keep_serving(db, repo):
    """Invalid settings (k 'lots', maxTokens -3, numerics 'bogus', then proposer 'psychic' in a
    configuration change) each warn naming the setting and the server keeps serving."""
    async with lsp_session(db, root=repo, settings={"k": "lots", "maxTokens": -3,
                                                    "numerics": "bogus"}) as (client, _):
        uri = open_doc(client, repo / "set.py", PATTERN)
        assert await inline(client, uri, 9, 0)
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"assistd": {"proposer": "psychic"}}))
        assert await inline(client, uri, 9, 0)
        warnings = [m.message for m in client.messages if m.type == types.MessageType.Warning]
    assert any("'k'" in w for w in warnings) and any("'maxTokens'" in w for w in warnings)
    assert any("'proposer'" in w for w in warnings)
    assert any("'numerics'='bogus' is invalid" in w and "'fast', 'exact' or 'llama'" in w
               and "using 'fast'" in w for w in warnings), warnings


async def test_missing_model_is_reported_once(db, repo, tmp_path):
    """A model file that does not exist gives no suggestions and one error message naming the
    file, however many requests."""
    async with lsp_session(db, root=repo, settings={"model": str(tmp_path / "none.gguf")}) as (client, _):
        uri = open_doc(client, repo / "m.py", PATTERN)
        assert await inline(client, uri, 9, 0) is None
        assert await inline(client, uri, 9, 0) is None
        await asyncio.sleep(0.2)
        errors = [m.message for m in client.messages if m.type == types.MessageType.Error]
    assert len(errors) == 1 and "none.gguf" in errors[0]


async def test_time_budget_shortens_the_suggestion(db, repo):
    """maxLatencyMs 1 cuts the generation short (one budget cut counted): no suggestion or a
    shorter one."""
    async with lsp_session(db, root=repo, settings={"maxLatencyMs": 1}) as (client, _):
        uri = open_doc(client, repo / "budget.py", PATTERN)
        s = await inline(client, uri, 9, 0)
        st = (await stats(client))["server"]
    assert st["budget_cuts"] == 1
    assert s is None or len(s) < len("\ndef f4():\n    return 4")


async def test_completion_for_older_clients(db, repo):
    """textDocument/completion gives one incomplete-list item whose edit is the suggestion,
    labelled by its first line, as plain text for a client without snippet support."""
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "old.py", PATTERN)
        res = await client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(9, 0)))
    assert res.is_incomplete and len(res.items) == 1
    item = res.items[0]
    assert item.text_edit.new_text.startswith("\ndef f4():") and item.label == "def f4():"
    # This client does not take snippets: plain text (a snippet-capable one gets an escaped snippet).
    assert item.insert_text_format == types.InsertTextFormat.PlainText


async def test_percent_encoded_uri_is_the_open_document(db, repo):
    """A percent-encoded file URI (space, é) names the open document: suggestions work and
    closing it drops its buffer and window."""
    # VS Code sends file URIs percent-encoded (spaces, non-ASCII, c%3A on Windows).
    async with lsp_session(db, root=repo) as (client, _):
        uri = open_doc(client, repo / "my file é.py", PATTERN)
        assert "%20" in uri and "%C3%A9" in uri
        assert await inline(client, uri, 9, 0)
        client.text_document_did_close(types.DidCloseTextDocumentParams(
            types.TextDocumentIdentifier(uri=uri)))
        state = (await stats(client))["server"]
    assert state["buffers_indexed"] == 0 and state["prompt_windows"] == 0


async def test_shutdown_with_requests_in_flight_answers_cleanly(db, repo):
    """shutdown with a generation and stats requests in flight answers cleanly; every pending
    request ends with a result, None or a cancellation."""
    text = "".join(f"{i}. item number {i}\n" for i in range(1, 9))
    async with lsp_session(db, root=repo, settings={"maxTokens": 200, "k": 0}) as (client, _):
        uri = open_doc(client, repo / "sd.md", text, language="markdown")
        pending = [asyncio.ensure_future(inline(client, uri, 8, 0))]
        pending += [asyncio.ensure_future(stats(client)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert await client.shutdown_async(None) is None  # no "dictionary changed size"
        done = await asyncio.gather(*pending, return_exceptions=True)
        client.exit(None)
        client.capabilities = None  # exit sent: the session helper must not shut down again
    assert len(done) == 4 and all(r is None or isinstance(r, (dict, str, JsonRpcRequestCancelled))
                                  for r in done)
