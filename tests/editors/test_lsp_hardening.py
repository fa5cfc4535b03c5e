"""Issue 21 (hardening), the editor side: scopes a buffer cannot cross (class 4),
`assistd lsp --tcp` authentication and framing (class 5), the LSP lifecycle (class 7).
Real parts: the embedded Target, SQLite files, pytest-lsp's client, real sockets, the
`assistd lsp` and `assistd serve` processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest, JsonRpcServerNotInitialized
from pytest_lsp import ClientServerConfig

from assistd.runtime.runtime import Runtime, open_store
from editors.completer import Completer, Request, uri_path
from editors.settings import Settings
from harness.daemon import start_daemon
from harness.lsp import inline_params, lsp_session, open_doc, stats
from harness.ports import free_port
from tests.conftest import make_repo
from tests.lsp_helpers import answers as _answers
from tests.lsp_helpers import frame as _frame
from tests.lsp_helpers import read_message as _read
from tests.lsp_helpers import rpc as _rpc

B_ONLY = "def b_only_secret_helper(zz):\n    return zz * 7919 + 104729\n"


def _repos(tmp_path: Path) -> tuple[Path, Path]:
    """Repository A (with a symlink ``A/linked`` into B) and repository B."""
    a = make_repo(tmp_path / "A", {"main.py": "x = 1\n"})
    b = make_repo(tmp_path / "B", {"secret.py": B_ONLY})
    (a / "linked").symlink_to(b)
    return a, b


# -- class 4: scopes -------------------------------------------------------------


def test_uri_forms_resolve_to_real_paths(tmp_path):
    """uri_path resolves .., symlinks, localhost, upper-case schemes and doubled slashes to the
    real path; untitled, notebook-cell, another host's, relative and NUL-holding URIs give
    None."""
    a, b = _repos(tmp_path)
    real_b = b.resolve() / "secret.py"
    for uri in [f"file://{a}/../B/secret.py", f"file://{a}/linked/secret.py",
                f"file://localhost{a}/linked/secret.py", f"FILE://{a}/./../B/secret.py",
                f"file:{a}/linked//secret.py"]:
        assert uri_path(uri) == real_b, uri
    assert uri_path(f"file://{a}/") == a.resolve()  # trailing slash
    for uri in ["untitled:Untitled-1", "vscode-notebook-cell:/x.py#1", f"file://otherhost{a}/x",
                "file:main.py", "file:../B/secret.py", "file:///x\0y"]:
        assert uri_path(uri) is None, uri


@pytest.fixture
def completer(target, tmp_path):
    rt = Runtime(target, open_store(tmp_path / "c.db"))
    c = Completer(Settings(max_prompt_tokens=96, max_tokens=4, max_latency_ms=0), shared=rt)
    c.open()
    yield c
    c.close()
    rt.store.close()


def test_buffers_outside_the_scope_join_no_history(completer, tmp_path):
    """Buffers whose URIs climb out of the repository with .. or through a symlink into another
    repository join no history: A's index holds only its file and its own buffer, and the
    symlinked document's scope is B."""
    a, b = _repos(tmp_path)
    # Before the fix: both buffers' paths start with "A/", so they joined A's history.
    climbing, linked = f"file://{a}/../B/secret.py", f"file://{a}/linked/secret.py"
    req = Request(uri=(a / "main.py").as_uri(), text="def b_only_secret_helper(",
                  offset=len("def b_only_secret_helper("), language="python",
                  buffers={climbing: B_ONLY, linked: B_ONLY})
    completer.complete(req)
    scope_a = str(a.resolve())
    docs = completer.index.documents(scope_a)
    b_tokens = completer.target.tokenize(B_ONLY)
    # The repository's file and the open buffer; not B's file (the indexer skips links).
    assert {name for name, _ in docs.values()} == {"main.py", "buffer:main.py"}
    assert not any(list(t) == b_tokens for _, t in docs.values())
    assert completer._buffers.keys() == {req.uri}  # B's buffers are in no scope's history
    # A document reached through the symlink is B's: its scope is B, not A.
    assert completer.scope_of(linked) == str(b.resolve())


async def test_lsp_buffers_through_dotdot_percent_and_symlink_stay_out(tmp_path):
    """Over LSP, buffers opened through a percent-encoded .. or a symlink into another
    repository are not indexed: only the repository's own document is."""
    a, b = _repos(tmp_path)
    async with lsp_session(tmp_path / "h.db", root=a) as (client, _):
        for uri in [f"file://{a}/%2e%2e/B/secret.py", f"file://{a}/linked/secret.py"]:
            client.text_document_did_open(types.DidOpenTextDocumentParams(
                types.TextDocumentItem(uri=uri, language_id="python", version=1, text=B_ONLY)))
        uri = open_doc(client, a / "main.py", "def b_only_secret_helper(")
        await client.text_document_inline_completion_async(inline_params(uri, 0, 25))
        state = (await stats(client))["server"]
    assert state["buffers_indexed"] == 1  # A's own document only (3 before the fix)


# -- class 7: lifecycle ------------------------------------------------------------


async def test_requests_before_initialize_and_after_shutdown_get_an_answer(tmp_path):
    """Requests before initialize get -32002, a second initialize and requests after shutdown
    get invalid-request errors saying why, and exit ends the server with status 0."""
    config = ClientServerConfig(server_command=[sys.executable, "-m", "assistd", "lsp",
                                                "--no-daemon"],
                                server_env={**os.environ, "ASSISTD_DB": str(tmp_path / "h.db")})
    client = await config.start()
    try:
        params = inline_params((tmp_path / "x.py").as_uri(), 0, 0)
        # pytest-lsp checks requests against the client's capabilities, known once it has
        # initialized: give it some, so that it sends these requests as a careless client would.
        client.capabilities = types.ClientCapabilities()
        # pygls's client names -32002 a JsonRpcServerError (the -32099..-32000 range): check the code.
        with pytest.raises(JsonRpcException, match="before initialize") as e:
            await client.text_document_inline_completion_async(params)
        assert e.value.code == JsonRpcServerNotInitialized.CODE == -32002
        with pytest.raises(JsonRpcException) as e:
            await client.workspace_execute_command_async(
                types.ExecuteCommandParams(command="assistd.stats"))
        assert e.value.code == -32002
        await client.initialize_session(types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            initialization_options={"assistd": {"db": str(tmp_path / "h.db")}}))
        with pytest.raises(JsonRpcInvalidRequest, match="already sent"):
            await client.initialize_async(types.InitializeParams(
                capabilities=types.ClientCapabilities()))
        assert await client.shutdown_async(None) is None
        with pytest.raises(JsonRpcInvalidRequest, match="after shutdown"):
            await client.text_document_inline_completion_async(params)
        with pytest.raises(JsonRpcInvalidRequest, match="after shutdown"):
            await client.shutdown_async(None)
        client.exit(None)
        client.capabilities = None
        assert await _wait_exit(client._server) == 0
    finally:
        if client._server is not None and client._server.returncode is None:
            client._server.kill()
        await client.stop()


def test_a_body_that_is_not_json_gets_a_parse_error_and_no_traceback(tmp_path):
    """Invalid JSON and a body nested 100,000 deep got no answer and a ~70-line
    traceback each in the log (a break-it pass); now each gets JSON-RPC's ParseError
    (-32700, id null), the log one line, and the session goes on."""
    def frame(body: bytes) -> bytes:
        return b"Content-Length: %d\r\n\r\n" % len(body) + body

    def msg(obj) -> bytes:
        return frame(json.dumps(obj).encode())

    stdin = b"".join([
        msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "capabilities": {}, "initializationOptions": {"assistd": {
                "db": str(tmp_path / "h.db")}}}}),
        frame(b"{{{"), frame(b"[" * 100_000 + b"]" * 100_000), frame(b"\xff\xfe{}"),
        # Still reading and answering: a second initialize is refused, in order.
        msg({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"capabilities": {}}}),
        msg({"jsonrpc": "2.0", "method": "exit"})])
    r = subprocess.run([sys.executable, "-m", "assistd", "lsp", "--no-daemon"], input=stdin,
                       capture_output=True, timeout=300, env={
                           **os.environ, "ASSISTD_DB": str(tmp_path / "h.db")})
    assert r.returncode == 0, r.stderr[-2000:]
    answers = _answers(r.stdout)
    parse_errors = [a for a in answers if a.get("error", {}).get("code") == -32700]
    assert len(parse_errors) == 3 and all(a["id"] is None for a in parse_errors), answers
    assert answers[-1]["id"] == 2 and answers[-1]["error"]["code"] == -32600, answers
    assert b"Traceback" not in r.stderr, r.stderr[-3000:]


def test_json_that_is_no_message_and_a_huge_length_get_no_traceback(tmp_path):
    """A break-it pass: ``{}``, ``[]`` and ``42`` (JSON, but no JSON-RPC message) logged
    an AttributeError traceback each; a Content-Length of 99,999,999,999 ended the
    server with a MemoryError traceback. Now: InvalidRequest (-32600, id null) each, and
    the session goes on; a body past the limit is refused unread with one warning (and
    the input ending inside it ends the session)."""
    env = {**os.environ, "ASSISTD_DB": str(tmp_path / "h.db")}
    cmd = [sys.executable, "-m", "assistd", "lsp", "--no-daemon"]
    stdin = b"".join([_frame(x) for x in ({}, [], 42)] + [
        _frame({"jsonrpc": "2.0", "id": 7, "method": "shutdown"}),
        _frame({"jsonrpc": "2.0", "method": "exit"})])
    r = subprocess.run(cmd, input=stdin, capture_output=True, timeout=300, env=env)
    answers = _answers(r.stdout)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-3000:]
    assert [a["error"]["code"] for a in answers[:3]] == [-32600] * 3
    assert all(a["id"] is None for a in answers[:3])
    assert answers[3]["id"] == 7 and answers[3]["error"]["code"] == -32002  # still reading
    r = subprocess.run(cmd, input=b"Content-Length: 99999999999\r\n\r\n{}",
                       capture_output=True, timeout=300, env=env)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-3000:]
    assert b"past the 268435456-byte limit: refused unread" in r.stderr


def test_the_server_structures_lsp_types_strictly():
    """cattrs's default casts took a position of 1.5, "1" or true as line 1 and a didChange
    text of 7 as the document "7" (a break-it pass); the server's converter refuses them
    (InvalidParams), and still makes enums and booleans of the right JSON types."""
    import cattrs

    from editors.transport import strict_converter

    c = strict_converter()
    for line in (1.5, "1", True, None):
        with pytest.raises(cattrs.ClassValidationError):
            c.structure({"line": line, "character": 0}, types.Position)
    with pytest.raises(cattrs.ClassValidationError):
        c.structure({"text": 7}, types.TextDocumentContentChangeWholeDocument)
    with pytest.raises(cattrs.ClassValidationError):
        c.structure({"configuration": 1}, types.WorkspaceClientCapabilities)
    assert c.structure({"line": 3, "character": 4}, types.Position) == types.Position(3, 4)
    init = c.structure({"capabilities": {"workspace": {"configuration": True}}, "trace": "off",
                        "processId": 7}, types.InitializeParams)
    assert init.trace is types.TraceValue.Off and init.process_id == 7
    assert init.capabilities.workspace.configuration is True
    ctx = c.structure({"triggerKind": 1}, types.InlineCompletionContext)
    assert ctx.trigger_kind is types.InlineCompletionTriggerKind.Invoked


async def _wait_exit(proc, timeout: float = 60) -> int:
    import asyncio

    return await asyncio.wait_for(proc.wait(), timeout)


async def test_position_out_of_range_is_a_clear_error(tmp_path):
    """Positions at 2^31 - 1 (line, character or both) get invalid-params errors, and the
    session stays up."""
    from pygls.exceptions import JsonRpcInvalidParams

    async with lsp_session(tmp_path / "h.db") as (client, _):
        uri = open_doc(client, tmp_path / "p.py", "x = 1\n")
        for line, char in [(0, 2**31 - 1), (2**31 - 1, 0), (2**31 - 1, 2**31 - 1)]:
            with pytest.raises(JsonRpcInvalidParams):
                await client.text_document_inline_completion_async(inline_params(uri, line, char))
        assert client.error is None


# -- class 5: lsp --tcp --------------------------------------------------------------


def test_framing_reader_takes_lsp_in_any_pieces_and_nothing_else():
    """read_message reads an LSP frame sent a byte at a time (with Content-Type) and refuses
    HTTP, a bad or huge Content-Length, a non-object or unparsable body and an endless header as
    NotLsp."""
    from assistd.serving.lsp_host import NotLsp, read_message

    msg = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"x": "é"}}
    body = json.dumps(msg).encode()
    wire = b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n" \
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    a, b = socket.socketpair()
    with a, b:
        for i in range(len(wire)):  # one byte at a time: a line end split across reads
            a.sendall(wire[i:i + 1])
        buf = bytearray()
        assert read_message(b, buf) == msg and not buf
    for bad in [b"POST / HTTP/1.1\r\n", b"GET /", b"Content-Length: x\r\n\r\n",
                b"Content-Length: 99999999999\r\n\r\n", b"Content-Length: 2\r\n\r\n[]",
                b"Content-Length: 5\r\n\r\n{bad}", b"Content-Length: 1" + b"0" * 2000]:
        a, b = socket.socketpair()
        with a, b:
            a.sendall(bad)
            a.shutdown(socket.SHUT_WR)
            with pytest.raises(NotLsp):
                read_message(b, bytearray())

TOKEN = "test-token-0123456789"


def _initialize(db: Path, token: str | None, where: str = "top") -> dict:
    opts: dict = {"assistd": {"db": str(db)}}
    if token is not None and where == "top":
        opts["token"] = token
    elif token is not None:
        opts["assistd"]["token"] = token
    return {"processId": None, "capabilities": {}, "initializationOptions": opts}


def _closed(sock: socket.socket, timeout: float = 30) -> bool:
    """True when the peer closes ``sock`` without sending anything."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _connect(port: int, proc=None, timeout: float = 120) -> socket.socket:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the server exited {proc.returncode}")
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=60)
        except OSError:
            time.sleep(0.05)
    pytest.fail("the server did not listen")


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, (TOKEN + "\n").encode())
    os.close(fd)
    return path


def _lsp_tcp(tmp_path: Path, port: int, *, daemon=None) -> subprocess.Popen:
    env = daemon.env() if daemon is not None else {**os.environ, "ASSISTD_DB": str(tmp_path / "h.db")}
    mode = "--daemon" if daemon is not None else "--no-daemon"
    return subprocess.Popen([sys.executable, "-m", "assistd", "lsp", mode, "--tcp",
                             f"127.0.0.1:{port}", "--token-file", str(_token_file(tmp_path))],
                            env=env, stderr=open(tmp_path / "lsp.stderr", "w"))


def _check_gate(port: int, proc: subprocess.Popen, db: Path) -> None:
    """The --tcp rules, the same whichever side runs the server."""
    idle = _connect(port, proc)  # connected, silent: it must not hold the editor's place
    # An HTTP POST (what a web page can send to localhost) is dropped unexecuted.
    with _connect(port, proc) as web:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                           "params": _initialize(db, TOKEN)}).encode()
        web.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert _closed(web)
    # Unauthenticated: every request is refused, before and after a wrong initialize.
    with _connect(port, proc) as anon:
        out = _rpc(anon, 1, "textDocument/inlineCompletion", {
            "textDocument": {"uri": "file:///x.py"}, "position": {"line": 0, "character": 0},
            "context": {"triggerKind": 1}})
        assert out["error"]["code"] == -32002
        for i, token in enumerate([None, "wrong", 12345]):
            out = _rpc(anon, 2 + i, "initialize", _initialize(db, token))
            assert out["error"]["code"] == -32600 and "token" in out["error"]["message"]
            assert "result" not in out
        assert _rpc(anon, 9, "shutdown")["error"]["code"] == -32002
        # The right token, nested under "assistd", on the same connection: served.
        first = _rpc(anon, 10, "initialize", _initialize(db, TOKEN, where="assistd"))
        assert first["result"]["serverInfo"]["name"] == "assistd"
        anon.sendall(_frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        # A second editor is refused while the first is served (after a wait for the
        # first to leave), with a reason ...
        with _connect(port, proc) as second:
            second.settimeout(120)
            refused = _rpc(second, 1, "initialize", _initialize(db, TOKEN))
            assert refused["error"]["code"] == -32600, refused
            assert "one editor at a time" in refused["error"]["message"]
            assert _closed(second)
        # ... and the first session survives the second's drop, and gets only its answers.
        out = _rpc(anon, 11, "textDocument/inlineCompletion", {
            "textDocument": {"uri": "file:///nowhere.py"},
            "position": {"line": 0, "character": 0}, "context": {"triggerKind": 1}})
        assert out["id"] == 11 and "not open" in out["error"]["message"]
        assert _rpc(anon, 12, "shutdown")["result"] is None
        anon.sendall(_frame({"jsonrpc": "2.0", "method": "exit"}))
    idle.close()


def test_lsp_tcp_in_process_gate(tmp_path):
    """`assistd lsp --tcp` in-process keeps the TCP gate: HTTP is dropped, requests without the
    token are refused, the right token is served, a second editor waits; the server exits with
    its editor, no traceback."""
    port = free_port()
    proc = _lsp_tcp(tmp_path, port)
    try:
        _check_gate(port, proc, tmp_path / "h.db")
        assert proc.wait(60) == 0  # the in-process server lives as long as its editor
    finally:
        proc.kill()
        proc.wait()
    assert "Traceback" not in (tmp_path / "lsp.stderr").read_text()


def test_lsp_tcp_through_the_daemon_gate(tmp_path):
    """`assistd lsp --tcp` piped to a daemon keeps the same TCP gate, and keeps listening for
    the next editor after the first leaves."""
    d = start_daemon(tmp_path / "d")
    port = free_port()
    proc = _lsp_tcp(tmp_path, port, daemon=d)
    try:
        _check_gate(port, proc, d.db)
        # The pipe keeps listening for the next editor (the daemon keeps the history).
        with _connect(port, proc) as again:
            assert _rpc(again, 1, "initialize", _initialize(d.db, TOKEN))["result"]
    finally:
        proc.kill()
        proc.wait()
        assert d.stop() == 0
    assert "Traceback" not in (tmp_path / "lsp.stderr").read_text()
