"""The daemon's engine: one Target, the history index, the tuner and the store, behind
one :class:`~assistd.serving.scheduler.Scheduler` thread.

Every front end (the local API, the MCP tools, ``assistd complete`` and ``assistd
lsp`` through the daemon) turns its request into a job here; the job runs the one
engine path, history -> proposer -> Target -> verification -> ledger
(:func:`assistd.decoding.engine.generate`). Methods named ``*_job`` run on the scheduler's
thread; the public ones submit them and return futures.
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
from assistd.ground.errors import InputError
from assistd.ground.sampling import GREEDY, SamplingParams
from assistd.serving.scheduler import AGENT, EDITOR, SHELL, Scheduler

log = logging.getLogger("assistd.service")

# An LSP session not heard from for this long is closed (its editor died without a
# shutdown): its buffers leave the shared history index.
LSP_SESSION_IDLE_S = 3600.0


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
    """

    prompt: list[int]
    max_tokens: int = 16
    sampling: SamplingParams = GREEDY
    stop: tuple[str, ...] = ()
    proposer: str | None = None  # None = the configured one; "none" = plain decoding
    k: int | str | None = None  # None = the configured one
    scope: str | None = None
    language: str = "plaintext"
    on_text: Callable[[str], None] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)


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
        self.target = self.store = self.tuner = self.index = self.suggestions = None
        self.model_id = ""
        self.started_at = time.time()
        self._scopes: dict[str, bool] = {}
        self._next_buffer_id = -1_000_000  # LSP buffers of all sessions: one id space
        self.lsp_sessions: dict[str, object] = {}
        self._lsp_seen: dict[str, float] = {}  # session -> monotonic time of its last call
        self.requests = {"api": 0, "lsp": 0, "complete": 0, "mcp": 0}
        self.tokens_generated = 0
        self.generations_cancelled = 0  # stopped early: the client hung up or cancelled
        self._inflight: set[threading.Event] = set()  # cancel flags of queued/running generations
        self._inflight_lock = threading.Lock()
        self.watcher = None  # the daemon's WatcherThread, for status()

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self.scheduler.start()
        self.scheduler.submit(self._open_job, EDITOR, "load").result()

    def _open_job(self) -> None:
        from assistd.targets.open import open_target
        from assistd.runtime.session import open_store
        from assistd.decoding.tuner import Tuner, env_seed
        from proposers.index import HistoryIndex
        from storage.ledger_store import LedgerStore
        from storage.suggestions import SuggestionStore

        c = self.config
        self.store = open_store(Path(c.db).expanduser() if c.db else None)
        self.suggestions = SuggestionStore(self.store)
        self.target = open_target(Path(c.model).expanduser() if c.model else None,
                                  backend=c.backend, n_ctx=c.n_ctx, n_threads=c.threads,
                                  n_gpu_layers=c.n_gpu_layers, device=c.device, dtype=c.dtype,
                                  numerics=c.numerics)
        self.model_id = c.model_name or Path(self.target.model_path).stem
        log.info("Target loaded; opening the tuner (the first use of a Target measures its"
                 " forward times t(n): a few seconds on an idle machine)")
        self.tuner = Tuner.open(LedgerStore(self.store), self.target, seed=env_seed())
        self.index = HistoryIndex(width=2 if self.target.n_vocab < 65535 else 4)

    def close(self) -> None:
        """Finish the job in hand, then release the Target and the store (on their thread)."""
        try:
            self.scheduler.submit(self._close_job, EDITOR, "close").result(timeout=60)
        except Exception:  # noqa: BLE001 - already stopping
            pass
        self.scheduler.stop()

    def _close_job(self) -> None:
        for session in list(self.lsp_sessions.values()):
            session.close()
        self.lsp_sessions.clear()
        if self.target is not None:
            self.target.close()
        if self.store is not None:
            self.store.close()  # every ledger row is committed per generation already
        self.target = self.store = None

    def submit(self, fn, priority: int, name: str) -> Future:
        return self.scheduler.submit(fn, priority, name)

    # -- history -----------------------------------------------------------------

    def new_buffer_id(self) -> int:
        self._next_buffer_id -= 1
        return self._next_buffer_id

    def scope_job(self, path: str | None) -> str | None:
        """The history scope of a path: its repository root, indexed on first use and
        followed through the store's change log afterwards (the watcher writes there).
        A directory outside git drafts only if ``assistd index`` took it before."""
        from storage.indexer import find_repository_root, index_repository, is_repository

        if not path:
            return None
        p = Path(path).expanduser()
        root = find_repository_root(p if p.is_dir() else p.parent)
        scope = str(root)
        if scope not in self._scopes:
            usable = root.is_dir() and (is_repository(root) or self.store.has_scope(scope))
            if usable:
                recursive = is_repository(root) or self.store.scope_recursive(scope)
                index_repository(self.store, root, self.target.tokenize,
                                 self.target.fingerprint, recursive=recursive,
                                 max_bytes=self.config.max_bytes)
                self.store.mark_used(scope)
            self._scopes[scope] = usable
        if not self._scopes[scope]:
            return None
        self.index.ensure(self.store, scope, self.target.fingerprint)
        return scope

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
        from assistd.decoding.engine import generate
        from assistd.runtime.session import proposer_options
        from assistd.decoding.tuner import K_MAX
        from proposers import make_proposer

        queue_ms = (time.monotonic() - queued) * 1000
        t = self.target
        if len(req.prompt) + 1 >= t.n_ctx:
            raise InputError(f"the prompt is {len(req.prompt)} tokens; the context window is"
                             f" {t.n_ctx}")
        max_tokens = min(req.max_tokens, t.n_ctx - len(req.prompt) - 1)
        name = req.proposer or self.config.proposer
        k = req.k if req.k is not None else (
            "auto" if self.config.k == "auto" else int(self.config.k))
        if k == 0:
            name = "none"
        scope = self.scope_job(req.scope) if req.scope else None
        if scope is None and self.index is not None:
            self.index.sync(self.store)
        prop, ceiling, k_run = None, None, 0
        if name != "none":
            options = proposer_options(name, self.index, self.tuner.cost_model(), t)
            try:
                prop = make_proposer(name, **options)
            except KeyError as e:
                raise InputError(str(e).strip('"')) from None
            if k == "auto":
                k_run, ceiling = K_MAX, self.tuner.policy(name, req.language)
            else:
                k_run = int(k)
        streamer = _Streamer(req.on_text, req.stop) if req.on_text is not None else None
        gen = generate(t, req.prompt, prop, max_tokens=max_tokens, k=k_run,
                       sampling=req.sampling, stop=req.stop, scope=scope,
                       language=req.language, ceiling=ceiling, stop_at=streamer,
                       cancelled=req.cancel.is_set, between_rounds=self.scheduler.preempt)
        if streamer is not None:
            streamer.finish(gen.text)
        self.tuner.record(scope, req.language, name, gen.ledger)
        self.tokens_generated += len(gen.tokens)
        self.generations_cancelled += gen.stop_reason == "cancelled"
        return GenerationResult(text=gen.text, tokens=gen.tokens, stop_reason=gen.stop_reason,
                                ledger=gen.ledger.as_dict(), proposer=name, k=k,
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
            n_ctx=self.target.n_ctx, target=self.target, store=self.store,
            sampling=sampling, stop=tuple(args.get("stop") or ()),
            guess_outside_git=bool(args.get("guess_outside_git")),
            language=args.get("language") or "plaintext", tuner=self.tuner,
            between_rounds=self.scheduler.preempt)
        self.tokens_generated += len(result.generation.tokens)
        out = result.as_dict()
        out["daemon"] = True
        return out

    # -- LSP sessions (assistd lsp as a client of the daemon) ---------------------------

    def lsp_job(self, session: str, op: str, args: dict):
        """Run one LSP completer operation for ``session`` (engine thread)."""
        from editors.completer import Completer, Request
        from editors.settings import parse_settings

        now = time.monotonic()
        for other, seen in list(self._lsp_seen.items()):
            if now - seen > LSP_SESSION_IDLE_S and other != session:
                log.info("closing LSP session %s: idle for %.0f s", other, now - seen)
                self.lsp_sessions.pop(other).close()
                del self._lsp_seen[other]
        self._lsp_seen[session] = now
        comp = self.lsp_sessions.get(session)
        if comp is None:
            if op == "close":
                self._lsp_seen.pop(session, None)
                return None
            comp = self.lsp_sessions[session] = Completer(shared=self)
        if op == "configure":
            settings, _ = parse_settings(args.get("settings") or {})
            comp.configure(settings)
            return None
        if op == "complete":
            req = Request(uri=args["uri"], text=args["text"], offset=int(args["offset"]),
                          language=args.get("language") or "plaintext",
                          buffers=args.get("buffers") or {})
            cancel = args.get("_cancel")
            if cancel is not None:
                req.cancel = cancel
            return comp.complete(req).as_dict()
        if op == "reindex":
            return comp.reindex(args["uri"])
        if op == "drop_buffer":
            return comp.drop_buffer(args["uri"])
        if op == "event":
            return comp.event(args["id"], args["event"], int(args.get("accepted_chars", 0)))
        if op == "stats":
            return comp.stats()
        if op == "close":
            comp.close()
            del self.lsp_sessions[session]
            self._lsp_seen.pop(session, None)
            return None
        raise InputError(f"unknown LSP operation {op!r}")

    # -- reports -----------------------------------------------------------------------

    def stats_job(self, scope: str | None = None) -> dict:
        from assistd.runtime.stats import stats_report
        from storage.ledger_store import LedgerStore

        return {"ledger": stats_report(LedgerStore(self.store), scope=scope),
                "user_acceptance": self.suggestions.summary()}

    def status(self) -> dict:
        """What the daemon is doing (any thread; no engine job)."""
        import resource

        s = self.scheduler.stats
        t = self.target
        return {
            "model": self.model_id,
            "target": None if t is None else {"backend": t.backend, "model": t.model_path,
                                              "n_ctx": t.n_ctx, "device": t.device,
                                              "numerics": t.numerics,
                                              "speculation_off": t.speculation_off},
            "uptime_s": round(time.time() - self.started_at, 1),
            "requests": dict(self.requests),
            "tokens_generated": self.tokens_generated,
            "generations_cancelled": self.generations_cancelled,
            "jobs_running": self.scheduler.running(),
            "jobs_queued": self.scheduler.queued(),
            "scheduler": {**s.__dict__, "queue_ms_total": round(s.queue_ms_total, 1),
                          "queue_ms_max": round(s.queue_ms_max, 1)},
            "lsp_sessions": len(self.lsp_sessions),
            "history_scopes_loaded": self.index.scopes() if self.index is not None else [],
            "history_tokens_loaded": self.index.tokens() if self.index is not None else 0,
            "watcher": self.watcher.status() if self.watcher is not None else None,
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
