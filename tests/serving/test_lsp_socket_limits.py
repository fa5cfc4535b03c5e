"""The daemon's editor socket under hostile local clients (issue 21): connections that
never send ``initialize`` (silent, dribbling, not LSP at all), the cap of editor
sessions, and running out of descriptors, while real editors are served throughout and
an initialized session stays open however long it is idle.

A real daemon (real model, the real hosted language server) with a short
``editor_initialize_timeout_ms`` and a small ``max_editor_sessions`` set through its
``ASSISTD_*`` environment; editors are pytest-lsp's client through ``assistd lsp``, or
raw LSP over the socket.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import threading
import time

import pytest

from assistd.serving.lsp_host import _frame, lsp_socket_for, read_message
from harness.daemon import start_daemon
from tests.daemon_helpers import open_fds, wait_closed, wait_for

INIT_MS = 3000  # the deadline for initialize (the default is 30 s)
CAP = 6  # max_editor_sessions (the default is 64)
SETTINGS = {"ASSISTD_EDITOR_INITIALIZE_TIMEOUT_MS": str(INIT_MS),
            "ASSISTD_MAX_EDITOR_SESSIONS": str(CAP)}
INIT_PARAMS = {"processId": None, "rootUri": None, "capabilities": {}}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("lsp_limits"), env=SETTINGS)
    yield d
    assert d.stop() == 0


def _editors(d) -> dict:
    return d.status()["editors"]


def _connect(d) -> socket.socket:
    """A connection to ``d``'s editor socket; waits while its backlog is full (a Unix
    socket's connect fails with EAGAIN then, where TCP's would wait)."""
    deadline = time.monotonic() + 60
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        try:
            s.connect(str(lsp_socket_for(d.socket)))
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class RawEditor:
    """LSP over the editor socket by hand: requests, and the response to each."""

    def __init__(self, d):
        self.sock, self.buf, self.next_id = _connect(d), bytearray(), 0

    def request(self, method: str, params=None) -> dict:
        self.next_id += 1
        self.sock.sendall(_frame({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                                  "params": params}))
        while True:  # notifications (window/logMessage ...) may come first
            msg = read_message(self.sock, self.buf)
            assert msg is not None, f"the daemon closed the connection during {method}"
            if msg.get("id") == self.next_id and "method" not in msg:
                return msg

    def initialize(self) -> dict:
        msg = self.request("initialize", INIT_PARAMS)
        assert "result" in msg, msg
        self.sock.sendall(_frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        return msg["result"]

    def close(self):
        self.sock.close()


def _closed_at_once(s: socket.socket) -> bool:
    """True when the daemon has closed ``s`` (end of file or reset)."""
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


# -- deadline ------------------------------------------------------------------------


async def test_200_silent_connections_neither_lock_out_an_editor_nor_stay_open(daemon):
    """200 connections that never send a byte: the oldest make room for new ones at the
    cap, the rest are closed at the deadline, the daemon's descriptors stay bounded, and
    a real editor (pytest-lsp through `assistd lsp`) is served meanwhile and afterwards,
    past the deadline."""
    from harness.lsp import inline, lsp_session, open_doc, stats

    before = _editors(daemon)
    base_fds = open_fds(daemon.proc.pid)
    silent = [_connect(daemon) for _ in range(200)]
    try:
        assert wait_for(lambda: _editors(daemon)["evicted"] - before["evicted"] >= 200 - CAP)
        assert wait_for(lambda: open_fds(daemon.proc.pid) <= base_fds + CAP + 2)
        env = {"ASSISTD_SOCKET": str(daemon.socket)}
        async with lsp_session(daemon.db, env=env) as (client, result):
            assert result.capabilities.inline_completion_provider
            uri = open_doc(client, daemon.socket.parent / "a.py", "def f():\n    return")
            await inline(client, uri, 1, 10)  # answered: str or None, not an error
            assert wait_closed(silent, timeout=INIT_MS / 1000 + 60) == 0
            st = _editors(daemon)
            assert st["sessions"] == 1 and st["initializing"] == 0, st
            await asyncio.sleep(INIT_MS / 1000 + 0.5)  # idle past the deadline: it stays open
            await inline(client, uri, 1, 10)
            assert (await stats(client))["daemon"].startswith(st["socket"] + "#")
    finally:
        for s in silent:
            s.close()
    after = _editors(daemon)
    closed = (after["evicted"] - before["evicted"]) + (after["timed_out"] - before["timed_out"])
    assert closed >= 200, after
    assert after["timed_out"] > before["timed_out"], after  # the last CAP - 1 or so
    assert after["refused"] == before["refused"], after  # none had sent initialize


def test_an_idle_initialized_session_outlives_the_deadline(daemon):
    """An editor session idle after initialize outlives the initialize deadline and still
    answers shutdown."""
    editor = RawEditor(daemon)
    try:
        assert "capabilities" in editor.initialize()
        time.sleep(2 * INIT_MS / 1000)  # no timeout after initialize, however idle
        assert editor.request("shutdown")["result"] is None
    finally:
        editor.close()


def test_an_initialize_dribbled_byte_by_byte_is_closed_at_the_deadline(daemon):
    """The deadline is for the whole initialize, not per read: a client sending a byte
    of its header every 100 ms is closed anyway."""
    before = _editors(daemon)["timed_out"]
    s = _connect(daemon)
    stop = threading.Event()

    def dribble():
        for b in b"Content-Length: 1" + b"0" * 1000:
            if stop.wait(0.1):
                return
            try:
                s.send(bytes([b]))
            except OSError:
                return

    t = threading.Thread(target=dribble)
    t.start()
    try:
        assert wait_closed([s], timeout=INIT_MS / 1000 + 60) == 0
    finally:
        stop.set()
        t.join()
        s.close()
    assert _editors(daemon)["timed_out"] == before + 1


def test_bytes_that_are_not_lsp_are_dropped_before_the_deadline(daemon):
    """No LSP framing: closed, nothing written back. Framed but no message (a
    newcomer's garbage through `assistd lsp` got no answer at all): the JSON-RPC error
    the in-process server gives (id null), then closed."""
    from tests.lsp_helpers import read_message

    before = _editors(daemon)
    for junk, code in ((b"GET / HTTP/1.1\r\nHost: assistd\r\n\r\n", None),
                       (b"Content-Length: 5\r\n\r\nhello", -32700),  # not JSON
                       (b"Content-Length: 2\r\n\r\n[]", -32600),  # JSON, no JSON-RPC
                       (b"Content-Length: 99999999999\r\n\r\n", None)):  # over the limit
        s = _connect(daemon)
        s.sendall(junk)
        if code is not None:
            answer = read_message(s)
            assert answer["id"] is None and answer["error"]["code"] == code, answer
        assert _closed_at_once(s)
        s.close()
    after = _editors(daemon)
    assert after["not_lsp"] == before["not_lsp"] + 4, after
    assert after["timed_out"] == before["timed_out"], after  # closed for the bytes, not late


def test_messages_before_initialize_reach_the_server(daemon):
    """A notification sent before initialize (read by the daemon while it waits for
    initialize) is passed on with it: the session works as without the wait."""
    editor = RawEditor(daemon)
    try:
        editor.sock.sendall(_frame({"jsonrpc": "2.0", "method": "$/setTrace",
                                    "params": {"value": "off"}}))
        assert "capabilities" in editor.initialize()
        assert editor.request("shutdown")["result"] is None
    finally:
        editor.close()


def test_a_request_before_initialize_is_answered_server_not_initialized(daemon):
    """Through the daemon a request before initialize got no answer at all, until the
    deadline closed the connection (a break-it pass); the in-process server answered
    -32002. Now both do, and the session then initializes as usual."""
    editor = RawEditor(daemon)
    try:
        for method in ("textDocument/completion", "foo/bar"):
            msg = editor.request(method, {})
            assert msg["error"]["code"] == -32002, msg
        assert "capabilities" in editor.initialize()
        assert editor.request("shutdown")["result"] is None
    finally:
        editor.close()


# -- the cap ---------------------------------------------------------------------------


def test_at_the_cap_the_oldest_uninitialized_goes_then_new_ones_are_refused(daemon):
    """At the editor-session cap the oldest uninitialized connection is closed to make room;
    with every slot initialized a new connection is refused (counted and logged); when one
    editor leaves the next is served."""
    # The sessions of the tests before have ended (they end a moment after their close).
    assert wait_for(lambda: _editors(daemon)["sessions"] + _editors(daemon)["initializing"] == 0)
    before = _editors(daemon)
    assert before["cap"] == CAP and before["initialize_timeout_s"] == INIT_MS / 1000
    silent = _connect(daemon)
    assert wait_for(lambda: _editors(daemon)["initializing"] == 1)
    editors = []
    try:
        for _ in range(CAP):  # the last one takes the silent one's place
            editors.append(RawEditor(daemon))
            editors[-1].initialize()
        assert _closed_at_once(silent)
        st = _editors(daemon)
        assert st["sessions"] == CAP and st["evicted"] == before["evicted"] + 1, st
        # Every slot holds an editor: a new connection is closed, the editors go on.
        refused = _connect(daemon)
        assert _closed_at_once(refused)
        refused.close()
        st = _editors(daemon)
        assert st["refused"] == before["refused"] + 1 and st["sessions"] == CAP, st
        assert all(e.request("shutdown")["result"] is None for e in editors[1:])
        # One editor leaves: the next one is served.
        editors.pop(0).close()
        assert wait_for(lambda: _editors(daemon)["sessions"] == CAP - 1)
        editors.append(RawEditor(daemon))
        assert "capabilities" in editors[-1].initialize()
    finally:
        silent.close()
        for e in editors:
            e.close()
    log = [json.loads(x)["msg"] for x in daemon.log.read_text().splitlines()]
    assert any(m.startswith(f"editor connection refused: all {CAP} editor sessions") for m in log)
    assert wait_for(lambda: _editors(daemon)["sessions"] == 0)


# -- out of descriptors ---------------------------------------------------------------------


def test_out_of_descriptors_the_editor_socket_pauses_and_goes_on(tmp_path):
    """A real EMFILE: at a limit of 64 descriptors and the default cap of 64 sessions,
    150 silent connections run the daemon out of descriptors in the editor socket's
    accept. It pauses, logs it (rate limited), frees descriptors at the deadline and
    serves an editor afterwards; the API answers too, and the daemon stops cleanly."""
    d = start_daemon(tmp_path, env={"ASSISTD_EDITOR_INITIALIZE_TIMEOUT_MS": str(INIT_MS)},
                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    burst = []
    try:
        burst = [_connect(d) for _ in range(150)]  # the backlog (128) holds the rest

        def status():  # the API shares the descriptors: it may have to retry
            try:
                return _editors(d)
            except Exception:  # noqa: BLE001 - out of descriptors for this request
                return None

        assert wait_for(lambda: (status() or {}).get("accept_errors", 0) >= 1)
        assert wait_closed(burst, timeout=INIT_MS / 1000 * 10 + 60) == 0
        editor = RawEditor(d)
        assert "capabilities" in editor.initialize()
        editor.close()
        st = _editors(d)
        assert st["timed_out"] >= 1 and st["cap"] == 64, st
        with d.uds(60) as c:
            assert c.get("/healthz").status_code == 200
    finally:
        for s in burst:
            s.close()
        assert d.stop() == 0
    lines = [json.loads(x)["msg"] for x in d.log.read_text().splitlines()]
    emfile = [m for m in lines if m.startswith("editor socket: accept failed")]
    assert 1 <= len(emfile) <= 3, emfile  # rate limited: one per window


def test_the_settings_are_checked(tmp_path):
    """editor_initialize_timeout_ms and max_editor_sessions default to 30,000 and 64; zero,
    negative or non-numeric values are refused naming the setting."""
    from assistd.ground.errors import InputError
    from assistd.serving.config import load_config

    empty = tmp_path / "config.toml"  # not the user's own file
    empty.write_text("")
    config, _ = load_config(empty, environ={})
    assert (config.editor_initialize_timeout_ms, config.max_editor_sessions) == (30_000, 64)
    for name, value in (("MAX_EDITOR_SESSIONS", "0"), ("EDITOR_INITIALIZE_TIMEOUT_MS", "-5"),
                        ("MAX_EDITOR_SESSIONS", "many")):
        with pytest.raises(InputError, match=name.lower()):
            load_config(empty, environ={f"ASSISTD_{name}": value})


# -- `assistd lsp --tcp`'s gate -----------------------------------------------------------


def test_the_tcp_gate_closes_a_dribbled_handshake_at_its_deadline(monkeypatch):
    """A bug found here: the gate's handshake deadline was a timeout per read, so a byte
    every 100 ms held one of its 8 unauthenticated slots for as long as the client
    liked (8 such clients locked every editor out). The gate's deadline is set shorter
    than its 30 s (the module's constant) so the test need not wait that long."""
    from assistd.serving import lsp_host

    monkeypatch.setattr(lsp_host, "HANDSHAKE_S", 1.0)
    gate = lsp_host.LspTcpGate(("127.0.0.1", 0), "a token", connect=lambda: pytest.fail(
        "a connection without the token reached the server"))
    address = gate.bind()
    threading.Thread(target=gate.serve_forever, daemon=True).start()
    s = socket.create_connection(address, timeout=30)
    stop = threading.Event()

    def dribble():  # 1,000 header bytes, 100 s at this pace (the header limit is 1 KB)
        for b in b"Content-Length: 1" + b"0" * 1000:
            if stop.wait(0.1):
                return
            try:
                s.send(bytes([b]))
            except OSError:
                return

    t = threading.Thread(target=dribble)
    t.start()
    try:
        assert wait_closed([s], timeout=30) == 0
    finally:
        stop.set()
        t.join()
        s.close()
        gate.close()
