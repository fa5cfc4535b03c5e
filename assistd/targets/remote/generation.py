"""A remote Target's generation (:class:`Generating`, a part of
:class:`assistd.targets.remote.target.RemoteTarget`): one streamed completion, read to
its limits, retried where that is safe, with its ledger (:class:`RemoteLedger`).

Retry policy: a connection refused or timed out while connecting (not a failed TLS
handshake: it would fail again), and HTTP 429 or 503, are retried at most
:data:`RETRIES` times, and only before any text arrived (waiting ``Retry-After`` when
the server gives one, up to ``RETRY_AFTER_MAX_S`` and never past the deadline); never
once text has streamed, and never after a read timeout (the server may still be
working).

Limits, against a server that is slow, broken or hostile (docs/design.md, "Remote Target"):

- a deadline per generation (:meth:`Generating.deadline_for`): ``--target-deadline-ms``,
  else ``target_timeout + max_tokens / DEADLINE_TOKENS_PER_S`` seconds; and no text for
  twice ``target_timeout`` (keep-alive comments and empty chunks are no text; a silent
  socket fails sooner, at the read timeout) ends it too;
- reading stops at ``max_tokens`` worth of text: ``max_tokens`` non-empty chunks, and
  at most :data:`MAX_TOKEN_CHARS` characters per token;
- the bytes read are capped (:mod:`assistd.targets.remote.stream`,
  :mod:`assistd.targets.remote.network`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from assistd.ground.errors import InputError
from assistd.ground.ledger import Ledger
from assistd.targets.base import Target
from assistd.targets.remote.errors import RemoteTargetError, with_message
from assistd.targets.remote.stream import POLL_S, RETRY_AFTER_MAX_S, Stream

log = logging.getLogger("assistd.targets.remote")  # one logger for the whole remote Target

RETRIES = 2  # retries of a request that got no text yet (connect error, 429, 503)
BACKOFF_S = (0.25, 1.0)  # waits between retries without a Retry-After
# The default deadline of one generation: the read timeout for the first chunk, then at
# least this many tokens a second. Lenient on purpose: the embedded model on a loaded
# 2-core machine streams 1-2 a second, and a stream that sends no text at all is ended
# sooner, by the read timeout (see Generating.complete).
DEADLINE_TOKENS_PER_S = 1.0
MAX_TOKEN_CHARS = 128  # a generous bound on one token's text (characters)


@dataclass
class RemoteResult:
    """One remote generation: ``text`` (stop string excluded), ``stop_reason`` (as
    :class:`assistd.decoding.engine.Generation`'s), ``tokens`` (ids of ``text`` when a
    tokenizer is known, else empty) and its ``ledger``."""

    text: str
    stop_reason: str
    tokens: list[int]
    ledger: Ledger


@dataclass
class RemoteLedger(Ledger):
    """A remote generation's ledger: what the server reported and the times assistd saw
    (``first_token_ms``, ``total_ms``), no acceptance figure (no draft was verified
    here). ``committed_tokens`` counts the server's tokens (its ``usage`` when it sends
    one, else one per streamed chunk); rounds and plain steps stay 0."""

    server_usage: dict = field(default_factory=dict)
    retries: int = 0
    tokens_from: str = "streamed chunks"  # where committed_tokens came from
    prompt_sent: str = "text"  # "token ids" where the server takes them, else "text"

    def as_dict(self) -> dict:
        # The server's usage, or None where it sent none (llama-cpp-python's stream):
        # committed_tokens then counts the streamed chunks, and "tokens_from" says so.
        return {**super().as_dict(), "target": "remote",
                "decoded_by": "the server (no local draft verification)",
                "server_usage": self.server_usage or None,
                "tokens_from": self.tokens_from, "retries": self.retries,
                "prompt_sent": self.prompt_sent}

    def summary(self) -> str:
        return (f"target=remote tokens={self.committed_tokens} prompt={self.prompt_tokens}"
                f" first_token={self.first_token_ms:.0f}ms total={self.total_ms:.0f}ms"
                + (f" retries={self.retries}" if self.retries else ""))


def sampling_fields(s) -> dict:
    """assistd's sampling parameters as the servers name them (llama.cpp's
    ``repeat_penalty``, vLLM's ``repetition_penalty``; ``top_k`` 0 and ``min_p`` 0 are
    off, against llama.cpp's defaults of 40 and 0.05); greedy is temperature 0."""
    from assistd.ground.sampling import GREEDY

    s = GREEDY if s is None else s
    out = {"temperature": float(s.temperature), "top_p": float(s.top_p), "top_k": int(s.top_k),
           "min_p": 0.0, "repeat_penalty": float(s.repetition_penalty),
           "repetition_penalty": float(s.repetition_penalty)}
    if s.seed is not None:
        out["seed"] = int(s.seed)
    return out


def sleep(seconds: float, cancelled) -> bool:
    """Wait ``seconds``; False as soon as ``cancelled()`` turns true."""
    end = time.monotonic() + max(0.0, seconds)
    while time.monotonic() < end:
        if cancelled is not None and cancelled():
            return False
        time.sleep(min(POLL_S, max(0.0, end - time.monotonic())))
    return True


class Generating(Target):
    """The generation methods of a remote Target (a mixin of ``RemoteTarget``). Reads
    the Target's ``server``, ``url``, ``timeout_s``, ``deadline_s``, ``n_ctx``,
    ``model_name``, its prompt and tokenizer methods, and reports to its health
    (``_seen``, ``_failed``)."""

    _overran = False  # the server streamed past max_tokens (said once)

    def deadline_for(self, max_tokens: int) -> float:
        """The deadline of one generation of ``max_tokens``, seconds from its start:
        ``deadline_s`` when configured, else ``timeout_s + max_tokens /``
        :data:`DEADLINE_TOKENS_PER_S` (the first chunk within the read timeout, then 1
        token a second at the least: 30 s + 64 s for 64 tokens by default)."""
        if self.deadline_s is not None:
            return self.deadline_s
        return self.timeout_s + max(1, int(max_tokens)) / DEADLINE_TOKENS_PER_S

    def complete(self, prompt: Sequence[int], *, max_tokens: int, sampling=None,
                 stop: Sequence[str] = (), stop_at: Callable[[str], int | None] | None = None,
                 cancelled: Callable[[], bool] | None = None,
                 between_rounds: Callable[[], bool] | None = None) -> RemoteResult:
        """Stream one completion of ``prompt`` (token ids) from ``/v1/completions``.

        ``stop`` strings and ``stop_at`` (the engine's contract: called with the text so
        far, returns where it ends or None) are applied here, on the text, and end the
        stream; ``cancelled()`` is polled every :data:`POLL_S` s and between chunks and
        ends it with ``"cancelled"``; ``between_rounds()`` is called while waiting (the
        daemon's preemption). Reading stops at ``max_tokens`` worth of text (stop reason
        ``"max_tokens"``, see the module), and with an error of kind "deadline" at
        :meth:`deadline_for` or when no text came for twice ``timeout_s`` (a stream of
        keep-alives or empty chunks never trips the socket's read timeout, which ends a
        silent one at ``timeout_s``). Raises
        :class:`InputError` when the prompt does not fit ``n_ctx`` or the server refuses
        it (HTTP 400), :class:`RemoteTargetError` for the rest, its ``kind`` saying which
        (see the module for the retry policy)."""
        n_prompt = self.prompt_tokens(prompt)
        if n_prompt + 1 >= self.n_ctx:
            raise InputError(f"the prompt is {n_prompt} tokens; the context window is {self.n_ctx}")
        max_tokens = int(max_tokens)
        ledger = RemoteLedger(prompt_tokens=n_prompt)
        t0 = time.perf_counter()
        limit = self.deadline_for(max_tokens)
        deadline = time.monotonic() + limit
        sent = self.prompt_ids(prompt) if self.takes_token_ids() else None
        ledger.prompt_sent = "text" if sent is None else "token ids"
        body = {"prompt": self.prompt_text(prompt) if sent is None else sent,
                "max_tokens": max_tokens,
                "stream": True, "stream_options": {"include_usage": True}, "echo": False,
                **sampling_fields(sampling)}
        if self.model_name:
            body["model"] = self.model_name
        stops = [s for s in stop if s]
        longest = max((len(s) for s in stops), default=0)
        max_chars = max_tokens * MAX_TOKEN_CHARS
        text, chunks, reason, scanned = "", 0, None, 0
        for attempt in range(RETRIES + 1):
            ledger.retries = attempt
            sent = time.perf_counter()
            stream = Stream(self.server, body)
            quiet_until = time.monotonic() + 2 * self.timeout_s  # no text by then: an error
            try:
                while reason is None:
                    ev = stream.next(cancelled, between_rounds, min(deadline, quiet_until))
                    if ev is None:
                        reason = "cancelled"
                        break
                    kind = ev[0]
                    if kind == "deadline":
                        if time.monotonic() >= deadline:
                            self._past_deadline(limit, max_tokens, chunks)
                        self._no_text(chunks)
                    if kind == "open":
                        self._seen((time.perf_counter() - sent) * 1000)
                        continue
                    if kind == "text":
                        piece, finish, usage = ev[1], ev[2], ev[3]
                        if usage:
                            ledger.server_usage = usage
                        if piece:
                            quiet_until = time.monotonic() + 2 * self.timeout_s
                            if chunks >= max_tokens:  # the server ignores max_tokens
                                self._overrun(max_tokens)
                                reason = "max_tokens"
                                break
                            if len(text) + len(piece) > max_chars:  # more than it holds
                                piece = piece[:max_chars - len(text)]
                                self._overrun(max_tokens)
                                finish = "length"
                            if not chunks:
                                ledger.first_token_ms = (time.perf_counter() - t0) * 1000
                            chunks += 1
                            text += piece
                            if stops:
                                start = max(0, scanned - longest + 1)
                                hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
                                scanned = len(text)
                                if hits:
                                    text, reason = text[:min(hits)], "stop"
                                    break
                            if stop_at is not None and (cut := stop_at(text)) is not None:
                                text, reason = text[:cut], "stop"
                                break
                        if finish:
                            reason = "max_tokens" if finish == "length" else "eos"
                        continue
                    if kind == "done":
                        # The stream ended without a finish reason: a server that failed
                        # before (or while) writing its answer, never an empty completion
                        # (one that has nothing to say still finishes with "stop").
                        if reason is None:
                            skipped = ev[1]
                            what = (f"after {chunks} {'chunk' if chunks == 1 else 'chunks'}"
                                    if chunks else "before any completion")
                            bad = (f" ({skipped} unreadable {'event' if skipped == 1 else 'events'}"
                                   " skipped)" if skipped else "")
                            raise RemoteTargetError(
                                f"the remote Target {self.url} closed the stream {what}"
                                f" without finishing{bad}; the completion was dropped"
                                " (nothing was stored)", "malformed")
                        break
                    if kind == "error":  # (kind, retryable, wait_s, the exception, whether
                        _, retryable, wait, exc, answered = ev  # it is an HTTP answer)
                        if chunks:
                            raise with_message(exc, (
                                f"{exc}, after {chunks} {'chunk' if chunks == 1 else 'chunks'}"
                                " of text: the completion"
                                " was dropped (nothing was stored)"))
                        pause = wait if wait is not None else BACKOFF_S[min(attempt, 1)]
                        if (retryable and attempt < RETRIES and (wait or 0) <= RETRY_AFTER_MAX_S
                                and time.monotonic() + pause < deadline):
                            self._failed(str(exc), answered)
                            if not sleep(pause, cancelled):
                                reason = "cancelled"
                            break
                        if (retryable and wait is not None and wait <= RETRY_AFTER_MAX_S
                                and time.monotonic() + wait >= deadline):
                            exc = with_message(exc, f"{exc}; it asks to wait {wait:g} s,"
                                                  f" past the deadline of {limit:g} s")
                        self._failed(str(exc), answered)
                        raise with_message(exc, str(exc) + (
                            f" (after {attempt} retries)" if attempt else ""))
            finally:
                stream.close()
            if reason is not None:
                break
        ledger.total_ms = (time.perf_counter() - t0) * 1000
        tokens = []
        if self._mode in ("model", "server") and text:
            try:  # the text's ids (the server streams text): for counts, not decoding
                tokens = self.tokenize(text)
            except RemoteTargetError:
                pass  # the server left after answering: the answer stands
        # The server's tokens: its usage; else the limit it stopped at; else the text's
        # tokens; else one per chunk (a chunk may hold several tokens, or part of one).
        ledger.committed_tokens, ledger.tokens_from = next(
            (n, src) for n, src in (
                (ledger.server_usage.get("completion_tokens"), "server usage"),
                (max_tokens if reason == "max_tokens" else None, "max_tokens reached"),
                (len(tokens) if tokens else None, "the text tokenized"),
                (chunks, "streamed chunks")) if isinstance(n, int))
        if reason == "eos" and self.eos_token_ids:
            tokens.append(min(self.eos_token_ids))
        return RemoteResult(text=text, stop_reason=reason, tokens=tokens, ledger=ledger)

    def _past_deadline(self, limit: float, max_tokens: int, chunks: int):
        why = ("target_deadline_ms" if self.deadline_s is not None else
               f"{self.timeout_s:g} s + {max_tokens} tokens at {DEADLINE_TOKENS_PER_S:g} tokens/s")
        message = (f"the remote Target {self.url} did not finish within the deadline of"
                   f" {limit:g} s ({why}) after {chunks} {'chunk' if chunks == 1 else 'chunks'};"
                   " the completion was dropped (nothing was stored); a slow server needs a"
                   " larger --target-deadline-ms (target_deadline_ms)")
        self._failed(message, answered=chunks > 0)
        raise RemoteTargetError(message, "deadline")

    def _no_text(self, chunks: int):
        message = (f"the remote Target {self.url} sent no text for {2 * self.timeout_s:g} s"
                   + (f" after {chunks} {'chunk' if chunks == 1 else 'chunks'}" if chunks else "")
                   + " (only keep-alives or empty chunks); the completion was dropped (nothing"
                   " was stored); the server may be overloaded: check it, or raise"
                   " --target-timeout-ms (target_timeout_ms)")
        self._failed(message, answered=True)
        raise RemoteTargetError(message, "deadline")

    def _overrun(self, max_tokens: int) -> None:
        if not self._overran:  # said once: the server ignores the limit it was sent
            self._overran = True
            log.warning("warning: the remote Target %s streamed more than max_tokens (%d)"
                        " worth of text: the rest was not read", self.url, max_tokens)
