"""The runtime: the one object every front end drives.

A :class:`Runtime` owns the Target, the history store, the in-memory history index,
the tuner (and through it the Target's cost model) and the user-acceptance store. It
offers what a front end needs and nothing about how that front end talks:

- :meth:`Runtime.resolve_scope`: the history scope of a file or directory (its
  repository root), indexed on first use;
- :meth:`Runtime.prompt`: text before a cursor -> prompt token ids within a budget;
- :meth:`Runtime.plan`: proposer name + draft ceiling ``k`` -> a :class:`Plan`;
- :meth:`Runtime.run`: one generation by the Runtime's decoder, chosen once for its
  Target (:mod:`assistd.runtime.decoders`): speculative decoding here, whose ledger goes
  to the tuner, or a remote Target's server;
- :meth:`Runtime.stats`, :meth:`Runtime.close`.

The CLI's in-process ``complete``, the daemon (:mod:`assistd.serving.service`), the LSP
server (``editors/``), the MCP tools and ``assistd bench`` all assemble their engine
here. A Runtime is used from one thread at a time (the SQLite connection and the
Target are not thread-safe); the daemon's scheduler serialises its jobs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from assistd.decoding.engine import Generation
from assistd.decoding.tuner import Tuner, env_seed
from assistd.ground.errors import InputError
from assistd.ground.ledger import Ledger
from assistd.ground.options import parse_k
from assistd.ground.paths import is_dir, user_path
from assistd.ground.sampling import GREEDY, SamplingParams
from assistd.runtime.decoders import (REMOTE, Plan, check_proposer, decoder_for,  # noqa: F401
                                      proposer_options, served_proposers)  # (imported from here)
from assistd.runtime.sequences import SequencePool
from assistd.targets.base import Target
from assistd.targets.open import open_target
from assistd.targets.spec import DEFAULT_N_CTX, TargetSpec, from_options
from proposers.index import HistoryIndex
from storage.indexer import IndexReport, find_repository_root, index_repository, is_repository
from storage.ledger_store import LedgerStore
from storage.store import HistoryStore, default_db_path
from storage.suggestions import SuggestionStore

# mark_used is a write: at most once a minute per scope, not on every keystroke.
MARK_USED_EVERY_S = 60.0


def index_width(target: Target) -> int:
    """Bytes per token id in the history index: 2 for vocabularies under 65,535, else 4."""
    return 2 if target.n_vocab < 65535 else 4


# The stages Runtime.open reports (an editor shows them as work-done progress).
LOADING = "loading the model"
CALIBRATING = "calibrating (measuring the model's speed, first use only)"


def open_store(db: Path | None, *, create: bool = True) -> HistoryStore:
    """The history database ``db`` (None: ``$ASSISTD_DB``, else the user data dir).
    ``create=False`` (the commands that only read or prune it): raises
    :class:`InputError` when there is no such file, instead of creating it and its
    folders (a mistyped ``--db`` made an empty database)."""
    path = Path(db) if db is not None else default_db_path()
    if not create and not path.exists():
        raise InputError(f"no history database at {path}: `assistd index` (or an editor,"
                         " or `assistd serve`) creates it; pass --db to choose another")
    return HistoryStore(path)


@dataclass
class Scope:
    """A resolved history scope: its root (None: no history) and the index report of
    the scan that brought it up to date now (None when nothing was scanned)."""

    root: str | None
    report: IndexReport | None = None


TOKEN_CHARS = 16  # a token is rarely over 16 characters: the tail a prompt is cut from


def prompt_tail(text: str, budget: int) -> str:
    """The end of ``text`` that :meth:`Runtime.prompt` tokenizes for a budget of
    ``budget`` ids: ``TOKEN_CHARS`` characters per id (a multi-megabyte file before the
    cursor would otherwise take seconds). A client that sends the daemon this tail, or
    a longer one, gets the tokens the whole text would give."""
    return text[-budget * TOKEN_CHARS:] if budget > 0 else ""


class Runtime:
    """The Target (with its KV sequences), the history and the tuner, assembled once.

    ``target`` and ``store`` are taken as given (the Runtime closes them); ``tuner``
    defaults to one opened on the store (the first use of a Target measures t(n):
    a few seconds). ``store`` may be None with a ``tuner`` and an ``index`` given: a
    history in memory only (``assistd bench``), with no scopes to resolve.
    ``max_bytes`` caps each scanned file (None: the indexer's default).
    """

    def __init__(self, target: Target, store: HistoryStore | None, *,
                 tuner: Tuner | None = None, index: HistoryIndex | None = None,
                 seed: int | None = None, max_bytes: int | None = None):
        self.target, self.store = target, store
        kind = decoder_for(target)  # chosen once: here, or a remote Target's server
        self.tuner = tuner or Tuner.open(LedgerStore(store), target, calibrate=kind.calibrates,
                                         seed=seed if seed is not None else env_seed())
        self.index = index if index is not None else HistoryIndex(width=index_width(target))
        self.suggestions = SuggestionStore(store) if store is not None else None
        self.sequences = SequencePool(target)
        self.decoder = kind(target, self.tuner, self.index, self.sequences)
        self.remote = self.decoder.remote  # (front ends show the server's k, not a plan's)
        self.max_bytes = max_bytes
        self._scopes: dict[str, bool] = {}  # scope root -> usable (history may draft)
        self._used: dict[str, float] = {}  # scope -> monotonic time mark_used last wrote
        self._buffer_ids = itertools.count(-1_000_001, -1)  # editor buffers: one id space

    @classmethod
    def open(cls, spec: TargetSpec | Path | None = None, *, db: Path | None = None,
             sequences: int | str = 1, store: HistoryStore | None = None,
             seed: int | None = None, max_bytes: int | None = None,
             progress: Callable[[str], None] | None = None, n_ctx: int | None = None,
             target_options: dict | None = None) -> Runtime:
        """Open the store first (a bad ``db`` fails before the model loads), then the
        Target ``spec`` names (:func:`assistd.targets.open.open_target`, keeping
        ``sequences`` KV sequences), then the tuner (which calibrates t(n) unless its
        cache holds it). Callers not yet moved pass a model path, ``n_ctx`` and
        ``target_options`` (open_target's former keywords). ``progress(stage)``
        hears :data:`LOADING` and :data:`CALIBRATING` as they begin. What was opened is
        closed again when a later part fails. Raises
        :class:`~assistd.ground.errors.HistoryError`, :class:`~assistd.ground.errors.ModelError`."""
        say = progress or (lambda stage: None)
        own = store is None
        store = store or open_store(db)
        try:
            say(LOADING)
            if not isinstance(spec, TargetSpec):
                options = dict(target_options or {})
                sequences = options.pop("sequences", sequences)
                spec = from_options(spec, n_ctx=n_ctx or DEFAULT_N_CTX, **options)
            target = open_target(spec, sequences=sequences)
        except BaseException:
            if own:
                store.close()
            raise
        try:
            say(CALIBRATING)
            return cls(target, store, seed=seed, max_bytes=max_bytes)
        except BaseException:
            target.close()
            if own:
                store.close()
            raise

    @property
    def tokens_generated(self) -> int:
        """Tokens generated by every front end, for status (a remote Target's: the
        server's count)."""
        return self.decoder.tokens_generated

    @property
    def totals(self) -> dict[tuple[str, str], Ledger]:
        """Decode counters since this process started, undecayed, by ``(language,
        proposer)``: every generation's ledger summed (:meth:`Ledger.add`), recorded or
        not. Empty on a remote Target (its server drafts, if anything)."""
        return self.decoder.totals

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of every generation since this process started."""
        return self.decoder.prompt_tokens

    def close(self) -> None:
        """Release the Target and the store (every ledger row is committed already)."""
        if self.target is not None:
            self.target.close()
        if self.store is not None:
            self.store.close()
        self.target = self.store = None

    # -- history ---------------------------------------------------------------

    def new_buffer_id(self) -> int:
        """A document id for an editor buffer (negative: never a stored document's)."""
        return next(self._buffer_ids)

    def resolve_scope(self, path: Path | str | None, *, chosen: bool = False,
                      refresh: bool = False, index: bool = True) -> Scope:
        """The history scope of ``path`` (a file or a directory): its git root, else its
        directory.

        A directory outside git drafts only when the user ``chosen`` it (``--repo``),
        or ``assistd index`` took it before: ``~/scratch.py`` must not pull
        ``~/.netrc`` into the history. Outside git only the top directory is scanned,
        unless ``assistd index`` took the subtree. The scope is scanned (incrementally)
        on first use, or again with ``refresh`` (a saved file); afterwards the index
        follows the store's change log, which the watcher writes. With ``index`` False
        nothing is scanned or loaded: the root is returned when it is a scope (plain
        decoding's steps still belong to the repository's ledger row). Raises
        :class:`InputError` for a path the OS refuses, or a ``chosen`` one that is not a
        directory (a client's ``repo`` of ``/etc/passwd`` must not index ``/etc``).
        """
        if path is None or path == "":
            return Scope(None)
        p = user_path(path)  # InputError for ~nosuchuser
        if chosen and not is_dir(p):  # a chosen scope is a directory, never a file's folder
            raise InputError(f"repo {str(path)[:200]!r} is not a directory; pass a repository"
                             " (or any directory) to draft from")
        try:
            root = find_repository_root(p if p.is_dir() else p.parent)
        except (OSError, ValueError) as e:  # a name the OS refuses (too long)
            raise InputError(f"{str(path)[:80]!r} is not a usable path: {e}") from None
        scope = str(root)
        known = is_repository(root) or self.store.has_scope(scope)
        # A remote Target with the served model's tokenizer here (its GGUF or Hugging Face
        # folder) indexes in that token space, for the engine behind it to draft from
        # (vLLM's proposer: docs/scale.md); with the server's tokenizer nothing is stored.
        drafts = self.decoder.drafts
        index = index and (drafts or getattr(self.target, "local_tokenizer", False))
        if not index:
            return Scope(scope if known else None)
        report = None
        if scope not in self._scopes or refresh:
            usable = root.is_dir() and (known or chosen)
            if usable:
                recursive = is_repository(root) or self.store.scope_recursive(scope)
                options = {} if self.max_bytes is None else {"max_bytes": self.max_bytes}
                report = index_repository(self.store, root, self.target.tokenize,
                                          self.target.fingerprint, recursive=recursive,
                                          **options)
            self._scopes[scope] = usable
        if not self._scopes[scope]:
            return Scope(None)
        if time.monotonic() - self._used.get(scope, -1e9) > MARK_USED_EVERY_S:
            self.store.mark_used(scope)  # eviction keeps the scopes completions use
            self._used[scope] = time.monotonic()
        if drafts:  # (the in-memory index is for drafting here)
            self.index.ensure(self.store, scope, self.target.fingerprint)
        return Scope(scope, report)

    # -- prompts -----------------------------------------------------------------

    def prompt(self, text: str, budget: int) -> list[int]:
        """The last ``budget`` tokens of ``text``, with the Target's BOS first when the
        model wants one (or the text is empty) and it fits. Raises :class:`InputError`
        for an empty prompt on a model without BOS."""
        t = self.target
        budget *= getattr(t, "chars_per_token", 1)  # a remote Target's ids may be characters
        ids = t.tokenize(prompt_tail(text, budget)) if budget > 0 else []
        ids = ids[-budget:] if len(ids) > budget else ids
        return self.with_bos(ids, budget)

    def with_bos(self, ids: list[int], budget: int | None = None) -> list[int]:
        """``ids`` with BOS prepended when the model expects it (or ``ids`` is empty),
        unless that would exceed ``budget`` tokens."""
        t = self.target
        fits = budget is None or len(ids) < budget
        if (t.add_bos or not ids) and t.bos_token_id is not None and fits:
            ids = [t.bos_token_id] + ids
        if not ids:
            raise InputError("empty prompt and the model has no BOS token to start from")
        return ids

    # -- planning and running ------------------------------------------------------

    def plan(self, proposer: str, k, language: str = "plaintext", *,
             history: bool = True, draft_model: Path | None = None) -> Plan:
        """Turn a proposer name and a ceiling into a :class:`Plan`.

        ``proposer``: a registered name (``suffix``, ``ngram``, ``draft_model``, a
        ``peer:...`` rule) or ``"none"``; ``k``: ``"auto"`` or tokens 0..64 (validated
        by :func:`assistd.ground.options.parse_k`; 0 = plain decoding). ``history``:
        whether the proposer may draft from the history index. ``draft_model``: the
        draft's GGUF for ``draft_model``. Raises :class:`InputError` (unknown proposer,
        bad k, missing draft model) and :class:`ModelError` (the draft fails to load).
        On a remote Target a drafting plan is :data:`REMOTE`: no proposer, ``k`` 0.
        """
        k = parse_k(k)
        if proposer == "none" or k == 0:
            return Plan.plain(language)
        return self.decoder.plan(proposer, k, language, history=history, draft_model=draft_model)

    def run(self, prompt: list[int], plan: Plan, *, scope: str | None = None,
            max_tokens: int = 64, sampling: SamplingParams = GREEDY,
            stop: tuple[str, ...] = (), stop_at=None, cancelled=None,
            between_rounds=None, record: bool = True, owner: str = "local",
            prediction: list[int] | None = None) -> Generation:
        """One generation after ``prompt`` (token ids) as ``plan`` says, by the
        Runtime's decoder (:mod:`assistd.runtime.decoders`). Here its counters go to the
        ledger (one transaction) and its verify times to the cost model; on a remote
        Target the server decodes and nothing is recorded.

        The generation runs on the KV sequence :class:`SequencePool` picks for
        ``prompt`` (``owner`` labels it in status). ``scope``: the history scope the
        ledger row belongs to. ``stop_at``, ``cancelled`` and ``between_rounds`` go to
        :func:`assistd.decoding.engine.generate` (streaming and latency budgets,
        cancellation, the daemon's preemption). ``record`` False keeps the generation
        out of the tuner (a benchmark's plain baseline). ``prediction``: the request's
        predicted output (token ids, OpenAI's Predicted Outputs), drafted from beside
        the plan's proposer when the plan drafts at all
        (:meth:`~assistd.runtime.decoders.LocalDecoder.with_prediction`); it is never
        stored. Raises :class:`InputError` when the prompt does not fit the context window.
        """
        return self.decoder.run(prompt, plan, scope=scope, max_tokens=max_tokens,
                                sampling=sampling, stop=stop, stop_at=stop_at,
                                cancelled=cancelled, between_rounds=between_rounds,
                                record=record, owner=owner, prediction=prediction)

    def estimate(self, plan: Plan) -> dict | None:
        """With ``k="auto"``: the tuner's estimate behind its choice, as JSON."""
        return self.decoder.estimate(plan)  # (None on a remote Target: nothing measured here)

    # -- reports -------------------------------------------------------------------------

    def stats(self, scope: str | None = None) -> dict:
        """``{"ledger": <stats report>, "user_acceptance": <summary>}``. Raises
        :class:`InputError` for a scope without data."""
        return store_stats(self.store, scope)


def store_stats(store: HistoryStore, scope: str | None = None) -> dict:
    """:meth:`Runtime.stats` from a history store alone (no Target needed): the tuner's
    report (:func:`assistd.runtime.stats.stats_report`) and user acceptance."""
    from assistd.runtime.stats import stats_report

    return {"ledger": stats_report(LedgerStore(store), scope=scope),
            "user_acceptance": SuggestionStore(store).summary()}
