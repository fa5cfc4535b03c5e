"""Fuzzing `assistd lsp` through pytest-lsp's real client against the real server process
(the embedded Target, a real SQLite file), one server for the module.

Hypothesis drives synchronous tests; the client lives on an event loop in a thread of
its own and each example's messages are run there. Properties: arbitrary positions
(past the end of a line or the document, inside a UTF-16 surrogate pair, negative or
null ones sent as raw JSON), arbitrary didChange contents and ranges, documents opened,
changed, saved and closed in any order on any URI, and arbitrary or unknown settings get
an answer or InvalidParams, never an internal error; after each example the server still
answers and its log holds no traceback (one known record excepted, finding 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
import uuid
from concurrent.futures import Future

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pytest_lsp import ClientServerConfig

from editors.positions import PositionError, offset_at
from editors.settings import parse_settings
from harness.lsp import inline_params, stats
from tests.conftest import make_repo
from tests.fuzz.conftest import examples
from tests.fuzz.strategies import JSON, TEXT, mutated

SETTINGS = {"maxTokens": 2, "maxPromptTokens": 64, "maxLatencyMs": 0, "proposer": "suffix",
            "k": "auto", "enabled": True, "telemetry": True}
DOC = st.one_of(
    st.lists(st.sampled_from(["a", " ", "\n", "\r\n", "\r", "\t", "😋", "中", "\u2028", "\x00",
                              "def f(x):\n", "    return x\n"]), max_size=20).map("".join),
    st.text(st.characters(exclude_categories=()), max_size=30))
UINT = st.one_of(st.integers(0, 8), st.integers(0, 2**31 - 1))
# (NaN is not JSON: the server could not even read the id to answer.)
ANY_INT = st.one_of(st.integers(-3, 8), st.integers(), st.none(), st.text(max_size=3),
                    st.floats(allow_nan=False, allow_infinity=False))


class Session:
    """A started server and its client, on a loop of their own thread. The server runs
    in-process (``--no-daemon``) and logs to a file the tests read for tracebacks: an
    error in a notification handler has no answer to carry it."""

    def __init__(self, folder):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        repo = make_repo(folder / "repo", {"README.md": "a fuzzed repository\n"})
        self.uri_of = lambda name: (repo / name).as_uri()
        self.log = folder / "lsp.log"
        self.log_seen = 0
        env = {**os.environ, "ASSISTD_DB": str(folder / "history.db"),
               "ASSISTD_SOCKET": str(folder / "no-daemon.sock"),
               "XDG_CONFIG_HOME": str(folder / "config-home")}
        config = ClientServerConfig(server_command=[
            sys.executable, "-m", "assistd", "lsp", "--no-daemon", "--log-file", str(self.log)],
            server_env=env)
        cwd = os.getcwd()
        os.chdir(folder)  # a fuzzed relative "db" setting lands here, not in the checkout
        try:
            self.client = self.run(config.start())
        finally:
            os.chdir(cwd)
        caps = types.ClientCapabilities(text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities(),
            synchronization=types.TextDocumentSyncClientCapabilities(did_save=True)))
        self.run(self.client.initialize_session(types.InitializeParams(
            capabilities=caps, root_uri=repo.as_uri(),
            initialization_options={"assistd": {"db": str(folder / "history.db"),
                                                **SETTINGS}})))
        self.versions: dict[str, int] = {}

    def run(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args):
        """``fn(*args)`` (a client method that sends a notification) on the client's loop."""
        async def go():
            return fn(*args)
        return self.run(go())

    def request(self, method: str, params):
        """A raw JSON-RPC request: ``params`` go on the wire as given. pygls's own
        ``send_request`` would first build the method's typed message from them, which
        ill-typed params cannot be, so the message is sent as a dict, with the future
        and result type registered the way ``send_request`` does."""
        async def go():
            proto = self.client.protocol
            msg_id = str(uuid.uuid4())
            future = Future()
            proto._request_futures[msg_id] = future
            proto._result_types[msg_id] = proto.get_result_type(method)
            proto._send_data({"jsonrpc": "2.0", "id": msg_id, "method": method,
                              "params": params})
            return await asyncio.wrap_future(future)
        return self.run(go())

    def notify(self, method: str, params) -> None:
        """A raw JSON-RPC notification (see :meth:`request`)."""
        async def go():
            self.client.protocol._send_data({"jsonrpc": "2.0", "method": method,
                                             "params": params})
        self.run(go())

    def open(self, name: str, text: str) -> str:
        uri = self.uri_of(name)
        self.versions[uri] = self.versions.get(uri, 0) + 1
        self.call(self.client.text_document_did_open, types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=self.versions[uri],
                                   text=text)))
        return uri

    def alive(self) -> None:
        """The server still answers a request, logged no traceback since the last check,
        and the session saw no client error."""
        assert isinstance(self.run(stats(self.client)), dict)
        assert self.client.error is None, self.client.error
        new = self.new_log()
        assert "Traceback" not in new, new[-3000:]

    def new_log(self) -> str:
        """What the server logged since the last call, once the file stops growing (its
        log may be written by a thread of its own, after the answer)."""
        size, deadline = -1, time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.02)
            now = self.log.stat().st_size if self.log.exists() else 0
            if now == size:
                break
            size = now
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        new, self.log_seen = text[self.log_seen:], len(text)
        return new

    def close(self):
        try:
            self.run(asyncio.wait_for(self.client.shutdown_session(), 60))
        finally:
            server = self.client._server  # never leave the server (and pytest) hanging
            if server is not None and server.returncode is None:
                server.kill()
            try:
                self.run(self.client.stop())
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(10)


@pytest.fixture(scope="module")
def lsp(tmp_path_factory):
    s = Session(tmp_path_factory.mktemp("lsp-fuzz"))
    yield s
    s.close()


def expect_answer_or_invalid(fn) -> object | None:
    """``fn()``'s answer, or None for InvalidParams; any other error fails the test."""
    try:
        return fn()
    except JsonRpcInvalidParams:
        return None


# -- positions ------------------------------------------------------------------------


@settings(max_examples=examples(0.3))
@given(text=DOC, line=UINT, character=UINT, inline=st.booleans())
@example(text="x = '😋'\n", line=0, character=6, inline=True)  # between the halves of 😋
@example(text="a\r\nb", line=0, character=2, inline=False)
@example(text="", line=2**31 - 1, character=2**31 - 1, inline=True)
def test_any_position_is_answered_or_invalid_params(lsp, text, line, character, inline):
    """Any line and character in any document, for inline or classic completion, is answered
    exactly when it lies inside the document (UTF-16) and refused with invalid params otherwise;
    the server stays up."""
    uri = lsp.open("pos.py", text)
    if inline:
        ask = lsp.client.text_document_inline_completion_async(inline_params(uri, line, character))
    else:
        ask = lsp.client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line, character)))
    res = expect_answer_or_invalid(lambda: lsp.run(ask))
    try:  # the server refuses exactly the positions outside the document
        offset_at(text, types.Position(line, character), "utf-16")
        inside = True
    except PositionError:
        inside = False
    assert (res is not None) == inside
    lsp.alive()


@settings(max_examples=examples(0.2))
@given(line=ANY_INT, character=ANY_INT, position_null=st.booleans())
@example(line=-1, character=0, position_null=False)
@example(line=0, character=2**40, position_null=False)
@example(line=0, character=0, position_null=True)
def test_raw_positions_of_any_json_type_get_an_answer(lsp, line, character, position_null):
    """Positions of any integer size, negative, or null get an answer or invalid params, and the
    server stays up."""
    uri = lsp.open("raw.py", "def f(x):\n    return x\n")
    params = {"textDocument": {"uri": uri},
              "position": None if position_null else {"line": line, "character": character},
              "context": {"triggerKind": 2}}
    try:
        lsp.request(types.TEXT_DOCUMENT_INLINE_COMPLETION, params)
    except JsonRpcInvalidParams:
        pass
    lsp.alive()


# -- didChange ------------------------------------------------------------------------


RANGE = st.builds(lambda a, b, c, d: types.Range(types.Position(a, b), types.Position(c, d)),
                  UINT, UINT, UINT, UINT)
CHANGE = st.one_of(
    st.builds(types.TextDocumentContentChangePartial, range=RANGE, text=DOC),
    st.builds(types.TextDocumentContentChangeWholeDocument, text=DOC))


@settings(max_examples=examples(0.3))
@given(start=DOC, changes=st.lists(CHANGE, min_size=1, max_size=4), line=UINT, character=UINT)
@example(start="a😋b", changes=[types.TextDocumentContentChangePartial(
    range=types.Range(types.Position(0, 2), types.Position(0, 2)), text="x")],
    line=0, character=3)  # an edit inside a surrogate pair
@example(start="ab", changes=[types.TextDocumentContentChangePartial(
    range=types.Range(types.Position(0, 2), types.Position(0, 0)), text="x")],
    line=0, character=0)  # start after end
def test_any_did_change_keeps_the_server_answering(lsp, start, changes, line, character):
    """Any didChange (ranges inside surrogate pairs, start after end) keeps the server answering
    the next request or refusing it as invalid params."""
    uri = lsp.open("change.py", start)
    lsp.versions[uri] += 1
    lsp.call(lsp.client.text_document_did_change, types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=lsp.versions[uri]),
        content_changes=changes))
    expect_answer_or_invalid(lambda: lsp.run(
        lsp.client.text_document_inline_completion_async(inline_params(uri, line, character))))
    lsp.alive()


@settings(max_examples=examples(0.2))
@given(data=st.data())
def test_raw_did_change_params_keep_the_server_answering(lsp, data):
    """didChange params of any JSON shape: a valid one mutated, or anything."""
    uri = lsp.open("rawchange.py", "x = 1\n")
    valid = {"textDocument": {"uri": uri, "version": lsp.versions[uri] + 1}, "contentChanges": [
        {"range": {"start": {"line": 0, "character": 1}, "end": {"line": 0, "character": 2}},
         "text": "y"}, {"text": "whole"}]}
    lsp.notify(types.TEXT_DOCUMENT_DID_CHANGE, data.draw(st.one_of(mutated(valid), JSON)))
    expect_answer_or_invalid(lambda: lsp.run(
        lsp.client.text_document_inline_completion_async(inline_params(uri, 0, 0))))
    lsp.alive()


# -- settings -------------------------------------------------------------------------

# Settings whose valid values are costly to apply in a test (a new Target, a context
# window of a million tokens) are fuzzed with wrong values only, by the JSON strategy.
KNOWN = ["proposer", "k", "maxTokens", "maxPromptTokens", "maxSuffixChars", "fim",
         "maxLatencyMs", "enabled", "telemetry", "model", "backend", "nCtx", "db",
         "crossFileTokens"]
SETTING_VALUE = JSON.filter(lambda v: not isinstance(v, int) or isinstance(v, bool) or v < 0)


@settings(max_examples=examples(0.3))
@given(raw=st.one_of(
    JSON,
    st.dictionaries(TEXT, JSON, max_size=4).map(lambda d: {"assistd": d}),
    st.dictionaries(st.sampled_from(KNOWN), SETTING_VALUE, max_size=4).map(
        lambda d: {"assistd": d}),
    st.dictionaries(st.sampled_from(KNOWN), SETTING_VALUE, max_size=3)),
    via_initialize_shape=st.booleans())
@example(raw={"assistd": None}, via_initialize_shape=False)
@example(raw=[{"assistd": {"k": 4}}], via_initialize_shape=False)
@example(raw={"assistd": {"nCtx": "2048", "k": 2**70, "enabled": "yes"}},
         via_initialize_shape=True)
def test_any_settings_keep_the_server_answering(lsp, raw, via_initialize_shape):
    """Any settings object, as a configuration change in either shape, keeps the server
    answering."""
    try:
        lsp.call(lsp.client.workspace_did_change_configuration,
                 types.DidChangeConfigurationParams(settings=raw))
        lsp.alive()
    finally:  # back to the module's settings for the next example
        lsp.call(lsp.client.workspace_did_change_configuration,
                 types.DidChangeConfigurationParams(settings={"assistd": SETTINGS}))
    lsp.alive()


# -- custom notifications and commands ------------------------------------------------------


@settings(max_examples=examples(0.2))
@given(method=st.sampled_from(["assistd/didShowCompletion", "assistd/didPartiallyAcceptCompletion",
                               "assistd/didDismissCompletion"]),
       params=st.one_of(JSON, st.dictionaries(st.sampled_from(["id", "acceptedLength"]), JSON)))
def test_custom_notifications_of_any_shape(lsp, method, params):
    """assistd's suggestion notifications with params of any shape keep the server up."""
    lsp.notify(method, params)
    lsp.alive()


@settings(max_examples=examples(0.2))
@given(command=st.sampled_from(["assistd.accepted", "assistd.stats"]),
       arguments=st.one_of(st.none(), st.lists(JSON, max_size=3)))
def test_commands_with_any_arguments(lsp, command, arguments):
    """assistd.accepted and assistd.stats with any arguments are answered or refused as invalid
    params; the server stays up."""
    with contextlib.suppress(JsonRpcInvalidParams):
        lsp.request(types.WORKSPACE_EXECUTE_COMMAND,
                    {"command": command, "arguments": arguments})
    lsp.alive()


# -- document lifecycle in any order ------------------------------------------------------

# URIs a client may send: the fuzzed repository's files (one with %20 and #), another
# host's, untitled buffers, a NUL, odd schemes. Never a real repository's (a didSave there
# would index it).
URIS = ["repo:a.py", "repo:sub dir/b%20c.py", "repo:x#1.py", "untitled:Untitled-1",
        "file://otherhost/x.py", "file:///nonexistent%00/x.py", "file:relative.py",
        "vscode-notebook-cell:/x.py#W0", "", "file:///" + "a" * 5000 + ".py",
        "file:///" + "a/" * 3000 + "x.py", "file:///~nosuchuser/x.py"]
STEP = st.tuples(st.sampled_from(["open", "change", "save", "close", "complete"]),
                 st.sampled_from(URIS), DOC, UINT, UINT)


@settings(max_examples=examples(0.2))
@given(steps=st.lists(STEP, min_size=1, max_size=6))
def test_document_lifecycle_in_any_order(lsp, steps):
    """didOpen/didChange/didSave/didClose and completions in any order, on any URI
    (changed before opened, closed twice, completed after close): the server answers
    a completion or InvalidParams, and keeps answering."""
    c = lsp.client
    for op, uri, text, line, character in steps:
        uri = lsp.uri_of(uri[5:]) if uri.startswith("repo:") else uri
        version = lsp.versions[uri] = lsp.versions.get(uri, 0) + 1
        ident = types.VersionedTextDocumentIdentifier(uri=uri, version=version)
        if op == "open":
            lsp.call(c.text_document_did_open, types.DidOpenTextDocumentParams(
                types.TextDocumentItem(uri=uri, language_id="python", version=version,
                                       text=text)))
        elif op == "change":
            lsp.call(c.text_document_did_change, types.DidChangeTextDocumentParams(
                text_document=ident, content_changes=[types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(line, character),
                                      types.Position(line, character)), text=text)]))
        elif op == "save":
            lsp.call(c.text_document_did_save, types.DidSaveTextDocumentParams(
                text_document=types.TextDocumentIdentifier(uri=uri)))
        elif op == "close":
            lsp.call(c.text_document_did_close, types.DidCloseTextDocumentParams(
                text_document=types.TextDocumentIdentifier(uri=uri)))
        else:
            expect_answer_or_invalid(lambda: lsp.run(c.text_document_inline_completion_async(
                inline_params(uri, line, character))))
    lsp.alive()


# -- finding 4: the log of a client's ill-typed message ----------------------------------


# A message whose params do not deserialize was logged as an ERROR with a traceback
# (pygls puts it in the text; the server's filter looked only at exc_info).
@pytest.mark.parametrize("kind", ["request", "notification"])
def test_finding_ill_typed_params_log_no_traceback(tmp_path, kind):
    """A request or notification with an ill-typed position is answered (or dropped) without a
    traceback in the server's log."""
    # A server of its own: the log counts a repeated message instead of writing it again,
    # so the module's server, fuzzed already, may have logged this one before.
    lsp = Session(tmp_path)
    try:
        _ill_typed(lsp, kind)
    finally:
        lsp.close()


def _ill_typed(lsp, kind):
    uri = lsp.open("ill.py", "x = 1\n")
    bad = {"line": -1, "character": 0}
    lsp.new_log()
    if kind == "request":
        with pytest.raises(JsonRpcInvalidParams):  # answered as it should be
            lsp.request(types.TEXT_DOCUMENT_INLINE_COMPLETION, {
                "textDocument": {"uri": uri}, "position": bad, "context": {"triggerKind": 2}})
    else:
        lsp.notify(types.TEXT_DOCUMENT_DID_CHANGE, {
            "textDocument": {"uri": uri, "version": 99},
            "contentChanges": [{"range": {"start": bad, "end": bad}, "text": "y"}]})
    lsp.alive()


# -- finding 6: a settings path naming an unknown user ------------------------------------

# Finding 6 in fuzz_findings: a 'db' or 'model' setting '~nosuchuser/...' made
# Path.expanduser raise RuntimeError inside parse_settings, which promises never to raise.


@pytest.mark.parametrize("key", ["db", "model"])
def test_finding_settings_path_of_an_unknown_user_never_raises(key):
    """A db or model setting of ~nosuchuser/x falls back to None with a warning instead of
    raising."""
    settings_, warnings = parse_settings({"assistd": {key: "~nosuchuser/x"}})
    owner = settings_.target if key == "model" else settings_  # the Target's settings
    assert getattr(owner, key) is None and warnings


def test_finding_settings_path_of_an_unknown_user_is_a_warning(tmp_path):
    """The whole settings change was dropped, with one log line ("protocol error
    (FeatureNotificationError): RuntimeError: ...") and nothing shown to the user; now,
    as for a bad value elsewhere, a window/showMessage warning names it, the rest applied."""
    lsp = Session(tmp_path)
    try:
        lsp.call(lsp.client.workspace_did_change_configuration,
                 types.DidChangeConfigurationParams(settings={"assistd": {
                     **SETTINGS, "db": "~nosuchuser/x"}}))
        lsp.alive()
        assert any("'db'" in m.message for m in lsp.client.messages), lsp.client.messages
    finally:
        lsp.close()
