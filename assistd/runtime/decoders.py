"""The two ways a :class:`~assistd.runtime.runtime.Runtime` decodes, chosen once when it
is built (:func:`decoder_for`), both planning a generation (:class:`Plan`) and running it
to a :class:`~assistd.decoding.engine.Generation`:

- :class:`LocalDecoder`: the speculative engine (:func:`assistd.decoding.engine.generate`)
  on a local Target's KV sequences; proposers draft from the history, the tuner
  calibrates t(n) and records each ledger.
- :class:`RemoteDecoder`: a remote Target's server decodes (its own speculation, or none;
  :meth:`assistd.targets.remote.RemoteTarget.complete`); nothing drafts here, nothing is
  calibrated or recorded (docs/design.md, "Remote Target").

Also the proposer vocabulary every front end validates against (:func:`served_proposers`,
:func:`check_proposer`) and the options a proposer is built with (:func:`proposer_options`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from assistd.decoding.engine import Generation, generate
from assistd.decoding.tuner import K_MAX, Tuner
from assistd.ground.errors import InputError, ModelError
from assistd.ground.ledger import Ledger
from assistd.ground.sampling import GREEDY, SamplingParams
from assistd.runtime.sequences import SequencePool
from assistd.targets.base import Target
from proposers import available, make_proposer
from proposers.base import Proposer
from proposers.index import HistoryIndex
from proposers.prediction import K_MAX as PREDICTION_K_MAX
from proposers.prediction import PredictionProposer

# The plan of every generation on a remote Target: the server decodes (its own
# speculation, or none), so the proposer asked for is not used.
REMOTE = "remote"


@dataclass
class Plan:
    """How one generation drafts.

    proposer:  the registered proposer's name, ``"none"`` (plain decoding) or
               :data:`REMOTE` (a remote Target's server decodes).
    draft:     the proposer object (None for plain decoding).
    k:         the ceiling as asked: tokens, or ``"auto"`` (0 when plain).
    k_run:     the per-round ceiling handed to the engine (tokens; K_MAX under "auto").
    ceiling:   with ``"auto"``, the tuner's per-round policy for ``language``.
    language:  the LSP language id the ledger rows are kept under.
    """

    proposer: str
    draft: Proposer | None
    k: int | str
    k_run: int
    ceiling: Callable[[], int] | None
    language: str

    @property
    def speculative(self) -> bool:
        return self.draft is not None

    @classmethod
    def plain(cls, language: str, proposer: str = "none") -> Plan:
        """No draft: plain decoding (``"none"``), or the server's (:data:`REMOTE`)."""
        return cls(proposer, None, 0, 0, None, language)


class LocalDecoder:
    """Speculative decoding here, on ``target`` (a local Target): plans draft with the
    proposers over ``index``, each generation runs on a KV sequence of ``sequences`` and
    its ledger goes to ``tuner``."""

    remote = False
    drafts = True  # the history drafts, so scopes are indexed
    calibrates = True  # the tuner measures the Target's t(n)

    def __init__(self, target: Target, tuner: Tuner, index: HistoryIndex,
                 sequences: SequencePool):
        self.target, self.tuner, self.index, self.sequences = target, tuner, index, sequences
        self.tokens_generated = 0
        # Since this process started, undecayed (the tuner's ledger fades): the decode
        # counters of every generation by (language, proposer), for /metrics' counters.
        self.totals: dict[tuple[str, str], Ledger] = {}
        self.prompt_tokens = 0

    def plan(self, proposer: str, k: int | str, language: str, *, history: bool,
             draft_model: Path | None) -> Plan:
        """The drafting plan of ``proposer`` with ceiling ``k`` (tokens 1..64, or
        "auto"): see :meth:`assistd.runtime.runtime.Runtime.plan`."""
        options = proposer_options(proposer, self.index if history else None,
                                   self.tuner.cost_model(), self.target)
        if proposer == "draft_model":
            from proposers.draft_model import draft_numerics, open_draft

            if draft_model is None:
                raise InputError("--proposer draft_model needs --draft-model PATH (a GGUF of a"
                                 " smaller model with the Target's tokenizer)")
            try:
                options["draft"] = open_draft(draft_model, n_ctx=self.target.n_ctx,
                                              numerics=draft_numerics(self.target))
            except ModelError as e:
                raise ModelError(f"--draft-model {draft_model}: {str(e).split(';')[0]}; pass a"
                                 " GGUF of a small model with the Target's tokenizer") from None
        try:
            draft = make_proposer(proposer, **options)
        except KeyError as e:
            raise InputError(str(e).strip('"')) from None
        if k == "auto":
            return Plan(proposer, draft, "auto", K_MAX, self.tuner.policy(proposer, language),
                        language)
        return Plan(proposer, draft, k, k, None, language)

    def run(self, prompt: list[int], plan: Plan, *, scope: str | None, max_tokens: int,
            sampling: SamplingParams = GREEDY, stop: tuple[str, ...] = (), stop_at=None,
            cancelled=None, between_rounds=None, record: bool = True,
            owner: str = "local", prediction: list[int] | None = None) -> Generation:
        """One generation: see :meth:`assistd.runtime.runtime.Runtime.run`."""
        t = self.target
        if len(prompt) + 1 >= t.n_ctx:
            raise InputError(f"the prompt is {len(prompt)} tokens; the context window is"
                             f" {t.n_ctx}")
        if prediction and plan.speculative:
            plan = self.with_prediction(plan, prediction, start=len(prompt))
        seq = self.sequences.choose(prompt, owner)
        t.use_sequence(seq)
        ceiling = plan.ceiling
        if plan.k == "auto" and ceiling is not None:  # the tuner's choice at this context
            ceiling = self.tuner.policy(plan.proposer, plan.language, context=len(prompt))

        def hook() -> bool:
            ran = between_rounds()
            # Other requests ran on the Target meanwhile: back to this sequence (the
            # engine then re-evaluates whatever of its context is gone).
            t.use_sequence(seq)
            return ran

        with self.sequences.pinned(seq):
            gen = generate(t, prompt, plan.draft,
                           # Not cut to the room left: where the context ends the
                           # engine stops with stop_reason "n_ctx", not "max_tokens".
                           max_tokens=min(max_tokens, t.n_ctx),
                           k=plan.k_run, sampling=sampling, stop=stop, scope=scope,
                           language=plan.language, ceiling=ceiling, stop_at=stop_at,
                           cancelled=cancelled,
                           between_rounds=hook if between_rounds is not None else None)
        if record:
            self.tuner.record(scope, plan.language, plan.proposer, gen.ledger)
        self.tokens_generated += len(gen.tokens)
        self.prompt_tokens += len(prompt)
        self.totals.setdefault((plan.language, plan.proposer), Ledger()).add(gen.ledger)
        return gen

    def with_prediction(self, plan: Plan, prediction: list[int], *, start: int) -> Plan:
        """``plan`` drafting from a request's predicted output as well
        (:class:`proposers.prediction.PredictionProposer`, ``plan``'s proposer as its
        ``inner``): named ``"prediction"`` in the ledger, so the tuner keeps its
        acceptance apart. The per-round ceiling is no tuner's: ``k`` as asked, and with
        ``"auto"`` the prediction's ceiling (63 tokens), the proposer's cost model cutting each draft
        (a prediction's acceptance is the request's own, not the file type's)."""
        draft = PredictionProposer(prediction, start=start, inner=plan.draft,
                                   cost=self.tuner.cost_model())
        k_run = PREDICTION_K_MAX if plan.k == "auto" else plan.k_run
        return Plan("prediction", draft, plan.k, k_run, None, plan.language)

    def estimate(self, plan: Plan) -> dict | None:
        """With ``k="auto"``: the tuner's estimate behind its choice, as JSON."""
        if plan.k != "auto" or not plan.speculative:
            return None
        return self.tuner.estimate(plan.proposer, plan.language).as_dict()


class RemoteDecoder:
    """A remote Target's server decodes (``target.complete``: a streamed completion):
    every drafting plan is :data:`REMOTE`, no ledger goes to the tuner (it measured
    nothing here), and there is no estimate to show."""

    remote = True
    drafts = False  # nothing drafts against a remote Target: no scope is indexed
    calibrates = False  # no local t(n) to measure

    def __init__(self, target: Target, tuner: Tuner | None = None,
                 index: HistoryIndex | None = None, sequences: SequencePool | None = None):
        self.target = target  # (the local decoder's parts are not used: the server decodes)
        self.tokens_generated = 0
        self.totals: dict[tuple[str, str], Ledger] = {}  # nothing drafts here: stays empty
        self.prompt_tokens = 0

    def plan(self, proposer: str, k: int | str, language: str, *, history: bool,
             draft_model: Path | None) -> Plan:
        """:data:`REMOTE`, whatever was asked; a name no proposer has is still the
        caller's error (:class:`InputError` naming the known ones)."""
        if proposer not in available():
            check_proposer(proposer)
        return Plan.plain(language, REMOTE)

    def run(self, prompt: list[int], plan: Plan, *, scope: str | None, max_tokens: int,
            sampling: SamplingParams = GREEDY, stop: tuple[str, ...] = (), stop_at=None,
            cancelled=None, between_rounds=None, record: bool = True,
            owner: str = "local", prediction: list[int] | None = None) -> Generation:
        """One generation by the server; ``scope``, ``record``, ``owner`` and
        ``prediction`` are unused (no history, no tuner, no KV sequence here; the
        server is not sent the prediction: no OpenAI-compatible server honours it)."""
        t = self.target
        r = t.complete(prompt, max_tokens=max_tokens, sampling=sampling, stop=stop,
                       stop_at=stop_at, cancelled=cancelled, between_rounds=between_rounds)
        self.tokens_generated += r.ledger.committed_tokens  # the server's tokens
        self.prompt_tokens += len(prompt)
        return Generation(tokens=r.tokens, text=r.text, stop_reason=r.stop_reason,
                          ledger=r.ledger, speculation_off=t.speculation_off)

    def estimate(self, plan: Plan) -> dict | None:
        return None  # nothing measured here to estimate from


def decoder_for(target: Target) -> type[LocalDecoder] | type[RemoteDecoder]:
    """The decoder of ``target``: :class:`RemoteDecoder` when a server decodes for it
    (its ``remote`` attribute), else :class:`LocalDecoder`."""
    return RemoteDecoder if getattr(target, "remote", False) else LocalDecoder


def served_proposers() -> list[str]:
    """The proposer names a setting may give (CLI, TOML config, LSP settings, API
    options): ``"none"`` and every registered proposer but ``draft_model``, which needs
    a model file of its own (``assistd complete --draft-model``)."""
    return ["none"] + [p for p in available() if p != "draft_model"]


def check_proposer(name: str, *, what: str = "proposer") -> str:
    """``name`` if :func:`served_proposers` has it; else :class:`InputError` naming them."""
    known = served_proposers()
    if name not in known:
        raise InputError(f"{what} must be one of {', '.join(known)}, not {name!r}")
    return name


def proposer_options(name: str, history, cost, target: Target | None = None, *,
                     tree: bool = False, max_nodes: int = 64) -> dict:
    """Constructor options of proposer ``name``: the ones a completion and ``replay``
    both use, so that a replay measures what a completion runs.

    ``history`` (a :class:`proposers.index.HistoryIndex`), ``cost`` (the Target's
    :class:`assistd.ground.costmodel.CostModel`, or None) and ``target`` are offered to
    every proposer (each takes what its constructor names). ngram also gets alpha=0.5: a
    match of m tokens drafts at most ceil(m/2), because on llama.cpp on a CPU verifying
    k tokens costs ~k/2 plain steps and long drafts on weak matches lose time
    (benchmarks/copy_heavy.py: k=8 without the cap ran at 0.69-0.80x plain). With
    ``k="auto"`` the tuner then caps every draft per language (``assistd.decoding.tuner``).
    ``tree``: the proposer's token-tree mode (only for one whose constructor takes
    ``tree``: suffix, peer:suffixdecoding), at most ``max_nodes`` nodes a round and the
    Target's ``tree_leaves`` branches (any without a Target).
    """
    options = {"history": history, "target": target, "cost": cost}
    if name == "ngram":
        options["alpha"] = 0.5
    if tree:
        options.update(tree=True, max_nodes=max_nodes,
                       max_leaves=None if target is None else target.tree_leaves)
    return options
