"""``assistd lsp``: the language server (pygls 2) for VS Code, Neovim and any LSP client.

Thin layer over :class:`editors.completer.Completer`: the event loop owns the
protocol and the documents (pygls applies incremental changes), one worker thread
owns the engine. A request snapshots the document and queues a job; the loop keeps
answering ``didChange`` while the worker generates.

Cancellation and supersession (docs/design.md, "Editors"): ``$/cancelRequest`` cancels the handler's
task, which sets the job's cancel flag; the engine checks it before every round.
A newer completion request for the same document sets the older one's flag: the
older gets an empty answer, so every request id gets exactly one response.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcServerNotInitialized,
)
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, default_converter

from assistd import __version__
from assistd.ground.errors import AssistdError
from assistd.ground.process import process_alive
from assistd.runtime.runtime import LOADING
from editors.completer import Completer, Request, Suggestion
from editors.positions import PositionError, offset_at
from editors.settings import Settings, parse_settings

log = logging.getLogger("assistd.lsp")

CLIENT_POLL_S = 2.0  # how often the client's process (initialize's processId) is checked
# One message's body at most (a didOpen of a 100 MB file fits). A longer Content-Length
# is refused before its body is read: InvalidRequest (id null: the id is in the body),
# the body skipped unread, the session goes on; reading it whole could exhaust memory.
MAX_MESSAGE_BYTES = 256 << 20
# A URI's characters at most (``uri``, ``rootUri``, ... anywhere in a message's params):
# any real path fits (PATH_MAX is 4096 bytes, three characters each percent-encoded).
# A message holding a longer one is refused before pygls reads it (a request gets
# InvalidParams, a notification is dropped): a 1 MiB URI took 27 s of the engine's
# thread to resolve, which every editor of the daemon shares.
MAX_URI_CHARS = 16384
# A log record's message at most, in characters (its traceback too): what a client
# sends (a URI, a method name, a parse error quoting the body) is never written whole.
MAX_LOG_LINE_CHARS = 4000
SKIP_CHUNK_BYTES = 1 << 20  # an over-long body is read and dropped this much at a time
# The client went away mid-write: the end of the session, not an error.
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class _QuietProtocol(logging.Filter):
    """pygls logs every message it sends at INFO (suggestions are the user's code: not
    for a log kept at info) and a client's invalid params or a cancelled request as an
    ERROR with a traceback. Keep its warnings and real errors; the rest only at DEBUG."""

    # pygls's records that carry a message's content (the user's code, the token in
    # initializationOptions): logged at DEBUG with sizes only, the kept args by index.
    PAYLOAD = {"Sending data: %s": (), "Received result for message \"%s\": %s": (0,),
               "Sending notification: '%s' %s": (0,),
               "Sending request with id \"%s\": %s %s": (0, 1),
               "Client response for %s received: %s": (), "Language server initialized %s": (),
               "Workspace folders changed: %s": ()}

    def filter(self, record: logging.LogRecord) -> bool:
        keep = self.PAYLOAD.get(record.msg) if isinstance(record.msg, str) else None
        if keep is not None and isinstance(record.args, tuple):
            record.args = tuple(a if i in keep else f"<{len(str(a))} chars>"
                                for i, a in enumerate(record.args))
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        exc = record.exc_info[1] if record.exc_info else None
        # pygls puts the traceback of params that do not deserialize in the message text;
        # the client gets InvalidParams and the log one warning line naming the method.
        # A body that is not JSON (or nests past the recursion limit) is answered -32700
        # by report_server_error, and logged there in one line.
        if isinstance(exc, (JsonRpcException, asyncio.CancelledError, *_GONE)) or (
                record.msg == "Unable to deserialize message\n%s") or (
                record.msg == "Unable to handle message" and isinstance(exc, _NOT_JSON)):
            if isinstance(exc, JsonRpcException):  # a client's error: one line at debug
                record.msg, record.args = f"{record.getMessage()} ({exc})", ()
                record.exc_info = record.exc_text = None
            return logging.getLogger("assistd").isEnabledFor(logging.DEBUG)
        return record.levelno >= logging.WARNING or logging.getLogger(
            "assistd").isEnabledFor(logging.DEBUG)


def _cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text)} characters, cut]"


class _CapLines(logging.Filter):
    """No record longer than :data:`MAX_LOG_LINE_CHARS` (and a few characters saying
    so): its long arguments are cut, keeping the message template (the rate limit's
    key), else its whole message; a traceback is cut alike. Put on the loggers a
    session writes through."""

    def filter(self, record: logging.LogRecord) -> bool:
        limit = MAX_LOG_LINE_CHARS
        try:
            text = record.getMessage()
        except (TypeError, ValueError):  # bad arguments: logging reports it itself
            return True
        if len(text) > limit:
            args = record.args if isinstance(record.args, tuple) else ()
            template, cut = str(record.msg), None
            if args and len(template) < limit // 2:
                share = max(1, (limit - len(template)) // len(args) - 40)
                cut = tuple(_cut(str(a), share) if len(str(a)) > share else a for a in args)
                try:
                    cut = cut if len(template % cut) <= limit else None
                except (TypeError, ValueError):  # a %d given a cut text
                    cut = None
            if cut is not None:
                record.args = cut
            else:
                record.msg, record.args = _cut(text, limit), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and len(record.exc_text) > limit:
            record.exc_text = _cut(record.exc_text, limit)
        return True


# json.loads of a body: JSONDecodeError (a ValueError), bad UTF-8, nesting past the limit.
_NOT_JSON = (json.JSONDecodeError, UnicodeDecodeError, RecursionError)

for _name in ("pygls.protocol.json_rpc", "pygls.protocol.language_server", "pygls.server",
              "pygls.feature_manager"):
    logging.getLogger(_name).addFilter(_QuietProtocol())
for _name in ("assistd.lsp", "assistd.daemon", "pygls.protocol.json_rpc",
              "pygls.protocol.language_server", "pygls.server", "pygls.feature_manager",
              "pygls.io_", "pygls.workspace.workspace", "pygls.workspace.text_document"):
    logging.getLogger(_name).addFilter(_CapLines())

ACCEPTED = "assistd.accepted"
STATS = "assistd.stats"
SHOWN = "assistd/didShowCompletion"
PARTIAL = "assistd/didPartiallyAcceptCompletion"
DISMISSED = "assistd/didDismissCompletion"
# Server -> client: {state, message}, for a status bar or statusline. States:
STATUS = "assistd/status"
READY, ERROR, DISABLED = "ready", "error", "disabled"  # and "loading"


class _Writer:
    """pygls's writer, except that a client gone before reading its answers (Neovim
    does not wait for the shutdown reply) ends the session with one debug line, not a
    BrokenPipeError traceback per unsent message."""

    def __init__(self, writer, on_gone):
        self._writer, self._on_gone, self.gone = writer, on_gone, False
        # The reader's thread answers an over-long message (_BoundedInput) while the
        # event loop may be writing: one message at a time, never interleaved.
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            with self._lock:
                self._writer.write(data)
        except (*_GONE, ValueError) as e:  # ValueError: the stream is closed already
            self.gone = True
            log.debug("the client closed the connection before reading (%s): ending",
                      type(e).__name__)
            self._on_gone()

    def close(self) -> None:
        try:
            self._writer.close()
        except (*_GONE, ValueError):
            pass


class _BoundedInput:
    """stdin as pygls reads it (``readline`` for headers, ``read(n)`` for a body), except
    that a body past :data:`MAX_MESSAGE_BYTES` is refused before it is read: one warning,
    ``refuse(n)`` (the server answers InvalidRequest at once), the body read and dropped
    a chunk at a time, and pygls given ``{}`` with :attr:`skipped` set, which the
    protocol drops (pygls read a body whole, and died with a MemoryError traceback)."""

    def __init__(self, raw, refuse=None):
        self.raw, self.ended, self.skipped, self._refuse = raw, False, False, refuse

    def readline(self) -> bytes:
        return b"" if self.ended else self.raw.readline()

    def read(self, n: int = -1) -> bytes:
        if self.ended:
            return b""
        if n is None or n <= MAX_MESSAGE_BYTES:
            return self.raw.read(n)
        log.warning("a message of %d bytes (Content-Length) is past the %d-byte limit:"
                    " refused unread", n, MAX_MESSAGE_BYTES)
        if self._refuse is not None:
            self._refuse(n)
        left = n
        while left > 0:
            chunk = self.raw.read(min(left, SKIP_CHUNK_BYTES))
            if not chunk:  # the client ended before its body did
                self.ended = True
                return b""
            left -= len(chunk)
        self.skipped = True
        return b"{}"


class _Protocol(LanguageServerProtocol):
    """pygls's protocol, except that every request gets exactly one answer, as LSP's
    lifecycle says (pygls executes requests before ``initialize``, with a -32603 and a
    traceback where the workspace is missing, and ignores those after ``shutdown``, so a
    waiting client hangs):

    - before ``initialize``: ServerNotInitialized (-32002); notifications are dropped;
    - a second ``initialize``, or any request after ``shutdown``: InvalidRequest (-32600);
    - params that do not deserialize (a negative or non-integer position,
      ``position: null``): InvalidParams (-32602).
    """

    _initialize_seen = False

    def set_writer(self, writer, include_headers: bool = True):
        super().set_writer(_Writer(writer, self._server.stop), include_headers)

    def handle_message(self, message):
        skipped = getattr(self._server, "_input", None)
        if message == {} and skipped is not None and skipped.skipped:
            skipped.skipped = False  # an over-long body, answered when its header came
            return
        if not hasattr(message, "jsonrpc"):  # JSON that is no JSON-RPC message: {}, [], 42
            log.warning("a message that is not JSON-RPC (%s): answered InvalidRequest",
                        type(message).__name__)
            self._send_data({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32600, "message": "Invalid Request: not a JSON-RPC 2.0 message"}})
            return
        method = getattr(message, "method", None)
        msg_id = getattr(message, "id", None) if method is not None else None
        refusal = None
        if method == types.EXIT and self._server._stopped:
            return  # the session is ending already (the client is gone)
        if method == types.EXIT or method is None:  # exit, and the client's responses
            pass
        elif method == types.INITIALIZE and not self._initialize_seen:
            self._initialize_seen = True
        elif method == types.INITIALIZE:
            refusal = JsonRpcInvalidRequest("initialize was already sent on this connection")
        elif not self._initialize_seen:
            refusal = JsonRpcServerNotInitialized(f"{method} before initialize")
        elif self._shutdown:
            refusal = JsonRpcInvalidRequest(f"{method} after shutdown: only exit is accepted")
        if refusal is None:
            return super().handle_message(message)
        if msg_id is not None:  # a refused notification is dropped without an answer
            self._send_response(msg_id, error=refusal.to_response_error())
        log.debug("refused %s: %s", method, refusal)

    def structure_message(self, data):
        if isinstance(data, dict) and "jsonrpc" in data and "method" in data:
            n = _long_uri(data.get("params"))
            if n is not None:  # refused before pygls structures (and resolves) it
                method = str(data["method"])[:100]
                error = JsonRpcInvalidParams(
                    f"{method}: a URI of {n} characters is past the limit of {MAX_URI_CHARS}"
                    " (MAX_URI_CHARS); refused unread")
                if data.get("id") is not None:
                    self._send_response(data["id"], error=error.to_response_error())
                raise error  # logged in one line by report_server_error
        try:
            return super().structure_message(data)
        except JsonRpcException:
            if isinstance(data, dict) and "method" in data and data.get("id") is not None:
                self._send_response(data["id"], error=JsonRpcInvalidParams(
                    f"invalid params for {data['method']}").to_response_error())
            raise


def _long_uri(params) -> int | None:
    """The length of the first string in ``params`` (a message's, as JSON decoded it)
    under a key naming a URI (``uri``, ``rootUri``, ``targetUri``..., and ``rootPath``)
    that is longer than :data:`MAX_URI_CHARS`; None when there is none."""
    stack = [params]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) \
            if isinstance(node, list) else ()
        for key, value in items:
            if isinstance(value, str):
                if len(value) > MAX_URI_CHARS and isinstance(key, str) and (
                        key.lower().endswith("uri") or key == "rootPath"):
                    return len(value)
            elif isinstance(value, (dict, list)):
                stack.append(value)
    return None


def _strict_int(value, type_):
    """int, and through its subclasses bool and the IntEnums, from that JSON type only."""
    if type_ is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{str(value)[:40]!r} is not a boolean")
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{str(value)[:40]!r} is not an integer")
    return value if type_ is int else type_(value)  # an IntEnum: its value, or ValueError


def _strict_str(value, type_):
    """str, and through its subclasses the string enums, from a JSON string only."""
    if not isinstance(value, str):
        raise ValueError(f"{str(value)[:40]!r} is not a string")
    return value if type_ is str else type_(value)


def strict_converter():
    """pygls's converter, except that an LSP integer or string takes only that JSON type:
    cattrs's default casts (a position of 1.5 or "1" was line 1, a didChange text of 7
    replaced the document with "7"), so a wrong type is InvalidParams like any other."""
    converter = default_converter()
    # Class hooks: they take the subclasses too (bool, IntEnum, the str enums), which
    # the hooks structure as cattrs would, from the right JSON type only.
    converter.register_structure_hook(int, _strict_int)
    converter.register_structure_hook(str, _strict_str)
    return converter


class AssistdServer(LanguageServer):
    """The server object: pygls's LanguageServer plus the worker and per-document jobs."""

    def __init__(self, settings: Settings | None = None, completer=None, worker=None):
        super().__init__("assistd", __version__,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
                         protocol_cls=_Protocol, converter_factory=strict_converter)
        self.settings = settings or Settings()
        self.completer = completer if completer is not None else Completer(self.settings)
        # One thread: the Target, its KV cache, SQLite and the index are single-threaded.
        # Hosted by the daemon, the daemon's scheduler at editor priority instead.
        self.worker = worker or ThreadPoolExecutor(max_workers=1,
                                                   thread_name_prefix="assistd-engine")
        self.latest: dict[str, Request] = {}  # uri -> newest completion request
        self._reported: set[str] = set()  # error messages already shown (once each)
        self.watch_client = True  # end when initialize's processId is gone (in-process)
        self.loading = None  # the Future of the engine's opening, once started
        self._stage = LOADING  # what the loading does now (progress message)
        self._progress: str | None = None  # the work-done progress token shown meanwhile
        self._stopped = False
        self._watch: asyncio.Task | None = None
        self._main: asyncio.Task | None = None  # pygls's read loop (stop() cancels it)
        self._status: tuple[str, str] | None = None  # (state, message) last sent
        self._initialized = False  # notifications may go out (initialize answered)
        self._growing: threading.Event | None = None  # set: the background growth stops
        self._input: _BoundedInput | None = None  # what start_io reads

    async def run(self, fn, *args):
        """Run ``fn(*args)`` on the engine thread without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)

    def submit(self, fn, *args) -> None:
        """Fire-and-forget engine work (telemetry, re-indexing, loading); call it on the
        event loop. An error is reported back on the loop: the transport is not thread-safe."""
        loop = asyncio.get_running_loop()
        fut = self.worker.submit(fn, *args)

        def done(f) -> None:
            if not f.cancelled() and f.exception() is not None:
                _on_loop(loop, self.report, f.exception())

        fut.add_done_callback(done)

    def stop(self) -> None:
        """End the session as if the client had sent ``exit`` (client process gone, or
        its end of the connection closed): pending requests are cancelled, the read loop
        ends, and :meth:`start_io` returns."""
        if self._stopped:
            return
        self._stopped = True
        self.stop_growing()
        for req in self.latest.values():
            req.cancel.set()
        if self._stop_event is not None:
            self._stop_event.set()
        if self._main is not None:  # the read loop waits on the client: cancel its wait
            self._main.cancel()

    def start_io(self, stdin=None, stdout=None) -> None:
        """pygls's; returns (instead of raising CancelledError) when :meth:`stop` ended
        the read loop."""
        self._input = _BoundedInput(stdin or sys.stdin.buffer, self._refuse_message)
        try:
            super().start_io(self._input, stdout)
        except asyncio.CancelledError:
            if not self._stopped:
                raise

    def _refuse_message(self, n: int) -> None:
        """Answer a message of ``n`` bytes, past :data:`MAX_MESSAGE_BYTES`, before its
        body is read (on the reader's thread: the writer takes one message at a time)."""
        self.protocol._send_data({"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": f"Invalid Request: a message of {n} bytes is past the"
            f" {MAX_MESSAGE_BYTES}-byte limit (MAX_MESSAGE_BYTES); refused unread"}})

    def shutdown(self) -> None:
        """pygls's, without waiting for its reader thread (blocked on a client that may
        never write again); the process ends it (``assistd lsp``)."""
        if self._stop_event is not None:
            self._stop_event.set()
        if self._thread_pool:
            self._thread_pool.shutdown(wait=False, cancel_futures=True)
        if self._server:
            self._server.close()

    def finish(self, timeout: float = 10.0) -> None:
        """After :meth:`start_io` returned, in-process: close the engine on its thread,
        waiting at most ``timeout`` seconds. A model still loading is not waited for
        (the process exits: every ledger row is committed already)."""
        self.stop_growing()
        for req in self.latest.values():
            req.cancel.set()
        if self.loading is not None and not self.loading.done():
            log.info("the model is still loading: exiting without waiting for it")
            return
        try:
            self.worker.submit(self.completer.close).result(timeout)
        except TimeoutError:
            log.info("the engine is still busy: exiting without waiting for it")
        except (AssistdError, RuntimeError, OSError) as e:
            log.debug("closing the engine: %s", e)
        self.worker.shutdown(wait=False, cancel_futures=True)

    def watch_client_process(self, pid: int) -> None:
        """Stop when process ``pid`` (the editor) is gone: a killed extension host never
        closes a pipe another process inherited, nor sends exit. Call it in initialize:
        a pid that is no process then is another pid namespace's (a sandboxed editor)."""
        if not process_alive(pid):
            log.info("the client's processId %d is no process here: not watched", pid)
            return
        log.debug("watching the client's process %d", pid)
        self._watch = asyncio.ensure_future(self._poll_client(pid))

    async def _poll_client(self, pid: int) -> None:
        while True:
            await asyncio.sleep(CLIENT_POLL_S)
            if not process_alive(pid):
                log.info("the client's process %d is gone: ending the session", pid)
                self.stop()
                return

    def start_loading(self) -> None:
        """Open the engine (model, history, tuner calibration) on the worker now, in the
        background; completion requests queue behind it on the one worker thread, so a
        request that arrives meanwhile is answered once the model is ready."""
        loop = asyncio.get_running_loop()

        def stage(msg: str) -> None:  # called on the worker thread
            _on_loop(loop, self._report_stage, msg)

        self.loading = self.worker.submit(self.completer.open, stage)
        self.loading.add_done_callback(lambda f: _on_loop(loop, self._loaded, f))

    def _report_stage(self, msg: str) -> None:
        self._stage = msg
        self.set_status()
        if self._progress is not None:
            self.work_done_progress.report(self._progress, types.WorkDoneProgressReport(
                message=msg))

    def _loaded(self, fut) -> None:
        error = None if fut.cancelled() else fut.exception()
        if error is not None:
            self.report(error)
        else:
            self.set_status()
        if self._progress is not None:
            self.work_done_progress.end(self._progress, types.WorkDoneProgressEnd(
                message="ready" if error is None else f"failed: {error}"))
            self._progress = None

    async def show_loading(self) -> None:
        """``window/workDoneProgress`` while the engine opens, where the client shows it
        (capabilities.window.workDoneProgress): both VS Code and Neovim do."""
        window = getattr(self.client_capabilities, "window", None)
        if self.loading is None or self.loading.done() or not getattr(
                window, "work_done_progress", False):
            return
        token = f"assistd-load-{uuid.uuid4().hex[:8]}"
        try:
            await self.work_done_progress.create_async(token)
        except (JsonRpcException, asyncio.CancelledError) as e:
            log.debug("the client refused the progress token: %s", e)
            return
        if self.loading.done():
            return
        self._progress = token
        self.work_done_progress.begin(token, types.WorkDoneProgressBegin(
            title="assistd", message=self._stage, cancellable=False))

    def stop_growing(self) -> None:
        """End the background growth of the last suggestion, if any (one round at most)."""
        if self._growing is not None:
            self._growing.set()
            self._growing = None

    def report(self, error: BaseException) -> None:
        """An error the user must see: ``window/showMessage`` once per message, the log,
        and the ``error`` status."""
        msg = f"assistd: {error}"
        log.error("%s", msg)
        self.set_status(ERROR, str(error))
        if msg not in self._reported:
            self._reported.add(msg)
            self.window_show_message(types.ShowMessageParams(types.MessageType.Error, msg))

    def set_status(self, state: str | None = None, message: str = "") -> None:
        """Send ``assistd/status`` ({state, message}) when it changed. ``state`` None:
        the state that follows from the settings and the loading (``disabled``,
        ``loading``, ``ready``, or ``error`` when the model failed to open)."""
        if state is None:
            failed = self.loading is not None and self.loading.done() and (
                self.loading.cancelled() or self.loading.exception() is not None)
            state = (DISABLED if not self.settings.enabled else ERROR if failed
                     else "loading" if self.loading is None or not self.loading.done()
                     else READY)
            message = (self._stage if state == "loading" else f"{self.loading.exception()}"
                       if state == ERROR else "")
        if (state, message) == self._status or not self._initialized or self._stopped:
            return
        self._status = (state, message)
        log.debug("status: %s %s", state, message)
        self.protocol.notify(STATUS, {"state": state, "message": message})

    def report_server_error(self, error: Exception, source) -> None:
        """pygls's out-of-band errors (a malformed notification, didChange for a document
        never opened) go to the log, not a popup per keystroke; ours go via :meth:`report`.
        A body that is not JSON gets JSON-RPC's ParseError (-32700, id null), which pygls
        does not send."""
        if isinstance(error, _NOT_JSON):
            log.warning("a message that is not JSON: %s", str(error)[:200])
            self.protocol._send_data({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32700, "message": f"Parse error: {str(error)[:200]}"}})
            return
        log.warning("protocol error (%s): %s", getattr(source, "__name__", source), error)

    def warn(self, messages: list[str]) -> None:
        for m in messages:
            log.warning("%s", m)
            self.window_show_message(types.ShowMessageParams(types.MessageType.Warning, m))

    def apply_settings(self, raw: Any) -> None:
        settings, warnings = parse_settings(raw, self.settings)
        self.warn(warnings)
        reopen = settings.engine_key() != self.settings.engine_key()
        self.settings = settings
        self._reported.clear()  # a new model path deserves a new error message
        self.submit(self.completer.configure, settings)
        if reopen and self.loading is not None and self.completer.shared is None:
            self.start_loading()  # a new model or db: load it now, not on a keystroke
        self.set_status()

    # -- completion --------------------------------------------------------

    async def suggest(self, uri: str, position: types.Position,
                      method: str = "inlineCompletion", explicit: bool = False
                      ) -> Suggestion | None:
        """The suggestion at ``position``; None when there is none (disabled, cancelled,
        failed: failures reach the user through :meth:`report`; dismissed there before,
        unless ``explicit``: the user asked). Raises
        JsonRpcInvalidParams for an unknown document or a position outside it. Logs one
        info line per request (``method``, language, sizes, ms: never the text)."""
        docs = self.workspace.text_documents
        uri = unquote(uri)  # pygls keys documents by the decoded URI (VS Code sends %20, c%3A)
        if uri not in docs:
            raise JsonRpcInvalidParams.of(ValueError(f"document {uri} is not open (didOpen first)"))
        if not self.settings.enabled:
            return None
        doc = docs[uri]
        text = _valid(doc.source)
        try:
            offset = offset_at(text, position, self.workspace.position_encoding or "utf-16")
        except PositionError as e:
            raise JsonRpcInvalidParams.of(e) from None
        req = Request(uri=uri, text=text, offset=offset, language=doc.language_id or "plaintext",
                      buffers={u: _valid(d.source) for u, d in docs.items() if u != uri},
                      explicit=explicit)
        older = self.latest.get(uri)
        if older is not None:
            older.cancel.set()  # latest wins
        self.stop_growing()  # the engine is needed now
        self.latest[uri] = req
        t0 = time.perf_counter()
        try:
            result = await self.run(self.completer.complete, req)
        except asyncio.CancelledError:
            req.cancel.set()  # $/cancelRequest: stop within one round
            log.info("%s %s: cancelled after %.0f ms", method, req.language,
                     (time.perf_counter() - t0) * 1000)
            raise
        except (AssistdError, RuntimeError, OSError) as e:
            self.report(e)
            return None
        finally:
            if self.latest.get(uri) is req:
                del self.latest[uri]
        if result.source != "cancelled":
            self.set_status()  # a request that worked after one that failed: ready again
        if result.growable and not self._stopped:
            # Cut by the time budget: the engine goes on with it while the user reads
            # (Completer.grow), until the next request needs the engine.
            self._growing = threading.Event()
            self.submit(self.completer.grow, self._growing.is_set)
        _log_request(method, req, result, (time.perf_counter() - t0) * 1000)
        return result if result.text else None


def _log_request(method: str, req: Request, s: Suggestion, ms: float) -> None:
    """One info line per answer (and the ledger's line): sizes and times, never text."""
    led = s.ledger
    prompt = led.prompt_tokens if led is not None else 0
    log.info("%s %s: %s, %d prompt tokens, %.0f ms (engine %.0f ms), %d chars returned",
             method, req.language, s.source, prompt, ms, s.ms, len(s.text))
    if led is not None:
        log.info("ledger: %s stop=%s", led.summary(), s.stop_reason)
    log.debug("%s: document %d chars, cursor at %d, %d other buffers", method,
              len(req.text), req.offset, len(req.buffers))


def _on_loop(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    """``fn(*args)`` on ``loop`` from another thread; nothing once the loop is closed
    (the session ended while the engine worked)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid(text: str) -> str:
    """Lone UTF-16 surrogates (a client may send them) become U+FFFD: same offsets,
    and the tokenizer, which needs valid UTF-8, does not fail on every request."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _snippets(caps: types.ClientCapabilities | None) -> bool:
    item = getattr(getattr(getattr(caps, "text_document", None), "completion", None),
                   "completion_item", None)
    return bool(getattr(item, "snippet_support", False))


def _item_command(s: Suggestion) -> types.Command:
    # length: the characters this answer inserts, counted from the suggestion's start
    # (the suggestion may grow after it is answered: an accept counts what went in).
    return types.Command(title="assistd: suggestion accepted", command=ACCEPTED,
                         arguments=[{"id": s.id, "length": s.covers}])


def _param(params: Any, name: str, default=None):
    """A field of a custom notification's params (pygls gives an object, tests a dict)."""
    if isinstance(params, dict):
        return params.get(name, default)
    return getattr(params, name, default)


def build_server(settings: Settings | None = None, completer=None,
                 worker=None) -> AssistdServer:
    """A configured server; start it with ``start_io()`` or ``start_tcp(host, port)``.
    ``completer``: the engine side (default: a :class:`Completer` that opens its own
    runtime); ``worker``: the executor its calls run on (default: one thread)."""
    server = AssistdServer(settings, completer, worker)

    @server.feature(types.INITIALIZE)
    def initialize(ls: AssistdServer, params: types.InitializeParams):
        ls._main = asyncio.current_task()  # handlers run inline in pygls's read loop
        ls.apply_settings(params.initialization_options)
        # Load the model now, in the background, not on the first keystroke.
        ls.start_loading()
        if ls.watch_client and isinstance(params.process_id, int) and params.process_id > 0:
            ls.watch_client_process(params.process_id)

    @server.feature(types.INITIALIZED)
    async def initialized(ls: AssistdServer, params: types.InitializedParams):
        # Progress and notifications may only go out once initialize is answered.
        ls._initialized = True
        ls.set_status()
        await ls.show_loading()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: AssistdServer, params: types.DidChangeConfigurationParams):
        ls.apply_settings(params.settings)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: AssistdServer, params: types.DidSaveTextDocumentParams):
        ls.submit(ls.completer.reindex, unquote(params.text_document.uri))

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: AssistdServer, params: types.DidCloseTextDocumentParams):
        uri = unquote(params.text_document.uri)
        if (req := ls.latest.pop(uri, None)) is not None:
            req.cancel.set()
        ls.submit(ls.completer.drop_buffer, uri)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: AssistdServer, params: types.InlineCompletionParams):
        explicit = params.context is not None and (
            params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked)
        s = await ls.suggest(params.text_document.uri, params.position, explicit=explicit)
        if s is None:
            return types.InlineCompletionList(items=[])
        pos = params.position
        # s.replace: whitespace before the cursor the text replaces (one code unit each in
        # every encoding); VS Code and Neovim 0.12 show only the text past the indentation.
        start = types.Position(pos.line, pos.character - s.replace)
        return types.InlineCompletionList(items=[types.InlineCompletionItem(
            insert_text=s.text, range=types.Range(start, pos), command=_item_command(s))])

    @server.feature(types.TEXT_DOCUMENT_COMPLETION,
                    types.CompletionOptions(trigger_characters=[".", "(", " "]))
    async def completion(ls: AssistdServer, params: types.CompletionParams):
        s = await ls.suggest(params.text_document.uri, params.position, "completion")
        if s is None or not s.item_text:
            return types.CompletionList(is_incomplete=True, items=[])
        first = s.text.lstrip("\r\n").splitlines()[0] if s.text.strip() else s.text
        pos = params.position
        # An older client filters items by the word before the cursor: the edit starts
        # at the cursor (or at the indentation it replaces: whitespace is no word to
        # filter by) and is always re-requested (isIncomplete) as the user types.
        # Its lines after the first are relative to the line's indentation (item_text):
        # VS Code (adjustIndentation) and vim.snippet.expand add it back.
        # A snippet (escaped) where the client takes snippets: Neovim 0.11 inserts a
        # plain-text item only up to its first whitespace (seen with its popup menu).
        text, fmt = s.item_text, types.InsertTextFormat.PlainText
        if _snippets(ls.client_capabilities):
            text = text.replace("\\", "\\\\").replace("$", "\\$").replace("}", "\\}")
            fmt = types.InsertTextFormat.Snippet
        return types.CompletionList(is_incomplete=True, items=[types.CompletionItem(
            label=first.strip()[:80] or s.text, kind=types.CompletionItemKind.Text,
            detail="assistd", insert_text_format=fmt,
            insert_text_mode=types.InsertTextMode.AdjustIndentation,
            text_edit=types.TextEdit(types.Range(types.Position(
                pos.line, pos.character - s.replace), pos), text), filter_text="",
            sort_text="0", command=_item_command(s))])

    @server.command(ACCEPTED)
    async def accepted(ls: AssistdServer, *args):
        sid = _param(args[0], "id") if args else None
        length = _param(args[0], "length", 0) if args else 0
        if sid:
            ls.submit(ls.completer.event, str(sid), "accepted",
                      length if isinstance(length, int) and length > 0 else 0)
        return None

    @server.command(STATS)
    async def stats(ls: AssistdServer, *args):
        try:
            return await ls.run(ls.completer.stats)
        except AssistdError as e:
            ls.report(e)
            return {"error": str(e)}

    @server.feature(SHOWN)
    def shown(ls: AssistdServer, params):
        if sid := _param(params, "id"):
            ls.submit(ls.completer.event, str(sid), "shown")

    @server.feature(PARTIAL)
    def partial(ls: AssistdServer, params):
        sid, n = _param(params, "id"), _param(params, "acceptedLength", 0)
        if sid and isinstance(n, int) and n > 0:
            ls.submit(ls.completer.event, str(sid), "partial", n)

    @server.feature(DISMISSED)
    def dismissed(ls: AssistdServer, params):
        if sid := _param(params, "id"):
            ls.submit(ls.completer.event, str(sid), "dismissed")

    @server.feature(types.EXIT)
    def exit_(ls: AssistdServer, params):
        ls._stopped = True  # pygls exits now; a client gone meanwhile must not exit twice
        ls.stop_growing()
        for req in ls.latest.values():
            req.cancel.set()

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: AssistdServer, params):
        ls.stop_growing()
        for req in ls.latest.values():
            req.cancel.set()
        # Cancel pending requests here, over a copy: pygls 2.1 cancels them while
        # iterating the dict their callbacks pop from ("dictionary changed size").
        # This handler's own task is in that dict too, under a key of pygls's.
        current, me = ls.protocol.msg_id, asyncio.current_task()
        for msg_id, fut in list(ls.protocol._request_futures.items()):
            if msg_id != current and fut is not me and not fut.done():
                fut.cancel()
        # Awaited, with no timeout: a shutdown right after start waits for the model
        # to finish loading, then answers null (it was a -32603 after 30 s on a busy
        # machine, with the event loop blocked meanwhile).
        try:
            await ls.run(ls.completer.close)
        except asyncio.CancelledError:
            # The client left without waiting for the answer (Neovim's :qa!) and pygls
            # cancelled this request: the close goes on on the engine thread, there is
            # no one to answer, and a CancelledError out of pygls's callback would be
            # logged by asyncio as an ERROR with a traceback.
            log.debug("the client left before the shutdown reply")

    return server


def serve_hosted(runtime, executor, reader, writer, *, label: str = "") -> None:
    """One editor connection hosted by the daemon (the factory ``assistd serve``
    registers): a language server over ``reader``/``writer`` (the connection's binary
    streams), its :class:`Completer` on the daemon's ``runtime``, every engine call on
    ``executor`` (the daemon's scheduler at editor priority). Returns when the client
    exits or disconnects; the session's buffers then leave the shared history index."""
    completer = Completer(shared=runtime)
    completer.owner, completer.host = f"lsp:{label.rpartition('#')[2]}", label
    server = build_server(completer=completer, worker=executor)
    server.watch_client = False  # `assistd lsp` (the pipe) watches the editor instead
    try:
        server.start_io(reader, writer)
    finally:
        executor.submit(completer.close).result(timeout=30)
