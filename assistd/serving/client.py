"""Talk to a running daemon over its Unix socket (httpx).

The front ends (``assistd complete``, ``assistd lsp``, ``assistd mcp``, ``assistd
status``) call :func:`find_daemon`: a client when the socket exists and answers
``/healthz``, else None and they work in-process.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

import httpx

from assistd.ground.errors import AssistdError, InputError
from assistd.ground.process import process_alive


log = logging.getLogger("assistd.lsp")

_PROCESS_ID = re.compile(rb'"processId"\s*:\s*(\d+)')


class DaemonError(AssistdError):
    """The daemon answered with an error (its message says why), or stopped answering."""


def socket_path() -> Path:
    """The socket the daemon listens on, by the same configuration it reads
    (``$ASSISTD_SOCKET``, the config file's ``socket``, else the default)."""
    from assistd.serving.config import Config, load_config

    try:
        config, _ = load_config()
    except AssistdError:
        config = Config(socket=os.environ.get("ASSISTD_SOCKET") or None)
    return config.socket_path()


class DaemonClient:
    """Requests to the daemon at the Unix socket ``path``; ``timeout`` in seconds
    (None: wait as long as the generation takes)."""

    def __init__(self, path: Path, timeout: float | None = None):
        self.path = Path(path)
        self.http = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.path)),
                                 base_url="http://assistd", timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            return self.http.get("/healthz", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def _check(self, r: httpx.Response) -> dict:
        try:
            data = r.json()
        except ValueError:
            raise DaemonError(f"the daemon answered {r.status_code} without JSON") from None
        if r.status_code >= 400:
            msg = (data.get("error") or {}).get("message") if isinstance(data, dict) else None
            cls = InputError if 400 <= r.status_code < 500 else DaemonError
            raise cls(msg or f"the daemon answered {r.status_code}")
        return data

    def get(self, path: str, **params) -> dict:
        try:
            return self._check(self.http.get(path, params=params or None))
        except httpx.HTTPError as e:
            raise DaemonError(f"the daemon on {self.path} stopped answering: {e}") from None

    def post(self, path: str, body: dict, timeout: float | None = None) -> dict:
        try:
            kw = {"timeout": timeout} if timeout is not None else {}
            return self._check(self.http.post(path, json=body, **kw))
        except httpx.HTTPError as e:
            raise DaemonError(f"the daemon on {self.path} stopped answering: {e}") from None


def find_daemon(path: Path | None = None) -> DaemonClient | None:
    """A client of the running daemon, or None when there is none (no socket, or
    nobody answers on it)."""
    path = path or socket_path()
    if not path.exists():
        return None
    client = DaemonClient(path)
    if client.healthy():
        return client
    client.close()
    return None


def pipe_lsp(path: Path, fd_in: int, fd_out: int, *, poll_s: float = 2.0,
             linger_s: float = 10.0) -> None:
    """``assistd lsp`` through the daemon: copy bytes between the editor (file
    descriptors ``fd_in`` and ``fd_out``: stdin and stdout, or one TCP connection twice)
    and the daemon's editor socket ``path`` until the daemon's side closes. The language
    server runs in the daemon (:mod:`assistd.serving.lsp_host`). One thread and
    ``select``: no reader is left blocked on stdin when the process exits. Raises
    :class:`InputError` when the socket does not answer.

    It also ends, closing the session, when the editor is gone: its process (the
    initialize request's ``processId``, or this process's parent) checked every
    ``poll_s`` seconds, or ``linger_s`` seconds after ``fd_in`` reached end of file
    without the daemon closing (a killed extension host sends no ``exit``)."""
    import selectors
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError as e:
        sock.close()
        raise InputError(f"the daemon's editor socket {path} does not answer ({e.strerror});"
                         " restart `assistd serve`, or run `assistd lsp --no-daemon`") from None
    sel = selectors.DefaultSelector()
    try:
        sel.register(fd_in, selectors.EVENT_READ, "editor")
    except PermissionError:  # epoll refuses a regular file (`assistd lsp < requests.txt`)
        sel.close()
        sel = selectors.SelectSelector()  # select() takes it: always readable
        sel.register(fd_in, selectors.EVENT_READ, "editor")
    sel.register(sock, selectors.EVENT_READ, "daemon")
    parent, client, head = os.getppid(), None, b""
    eof_at = None  # monotonic time fd_in reached end of file
    checked = time.monotonic()
    try:
        while True:
            for key, _ in sel.select(poll_s):
                if key.data == "editor":
                    data = os.read(fd_in, 65536)
                    if not data:  # the editor closed its end: the server sees end of file
                        sel.unregister(fd_in)
                        sock.shutdown(socket.SHUT_WR)
                        eof_at = time.monotonic()
                        continue
                    if client is None and len(head) < 65536:  # initialize comes first
                        head += data
                        if m := _PROCESS_ID.search(head):  # 0: not a process here
                            client, head = int(m.group(1)), b""
                            client = client if client > 0 and process_alive(client) else 0
                    sock.sendall(data)
                else:
                    data = sock.recv(65536)
                    if not data:  # the session ended (exit, or the daemon stopped)
                        return
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd_out, view):]
            now = time.monotonic()
            if eof_at is not None and now - eof_at > linger_s:
                log.info("the editor closed its input %.0f s ago: ending the session", linger_s)
                return
            if now - checked >= poll_s:
                checked = now
                if os.getppid() != parent or (client and not process_alive(client)):
                    log.info("the editor's process is gone: ending the session")
                    return
    except OSError as e:  # the editor went away mid-write, or the daemon mid-read
        log.debug("the connection ended: %s", e)
        return
    finally:
        sel.close()
        sock.close()


def pipe_lsp_tcp(path: Path, address: tuple[str, int], token: str,
                 token_path: Path | str = "the token file") -> None:
    """``assistd lsp --tcp`` through the daemon: listen on ``address`` (HOST, PORT) and
    join the editor that sends ``token`` in its initialize request to the daemon's editor
    socket ``path``, one editor at a time (:class:`assistd.serving.lsp_host.LspTcpGate`:
    the same rules as the in-process server), until interrupted. Raises
    :class:`InputError` when the address cannot be bound."""
    import socket

    from assistd.serving.lsp_host import LspTcpGate

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
        except OSError as e:
            sock.close()
            raise InputError(f"the daemon's editor socket {path} does not answer ({e.strerror})")
        return sock

    gate = LspTcpGate(address, token, connect, token_path=token_path)
    gate.bind()
    gate.serve_forever()
