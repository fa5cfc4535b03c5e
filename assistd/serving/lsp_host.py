"""Editor connections hosted by the daemon, on a Unix socket of their own.

``assistd lsp`` with a daemon running is a byte pipe between the editor's stdio and
this socket (:func:`assistd.serving.client.pipe_lsp`); the language server itself runs
here, one per connection, on a thread of its own, with every engine call on the
daemon's scheduler at editor priority. Which server runs is registered by the CLI
(``serve(..., lsp_host=factory)``): the serving layer knows no editor. A factory is
called as ``factory(runtime, executor, reader, writer, label=...)`` and returns when
the client disconnects; the session ends with its connection. A connection that does
not send ``initialize`` in time, or one past the cap of sessions, is closed
(:class:`LspHost`).

:class:`LspTcpGate` is ``assistd lsp --tcp``'s front door, in front of either server
(the daemon's, or one in the ``assistd lsp`` process): the token, one editor at a
time, LSP framing only.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import io
import json
import logging
import selectors
import socket
import threading
import time
from pathlib import Path

from assistd.ground.errors import InputError
from assistd.runtime.scheduler import EDITOR

log = logging.getLogger("assistd.daemon")


def lsp_socket_for(api_socket: Path) -> Path:
    """The editors' socket beside the API's: ``assistd.sock`` -> ``assistd.lsp.sock``."""
    return api_socket.with_name(api_socket.stem + ".lsp" + (api_socket.suffix or ".sock"))


class LspHost:
    """Accepts editor connections on ``sock`` (a listening Unix socket) and serves each
    with ``factory`` on its own thread (see the module), against hostile local clients:

    - a new connection must send LSP ``initialize`` within ``initialize_s`` seconds
      (default ``service.config.editor_initialize_timeout_ms``), else it is closed;
      bytes that are not LSP framing close it at once. After initialize there is no
      timeout: an editor may stay connected and idle for days.
    - at most ``cap`` connections (default ``service.config.max_editor_sessions``),
      initialized or not. At the cap a new connection closes the oldest one that has
      not sent initialize yet; when every one has, the new one is closed instead (and
      logged).
    - out of descriptors or memory in ``accept`` (EMFILE, ENFILE, ENOBUFS, ENOMEM) the
      loop pauses :data:`ACCEPT_BACKOFF_S` and goes on; nothing a client does ends it.

    :meth:`status` counts them (``timed_out``, ``evicted``, ``refused``, ``not_lsp``,
    ``accept_errors``). Log lines are message templates: the daemon's rate limit counts a
    flood of them instead of writing it."""

    def __init__(self, sock: socket.socket, path: Path, factory, service, *,
                 initialize_s: float | None = None, cap: int | None = None):
        self.sock, self.path, self.factory, self.service = sock, path, factory, service
        self.initialize_s = (initialize_s if initialize_s is not None
                             else service.config.editor_initialize_timeout_ms / 1000)
        self.cap = cap if cap is not None else service.config.max_editor_sessions
        self.sessions: dict[int, socket.socket] = {}  # every open connection, oldest first
        self._waiting: dict[int, tuple[socket.socket, float]] = {}  # before initialize: deadline
        self._threads: dict[int, threading.Thread] = {}
        self.served = 0  # connections admitted (numbered by it)
        self.counts = {"timed_out": 0, "evicted": 0, "refused": 0, "not_lsp": 0,
                       "accept_errors": 0}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="assistd-lsp-host",
                                        daemon=True)

    def start(self) -> None:
        self.sock.setblocking(False)
        self._thread.start()

    # -- the accept thread: admits connections, closes those past their deadline -------

    def _accept(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        try:
            while not self._stopping.is_set():
                with self._lock:  # one timeout for all: the oldest deadline comes first
                    first = next(iter(self._waiting.values()), None)
                timeout = None if first is None else max(0.0, first[1] - time.monotonic())
                try:
                    ready = sel.select(timeout)  # stop() wakes it (shutdown)
                    self._reap()
                    if ready and not self._stopping.is_set():
                        self._accept_ready()
                except Exception:  # noqa: BLE001 - the editor socket must outlive any bug
                    log.exception("editor socket: accept loop failed; going on")
                    self._stopping.wait(ACCEPT_BACKOFF_S)
        finally:
            sel.close()

    def _accept_ready(self) -> None:
        for _ in range(128):  # what the backlog holds, then the deadlines again
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if self._stopping.is_set():
                    return
                if e.errno in _OUT_OF_RESOURCES:
                    with self._lock:
                        self.counts["accept_errors"] += 1
                    log.warning("editor socket: accept failed (%s); pausing %g s",
                                e.strerror, ACCEPT_BACKOFF_S)
                    self._stopping.wait(ACCEPT_BACKOFF_S)
                    return
                if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # that client went away before we took it
                raise
            conn.setblocking(True)
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        evicted = thread = None
        with self._lock:
            if len(self.sessions) >= self.cap:
                evicted = next(iter(self._waiting), None)  # the oldest before initialize
                if evicted is not None:
                    self._drop(evicted)
                self.counts["evicted" if evicted is not None else "refused"] += 1
            if len(self.sessions) < self.cap:
                self.served += 1
                n = self.served
                self.sessions[n] = conn
                self._waiting[n] = (conn, time.monotonic() + self.initialize_s)
                thread = self._threads[n] = threading.Thread(
                    target=self._serve, args=(n, conn), name=f"assistd-lsp-{n}", daemon=True)
        if thread is None:
            log.warning("editor connection refused: all %d editor sessions have sent"
                        " initialize (max_editor_sessions)", self.cap)
            _close(conn)
            return
        if evicted is not None:
            log.warning("editor sessions at the cap of %d: closing the oldest connection"
                        " that has not sent initialize", self.cap)
        try:
            thread.start()
        except RuntimeError:  # out of threads: this one is not served
            log.warning("editor connection %d refused: cannot start a thread", n)
            with self._lock:
                self._forget(n)
            _close(conn)

    def _reap(self) -> None:
        """Close the connections that have not sent initialize by their deadline."""
        now, late = time.monotonic(), 0
        with self._lock:
            while self._waiting:
                n, (_, deadline) = next(iter(self._waiting.items()))
                if deadline > now:
                    break
                self._drop(n)
                late += 1
            self.counts["timed_out"] += late
        if late:
            log.info("closed %d editor connection(s) that sent no initialize within %g s"
                     " (editor_initialize_timeout_ms)", late, self.initialize_s)

    def _drop(self, n: int) -> None:
        """End connection ``n`` before its initialize (lock held): its thread then reads
        end of file and closes it. Forgotten now, so it no longer counts."""
        conn, _ = self._waiting[n]
        self._forget(n)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)

    def _forget(self, n: int) -> None:
        self._waiting.pop(n, None)
        self.sessions.pop(n, None)
        self._threads.pop(n, None)

    # -- one connection's thread ---------------------------------------------------------

    def _serve(self, n: int, conn: socket.socket) -> None:
        initialized = False
        try:
            first = self._initialize(n, conn)
            with self._lock:  # the deadline or the cap may have closed it meanwhile
                initialized = first is not None and self._waiting.pop(n, None) is not None
            if not initialized:
                return
            log.info("editor session %d connected", n)
            with io.BufferedReader(_Prefixed(first, conn)) as reader, \
                    conn.makefile("wb") as writer:
                # The scheduler's own executor (runtime floor): the editor session's
                # calls go down from editors/ into the runtime, never back up here.
                self.factory(self.service.runtime, self.service.scheduler.executor(EDITOR, "lsp"),
                             reader, writer, label=f"{self.path}#{n}")
        except Exception:  # noqa: BLE001 - one editor's failure must not stop the daemon
            log.exception("editor session %d failed", n)
        finally:
            with self._lock:
                self._forget(n)
            _close(conn)
            if initialized:
                log.info("editor session %d closed", n)

    def _initialize(self, n: int, conn: socket.socket) -> bytes | None:
        """Read ``conn`` up to its initialize request: returns the bytes for the server
        (the notifications so far, framed again, and what came after them), or None when
        the connection ends first or is not LSP. A request before initialize is answered
        here with ServerNotInitialized (-32002)."""
        buf, before, size = bytearray(), [], 0
        while True:
            try:
                msg = read_message(conn, buf)
            except NotLsp as e:
                with self._lock:
                    self.counts["not_lsp"] += 1
                log.warning("editor connection dropped: %s", e)
                if e.code is not None:  # framed, so an LSP peer: say why before closing
                    try:
                        conn.sendall(_frame({"jsonrpc": "2.0", "id": None, "error": {
                            "code": e.code, "message": f"{e}; closing the connection"}}))
                    except OSError:
                        pass
                return None
            except OSError:  # reset, or shut down by the deadline or the cap
                return None
            if msg is None or msg.get("method") == "exit":
                return None
            method = msg.get("method")
            if isinstance(method, str) and method != "initialize" and msg.get("id") is not None:
                # A request before initialize: ServerNotInitialized, as the LSP says (the
                # in-process server answers the same); it never reaches the server.
                try:
                    conn.sendall(_frame({"jsonrpc": "2.0", "id": msg["id"], "error": {
                        "code": -32002, "message": f"{method[:100]}: the server is not"
                                                   " initialized; send initialize first"}}))
                except OSError:
                    return None
                continue
            frame = _frame(msg)
            before.append(frame)
            size += len(frame)
            if msg.get("method") == "initialize" and msg.get("id") is not None:
                return b"".join(before) + bytes(buf)
            if size > MAX_BODY:
                with self._lock:
                    self.counts["not_lsp"] += 1
                log.warning("editor connection dropped: over %d bytes before initialize",
                            MAX_BODY)
                return None

    def stop(self, timeout: float = 10) -> None:
        """Stop accepting, end every session (its reader sees end of file), remove the socket."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept thread's select()
        if self._thread.is_alive():
            self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self.sock.close()
        with self._lock:
            conns = list(self.sessions.values())
            threads = list(self._threads.values())
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        # Each session closes its completer on the scheduler (its buffers leave the
        # index): let that happen before the caller stops the scheduler.
        for t in threads:
            t.join(timeout)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def status(self) -> dict:
        """``sessions``: initialized editor sessions open; ``initializing``: connections
        yet to send initialize; ``served``: connections admitted; ``cap``;
        ``initialize_timeout_s``; and the counts of closed connections (see the class)."""
        with self._lock:
            waiting, open_ = len(self._waiting), len(self.sessions)
        return {"socket": str(self.path), "sessions": open_ - waiting, "initializing": waiting,
                "served": self.served, "cap": self.cap,
                "initialize_timeout_s": self.initialize_s, **self.counts}


ACCEPT_BACKOFF_S = 0.5  # out of descriptors: the pause before accepting again
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _close(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        conn.close()


class _Prefixed(io.RawIOBase):
    """The reading side of ``conn``, after ``prefix`` (bytes read from it already)."""

    def __init__(self, prefix: bytes, conn: socket.socket):
        self._prefix, self._conn = memoryview(prefix), conn

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._prefix:
            n = min(len(b), len(self._prefix))
            b[:n], self._prefix = self._prefix[:n], self._prefix[n:]
            return n
        try:
            return self._conn.recv_into(b)
        except (ConnectionResetError, BrokenPipeError):
            return 0  # the editor went away: end of file


# -- `assistd lsp --tcp`: the gate in front of a language server -------------------------
#
# Both transports (`assistd lsp --no-daemon --tcp`: the server in this process;
# `assistd lsp --tcp` with a daemon: the server in the daemon) put this gate between
# TCP and the server, so the rules live in one place: an editor proves itself with the
# token in its initialize request before a byte reaches the server; one editor at a
# time; nothing but LSP framing (a browser's HTTP request is dropped unread).

TCP_TOKEN_KEY = "token"  # initializationOptions.token (or initializationOptions.assistd.token)
HANDSHAKE_S = 30.0  # an unauthenticated connection is dropped after this long
MAX_HEADER = 1024  # bytes of one message's header block
MAX_BODY = 4 << 20  # bytes of one message before authentication (initialize is ~10 KB)
MAX_PENDING = 8  # unauthenticated connections at once
SECOND_EDITOR_WAIT_S = 10.0  # an editor that proves itself while another is joined waits this long
_HEADERS = (b"content-length:", b"content-type:")


class NotLsp(Exception):
    """The peer sent something other than LSP's base protocol (an HTTP request, garbage).
    ``code``: the JSON-RPC error a well-framed body gets before the connection closes
    (-32700 not JSON, -32600 no JSON-RPC message), as the in-process server answers;
    None for bytes that are no LSP framing at all (nothing is written back)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


def _frame(payload: dict) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _recv(conn: socket.socket, size: int, deadline: float | None) -> bytes:
    if deadline is not None:  # for the whole message: a byte at a time must not extend it
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline has passed")
        conn.settimeout(left)
    return conn.recv(size)


def read_message(conn: socket.socket, buf: bytearray, deadline: float | None = None
                 ) -> dict | None:
    """One LSP message from ``conn`` (``buf``: bytes already read, consumed in place), or
    None at end of file. Raises :class:`NotLsp` at the first byte that cannot be LSP
    framing (each header line must be Content-Length or Content-Type), and
    ``TimeoutError`` per the socket's timeout, or once ``deadline`` (``time.monotonic()``
    seconds; it sets the socket's timeout) has passed."""
    while True:
        end = buf.find(b"\r\n\r\n")
        head = bytes(buf[:end if end >= 0 else len(buf)]).lower()
        for line in head.split(b"\r\n"):
            line = line.rstrip(b"\r")  # a line end may arrive in two reads
            if line and not any(line[:len(h)] == h[:len(line)] for h in _HEADERS):
                raise NotLsp(f"not LSP framing: {bytes(buf[:40])!r}")
        if end > MAX_HEADER or (end < 0 and len(buf) > MAX_HEADER):
            raise NotLsp("header block too long")
        if end >= 0:
            break
        data = _recv(conn, 4096, deadline)
        if not data:
            return None
        buf += data
    length = None
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            value = line.split(b":", 1)[1].strip()
            length = int(value) if value.isdigit() else None
    if length is None or length > MAX_BODY:
        raise NotLsp("missing, malformed or oversized Content-Length")
    del buf[:end + 4]
    while len(buf) < length:
        data = _recv(conn, 65536, deadline)
        if not data:
            return None
        buf += data
    body = bytes(buf[:length])
    del buf[:length]
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise NotLsp("body is not JSON", -32700) from None
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        raise NotLsp("not a JSON-RPC 2.0 message", -32600)
    return msg


def take_token(params) -> str | None:
    """Remove and return the token from initialize ``params`` (``initializationOptions.token``
    or ``initializationOptions.assistd.token``): the server never sees it."""
    opts = params.get("initializationOptions") if isinstance(params, dict) else None
    found = None
    for holder in (opts, opts.get("assistd") if isinstance(opts, dict) else None):
        if isinstance(holder, dict) and TCP_TOKEN_KEY in holder:
            value = holder.pop(TCP_TOKEN_KEY)
            found = found or (value if isinstance(value, str) else None)
    return found


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways between ``a`` and ``b`` until either side ends."""
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    try:
        while True:
            for key, _ in sel.select():
                data = key.fileobj.recv(65536)
                if not data:
                    return
                key.data.sendall(data)
    except OSError:  # one side went away mid-copy
        return
    finally:
        sel.close()


class LspTcpGate:
    """Listens on loopback ``address`` (HOST, PORT) for one editor at a time and joins
    the one that proves itself to the language server ``connect()`` returns (a
    connected stream socket, called once per authenticated editor).

    Before authentication: requests get ServerNotInitialized (-32002), an initialize
    without the right ``token`` InvalidRequest (-32600, naming ``token_path``),
    notifications are dropped, and a connection whose bytes are not LSP framing, or
    that has not proved itself within :data:`HANDSHAKE_S`, is closed. While an editor is
    joined, another that proves itself waits up to :data:`SECOND_EDITOR_WAIT_S` for it to
    leave (a reloaded window reconnects before its old session ends), then gets
    InvalidRequest naming the reason and is closed; the joined session goes on. ``once``:
    stop after the first session (the in-process server lives as long as its editor).
    :meth:`bind` raises :class:`InputError` when the address cannot be bound."""

    def __init__(self, address: tuple[str, int], token: str, connect, *,
                 token_path: Path | str = "the token file", once: bool = False):
        self.address, self.token, self.connect, self.once = address, token, connect, once
        self.token_path = token_path
        self.sock: socket.socket | None = None
        self._busy = False  # an editor is joined
        self._pending = 0
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)  # notified when the editor leaves
        self._done = threading.Event()

    def bind(self) -> tuple[str, int]:
        """Bind and listen; returns the address (the port, when 0 was asked for)."""
        family = socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(self.address)
        except OSError as e:
            self.sock.close()
            raise InputError(f"cannot listen on {self.address[0]}:{self.address[1]}:"
                             f" {e.strerror}") from None
        self.sock.listen(8)
        return self.sock.getsockname()[:2]

    def serve_forever(self) -> None:
        """Accept until :meth:`close` (or, with ``once``, the first session's end)."""
        if self.sock is None:
            self.bind()
        while not self._done.is_set():
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return  # closed
            with self._lock:
                refuse = ("too many unauthenticated connections"
                          if self._pending >= MAX_PENDING else None)
                if refuse is None:
                    self._pending += 1
            if refuse is not None:
                log.info("lsp --tcp: refused %s: %s", peer, refuse)
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
                continue
            threading.Thread(target=self._handle, args=(conn, peer), daemon=True,
                             name="assistd-lsp-tcp").start()

    def close(self) -> None:
        self._done.set()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
            self.sock.close()

    def _handle(self, conn: socket.socket, peer) -> None:
        joined = False
        try:
            with conn:
                buf = bytearray()
                try:
                    first = self._handshake(conn, buf, peer)
                finally:
                    with self._lock:
                        self._pending -= 1
                if first is None:
                    return
                with self._free:
                    # The editor before may be leaving (a reloaded window reconnects at
                    # once, before its old session has ended): give it a moment.
                    self._free.wait_for(lambda: not self._busy, timeout=SECOND_EDITOR_WAIT_S)
                    joined, self._busy = not self._busy, True
                if not joined:  # another editor is connected: one at a time
                    log.info("lsp --tcp: refused %s: another editor is connected", peer)
                    conn.sendall(_frame({"jsonrpc": "2.0", "id": first.get("id"), "error": {
                        "code": -32600, "data": {"retry": False}, "message":
                        "assistd lsp --tcp serves one editor at a time, and another is"
                        " connected"}}))
                    return
                log.info("lsp --tcp: editor %s connected", peer)
                conn.settimeout(None)
                with self.connect() as upstream:
                    upstream.sendall(_frame(first) + bytes(buf))
                    _relay(conn, upstream)
                    with contextlib.suppress(OSError):
                        upstream.shutdown(socket.SHUT_WR)  # the server sees end of file
                log.info("lsp --tcp: editor %s disconnected", peer)
        except OSError as e:  # the peer went away, or stopped reading our answers
            log.info("lsp --tcp: connection %s ended: %s", peer, e)
        except Exception:  # noqa: BLE001 - one connection's failure must not stop the gate
            log.exception("lsp --tcp: connection %s failed", peer)
        finally:
            if joined:
                with self._free:
                    self._busy = False
                    self._free.notify_all()
                if self.once:
                    self.close()

    def _handshake(self, conn: socket.socket, buf: bytearray, peer) -> dict | None:
        """Answer ``conn`` until it sends initialize with the token: returns that
        request (the token removed), or None when the connection is to be dropped."""
        deadline = time.monotonic() + HANDSHAKE_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                log.info("lsp --tcp: %s did not authenticate in %.0f s", peer, HANDSHAKE_S)
                return None
            try:
                msg = read_message(conn, buf, deadline)
            except NotLsp as e:
                log.warning("lsp --tcp: dropped %s: %s", peer, e)
                return None
            except OSError:  # timed out or reset
                return None
            if msg is None:
                return None
            method, msg_id = msg.get("method"), msg.get("id")
            if method == "exit":
                return None
            if not isinstance(method, str) or msg_id is None:
                continue  # a notification or a response: dropped before initialize
            if method == "initialize":
                token = take_token(msg.get("params"))
                if token is not None and hmac.compare_digest(token.encode(), self.token.encode()):
                    return msg
                error = {"code": -32600, "data": {"retry": False}, "message":
                         "assistd lsp --tcp: initializationOptions.token is missing or wrong"
                         f" (the token is in {self.token_path})"}
                log.warning("lsp --tcp: %s sent initialize without the right token", peer)
            else:
                error = {"code": -32002, "message": f"{method}: send initialize with"
                         " initializationOptions.token first (assistd lsp --tcp)"}
            conn.sendall(_frame({"jsonrpc": "2.0", "id": msg_id, "error": error}))
