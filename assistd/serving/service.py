"""The daemon's engine: one :class:`~assistd.runtime.runtime.Runtime` behind one
:class:`~assistd.runtime.scheduler.Scheduler` thread.

The local API, the MCP tools and ``assistd complete`` through the daemon turn their
requests into jobs here; editor sessions (``assistd lsp`` through the daemon) run
their own jobs on the same scheduler (:mod:`assistd.serving.lsp_host`). Methods named
``*_job`` run on the scheduler's thread; the public ones submit them and return futures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from assistd.serving.config import Config
from assistd.ground.options import parse_k
from assistd.ground.sampling import GREEDY, SamplingParams
from assistd.runtime.scheduler import AGENT, EDITOR, SHELL, Scheduler

log = logging.getLogger("assistd.service")



@dataclass
class GenerationRequest:
    """A generation from the API or MCP, in the Target's token space.

    prompt:    token ids (non-empty; BOS already added when the model wants it).
    max_tokens: tokens to generate at most; stop: stop strings (excluded from the text).
    scope:     history scope (a repository root) to draft from, or None (the live
               request and the only loaded scope).
    on_text:   called on the engine thread with each new piece of text (streaming);
               text that may begin a stop string is held back until it cannot.
    cancel:    set it to stop the generation before its next round.
    prediction: the request's predicted output (token ids; OpenAI's Predicted Outputs),
               a draft source for this request only: never stored, never logged (kept
               out of ``repr``).
    """

    prompt: list[int]
    max_tokens: int = 16
    sampling: SamplingParams = GREEDY
    stop: tuple[str, ...] = ()
    proposer: str | None = None  # None = the configured one; "none" = plain decoding
    k: int | str | None = None  # None = the configured one
    scope: str | None = None
    language: str = "plaintext"
    owner: str = "api"  # who asks (labels its KV sequence in status)
    on_text: Callable[[str], None] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    prediction: list[int] | None = field(default=None, repr=False)


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stop_reason: str
    ledger: dict
    proposer: str
    k: int | str
    queue_ms: float

    @property
    def finish_reason(self) -> str:
        """OpenAI's: "stop" (EOS or a stop string), "length" (max_tokens, context)."""
        return "stop" if self.stop_reason in ("eos", "stop") else (
            "cancelled" if self.stop_reason == "cancelled" else "length")


class _Streamer:
    """stop_at hook that reports new text as it is committed, holding back any tail
    that could still turn into a stop string (so streamed text never shows one)."""

    def __init__(self, on_text, stops):
        self.on_text, self.sent = on_text, 0
        self.hold = max((len(s) for s in stops), default=1) - 1

    def __call__(self, text: str) -> None:
        safe = len(text) - self.hold if self.hold else len(text)
        if safe > self.sent:
            self.on_text(text[self.sent:safe])
            self.sent = safe
        return None

    def finish(self, final: str) -> None:
        if len(final) > self.sent:
            self.on_text(final[self.sent:])
            self.sent = len(final)


class Service:
    """Owns the Target, the engine's store connection, the tuner and the history index.

    ``start()`` loads them on the scheduler thread (raises what loading raises:
    :class:`ModelError`, :class:`HistoryError`). Thread-safe: submit from anywhere.
    """

    def __init__(self, config: Config):
        self.config = config
        self.scheduler = Scheduler()
        self.runtime = None  # the one Runtime, opened by start() on the scheduler thread
        self.model_id = ""
        self.started_at = time.time()
        self.editors = None  # the daemon's LspHost (editor sessions), when it hosts one
        self.requests = {"api": 0, "lsp": 0, "complete": 0, "mcp": 0}
        self.generations_cancelled = 0  # stopped early: the client hung up or cancelled
        self._inflight: set[threading.Event] = set()  # cancel flags of queued/running generations
        self._inflight_lock = threading.Lock()
        self.watcher = None  # the daemon's WatcherThread, for status()
        self.connections = None  # the daemon's ConnectionGuard, for status()

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self.scheduler.start()
        self.scheduler.submit(self._open_job, EDITOR, "load").result()

    def _open_job(self) -> None:
        from assistd.runtime.runtime import Runtime

        c = self.config
        log.info("loading the Target; the first use of a Target also measures its forward"
                 " times t(n): a few seconds on an idle machine")
        self.runtime = Runtime.open(c.target, db=Path(c.db).expanduser() if c.db else None,
                                    sequences=c.sequences, max_bytes=c.max_bytes)
        self.model_id = c.model_name or (  # a remote one's path is its URL: the server's
            # own model id (asked at open: target_model, else the first of its /v1/models)
            (self.target.display_model or "remote") if c.backend == "openai"
            else Path(self.target.model_path).stem)

    # The runtime's parts, for the API's prompt checks and status (None before start()).
    target = property(lambda self: self.runtime and self.runtime.target)
    store = property(lambda self: self.runtime and self.runtime.store)
    tuner = property(lambda self: self.runtime and self.runtime.tuner)
    index = property(lambda self: self.runtime and self.runtime.index)
    suggestions = property(lambda self: self.runtime and self.runtime.suggestions)

    def close(self) -> None:
        """Finish the job in hand, then release the Target and the store (on their thread)."""
        try:
            self.scheduler.submit(self._close_job, EDITOR, "close").result(timeout=60)
        except Exception:  # noqa: BLE001 - already stopping
            pass
        self.scheduler.stop()

    def _close_job(self) -> None:
        if self.runtime is not None:
            self.runtime.close()  # every ledger row is committed per generation already

    def submit(self, fn, priority: int, name: str) -> Future:
        return self.scheduler.submit(fn, priority, name)

    # -- history -----------------------------------------------------------------

    def scope_job(self, path: str | None) -> str | None:
        """The history scope of a path (:meth:`Runtime.resolve_scope`), engine thread."""
        return self.runtime.resolve_scope(path).root

    # -- generation ----------------------------------------------------------------

    def generate(self, req: GenerationRequest, priority: int = AGENT,
                 kind: str = "api") -> Future:
        """Queue a generation; the future gives a :class:`GenerationResult`."""
        self.requests[kind] = self.requests.get(kind, 0) + 1
        queued = time.monotonic()
        with self._inflight_lock:
            self._inflight.add(req.cancel)
        fut = self.submit(lambda: self._generate_job(req, queued), priority,
                          f"{kind}:generate")

        def forget(_):
            with self._inflight_lock:
                self._inflight.discard(req.cancel)

        fut.add_done_callback(forget)
        return fut

    def cancel_all(self) -> int:
        """Stop every queued and running generation before its next round (shutdown):
        each ends with what it has, its ledger recorded. Returns how many."""
        with self._inflight_lock:
            flags = list(self._inflight)
        for f in flags:
            f.set()
        return len(flags)

    def _generate_job(self, req: GenerationRequest, queued: float) -> GenerationResult:
        queue_ms = (time.monotonic() - queued) * 1000
        rt = self.runtime
        name = req.proposer or self.config.proposer
        k = req.k if req.k is not None else self.config.k
        scope = rt.resolve_scope(req.scope).root if req.scope else None
        if scope is None:
            rt.index.sync(rt.store)  # no scope: draft from every loaded one, kept current
        plan = rt.plan(name, k, req.language)
        streamer = _Streamer(req.on_text, req.stop) if req.on_text is not None else None
        gen = rt.run(req.prompt, plan, scope=scope, max_tokens=req.max_tokens,
                     sampling=req.sampling, stop=req.stop, stop_at=streamer,
                     cancelled=req.cancel.is_set, between_rounds=self.scheduler.preempt,
                     owner=req.owner, prediction=req.prediction)
        if streamer is not None:
            streamer.finish(gen.text)
        self.generations_cancelled += gen.stop_reason == "cancelled"
        # The plan drafted from the prediction when it had tokens and the plan drafts at
        # all (LocalDecoder.run). (Usage's prediction counts are the API's, off this thread.)
        drafted = bool(req.prediction) and plan.speculative and not rt.remote
        return GenerationResult(text=gen.text, tokens=gen.tokens, stop_reason=gen.stop_reason,
                                ledger=gen.ledger.as_dict(),
                                proposer="prediction" if drafted else plan.proposer,
                                # a remote Target drafts nothing: 0, as its plan says
                                k=plan.k if plan.speculative or rt.remote else parse_k(k),
                                queue_ms=round(queue_ms, 2))

    def complete_at(self, args: dict) -> Future:
        """``assistd complete`` through the daemon: :func:`assistd.runtime.session.complete_at`
        with the daemon's Target, store and tuner. ``args`` are its keyword arguments
        (JSON: prompt_text, repo, proposer, k, max_tokens, max_prompt_tokens, stop,
        sampling, language). The future gives ``Completion.as_dict()``."""
        kind = "mcp" if args.get("client") == "mcp" else "complete"
        self.requests[kind] += 1
        return self.submit(lambda: self._complete_at_job(args), SHELL, kind)

    def _complete_at_job(self, args: dict) -> dict:
        from assistd.runtime.session import complete_at

        sampling = SamplingParams(**(args.get("sampling") or {}))
        result = complete_at(
            args["prompt_text"], repo=Path(args["repo"]) if args.get("repo") else None,
            proposer=args.get("proposer", "suffix"), k=args.get("k", "auto"),
            max_tokens=int(args.get("max_tokens", 64)),
            max_prompt_tokens=int(args.get("max_prompt_tokens", 1024)),
            runtime=self.runtime, sampling=sampling, stop=tuple(args.get("stop") or ()),
            guess_outside_git=bool(args.get("guess_outside_git")),
            language=args.get("language") or "plaintext", between_rounds=self.scheduler.preempt,
            owner="mcp" if args.get("client") == "mcp" else "complete")
        out = result.as_dict()
        out["daemon"] = True
        return out

    # -- reports -----------------------------------------------------------------------

    def stats_job(self, scope: str | None = None) -> dict:
        return self.runtime.stats(scope)

    def status(self) -> dict:
        """What the daemon is doing (any thread; no engine job)."""
        import resource

        s = self.scheduler.stats
        t = self.target
        editors = self.editors.status() if self.editors is not None else None
        return {
            "model": self.model_id,
            "target": None if t is None else {"backend": t.backend, "model": t.model_path,
                                              "n_ctx": t.n_ctx, "device": t.device,
                                              "threads": getattr(t, "n_threads", None),
                                              "numerics": t.numerics,
                                              # what speculative output promises
                                              "promise": t.promise,
                                              "speculation_off": t.speculation_off,
                                              # reachable, model, latency: a remote one's
                                              **({"remote": t.status()}
                                                 if getattr(t, "remote", False) else {})},
            "uptime_s": round(time.time() - self.started_at, 1),
            # the history database this daemon reads and writes
            "db": str(self.runtime.store.path) if self.runtime is not None else None,
            # Editor sessions submit their own jobs (named "lsp:complete" and so on).
            "requests": {**self.requests, "lsp": s.by_name.get("lsp:complete", 0)},
            "tokens_generated": self.runtime.tokens_generated if self.runtime else 0,
            "generations_cancelled": self.generations_cancelled,
            "jobs_running": self.scheduler.running(),
            "jobs_queued": self.scheduler.queued(),
            "scheduler": {**s.__dict__, "queue_ms_total": round(s.queue_ms_total, 1),
                          "queue_ms_max": round(s.queue_ms_max, 1)},
            # Initialized editor sessions; "editors" also has those yet to initialize
            # and how many connections the deadline, the cap or bad framing closed.
            "lsp_sessions": editors["sessions"] if editors is not None else 0,
            "editors": editors,
            "sequences": self.runtime.sequences.status() if self.runtime is not None else None,
            "history_scopes_loaded": self.index.scopes() if self.index is not None else [],
            "history_tokens_loaded": self.index.tokens() if self.index is not None else 0,
            "watcher": self.watcher.status() if self.watcher is not None else None,
            "connections": (self.connections.status() if self.connections is not None
                            else None),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
