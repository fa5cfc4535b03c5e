"""Editor connections hosted by the daemon, on a Unix socket of their own.

``assistd lsp`` with a daemon running is a byte pipe between the editor's stdio and
this socket (:func:`assistd.serving.client.pipe_lsp`); the language server itself runs
here, one per connection, on a thread of its own, with every engine call on the
daemon's scheduler at editor priority. Which server runs is registered by the CLI
(``serve(..., lsp_host=factory)``): the serving layer knows no editor. A factory is
called as ``factory(runtime, executor, reader, writer, label=...)`` and returns when
the client disconnects; the session ends with its connection.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from pathlib import Path

from assistd.runtime.scheduler import EDITOR

log = logging.getLogger("assistd.daemon")


def lsp_socket_for(api_socket: Path) -> Path:
    """The editors' socket beside the API's: ``assistd.sock`` -> ``assistd.lsp.sock``."""
    return api_socket.with_name(api_socket.stem + ".lsp" + (api_socket.suffix or ".sock"))


class LspHost:
    """Accepts editor connections on ``sock`` (a listening Unix socket, blocking) and
    serves each with ``factory`` on its own thread (see the module)."""

    def __init__(self, sock: socket.socket, path: Path, factory, service):
        self.sock, self.path, self.factory, self.service = sock, path, factory, service
        self.sessions: dict[int, socket.socket] = {}
        self._threads: dict[int, threading.Thread] = {}
        self.served = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="assistd-lsp-host",
                                        daemon=True)

    def start(self) -> None:
        self.sock.setblocking(True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed by stop()
            with self._lock:
                self.served += 1
                n = self.served
                self.sessions[n] = conn
                thread = self._threads[n] = threading.Thread(
                    target=self._serve, args=(n, conn), name=f"assistd-lsp-{n}", daemon=True)
            thread.start()

    def _serve(self, n: int, conn: socket.socket) -> None:
        log.info("editor session %d connected", n)
        try:
            with conn.makefile("rb") as reader, conn.makefile("wb") as writer:
                # The scheduler's own executor (runtime floor): the editor session's
                # calls go down from editors/ into the runtime, never back up here.
                self.factory(self.service.runtime, self.service.scheduler.executor(EDITOR, "lsp"),
                             reader, writer, label=f"{self.path}#{n}")
        except Exception:  # noqa: BLE001 - one editor's failure must not stop the daemon
            log.exception("editor session %d failed", n)
        finally:
            with self._lock:
                self.sessions.pop(n, None)
                self._threads.pop(n, None)
            with contextlib.suppress(OSError):
                conn.close()
            log.info("editor session %d closed", n)

    def stop(self, timeout: float = 10) -> None:
        """Stop accepting, end every session (its reader sees end of file), remove the socket."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone does not
        with contextlib.suppress(OSError):
            self.sock.close()
        with self._lock:
            conns = list(self.sessions.values())
            threads = list(self._threads.values())
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout)
        # Each session closes its completer on the scheduler (its buffers leave the
        # index): let that happen before the caller stops the scheduler.
        for t in threads:
            t.join(timeout)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def status(self) -> dict:
        return {"socket": str(self.path), "sessions": len(self.sessions), "served": self.served}
