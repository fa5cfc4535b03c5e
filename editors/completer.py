"""The editor's side of a completion: open buffers, the prompt window, type-through and
the boundary rules of an inline suggestion, over one
:class:`~assistd.runtime.runtime.Runtime` (the engine path: history -> proposer ->
Target -> verification -> ledger).

Every method runs on one thread at a time: the LSP server's worker thread
(``editors.server``), or the daemon's scheduler thread when the daemon hosts the
session (:func:`host`). The Target, its KV cache, the SQLite connection and the
history index are not thread-safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from assistd.ground.ledger import Ledger
from assistd.runtime.runtime import LOADING, Runtime
from editors import crossfile, prompting
from editors.crossfile import CrossFile
from editors.settings import Settings
from storage.suggestions import Served, line_context

log = logging.getLogger("assistd.lsp")

MAX_BUFFER_CHARS = 1_000_000  # an open buffer larger than this is not drafted from
PENDING_SUGGESTIONS = 256  # suggestions remembered for telemetry (most recent)
DISMISSED_PLACES = 32  # per document: places where the user dismissed a suggestion
BUFFER_REFRESH_S = 1.0  # the document being typed in is re-tokenized at most this often


@dataclass
class Request:
    """One completion request, a snapshot taken on the event loop.

    text:     the document (its own line endings); offset: code points into it.
    buffers:  ``{uri: text}`` of the other open documents (live history).
    cancel:   set by ``$/cancelRequest`` or by a newer request for the same document.
    explicit: the user asked (inline completion's Invoked trigger): served even where a
        suggestion was dismissed before.
    """

    uri: str
    text: str
    offset: int
    language: str
    buffers: dict[str, str] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)
    explicit: bool = False


@dataclass
class Suggestion:
    """The answer: ``text`` to insert at the cursor (document conventions; "" = none),
    replacing the ``replace`` characters before it (whitespace on the cursor's line, where
    the editor indented otherwise than the suggestion; :func:`editors.prompting.fit`).
    ``item_text``: the same edit as a completion item's text, its lines after the first
    relative to the line's indentation, which editors add back
    (:func:`editors.prompting.item_text`; "" where that cannot be written).

    source: "target" (a generation), "type-through" (the rest of the previous
        suggestion, no Target call), "dismissed" (none: the user dismissed one at this
        place) or "cancelled".
    ledger: the generation's counters (None without a generation).
    """

    id: str
    text: str
    source: str
    replace: int = 0
    item_text: str = ""
    stop_reason: str | None = None
    ledger: Ledger | None = None
    ms: float = 0.0
    growable: bool = False  # the time budget cut it: :meth:`Completer.grow` may go on
    # Characters of the suggestion, from its start, that accepting this answer gives:
    # its text, plus what was typed through before it (the accept command carries it,
    # so a suggestion that grew after this answer counts what was inserted).
    covers: int = 0

    def as_dict(self) -> dict:
        return {"id": self.id, "text": self.text, "source": self.source,
                "replace": self.replace,
                "stop_reason": self.stop_reason, "ms": round(self.ms, 2),
                "ledger": self.ledger.as_dict() if self.ledger else None}


@dataclass
class _Last:
    prefix: str
    suffix: str
    text: str  # the suggestion with "\n" line endings
    served: Served
    grown: bool = False  # longer than what was answered: serve it at the same place too


@dataclass
class _Grow:
    """A suggestion the time budget cut, and what continuing its generation needs."""

    uri: str
    prompt: list[int]
    tokens: list[int]  # every token generated so far (past the cut too)
    plan: object
    scope: str | None
    pctx: prompting.CursorContext
    ctx: prompting.CursorContext
    served: Served


@dataclass
class Counters:
    """What the server did, for ``assistd.stats`` and the typing benchmark."""

    requests: int = 0
    generations: int = 0
    type_through: int = 0
    cancelled_before_start: int = 0
    cancelled_during: int = 0
    tokens_generated: int = 0
    tokens_cancelled: int = 0  # committed by generations cancelled before they finished
    budget_cuts: int = 0  # suggestions ended by the time budget (maxLatencyMs)
    prompt_tokens_reused: int = 0
    prompt_tokens_evaluated: int = 0
    dismissed_places: int = 0  # requests answered empty: a suggestion was dismissed there
    grown: int = 0  # suggestions made longer in the background after the budget cut them
    tokens_grown: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _with_budget(stop, budget_ms: int, start: float):
    """``stop`` (the boundary rule) plus a time budget: ``budget_ms`` after ``start``
    (perf_counter s: the engine ready for the request) the suggestion ends at its last word
    boundary (an unfinished identifier is dropped unless it is all there is), never
    before its first non-blank text: a cut to nothing would show nothing after the
    wait. A late suggestion is worth less than a short one (llama.vim's
    ``t_max_predict_ms``)."""
    if not budget_ms:
        return stop
    deadline = start + budget_ms / 1000

    def word(ch: str) -> bool:
        return ch.isalnum() or ch == "_"

    def check(text: str) -> int | None:
        cut = stop(text)
        if cut is not None or time.perf_counter() < deadline:
            return cut
        body = text.rstrip()
        if not body.strip():
            return None  # blank so far (the new line, its indent): cutting leaves nothing
        check.budget_hit = True
        i = len(body)
        while i > 0 and word(body[i - 1]):
            i -= 1
        return i if i < len(body) and body[:i].strip() else len(body)

    check.budget_hit = False
    return check


def _place(ctx: prompting.CursorContext) -> str:
    """Where a suggestion was shown: a digest of the text before and after the cursor."""
    h = hashlib.blake2b(ctx.prefix.encode(), digest_size=16)
    h.update(b"\0")
    h.update(ctx.suffix.encode())
    return h.hexdigest()


def uri_path(uri: str) -> Path | None:
    """The real path (symlinks and ``..`` resolved, :func:`os.path.realpath`) of a
    decoded ``file:`` URI (as pygls keys documents: ``%20`` already a space), else None:
    untitled buffers and other schemes, another host's file (``file://host/...``;
    ``localhost`` is this one), a relative or NUL-holding path. Scopes are chosen on
    this path, so a buffer reached through ``A/../B`` or a symlink in A is B's.

    >>> uri_path("file:///tmp/my file#1.py"), uri_path("untitled:Untitled-1")
    (PosixPath('/tmp/my file#1.py'), None)
    """
    if uri[:5].lower() != "file:":
        return None
    rest = uri[5:]
    if rest.startswith("//"):
        host, slash, rest = rest[2:].partition("/")
        if host.lower() not in ("", "localhost"):
            return None
        rest = slash + rest
    if not rest.startswith("/") or "\0" in rest:
        return None
    return Path(os.path.realpath(rest))


class Completer:
    """Long-lived editor state over a :class:`Runtime`, opened lazily; raises
    :class:`assistd.ground.errors.AssistdError` (model missing, bad database) from the
    first call that needs the part that fails.

    ``shared``: the daemon's Runtime, which serves every editor session (the settings'
    model, backend, numerics and db are then the daemon's); None: this Completer opens its own.
    """

    def __init__(self, settings: Settings | None = None, shared: Runtime | None = None):
        self.settings = settings or Settings()
        self.shared = shared
        self.runtime: Runtime | None = shared
        self.owner = "lsp"  # labels this session's KV sequence in the daemon's status
        self.host = ""  # hosted by the daemon: its editor socket and session number
        self.counters = Counters()
        # uri -> (doc id, scope, sha1 of the text, monotonic time it was tokenized)
        self._buffers: dict[str, tuple[int, str, str, float]] = {}
        self._windows: dict[str, int] = {}  # uri -> prompt window start (chars of prefix)
        self._last: dict[str, _Last] = {}
        self._pending: OrderedDict[str, Served] = OrderedDict()
        self.crossfile = CrossFile()  # snippets of the other open buffers for the prompt
        self._place: dict[str, tuple[str, str]] = {}  # suggestion id -> (uri, place)
        self._dismissed: dict[str, OrderedDict[str, None]] = {}  # uri -> places
        self._grow: _Grow | None = None  # the last answer, when the budget cut it

    # The runtime's parts (None before the first request opens them).
    target = property(lambda self: self.runtime and self.runtime.target)
    store = property(lambda self: self.runtime and self.runtime.store)
    tuner = property(lambda self: self.runtime and self.runtime.tuner)
    index = property(lambda self: self.runtime and self.runtime.index)
    suggestions = property(lambda self: self.runtime and self.runtime.suggestions)

    # -- lifecycle -----------------------------------------------------------

    def configure(self, settings: Settings) -> None:
        """New settings; a changed model, backend, n_ctx, numerics or db reopens those parts."""
        if settings.engine_key() != self.settings.engine_key() and self.shared is None:
            self.close()
        elif self.shared is not None and settings.engine_key() != Settings().engine_key():
            # One Target serves every client of the daemon: its kernels are its own.
            log.warning("the daemon's Target and history serve this editor: the model,"
                        " backend, n_ctx, numerics and db settings are the daemon's"
                        " (`assistd serve`; its Target runs %s numerics)",
                        self.shared.target.numerics)
        self.settings = settings
        self._last.clear()

    def open(self, progress=None) -> None:
        """Open the runtime: the store, the Target and the tuner (calibrating t(n) once
        per Target), as :meth:`Runtime.open` does, logging each part's time.
        ``progress(message)`` is told each stage (called on this thread). Raises
        AssistdError (HistoryError, ModelError) from the part that fails."""
        if self.runtime is not None:
            return
        s = self.settings
        started = [time.perf_counter()]

        def stage(name: str) -> None:
            if name == LOADING:  # (a remote one: its URL, never the key)
                log.info("loading %s", s.target)
            else:  # the tuner logs whether it calibrated or read its cache
                log.info("model loaded in %.1f s", time.perf_counter() - started[0])
                started[0] = time.perf_counter()
            if progress is not None:
                progress(name)

        self.runtime = Runtime.open(s.target, db=Path(s.db) if s.db else None, progress=stage)
        log.info("history and tuner ready in %.1f s", time.perf_counter() - started[0])
        self._buffers.clear()

    def close(self) -> None:
        """Drop this session's buffers and per-document state; close the runtime when it
        is this Completer's own (the daemon's stays open for the other sessions)."""
        for uri in list(self._buffers):
            self.drop_buffer(uri)
        self._windows.clear()
        self._last.clear()
        self._dismissed.clear()
        self._grow = None
        self.crossfile.clear()
        if self.shared is not None:
            self._pending.clear()
            self._place.clear()
            return
        if self.runtime is not None:
            self.runtime.close()
        self.runtime = None
        self._buffers.clear()

    # -- history: repositories and open buffers --------------------------------

    def scope_of(self, uri: str) -> str | None:
        """The history scope of a document (:meth:`Runtime.resolve_scope`): its git root,
        indexed on first use. A file outside git drafts only from a directory
        ``assistd index`` took before."""
        path = uri_path(uri)
        if path is None:
            return None
        return self.runtime.resolve_scope(path.parent).root

    def reindex(self, uri: str) -> None:
        """After a save: bring the document's repository up to date in the history."""
        path = uri_path(uri)
        if self.runtime is None or path is None:
            return
        self.runtime.resolve_scope(path.parent, refresh=True)
        self.crossfile.touch(uri)

    def drop_buffer(self, uri: str) -> None:
        """A closed document leaves the live history and every per-document cache."""
        entry = self._buffers.pop(uri, None)
        if entry is not None and self.index is not None:
            self.index.remove(entry[0])
        self._windows.pop(uri, None)
        self._last.pop(uri, None)
        self._dismissed.pop(uri, None)
        if self._grow is not None and self._grow.uri == uri:
            self._grow = None
        self.crossfile.drop(uri)

    def _sync_buffers(self, scope: str, buffers: dict[str, str], current: str) -> None:
        """Open buffers of ``scope`` as history documents (tokenized when changed), those
        the history would keep only (:func:`editors.crossfile.kept`: never an open
        ``.env``, ``*.key``, ignored file or ``.git/config``; one that became ignored
        leaves). Only these become cross-file sources. The document being typed in
        (``current``) is re-tokenized at most every ``BUFFER_REFRESH_S``: not the whole
        file on every keystroke."""
        rules = crossfile.history_rules(scope)  # read now: an ignore file may have changed
        for uri, text in buffers.items():
            if len(text) > MAX_BUFFER_CHARS:
                continue
            path = uri_path(uri)  # real paths on both sides: no way out through .. or links
            if path is None or path == Path(scope) or not path.is_relative_to(scope):
                continue
            if not crossfile.kept(rules, path.relative_to(scope).as_posix(), text):
                self._unindex(uri)
                continue
            entry = self._buffers.get(uri)
            fresh = entry is not None and self.index.has(entry[0])
            if fresh and uri == current and time.monotonic() - entry[3] < BUFFER_REFRESH_S:
                continue  # the text near the cursor is in the prompt anyway
            sha = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
            if fresh and entry[2] == sha:
                continue
            doc_id = entry[0] if entry else self._new_buffer_id()
            if not getattr(self.target, "remote", False):  # (nothing drafts on a remote one,
                # and its tokenizer may be the server's: the buffer would be sent there)
                self.index.put(scope, doc_id, self.target.tokenize(text), name=f"buffer:{path.name}")
            self._buffers[uri] = (doc_id, scope, sha, time.monotonic())

    def _unindex(self, uri: str) -> None:
        """``uri`` leaves the live history and the cross-file sources (its editor state,
        the prompt window and type-through, stays)."""
        entry = self._buffers.pop(uri, None)
        if entry is not None and self.index is not None:
            self.index.remove(entry[0])
        self.crossfile.drop(uri)

    def _new_buffer_id(self) -> int:
        return self.runtime.new_buffer_id()

    # -- completion ------------------------------------------------------------

    def complete(self, req: Request) -> Suggestion:
        """The suggestion at ``req.offset``; "" when there is none. Raises AssistdError
        (model, store) and RuntimeError (backend failure)."""
        t0 = time.perf_counter()
        self.counters.requests += 1
        if req.cancel.is_set():
            self.counters.cancelled_before_start += 1
            return Suggestion(id="", text="", source="cancelled")
        ctx = prompting.context_at(req.text, req.offset)
        place = _place(ctx)
        if not req.explicit and place in self._dismissed.get(req.uri, ()):
            self.counters.dismissed_places += 1
            return Suggestion(id="", text="", source="dismissed")
        served = self._type_through(req.uri, ctx)
        if served is not None:
            self.counters.type_through += 1
            served.ms = (time.perf_counter() - t0) * 1000
            return served
        self.open()
        s = self.settings
        scope = self.scope_of(req.uri)
        # The budget starts once the engine is ready: a request held while the model
        # loaded, or a repository indexed on first use, is not cut to nothing.
        t_ready = time.perf_counter()
        if scope is not None:
            self._sync_buffers(scope, {**req.buffers, req.uri: req.text}, req.uri)
        pctx = prompting.prompt_context(ctx)  # an auto-indent is left for the model to write
        ids = self._prompt_ids(req.uri, pctx, self._cross_file(req, scope, pctx))
        plan = self.runtime.plan(s.proposer, s.k, req.language, history=scope is not None)
        name = plan.proposer
        stop = _with_budget(prompting.stop_at(pctx), s.max_latency_ms, t_ready)
        gen = self.runtime.run(ids, plan, scope=scope, max_tokens=s.max_tokens,
                               stop_at=stop, cancelled=req.cancel.is_set, owner=self.owner)
        self.counters.budget_cuts += int(getattr(stop, "budget_hit", False))
        c = self.counters
        c.generations += 1
        c.tokens_generated += len(gen.tokens)
        c.prompt_tokens_reused += gen.ledger.prompt_tokens_reused
        c.prompt_tokens_evaluated += gen.ledger.prompt_tokens_evaluated
        if gen.stop_reason == "cancelled":
            c.cancelled_during += 1
            c.tokens_cancelled += len(gen.tokens)
            return Suggestion(id="", text="", source="cancelled", stop_reason="cancelled",
                              ledger=gen.ledger, ms=(time.perf_counter() - t0) * 1000)
        replace, text = prompting.fit(prompting.postprocess(gen.text, pctx), ctx)
        sid = uuid.uuid4().hex[:16]
        lf = text.replace(ctx.eol, "\n") if ctx.eol != "\n" else text
        # The lines the suggestion completes go with it (never stored): a value is told a
        # secret by the line it completes (`password = "` + the suggestion).
        before, after = line_context(ctx.prefix, ctx.suffix)
        served = Served(id=sid, scope=scope, path=self._rel(req.uri, scope),
                        language_id=req.language, proposer=name,
                        target=self.tuner.target, text=text, before=before, after=after)
        if text:
            self._remember(served, (req.uri, place))
        if text and not replace:  # typing cannot go through a text that replaces indentation
            self._last[req.uri] = _Last(ctx.prefix, ctx.suffix, lf, served)
        else:
            self._last.pop(req.uri, None)
        growable = bool(text and not replace and getattr(stop, "budget_hit", False)
                        and len(gen.tokens) < s.max_tokens)
        self._grow = _Grow(req.uri, ids, list(gen.tokens), plan, scope, pctx, ctx,
                           served) if growable else None
        return Suggestion(id=sid if text else "", text=text, source="target", growable=growable,
                          covers=len(text),
                          replace=replace, item_text=prompting.item_text(text, replace, ctx),
                          stop_reason=gen.stop_reason, ledger=gen.ledger,
                          ms=(time.perf_counter() - t0) * 1000)

    def grow(self, cancelled) -> bool:
        """Go on generating the last answer that the time budget cut (``maxLatencyMs``),
        up to where it would have ended without a budget (end of line or block,
        ``maxTokens``), while the user reads it; ``cancelled()`` (a newer request) ends it
        within one round, keeping what it committed. The longer text is served by
        type-through and to the next request at the same place, under the same id. The
        prompt is the first generation's prompt plus its tokens, all in the KV cache:
        the continuation is exactly what one uncut generation would have given (greedy).
        Returns True when the suggestion grew."""
        g, self._grow = self._grow, None
        last = self._last.get(g.uri) if g is not None else None
        if g is None or last is None or last.served is not g.served or cancelled():
            return False  # accepted, dismissed or replaced meanwhile
        t0, t = time.perf_counter(), self.target
        head = t.detokenize(g.tokens, prev=g.prompt)
        base = prompting.stop_at(g.pctx)

        def stop(new: str) -> int | None:
            cut = base(head + new)
            return None if cut is None else max(0, cut - len(head))

        gen = self.runtime.run(g.prompt + g.tokens, g.plan, scope=g.scope,
                               max_tokens=self.settings.max_tokens - len(g.tokens),
                               stop_at=stop, cancelled=cancelled, owner=self.owner)
        c = self.counters
        c.tokens_generated += len(gen.tokens)
        c.prompt_tokens_reused += gen.ledger.prompt_tokens_reused
        c.prompt_tokens_evaluated += gen.ledger.prompt_tokens_evaluated
        total = head + gen.text
        cut = base(total)
        _, text = prompting.fit(prompting.postprocess(total[:cut], g.pctx), g.ctx)
        eol = g.ctx.eol
        lf = text.replace(eol, "\n") if eol != "\n" else text
        if self._last.get(g.uri) is not last or len(lf) <= len(last.text) or \
                not lf.startswith(last.text):
            return False
        last.text, last.grown = lf, True
        last.served = dataclasses.replace(g.served, text=text)  # what an accept stores
        if g.served.id in self._pending:
            self._pending[g.served.id] = last.served
        c.grown += 1
        c.tokens_grown += len(gen.tokens)
        log.debug("grew a suggestion by %d tokens (%s) in %.0f ms", len(gen.tokens),
                  gen.stop_reason, (time.perf_counter() - t0) * 1000)
        return True

    def _type_through(self, uri: str, ctx: prompting.CursorContext) -> Suggestion | None:
        """The user typed the start of the last suggestion: serve the rest, no Target call
        (and the same place again, once :meth:`grow` made the suggestion longer)."""
        last = self._last.get(uri)
        if last is None or ctx.suffix != last.suffix or not ctx.prefix.startswith(last.prefix):
            return None
        typed = ctx.prefix[len(last.prefix):]
        if (not typed and not last.grown) or not last.text.startswith(typed) or \
                len(last.text) == len(typed):
            return None
        rest = last.text[len(typed):]
        text = rest.replace("\n", ctx.eol) if ctx.eol != "\n" else rest
        return Suggestion(id=last.served.id, text=text, source="type-through",
                          item_text=prompting.item_text(text, 0, ctx),
                          covers=len(typed) + len(text))

    def _prompt_budget(self) -> int:
        """Prompt tokens after the BOS: ``maxPromptTokens``, less where nCtx is short."""
        s = self.settings
        return min(s.max_prompt_tokens, self.target.n_ctx - s.max_tokens - 1) - 1

    def _cross_file(self, req: Request, scope: str | None,
                    ctx: prompting.CursorContext) -> list[int]:
        """The cross-file part of the prompt (:mod:`editors.crossfile`): snippets of the
        scope's other open buffers, at most ``crossFileTokens`` and half the prompt budget;
        [] when off, outside a scope, or when no buffer has a similar chunk."""
        budget = min(self.settings.cross_file_tokens, self._prompt_budget() // 2)
        t = self.target  # a remote one: "file" (its own or this editor's) keeps them local
        if getattr(t, "remote", False) and "file" in (self.settings.target.target_context,
                                                      getattr(t, "context", "all")):
            budget = 0
        if scope is None or budget <= 0:
            self.crossfile.drop_pick(req.uri)
            return []
        for uri, text in req.buffers.items():
            entry = self._buffers.get(uri)  # in this scope and not too large: _sync_buffers
            if entry is not None and entry[1] == scope and uri != req.uri:
                self.crossfile.update(uri, scope, self._rel(uri, scope), text, entry[2])
        return self.crossfile.context(req.uri, scope, self._rel(req.uri, scope), ctx.prefix,
                                      ctx.suffix, budget, self.target.tokenize)

    def _prompt_ids(self, uri: str, ctx: prompting.CursorContext,
                    cross: list[int] | tuple = ()) -> list[int]:
        """Token ids of the prompt: ``cross`` (the cross-file part, taken from the budget)
        then FIM when the model declares FIM tokens (and ``fim`` is "auto"), else the text
        before the cursor. The cross-file part comes before the FIM prefix token, where
        llama.cpp's ``/infill`` puts ``input_extra``.

        The window of the prefix starts at a remembered line start per document, moved
        forward by half the budget only when the prefix outgrows it: typing then only
        appends tokens, so the Target reuses its KV cache (docs/design.md, "Editors") instead of
        re-evaluating a shifted window on every keystroke.
        """
        t, s = self.target, self.settings
        cross = list(cross)
        budget = self._prompt_budget() - len(cross)
        fim = t.fim_tokens() if s.fim == "auto" else None
        tail: list[int] = []
        if fim is not None:
            suffix_ids = t.tokenize(ctx.suffix[: s.max_suffix_chars])[: budget // 4]
            tail = [fim[1], *suffix_ids, fim[2]]
            budget -= len(tail) + 1
        prefix = ctx.prefix
        start = self._windows.get(uri, 0)
        if start > len(prefix) or (start and prefix[start - 1] != "\n"):
            start = 0  # an edit above the window moved its line start: recompute
        ids = t.tokenize(prefix[start:])
        if len(ids) > budget:
            # Move the start to a line start ~budget/2 tokens before the cursor.
            chars_per_token = max(1.0, (len(prefix) - start) / len(ids))
            want = len(prefix) - int(budget / 2 * chars_per_token)
            nl = prefix.find("\n", max(start, want))
            start = nl + 1 if 0 <= nl < len(prefix) else max(start, want)
            ids = t.tokenize(prefix[start:])
            ids = ids[-budget:]
        self._windows[uri] = start
        bos = t.bos_token_id is not None and (t.add_bos or not (cross or ids))
        head = [t.bos_token_id, *cross] if bos else cross
        if fim is not None:
            return head + [fim[0], *ids, *tail]
        return head + ids

    # -- telemetry ---------------------------------------------------------------

    def _remember(self, served: Served, place: tuple[str, str]) -> None:
        self._pending[served.id] = served
        self._pending.move_to_end(served.id)
        self._place[served.id] = place
        while len(self._pending) > PENDING_SUGGESTIONS:
            self._place.pop(self._pending.popitem(last=False)[0], None)

    def event(self, sid: str, event: str, accepted_chars: int = 0) -> bool:
        """The editor reports on suggestion ``sid`` ("shown", "accepted", "partial" with
        ``accepted_chars`` characters, "dismissed"); stored unless ``telemetry`` is off.
        For "accepted", ``accepted_chars`` > 0 is the answer's :attr:`Suggestion.covers`
        (the suggestion may have grown since). False when ``sid`` is unknown (too old)."""
        served = self._pending.get(sid)
        if served is None:
            return False
        if event == "accepted" and 0 < accepted_chars < len(served.text):
            served = dataclasses.replace(served, text=served.text[:accepted_chars])
        if event == "dismissed":
            self._dismiss(sid)
        if event in ("accepted", "dismissed"):
            for uri, last in list(self._last.items()):
                if last.served.id == sid:
                    del self._last[uri]
        if not self.settings.telemetry:
            return True
        self.open()
        doc_id = self.suggestions.event(served, event, accepted_chars=accepted_chars,
                                        tokenize=self.target.tokenize,
                                        fingerprint=self.target.fingerprint)
        if doc_id is not None and served.scope and self.index is not None:
            self.index.sync(self.store)  # the accepted text drafts the next suggestion
        return True

    def _dismiss(self, sid: str) -> None:
        """Not shown again where it was dismissed (Escape, or typed past): the same text
        before and after the cursor would give the same greedy suggestion."""
        uri, place = self._place.get(sid, ("", ""))
        if uri in self._windows:  # the document is still open (drop_buffer forgets it)
            places = self._dismissed.setdefault(uri, OrderedDict())
            places[place] = None
            while len(places) > DISMISSED_PLACES:
                places.popitem(last=False)

    def stats(self) -> dict:
        """The tuner's report (``assistd stats``), user acceptance, and server counters."""
        self.open()
        out = {**self.runtime.stats(), "server": {**self.counters.as_dict(), **self.state()}}
        if self.host:
            out["daemon"] = self.host
        return out

    def state(self) -> dict:
        """Sizes of the per-document state (bounded: closing a document empties its share)."""
        return {"buffers_indexed": len(self._buffers), "prompt_windows": len(self._windows),
                "type_through_entries": len(self._last), "pending_suggestions": len(self._pending),
                "history_tokens": self.index.tokens() if self.index is not None else 0,
                **self.crossfile.state()}

    @staticmethod
    def _rel(uri: str, scope: str | None) -> str:
        path = uri_path(uri)
        if path is None or scope is None:
            return uri
        try:
            return path.relative_to(scope).as_posix()
        except ValueError:
            return path.as_posix()
