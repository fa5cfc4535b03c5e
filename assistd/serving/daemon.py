"""``assistd serve``: one process owns the Target, the history and the watchers.

Listens on a Unix socket created 0600 inside a 0700 directory, and optionally on
loopback TCP with a bearer token read from a 0600 file (created with a random token
when missing). The watcher thread keeps the configured repositories and agent
transcripts in the history (its own SQLite connection; the engine's index follows
the store's change log). SIGTERM and SIGINT stop accepting, let the request in
hand finish (its ledger row is written with it), stop the watcher after its batch,
close the store and remove the socket.

Against hostile local clients (:class:`ConnectionGuard`): a connection must send a
whole request within ``header_timeout_ms``, each transport holds at most
``max_connections`` (the idle or slow ones make room for new ones), the descriptor
limit is raised to the hard one and the cap fitted into it; out of descriptors anyway,
asyncio pauses accepting for a second and the daemon carries on. The log goes through
:data:`LOG_LIMIT`: a flood of one message is counted, not written. The watcher is
restarted with a backoff when something kills it (:class:`WatcherThread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import stat
import threading
import time
from pathlib import Path

from assistd.serving.config import Config
from assistd.ground.errors import InputError
from assistd.ground.logs import RateLimitFilter
from assistd.ground.loopback import LOOPBACK_HOSTS

log = logging.getLogger("assistd.daemon")


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (+ exc)."""

    def format(self, record):
        out = {"ts": round(record.created, 3), "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


LOG_LIMIT = RateLimitFilter()  # one per process: every handler the daemon logs through


def setup_logging(config: Config) -> Path:
    """Structured (JSON lines) log to the log file, human lines to stderr; both through
    :data:`LOG_LIMIT` (a repeated message is counted, not repeated: a flood of bad
    requests must not fill the disk). uvicorn's loggers propagate to them."""
    path = config.log_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():  # the log names files and repositories: private, like the history
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    level = getattr(logging, config.log_level.upper())
    LOG_LIMIT.window_s = config.log_repeat_window_ms / 1000
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(level)
    fh = logging.FileHandler(path)
    fh.setFormatter(_JsonFormatter())
    eh = logging.StreamHandler()
    eh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for h in (fh, eh):
        h.addFilter(LOG_LIMIT)
        root.addHandler(h)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    # httpx says every request at INFO: the probe of a daemon already running, a remote
    # Target's every round. Its warnings and errors still come.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return path


def read_or_create_token(path: Path) -> str:
    """The bearer token in ``path`` (0600), created with 32 random bytes if missing.
    Raises :class:`InputError` when the file is readable by others."""
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise InputError(f"token file {path} has mode {mode:o}; it must be private:"
                             f" chmod 600 {path}")
        token = path.read_text(encoding="utf-8").strip()
        if not token:
            raise InputError(f"token file {path} is empty; delete it to get a new token")
        return token
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def socket_answers(path: Path, timeout: float = 2.0) -> bool:
    """True when a daemon answers ``GET /healthz`` on the Unix socket ``path``."""
    if not path.exists():
        return False
    try:
        import httpx

        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)),
                          timeout=timeout) as c:
            return c.get("http://assistd/healthz").status_code == 200
    except Exception:  # noqa: BLE001 - refused, stale, a non-daemon: not ours
        return False


def bind_unix(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600, in a directory of mode 0700.

    A stale socket (nobody answers) is replaced; a live daemon is an error."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    if path.exists() or path.is_symlink():
        if socket_answers(path):
            raise InputError(f"a daemon already answers on {path}; `assistd status` shows it")
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise InputError(f"{path} exists and is not a socket; remove it or set socket")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # created 0600: no window in which others may connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def bind_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


# -- connection limits ---------------------------------------------------------------

# Descriptors kept beside the caps: ~20 at rest (the store, the model, the sockets),
# and asyncio accepts up to 100 connections in a burst before the guard closes any.
FD_RESERVE = 128


# Descriptors an editor session holds in the daemon (its socket, the server's pipes).
FDS_PER_EDITOR = 4


def raise_fd_limit(max_connections: int, transports: int, editors: int = 0) -> int:
    """Raise the soft descriptor limit to the hard one, and return the connection cap
    per transport that fits in it: ``max_connections``, or less (with a warning) when
    ``transports`` caps plus :data:`FD_RESERVE` and ``editors`` sessions (the editor
    socket's cap) would not fit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        return max_connections
    fit = max(8, (soft - FD_RESERVE - FDS_PER_EDITOR * editors) // max(transports, 1))
    if fit < max_connections:
        log.warning("max_connections = %d per transport does not fit the descriptor limit"
                    " of %d; using %d", max_connections, soft, fit)
    return min(max_connections, fit)


class ConnectionGuard:
    """What uvicorn does not do for the daemon: a deadline on every request, and a cap
    on the connections of each transport (Unix socket, TCP).

    ``header_timeout_s``: a connection must deliver a whole request (headers and body)
    within this many seconds of connecting or of its previous response, or it is
    closed (a slowloris never finishes its headers; uvicorn's keep-alive timeout
    starts only after a response). ``cap``: connections per transport. At the cap a
    new connection closes the oldest one that is waiting for a request (idle, or
    sending one slowly: never one whose request is in hand, which over TCP has passed
    the token check) so junk cannot starve a real client; when every connection has a
    request in hand the new one is closed instead. Counts are in :meth:`status`."""

    def __init__(self, header_timeout_s: float, cap: int):
        self.header_timeout_s, self.cap = header_timeout_s, cap
        self.open: dict[str, dict] = {"unix": {}, "tcp": {}}  # insertion order = age
        self.counts = {"timed_out": 0, "evicted": 0, "refused": 0}

    def admit(self, conn) -> bool:
        """Register ``conn`` (a new connection); False when it must be closed."""
        live = self.open[conn.transport_kind]
        if len(live) >= self.cap:
            oldest = next((c for c in live if c.deadline is not None), None)
            if oldest is None:
                self.counts["refused"] += 1
                log.warning("%s connection refused: all %d connections have a request in"
                            " hand (max_connections)", conn.transport_kind, self.cap)
                return False
            self.counts["evicted"] += 1
            log.warning("%s connections at the cap of %d: closing the oldest one waiting"
                        " for a request", conn.transport_kind, self.cap)
            oldest.close_idle()
        live[conn] = None
        return True

    def forget(self, conn) -> None:
        self.open[conn.transport_kind].pop(conn, None)

    def status(self) -> dict:
        return {"open": {k: len(v) for k, v in self.open.items()}, "cap": self.cap,
                "header_timeout_s": self.header_timeout_s, **self.counts}


def guarded_protocol(guard: ConnectionGuard):
    """uvicorn's h11 protocol class with ``guard``'s deadline and cap."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11(H11Protocol):
        deadline = None  # the TimerHandle while waiting for a request, else None
        transport_kind = "tcp"

        def connection_made(self, transport):
            super().connection_made(transport)
            self.transport_kind = "unix" if self.server and self.server[1] is None else "tcp"
            if not guard.admit(self):
                self.connections.discard(self)
                transport.abort()
                return
            self._arm()

        def connection_lost(self, exc):
            self._disarm()
            guard.forget(self)
            super().connection_lost(exc)

        def handle_events(self):
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete \
                    and not self.cycle.more_body:
                self._disarm()  # the whole request is in: the app has it now

        def on_response_complete(self):
            super().on_response_complete()
            if not self.transport.is_closing() and (
                    self.cycle is None or self.cycle.response_complete):
                self._arm()

        def _arm(self):
            self._disarm()
            self.deadline = self.loop.call_later(guard.header_timeout_s, self._timed_out)

        def _disarm(self):
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _timed_out(self):
            self.deadline = None
            guard.counts["timed_out"] += 1
            log.info("closing a %s connection that sent no whole request in %g s"
                     " (header_timeout_ms)", self.transport_kind, guard.header_timeout_s)
            self.close_idle()

        def close_idle(self):
            self._disarm()
            guard.forget(self)
            if not self.transport.is_closing():
                # A plain close (FIN), as uvicorn's keep-alive timeout does: a client
                # pool sees it and does not reuse the connection.
                self.transport.close()

    return GuardedH11


class WatcherThread:
    """The history watcher on its own thread and SQLite connection.

    Whatever kills a run of the watcher (an unreadable database, a bug), the thread
    logs it and starts it again after a backoff: ``backoff_s`` seconds, doubled after
    each failure up to ``max_backoff_s``, back to ``backoff_s`` once a run has stayed
    up ``healthy_s`` seconds. Meanwhile the API serves without it; :meth:`status` says
    ``state`` ("starting", "scanning", "watching", "restarting", "stopped", or "off":
    never started, ``off_reason`` says why), ``restarts``, ``error`` (the last failure)
    and ``retry_in_s``."""

    def __init__(self, config: Config, tokenize, fingerprint: str, *,
                 backoff_s: float = 1.0, max_backoff_s: float = 60.0,
                 healthy_s: float = 300.0):
        self.config, self.tokenize, self.fingerprint = config, tokenize, fingerprint
        self.backoff_s, self.max_backoff_s, self.healthy_s = backoff_s, max_backoff_s, healthy_s
        self.stop_event = threading.Event()
        self.state = "starting"
        self.batches = 0
        self.restarts = 0
        self.last_batch: dict | None = None
        self.initial: dict | None = None
        self.error: str | None = None
        self.error_at: float | None = None
        self.off_reason: str | None = None  # why it was never started (state "off")
        self.retry_at: float | None = None  # time.time() of the next start, while waiting
        self._thread = threading.Thread(target=self._run, name="assistd-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30) -> None:
        self.stop_event.set()
        if self._thread.ident is not None:  # (never started: off)
            self._thread.join(timeout)

    def status(self) -> dict:
        retry = self.retry_at
        return {"state": self.state, "batches": self.batches, "restarts": self.restarts,
                "initial_scan": self.initial, "last_batch": self.last_batch,
                "error": self.error, "error_at": self.error_at, "off_reason": self.off_reason,
                "retry_in_s": None if retry is None else max(0.0, round(retry - time.time(), 1))}

    def _run(self) -> None:
        delay = self.backoff_s
        while not self.stop_event.is_set():
            began = time.monotonic()
            try:
                self._run_once()
                break  # stopped
            except Exception as e:  # noqa: BLE001 - the API keeps serving; retried below
                self.error, self.error_at = f"{type(e).__name__}: {e}", round(time.time(), 3)
                if time.monotonic() - began >= self.healthy_s:
                    delay = self.backoff_s  # it ran well for a while: a fresh failure
                log.exception("the history watcher failed; restarting it in %g s", delay)
            self.state, self.retry_at = "restarting", time.time() + delay
            if self.stop_event.wait(delay):
                break
            self.retry_at = None
            self.restarts += 1
            delay = min(delay * 2, self.max_backoff_s)
        self.state, self.retry_at = "stopped", None

    def _run_once(self) -> None:
        """One run: open the store, scan, watch until stopped. Raises what fails."""
        from assistd.runtime.runtime import open_store
        from storage.indexer import find_repository_root
        from storage.retention import enforce_budget
        from storage.watcher import HistoryWatcher, default_transcript_locations

        c = self.config
        store = None
        watcher = None
        try:
            self.state = "starting"
            store = open_store(Path(c.db).expanduser() if c.db else None)
            repos = [find_repository_root(Path(r).expanduser()) for r in c.repos]
            locations = [Path(t).expanduser() for t in c.transcripts]
            if c.agent_transcripts:
                locations += default_transcript_locations()
            budget = c.max_history_mb << 20
            protect = [str(r.resolve()) for r in repos]
            watcher = HistoryWatcher(store, self.tokenize, self.fingerprint, repos=repos,
                                     transcripts=locations, max_bytes=c.max_bytes)
            started = time.time()
            watcher.start()  # before the scan: a change made during it is not missed
            self.state = "scanning"
            reports, transcripts = watcher.scan()
            enforce_budget(store, budget, protect, started)
            self.initial = {"repositories": [r.as_dict() for r in reports],
                            "transcripts": transcripts.as_dict()}
            log.info("history scanned: %d repositories, %d transcript files",
                     len(reports), transcripts.files)

            def on_batch(batch):
                self.batches += 1
                self.last_batch = {"events": batch.events, "tokenized": batch.tokenized,
                                   "at": round(time.time(), 3),  # skips as initial_scan's:
                                   "repositories": [r.as_dict() for r in batch.repos],
                                   "transcripts": batch.transcripts.as_dict()}
                if batch.tokenized:
                    enforce_budget(store, budget, protect, batch.started_utc)

            watcher.on_batch = on_batch
            self.state = "watching"
            watcher.run(self.stop_event)
        finally:
            if watcher is not None:
                with contextlib.suppress(Exception):  # already failing: keep the first error
                    watcher.stop()
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()


def target_label(config: Config) -> str:
    """The configured Target in words, for the log: the model file (or the embedded
    default), or a remote server's URL, model name and tokenizer (never its key)."""
    if config.backend != "openai":
        return config.model or "embedded default"
    model = config.target_model or "the server's first"
    tokenizer = config.model or "the server's"
    return f"remote: {config.target_url}, model {model}, tokenizer {tokenizer}"


def serve(config: Config, *, lsp_host=None) -> None:
    """Run the daemon until SIGTERM/SIGINT. ``lsp_host``: the factory of hosted editor
    sessions, served on the socket beside the API's (:mod:`assistd.serving.lsp_host`;
    None: no editor socket). Raises :class:`InputError` (sockets, token) and
    :class:`ModelError` (the Target) before anything is served."""
    from assistd.serving.lsp_host import LspHost, lsp_socket_for

    import uvicorn

    from assistd.serving.api import build_app
    from assistd.serving.service import Service

    tcp = config.tcp_address()
    if tcp is not None and tcp[0] not in LOOPBACK_HOSTS and not config.allow_remote:
        raise InputError(f"tcp = {config.tcp} is not a loopback address; anyone who can reach"
                         " it could use your model and read your history: set allow_remote"
                         " (--allow-remote) to mean it")
    log_path = setup_logging(config)
    token = read_or_create_token(config.token_path()) if tcp is not None else None
    sock_path = config.socket_path()
    if socket_answers(sock_path):  # fail before the load, not after it
        raise InputError(f"a daemon already answers on {sock_path}; `assistd status` shows it")
    service = Service(config)
    log.info("loading the Target (%s)", target_label(config))
    service.start()
    # Listen only once the Target is loaded: a socket that does not answer would make
    # clients wait, and `assistd complete` would rather run in-process meanwhile.
    sockets = []
    lsp_path = lsp_socket_for(sock_path)
    try:
        sockets.append(bind_unix(sock_path))
        if tcp is not None:
            sockets.append(bind_tcp(*tcp))
        if lsp_host is not None:
            service.editors = LspHost(bind_unix(lsp_path), lsp_path, lsp_host, service)
    except BaseException:
        for s in sockets:
            s.close()
        if sockets:
            sock_path.unlink(missing_ok=True)
        service.close()
        raise
    if service.editors is not None:
        service.editors.start()
    watcher = WatcherThread(config, service.target.tokenize, service.target.fingerprint)
    service.watcher = watcher
    if getattr(service.target, "local_tokenizer", True):
        watcher.start()
    else:  # a remote Target tokenizing on its server: the history would be sent there,
        # to no use (nothing drafts against a remote Target). A choice, not a failure.
        watcher.state = "off"
        watcher.off_reason = ("the remote Target's tokenizer is its server's: pass --model"
                              " (the server model's GGUF or Hugging Face folder) to keep the"
                              " history up to date here")
        log.info("history watcher off: %s", watcher.off_reason)
    app = build_app(service, token)
    guard = ConnectionGuard(config.header_timeout_ms / 1000,
                            raise_fd_limit(config.max_connections, len(sockets),
                                           config.max_editor_sessions
                                           if service.editors is not None else 0))
    service.connections = guard
    server = _Server(uvicorn.Config(app, log_config=None, access_log=False,
                                    http=guarded_protocol(guard),
                                    timeout_keep_alive=min(5, guard.header_timeout_s),
                                    timeout_graceful_shutdown=60, lifespan="off"))
    server.service = service

    async def main():
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_exit, sig)
        log.info("serving %s on unix:%s%s; log %s", service.model_id, sock_path,
                 f" and http://{tcp[0]}:{tcp[1]} (bearer token in {config.token_path()})"
                 if tcp else "", log_path)
        await server.serve(sockets=sockets)

    try:
        asyncio.run(main())
    finally:
        log.info("stopping: editor sessions, watcher, engine, store")
        if service.editors is not None:
            service.editors.stop()
        watcher.stop()
        service.close()
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(sock_path.lstat().st_mode):
                sock_path.unlink()
        LOG_LIMIT.log_pending(log)  # formatted, never a bare template
        log.info("stopped")


import uvicorn as _uvicorn  # noqa: E402 - after the helpers that do not need it


class _Server(_uvicorn.Server):
    """uvicorn's server with our signal handling: theirs re-raises the signal after
    serving, which would kill the process before the store is closed."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    def request_exit(self, sig: int) -> None:
        # Generations end at their next round with what they have (a stream gets its
        # final chunk and [DONE]), their ledgers recorded; then the connections close.
        n = self.service.cancel_all()
        log.info("signal %s: stopping %d generations in hand", signal.Signals(sig).name, n)
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True
