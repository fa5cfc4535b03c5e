"""The language server's session: pygls's server (on the bounded transport of
:mod:`editors.transport`) plus the engine's worker, its loading, the status sent to the
client, and the completion jobs the handlers (:mod:`editors.server`) queue.

The event loop owns the protocol and the documents (pygls applies incremental changes),
one worker thread owns the engine. A request snapshots the document and queues a job;
the loop keeps answering ``didChange`` while the worker generates.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from assistd import __version__
from assistd.ground.errors import AssistdError
from assistd.ground.process import process_alive
from assistd.runtime.runtime import LOADING
from editors.completer import Completer, Request, Suggestion
from editors.positions import PositionError, offset_at
from editors.settings import Settings, parse_settings
from editors.transport import HardenedServer

log = logging.getLogger("assistd.lsp")

CLIENT_POLL_S = 2.0  # how often the client's process (initialize's processId) is checked
# Server -> client: {state, message}, for a status bar or statusline. States:
STATUS = "assistd/status"
READY, ERROR, DISABLED = "ready", "error", "disabled"  # and "loading"


class AssistdServer(HardenedServer):
    """The server object: pygls's LanguageServer plus the worker and per-document jobs."""

    def __init__(self, settings: Settings | None = None, completer=None, worker=None):
        super().__init__("assistd", __version__,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
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
        self._watch: asyncio.Task | None = None
        self._status: tuple[str, str] | None = None  # (state, message) last sent
        self._initialized = False  # notifications may go out (initialize answered)
        self._growing: threading.Event | None = None  # set: the background growth stops

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
        if not self._stopped:
            self.stop_growing()
            for req in self.latest.values():
                req.cancel.set()
        super().stop()

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
