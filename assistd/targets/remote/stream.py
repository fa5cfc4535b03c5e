"""One streamed completion from ``POST /v1/completions`` (``stream: true``): server-sent
events, one ``data:`` event per chunk, ``data: [DONE]`` at the end, read on a thread of
its own (:class:`Stream`) and turned into events the generation loop reads
(:mod:`assistd.targets.remote.generation`).

The events are parsed by httpx-sse (:class:`httpx_sse.EventSource`). It buffers a line
until the line ends and has no cap of its own, so it reads through :class:`CappedBody`,
which counts the bytes of the stream and of the line being read and ends the answer past
:data:`MAX_LINE_BYTES` or :data:`MAX_STREAM_BYTES` ("too_large"): a hostile server's
endless line is never held whole. An event's data is bounded by the stream's cap."""

from __future__ import annotations

import queue
import socket
import threading
import time

import httpx
from httpx_sse import EventSource, SSEError

from assistd.ground import jsonlimits
from assistd.ground.errors import InputError
from assistd.targets.base import encodable
from assistd.targets.remote.errors import JSON_DEPTH, RemoteTargetError
from assistd.targets.remote.network import Server, identity, retry_after, tls_failure

POLL_S = 0.02  # how often a waiting generation checks cancelled()
MAX_LINE_BYTES = 1 << 20  # one server-sent event line
MAX_STREAM_BYTES = 64 << 20  # one streamed answer, all lines
QUEUE_EVENTS = 256  # events read ahead of the caller (the reader then waits)
RETRY_AFTER_MAX_S = 10.0  # a longer Retry-After fails at once, naming the wait


def last_eol(data: bytes) -> int:
    """Where the last line end (``\\r`` or ``\\n``) in ``data`` is, or -1.

    >>> last_eol(b"a\\r\\nbc"), last_eol(b"abc")
    (2, -1)
    """
    return max(data.rfind(b"\n"), data.rfind(b"\r"))


class CappedBody(httpx.SyncByteStream):
    """The raw bytes of ``chunks`` (an answer's ``iter_raw()``), passed on until
    ``stop`` is set, raising :class:`RemoteTargetError` "too_large" as soon as more
    than :data:`MAX_STREAM_BYTES` came, or more than :data:`MAX_LINE_BYTES` since the
    last line end (``url``: the server, for the message)."""

    def __init__(self, chunks, url: str, stop: threading.Event):
        self.chunks, self.url, self.stop = chunks, url, stop

    def __iter__(self):
        total, line = 0, 0  # bytes so far; bytes since the last line end
        for data in self.chunks:
            if self.stop.is_set():
                return
            total += len(data)
            if total > MAX_STREAM_BYTES:
                raise RemoteTargetError(f"the remote Target {self.url} streamed more than"
                                        f" {MAX_STREAM_BYTES >> 20} MiB; the rest was not read",
                                        "too_large")
            end = last_eol(data)
            line = line + len(data) if end < 0 else len(data) - end - 1
            if line > MAX_LINE_BYTES:
                raise RemoteTargetError(f"the remote Target {self.url} sent an event line over"
                                        f" {MAX_LINE_BYTES >> 20} MiB; the rest was not read",
                                        "too_large")
            yield data


class Stream:
    """One streamed request of ``body`` to ``server``, read on its own thread into a
    bounded queue, so that the caller can poll ``cancelled()`` and the deadline while
    the server is silent and leave at once. Closing it shuts the socket down (a reader
    blocked in ``recv`` wakes: a plain ``close`` from another thread would not wake it),
    so the server sees the client hang up. Events: ``("open",)``, ``("text", piece,
    finish, usage)``, ``("done", skipped)``, ``("error", retryable, wait_s, exception,
    answered)``."""

    def __init__(self, server: Server, body: dict):
        self.server = server
        self.q: queue.Queue = queue.Queue(QUEUE_EVENTS)
        self.stop = threading.Event()
        self.finished = threading.Event()  # the reader closed the connection
        self.sock = None  # the connection's socket, once the answer's headers came
        self.thread = threading.Thread(target=self._read, args=(body,),
                                       name="assistd-remote-stream", daemon=True)
        self.thread.start()

    def _put(self, event) -> None:
        while not self.stop.is_set():  # waits while the caller is behind, never past close
            try:
                self.q.put(event, timeout=POLL_S)
                return
            except queue.Full:
                continue

    def _read(self, body: dict) -> None:
        put, s = self._put, self.server
        try:
            with s.http.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    raw = s.read_capped(r, float("inf"), "/v1/completions", s.timeout_s)
                    put(http_error(s, r.status_code, raw.decode("utf-8", "replace"), r.headers))
                    return
                if not identity(r):
                    raise RemoteTargetError(
                        f"the remote Target {s.url} streamed compressed"
                        f" ({s.shown(r.headers['content-encoding'])!r}) although asked for"
                        " identity", "malformed")
                stream = r.extensions.get("network_stream")
                self.sock = stream.get_extra_info("socket") if stream is not None else None
                put(("open",))
                capped = httpx.Response(200, headers=r.headers,
                                        stream=CappedBody(r.iter_raw(), s.url, self.stop))
                capped.encoding = "utf-8"  # an event stream is UTF-8, whatever it declares
                skipped = 0  # events that were no completion chunk (not JSON, no choices)
                for sse in EventSource(capped).iter_sse():
                    if self.stop.is_set():
                        return
                    if not sse.data:
                        continue  # an event without data (a named ping)
                    if sse.data.strip() == "[DONE]":
                        put(("done", skipped))
                        return
                    event = chunk_event(sse.data, s.url)
                    if event is None:
                        skipped += 1  # not a completion chunk (an unexpected event)
                        continue
                    put(event)
                put(("done", skipped))  # EOF without [DONE]: judged by whether a finish came
        except httpx.HTTPError as e:
            if self.stop.is_set():
                return  # closed by the caller: nobody waits for this
            retry = (isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                     and tls_failure(e) is None)
            put(("error", retry, None, RemoteTargetError(s.transport_message(e)), False))
        except SSEError:  # the answer is no event stream (its Content-Type says so)
            if not self.stop.is_set():
                put(("error", False, None, RemoteTargetError(
                    f"the remote Target {s.url} answered /v1/completions with Content-Type"
                    f" {s.shown(r.headers.get('content-type', ''))!r}, not an event stream"
                    " (text/event-stream)", "malformed"), True))
        except RemoteTargetError as e:  # a line or stream over its cap, a malformed chunk
            if not self.stop.is_set():
                put(("error", False, None, e, True))
        except Exception as e:  # noqa: BLE001 - reported to the caller, never a traceback
            if not self.stop.is_set():
                put(("error", False, None, RemoteTargetError(
                    s.redact(f"remote Target: {type(e).__name__}: {e}"), "malformed"), False))
        finally:
            self.finished.set()

    def next(self, cancelled, between_rounds, deadline: float | None = None):
        """The next event; None when ``cancelled()`` turned true first, ``("deadline",)``
        when ``deadline`` (``time.monotonic()``) passed first."""
        while True:
            if cancelled is not None and cancelled():
                return None
            wait = POLL_S
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return ("deadline",)
                wait = min(wait, left)
            try:
                return self.q.get(timeout=wait)
            except queue.Empty:
                if between_rounds is not None:
                    between_rounds()

    def close(self) -> None:
        self.stop.set()
        if self.sock is not None and not self.finished.is_set():
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already


_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def chunk_event(data: str, url: str):
    """A ``data:`` event as ``("text", piece, finish, usage)``, or None for one that is
    no completion chunk (not JSON, no ``choices``: skipped and counted); raises
    :class:`RemoteTargetError` "malformed" for a chunk of the wrong shape (a ``text``
    that is no string, ...; ``url``: the server, for the message). ``usage`` keeps the
    counts that are whole numbers.

    >>> chunk_event('{"choices": [{"text": "hi", "finish_reason": null}]}', "u")
    ('text', 'hi', None, {})
    """
    try:
        chunk = jsonlimits.loads(data, JSON_DEPTH)
    except ValueError:
        return None
    if not isinstance(chunk, dict):
        return None
    usage = chunk.get("usage")
    usage = {k: v for k, v in usage.items() if k in _USAGE_KEYS and isinstance(v, int)
             and not isinstance(v, bool) and 0 <= v < 1 << 31} if isinstance(usage, dict) else {}
    choices = chunk.get("choices")
    if choices is None:
        return ("text", "", None, usage) if usage else None
    if not isinstance(choices, list) or (choices and not isinstance(choices[0], dict)):
        raise RemoteTargetError(f"the remote Target {url} sent a malformed chunk:"
                                " its choices are not a list of objects", "malformed")
    choice = choices[0] if choices else {}
    piece, finish = choice.get("text"), choice.get("finish_reason")
    if piece is not None and not isinstance(piece, str):
        raise RemoteTargetError(f"the remote Target {url} sent a malformed chunk: its"
                                f" choices[0].text is {type(piece).__name__}, not a string",
                                "malformed")
    if finish is not None and not isinstance(finish, str):
        raise RemoteTargetError(f"the remote Target {url} sent a malformed chunk: its"
                                f" finish_reason is {type(finish).__name__}, not a string",
                                "malformed")
    return ("text", encodable(piece or ""), finish, usage)


def http_error(server: Server, code: int, body: str, headers) -> tuple:
    """The reader's error event for an HTTP status other than 200."""
    message = server.http_message(code, body, headers)
    wait = retry_after(headers) if code in (429, 503) else None
    if wait is not None and wait > RETRY_AFTER_MAX_S:
        message += f"; it asks to wait {wait:g} s: retry later"
    exc = InputError(message) if code == 400 else RemoteTargetError(message, "http")
    return ("error", code in (429, 503), wait, exc, True)
