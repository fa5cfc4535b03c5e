"""Offline replay: what each proposer would have done on recorded outputs.

The recorded model turns stand in for what the Target would produce (an oracle), and
the replay walks through them token by token as the decoder would. At position i of a
model turn y[0..T), the context is every token before it (earlier turns of the session
and y[:i]); the proposer is asked for at most ``min(k, T - i - 1)`` tokens (a round
commits its accepted tokens plus one, and must not run past the turn; the last token
of a turn is always a plain step), and the draft's accepted length is its common prefix
with y[i:]:

- a draft of L tokens with a accepted is a round committing a + 1 tokens;
- no draft is a plain step committing 1;
- a token tree of N nodes is a round verifying N nodes whose accepted branch is the
  longest one the recording follows (from the root, the child equal to the next true
  token, while there is one): a round committing that branch's length + 1. Its modeled
  cost is that of a forward over N + 1 tokens, as the engine's one tree forward.

Arms: a registered proposer's name, or ``NAME+tree`` for its token-tree mode (the
proposers whose constructor takes ``tree``: suffix, and peer:suffixdecoding as
Arctic's ``use_tree_spec``), at most ``max_nodes`` nodes a round. ``--tree both`` runs
each tree-capable proposer both ways in the same pass over the same tokens.

Non-model turns (user prompts, tool results, system prompts, a file's path) are
appended to the context without proposing. After a model turn, its tokens join the
history (one scope per replay, ``"replay"``), so later sessions draft from earlier
ones, as Arctic Inference's global suffix tree of earlier responses does. Files are
replayed in the order given. Each proposer walks all the sessions on its own, with a
fresh history, over the same tokens.

Counters are raw (D, C, R, plain steps, per position, rounds per draft length,
propose() times); every rate is computed on read by the pure functions below, with
the formula next to each.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from assistd.ground.costmodel import CostModel
from assistd.ground.errors import InputError
from assistd.ground.ledger import Ledger, grow, ratio
from assistd.measure.replay_inputs import Session
from proposers import Proposer, available, make_proposer

SCOPE = "replay"
EXCLUDED_BY_DEFAULT = ("draft_model",  # needs a second model; ask for it by name
                       "peer:arctic", "peer:arctic-tree")  # need `assistd peers build arctic`
TREE_ARM = "+tree"  # an arm name's suffix: the proposer's token-tree mode
TREE_CHOICES = ("off", "on", "both")
FLAT_COST = {1: 10.0, 128: 10.0}  # --cost-model flat: a round costs one forward, any size


# ---------------------------------------------------------------- pure arithmetic


def common_prefix_len(draft: np.ndarray, truth: np.ndarray) -> int:
    """Accepted draft tokens under an oracle: the length of the common prefix.

    >>> common_prefix_len(np.array([4, 2, 9]), np.array([4, 2, 3, 1]))
    2
    >>> common_prefix_len(np.array([4, 2]), np.array([4]))
    1
    """
    n = min(len(draft), len(truth))
    miss = np.flatnonzero(draft[:n] != truth[:n])
    return int(miss[0]) if len(miss) else n


def tree_accept(tokens: np.ndarray, parents: np.ndarray, truth: np.ndarray) -> tuple[int, bool]:
    """The oracle on a token tree (``tokens``, ``parents`` int64 ``[N]`` as
    :class:`proposers.base.Draft` has them, -1 = a child of the last committed token):
    from the root follow the child equal to the next ``truth`` token while there is one.
    Returns ``(accepted, leaf)``: the accepted branch's length, and whether it ended at
    a leaf (no node past it was verified).

    Worked example: the tree 4 -> {2 -> {9, 3}, 7} as ``tokens [4, 2, 9, 3, 7]``,
    ``parents [-1, 0, 1, 1, 0]``, truth ``4 2 3 1``: 4, 2, then 3 (the second child of
    2), a leaf: 3 accepted.

    >>> tokens, parents = np.array([4, 2, 9, 3, 7]), np.array([-1, 0, 1, 1, 0])
    >>> tree_accept(tokens, parents, np.array([4, 2, 3, 1]))
    (3, True)
    >>> tree_accept(tokens, parents, np.array([4, 5]))
    (1, False)
    """
    node, accepted = -1, 0
    children = {}
    for i, p in enumerate(np.asarray(parents).tolist()):
        children.setdefault(p, {})[int(tokens[i])] = i
    for t in np.asarray(truth).tolist():
        nxt = children.get(node, {}).get(int(t))
        if nxt is None:
            break
        node, accepted = nxt, accepted + 1
    return accepted, node not in children


def tokens_per_call(committed: int, rounds: int, plain_steps: int) -> float | None:
    """Committed tokens per Target call: ``committed / (R + P)``.

    >>> tokens_per_call(10, 2, 4)
    1.6666666666666667
    """
    return ratio(committed, rounds + plain_steps)


def modeled_ms(rounds_by_draft_len: Sequence[int], plain_steps: int,
               round_ms: Callable[[int], float], plain_ms: float) -> float:
    """Modeled Target time: ``Σ_L n_L · round_ms(L) + P · plain_ms``, with ``n_L`` =
    ``rounds_by_draft_len[L]`` the rounds that verified L draft tokens (tree nodes)."""
    return float(sum(n * round_ms(L) for L, n in enumerate(rounds_by_draft_len) if n)
                 + plain_steps * plain_ms)


def modeled_speedup(committed: int, rounds_by_draft_len: Sequence[int], plain_steps: int,
                    round_ms: Callable[[int], float], plain_ms: float) -> float | None:
    """Speedup over plain decoding of the same tokens, on a cost model:

        committed · t(1) / (Σ_L n_L · round_ms(L) + P · t(1))

    ``round_ms(L)`` is what a round with L draft tokens costs: the issue's formula
    writes t(L) (``CostModel.t_ms``; it reproduces the issue's reference numbers), while
    physically a round evaluates the last committed token and the draft, t(L + 1)
    (``CostModel.round_ms``). ``plain_ms`` = t(1). Draft time is not included
    (propose() latency is reported apart).

    Worked example, the reference CPU costs of ``CostModel.brief()`` (t(1) 11, t(2) 19,
    t(5) 30.25 ms): one round of 4 drafts with 3 accepted (commits 4) and 2 plain
    steps: 6 · 11 / (30.25 + 22) ≈ 1.26.

    >>> round(modeled_speedup(6, [0, 0, 0, 0, 1], 2, CostModel.brief().round_ms, 11.0), 3)
    1.263
    """
    total = modeled_ms(rounds_by_draft_len, plain_steps, round_ms, plain_ms)
    return ratio(committed * plain_ms, total)


def per_position(accepted: Sequence[int], reached: Sequence[int], tried: Sequence[int]
                 ) -> tuple[list[float | None], list[float | None]]:
    """Per-position acceptance (docs/design.md, 'Vocabulary'), position i = 1, 2, ... at index i - 1:

    - conditional ``a_i = accepted_i / tried_i``: P(position i accepted | positions < i
      accepted), over the rounds that proposed position i with every position before it
      accepted (``tried``);
    - cumulative ``A_i = accepted_i / reached_i``: P(positions 1..i all accepted), over
      the rounds that proposed position i (``reached``).

    >>> per_position([3, 1], [4, 2], [4, 2])
    ([0.75, 0.5], [0.75, 0.5])
    """
    conditional = [ratio(a, t) for a, t in zip(accepted, tried)]
    cumulative = [ratio(a, r) for a, r in zip(accepted, reached)]
    return conditional, cumulative


def percentile_ms(times_ms: Sequence[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation) of propose() times; None if none."""
    return float(np.percentile(times_ms, q)) if len(times_ms) else None


# ---------------------------------------------------------------- counters


@dataclass
class ReplayCounts:
    """Raw counters of one proposer over a replay.

    ledger: D, C, R, plain steps, committed tokens, per-position reached/accepted (by
        depth along the accepted branch for a tree), ``tree_rounds``, ``nodes_by_depth``;
        D counts tree nodes verified, C the tokens committed from them.
    rounds_by_draft_len: ``[L]`` rounds that verified L draft tokens, tree nodes
        included (what a forward costs, for any cost model).
    tried_per_position: ``[i]`` rounds that proposed position i+1 with positions 1..i
        accepted (the denominators of the conditional a_i).
    propose_ms: every propose() call's wall time, plain steps at the turn end excluded.
    """

    ledger: Ledger = field(default_factory=Ledger)
    rounds_by_draft_len: list[int] = field(default_factory=list)
    propose_ms: list[float] = field(default_factory=list)

    def record_round(self, num_draft: int, num_accepted: int, *, depth: int | None = None,
                     leaf: bool | None = None) -> None:
        """As :meth:`Ledger.record_round`: ``num_draft`` nodes verified, ``num_accepted``
        committed from them; ``depth``/``leaf`` for a tree (None: a chain)."""
        self.ledger.record_round(num_draft, num_accepted, depth=depth, leaf=leaf)
        grow(self.rounds_by_draft_len, num_draft + 1)
        self.rounds_by_draft_len[num_draft] += 1

    def record_plain_step(self) -> None:
        self.ledger.record_plain_step()

    @property
    def tried_per_position(self) -> list[int]:
        return self.ledger.tried_per_position


def metrics(counts: ReplayCounts, cost: CostModel) -> dict:
    """Every reported number of one proposer, computed from its counters."""
    led = counts.ledger
    conditional, cumulative = per_position(
        led.accepted_per_position, led.reached_per_position, counts.tried_per_position)
    t1 = cost.t_ms(1)
    return {
        "draft_tokens": led.draft_tokens,
        "accepted_tokens": led.accepted_tokens,
        "rounds": led.rounds,
        "plain_steps": led.plain_steps,
        "committed_tokens": led.committed_tokens,
        "acceptance_rate": led.acceptance_rate,
        "mean_acceptance_length": led.mean_acceptance_length,
        "coverage": led.coverage,
        # Trees: rounds that branched, and draft nodes verified per round (D / R).
        "tree_rounds": led.tree_rounds,
        "nodes_per_round": ratio(led.draft_tokens, led.rounds),
        "tokens_per_call": tokens_per_call(led.committed_tokens, led.rounds, led.plain_steps),
        # The formula, a round of L drafts costing t(L): it reproduces the issue's
        # reference numbers (llama-cpp-python PLD 0.44, SuffixDecoding 1.10).
        "modeled_speedup": modeled_speedup(led.committed_tokens, counts.rounds_by_draft_len,
                                           led.plain_steps, cost.t_ms, t1),
        # Physical: a round evaluates the last committed token and the L drafts, t(L + 1).
        "modeled_speedup_physical": modeled_speedup(
            led.committed_tokens, counts.rounds_by_draft_len, led.plain_steps, cost.round_ms, t1),
        "accepted_per_position": list(led.accepted_per_position),
        "reached_per_position": list(led.reached_per_position),
        "tried_per_position": list(counts.tried_per_position),
        "conditional_acceptance": conditional,
        "cumulative_acceptance": cumulative,
        "rounds_by_draft_len": list(counts.rounds_by_draft_len),
        "propose_calls": len(counts.propose_ms),
        "propose_ms_p50": percentile_ms(counts.propose_ms, 50),
        "propose_ms_p99": percentile_ms(counts.propose_ms, 99),
        "propose_ms_total": float(sum(counts.propose_ms)),
    }


# ---------------------------------------------------------------- the walk


Propose = Callable[[np.ndarray, int, "str | None"], "object | None"]


def walk_turn(propose: Propose, tokens: np.ndarray, start: int, end: int, k: int,
              counts: ReplayCounts, language: str | None = None, max_nodes: int = 64) -> None:
    """Oracle walk over one model turn ``tokens[start:end]`` (int64 ``[n]``: the whole
    session, so ``tokens[:i]`` is the context at position i).

    ``propose(context, k_cap, language)`` returns a Draft or None; its tokens past
    ``k_cap = min(k, end - i - 1)`` are cut (a tree: its nodes deeper than ``k_cap``,
    and past ``max_nodes`` nodes; the oracle is :func:`tree_accept`). Records rounds
    and plain steps in ``counts``.

    Worked example: turn ``[5, 6, 7, 8]``, a proposer that always drafts ``[6, 7, 9]``,
    k 3: at 0 the draft accepts nothing -> a round committing 1 (the Target's 5); at 1
    the draft is cut to 2 tokens (``end - i - 1``), ``[6, 7]``, both accepted -> a round
    committing 3 (6, 7 and the bonus 8); the turn is done: D = 5, C = 2, R = 2, P = 0.

    >>> from proposers.base import Draft
    >>> c = ReplayCounts()
    >>> walk_turn(lambda ctx, k, lang: Draft(np.array([6, 7, 9]), None, "context", 1),
    ...           np.array([5, 6, 7, 8]), 0, 4, 3, c)
    >>> c.ledger.draft_tokens, c.ledger.accepted_tokens, c.ledger.rounds, c.ledger.plain_steps
    (5, 2, 2, 0)

    A tree: turn ``[5, 6, 7, 8, 9]``, always the tree ``{6 -> 9, 7 -> 8}`` (tokens
    ``[6, 9, 7, 8]``, parents ``[-1, 0, -1, 2]``): at 0 nothing follows 5 -> a round of
    4 nodes committing 1; at 1 the branch 6 is taken, 9 is not the next token (7) -> 4
    nodes, committing 2 (6 and the Target's 7); at 3 the tree is cut to depth 1 (one
    token left before the turn's last), nodes 6 and 7, neither is 8 -> 2 nodes,
    committing 1; the last token is a plain step. D = 10, C = 1, R = 3, P = 1, three
    rounds that branched.

    >>> c = ReplayCounts()
    >>> tree = Draft(np.array([6, 9, 7, 8]), None, "context", 1, parents=np.array([-1, 0, -1, 2]))
    >>> walk_turn(lambda ctx, k, lang: tree, np.array([5, 6, 7, 8, 9]), 0, 5, 3, c)
    >>> led = c.ledger
    >>> led.draft_tokens, led.accepted_tokens, led.rounds, led.plain_steps, led.tree_rounds
    (10, 1, 3, 1, 3)
    >>> c.rounds_by_draft_len
    [0, 0, 1, 0, 2]
    """
    from assistd.decoding.engine import fit_draft

    i = start
    while i < end:
        k_cap = min(k, end - i - 1)
        draft = None
        if k_cap >= 1:
            t0 = time.perf_counter()
            d = propose(tokens[:i], k_cap, language)
            counts.propose_ms.append((time.perf_counter() - t0) * 1000.0)
            if d is not None and len(d.tokens):
                if d.is_tree:
                    d = fit_draft(d, depth=k_cap, nodes=max_nodes, leaves=None)
                draft = d if d.is_tree else np.asarray(d.tokens[:k_cap], dtype=np.int64)
        if draft is None:
            counts.record_plain_step()
            i += 1
            continue
        if isinstance(draft, np.ndarray):
            accepted = common_prefix_len(draft, tokens[i : i + len(draft)])
            counts.record_round(len(draft), accepted)
        else:  # a tree (fit_draft may have cut it back to a chain: then as a chain)
            depth = draft.depth
            accepted, leaf = tree_accept(draft.tokens, draft.parents, tokens[i : i + depth])
            counts.record_round(len(draft.tokens), accepted, depth=depth, leaf=leaf)
        i += accepted + 1


@dataclass
class TokenizedSession:
    """A session in the Target's tokens: ``tokens`` int64 ``[n]`` (all turns, in order);
    ``turns``: ``(start, end, is_model, language)`` spans; ``seed``: documents put in the
    history before the session."""

    name: str
    tokens: np.ndarray
    turns: list[tuple[int, int, bool, str | None]]
    seed: list[tuple[str, np.ndarray]] = field(default_factory=list)

    @property
    def model_tokens(self) -> int:
        return sum(e - s for s, e, m, _ in self.turns if m)


def tokenize_sessions(sessions: Iterable[Session], tokenize: Callable[[str], list[int]]
                      ) -> list[TokenizedSession]:
    """Tokenize each turn's text on its own and concatenate (no template between turns)."""
    out = []
    for s in sessions:
        parts, spans, pos = [], [], 0
        for turn in s.turns:
            ids = np.asarray(tokenize(turn.text), dtype=np.int64)
            parts.append(ids)
            spans.append((pos, pos + len(ids), turn.is_model, turn.language))
            pos += len(ids)
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        seed = [(name, np.asarray(tokenize(text), dtype=np.int64)) for name, text in s.seed]
        out.append(TokenizedSession(s.name, tokens, spans, seed))
    return out


class ReplayHistory:
    """The replay's history: the one place that knows the history index's API.

    ``index`` is what proposers get as their ``history``; :meth:`add` puts one document
    (a replayed model turn, or a seed) in the replay's scope.
    """

    def __init__(self):
        from proposers.index import HistoryIndex

        self.index = HistoryIndex()
        self._next_id = 1

    def add(self, tokens: np.ndarray, name: str) -> None:
        if len(tokens):
            self.index.put(SCOPE, self._next_id, tokens, name)
            self._next_id += 1


def split_arm(name: str) -> tuple[str, bool]:
    """``(proposer, tree)`` of an arm name: ``"suffix+tree"`` -> ``("suffix", True)``.

    >>> split_arm("suffix+tree"), split_arm("ngram")
    (('suffix', True), ('ngram', False))
    """
    if name.endswith(TREE_ARM):
        return name[: -len(TREE_ARM)], True
    return name, False


def has_tree_mode(proposer: str) -> bool:
    """Whether a registered proposer's constructor takes ``tree`` (a token-tree mode)."""
    import inspect

    from proposers.base import _REGISTRY

    cls = _REGISTRY.get(proposer)
    return cls is not None and "tree" in inspect.signature(cls).parameters


def check_arm(name: str) -> None:
    """Raise :class:`InputError` unless ``name`` is a proposer, or ``NAME+tree`` of one
    that has a tree mode."""
    proposer, tree = split_arm(name)
    if proposer not in available():
        raise InputError(f"unknown proposer {proposer!r}; known: {', '.join(available())}")
    if tree and not has_tree_mode(proposer):
        modes = [n for n in available() if has_tree_mode(n)]
        raise InputError(f"proposer {proposer!r} has no tree mode ({name!r}); those with one: "
                         f"{', '.join(modes)}")


def tree_arms(names: Sequence[str], tree: str = "off") -> list[str]:
    """The arms for ``names`` under ``--tree``: ``off`` as named, ``on`` every proposer
    with a tree mode in it (``NAME+tree``), ``both`` each such proposer twice, the chain
    arm first; a name given as ``NAME+tree`` stays as it is. Duplicates are dropped.
    Raises :class:`InputError` for an unknown choice or arm.

    >>> tree_arms(["suffix", "ngram"], "both")
    ['suffix', 'suffix+tree', 'ngram']
    """
    if tree not in TREE_CHOICES:
        raise InputError(f"--tree must be one of {', '.join(TREE_CHOICES)}, not {tree!r}")
    out: list[str] = []
    for name in names:
        check_arm(name)
        proposer, is_tree = split_arm(name)
        if is_tree or tree == "off" or not has_tree_mode(proposer):
            want = [name]
        else:
            want = [proposer + TREE_ARM] if tree == "on" else [proposer, proposer + TREE_ARM]
        out += [a for a in want if a not in out]
    return out


def build_proposer(name: str, history, cost: CostModel | None = None, *,
                   max_nodes: int = 64) -> Proposer:
    """A registered proposer (an arm name: ``NAME`` or ``NAME+tree``) with the replay's
    history and cost model and the settings ``assistd complete`` gives it
    (:func:`assistd.runtime.runtime.proposer_options`); a tree arm gets at most
    ``max_nodes`` nodes a round, any number of branches. Raises :class:`InputError` for
    an unknown name or one that cannot be built that way (``draft_model`` needs a draft
    model)."""
    from assistd.runtime.runtime import proposer_options

    check_arm(name)
    proposer, tree = split_arm(name)
    try:
        return make_proposer(proposer, **proposer_options(proposer, history, cost, tree=tree,
                                                          max_nodes=max_nodes))
    except TypeError as e:
        raise InputError(f"proposer {name!r} cannot be replayed here ({e}); "
                         f"pick others with --proposer") from None


def default_proposers() -> list[str]:
    return [n for n in available() if n not in EXCLUDED_BY_DEFAULT]


def replay_proposer(make: Callable[[object], Proposer], sessions: Sequence[TokenizedSession],
                    k: int, progress: Callable[[int], None] | None = None,
                    max_nodes: int = 64) -> ReplayCounts:
    """Walk every session with one proposer, ``make(history_index)``, over a fresh history;
    ``progress(tokens)`` is called with the model tokens of each session walked; trees
    are cut to ``max_nodes`` nodes."""
    history = ReplayHistory()
    proposer = make(history.index)
    counts = ReplayCounts()

    for s in sessions:
        for doc_name, ids in s.seed:
            history.add(ids, doc_name)
        for n, (start, end, is_model, language) in enumerate(s.turns):
            if not is_model or end == start:
                continue

            def propose(context, k_cap, lang=language):
                return proposer.propose(context, k_cap, scope=SCOPE, language=lang)

            walk_turn(propose, s.tokens, start, end, k, counts, language, max_nodes)
            history.add(s.tokens[start:end], f"{s.name}#{n}")
        if progress is not None:
            progress(s.model_tokens)
    counts.ledger.draft_ms = float(sum(counts.propose_ms))
    return counts


def run_replay(sessions: Sequence[TokenizedSession], names: Sequence[str], k: int,
               cost: CostModel, progress: Callable[[int], None] | None = None,
               max_nodes: int = 64) -> dict:
    """Every arm (``NAME`` or ``NAME+tree``) over the same sessions: ``{name: metrics}``
    in the order given; tree arms verify at most ``max_nodes`` nodes a round."""
    if max_nodes < 1:
        raise InputError(f"--nodes must be at least 1, got {max_nodes}")
    for name in names:  # fail before any work on a bad name
        check_arm(name)
    return {name: metrics(replay_proposer(
                lambda h, n=name: build_proposer(n, h, cost, max_nodes=max_nodes), sessions, k,
                progress, max_nodes), cost)
            for name in names}


def inputs_summary(sessions: Sequence[TokenizedSession]) -> dict:
    """Sessions, turns and tokens replayed (model turns: the ones walked)."""
    return {
        "sessions": len(sessions),
        "turns": sum(len(s.turns) for s in sessions),
        "model_turns": sum(1 for s in sessions for t in s.turns if t[2]),
        "tokens": sum(len(s.tokens) for s in sessions),
        "model_tokens": sum(s.model_tokens for s in sessions),
        "seed_tokens": sum(len(ids) for s in sessions for _, ids in s.seed),
    }


# ---------------------------------------------------------------- the driver


def resolve_cost_model(spec: str, target) -> CostModel:
    """``reference`` (t(n) of the reference 2-core CPU, docs/design.md, 'Reference
    measurements'; ``brief`` is its old name, accepted with a warning), ``flat`` (every
    forward 10 ms whatever its size, as on a GPU: the speedup is then tokens per call),
    ``calibrate`` (measured on ``target`` now, ~2 s), or a JSON file written by
    ``CostModel.save``."""
    if spec == "brief":
        warnings.warn("--cost-model brief is now called --cost-model reference",
                      FutureWarning, stacklevel=2)  # shown to end users
        spec = "reference"
    if spec == "reference":
        return CostModel.brief()
    if spec == "flat":
        return CostModel(dict(FLAT_COST), source="flat")
    if spec == "calibrate":
        return CostModel.calibrate(target)
    return CostModel.load(spec)


def replay_report(files: Sequence, *, git_repo=None, git_commits: int = 20,
                  names: Sequence[str] | None = None, k: int = 16, cost_model: str = "calibrate",
                  model=None, progress: Callable[[int, int], None] | None = None,
                  tree: str = "off", max_nodes: int = 64) -> dict:
    """Load the inputs, tokenize them with the Target's tokenizer, replay every proposer,
    and return the report (what ``assistd replay --json`` prints).

    ``progress(done, total)`` counts model tokens walked over all proposers. ``tree``
    (off | on | both) and ``max_nodes``: the arms' token-tree modes (:func:`tree_arms`)
    and their node budget per round.
    Raises :class:`InputError` (bad file, format, proposer, cost model file) and
    :class:`~assistd.ground.errors.ModelError` (the Target cannot be loaded).
    """
    from assistd.measure.replay_inputs import InputReport, git_sessions, transcript_sessions
    from assistd.targets.open import open_target

    if k < 1:
        raise InputError(f"--k must be at least 1, got {k}")
    names = tree_arms(list(names) if names else default_proposers(), tree)
    if max_nodes < 1:
        raise InputError(f"--nodes must be at least 1, got {max_nodes}")
    if not files and git_repo is None:
        raise InputError("nothing to replay: give transcript FILEs or --git REPO")
    report = InputReport()
    sessions = transcript_sessions(files, report)
    if git_repo is not None:
        sessions += git_sessions(git_repo, git_commits, report)
    if not sessions:
        raise InputError("no transcript found in the folders given; pass the files by name")

    target = open_target(model)
    try:
        tokenized = tokenize_sessions(sessions, target.tokenize)
        cost = resolve_cost_model(cost_model, target)
        target_desc = {"backend": target.backend, "model": getattr(target, "model_path", None)}
    finally:
        target.close()

    total = sum(s.model_tokens for s in tokenized) * len(names)
    done = 0

    def step(tokens: int) -> None:
        nonlocal done
        done += tokens
        if progress is not None:
            progress(done, total)

    results = run_replay(tokenized, names, k, cost, step, max_nodes)
    return {
        "k": k,
        "tree": tree,
        "max_nodes": max_nodes,
        "cost_model": cost.as_dict(),
        "target": target_desc,
        "scope": SCOPE,
        "inputs": {**report.as_dict(), **inputs_summary(tokenized)},
        "proposers": results,
    }
