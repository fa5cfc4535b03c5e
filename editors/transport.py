"""The language server's transport, bounded: what a client sends never costs more than a
fixed amount of memory, log or engine time, and every request gets exactly one answer.

:class:`HardenedServer` is pygls's ``LanguageServer`` with these guards; the session
(:mod:`editors.session`) and the LSP method handlers (:mod:`editors.server`) sit on it.
Bounds are checked before pygls parses a message (docs/design.md, "LSP lifecycle"):

- a body over :data:`MAX_MESSAGE_BYTES` is refused when its header is read, and skipped
  unread (:class:`_BoundedInput`);
- a URI over :data:`MAX_URI_CHARS` anywhere in a message's params is refused before pygls
  structures it (:meth:`_Protocol.structure_message`);
- an LSP integer or string takes only that JSON type (:func:`strict_converter`);
- requests before ``initialize`` or after ``shutdown`` are answered, not run (:class:`_Protocol`);
- no log record past :data:`MAX_LOG_LINE_CHARS`, and a client's error is one line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading

from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcServerNotInitialized,
)
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, default_converter

log = logging.getLogger("assistd.lsp")

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


class HardenedServer(LanguageServer):
    """pygls's ``LanguageServer`` on the bounded transport: :class:`_Protocol` (the
    lifecycle, the URI bound), :func:`strict_converter`, the input bounded by
    :data:`MAX_MESSAGE_BYTES`, a ParseError for a body that is not JSON, and a
    :meth:`stop` that ends the read loop from the server's side. Keyword arguments go
    to ``LanguageServer``."""

    def __init__(self, name: str, version: str, **kwargs):
        super().__init__(name, version, protocol_cls=_Protocol,
                         converter_factory=strict_converter, **kwargs)
        self._stopped = False
        self._main: asyncio.Task | None = None  # pygls's read loop (stop() cancels it)
        self._input: _BoundedInput | None = None  # what start_io reads

    def stop(self) -> None:
        """End the session as if the client had sent ``exit`` (its end of the
        connection closed): the read loop ends, and :meth:`start_io` returns."""
        if self._stopped:
            return
        self._stopped = True
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

    def report_server_error(self, error: Exception, source) -> None:
        """pygls's out-of-band errors (a malformed notification, didChange for a document
        never opened) go to the log, not a popup per keystroke (the session's own errors reach the user
        its way).
        A body that is not JSON gets JSON-RPC's ParseError (-32700, id null), which pygls
        does not send."""
        if isinstance(error, _NOT_JSON):
            log.warning("a message that is not JSON: %s", str(error)[:200])
            self.protocol._send_data({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32700, "message": f"Parse error: {str(error)[:200]}"}})
            return
        log.warning("protocol error (%s): %s", getattr(source, "__name__", source), error)
