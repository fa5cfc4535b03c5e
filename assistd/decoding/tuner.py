"""The tuner: per language id, the draft ceiling k that maximises committed tokens per ms.

For a ceiling k in {0, 1, ..., k_max} the expected throughput of a decode step is

    rate(k) = E[committed tokens | k] / E[draft ms + verify ms | k]

which is the issue's ``E[L(k)] / (t_draft(k) + t(k))`` with ``E[L(k)] = 1 + Σ_{i<=k} A_i``,
taken over the proposer's own draft lengths: a proposer may offer no draft (a plain
step, coverage < 1) or stop before k. From the ledger (the counters of
docs/design.md, 'The ledger'; tried_i = rounds that verified position i):

    a_i = accepted_i / tried_i                         conditional acceptance
    r_i = reached_i / (reached_{i-1} - ceiling_stops_{i-1})   P(draft goes on to i)
          (r_1 = rounds that reached 1 / steps that asked the proposer)
    P(len >= i) = Π_{j<=i} r_j,   A_i = Π_{j<=i} a_j
    E[committed | k] = 1 + Σ_{i<=k} P(len >= i) A_i
    E[ms | k] = Σ_{L<=k} P(len = L | k) (draft_ms(L) + t(L + 1))

where t(n) is the Target's measured forward time over n tokens after the context the
estimate is for (the online :class:`~assistd.ground.costmodel.CostModel`, t(n, context),
learned per context bucket) and draft_ms(L) the measured propose() time of a draft of L
tokens. k = 0 (a plain step, no proposer call) has rate 1 / t(1): when
no k beats it, the tuner turns speculation off for that file type. Rounds cut by
their ceiling are censored, never counted as the proposer stopping (ceiling_stops).

A token-tree round of depth L verifies more than L nodes; its forward is priced at
t(mean nodes of depth-L rounds + 1) from the ledger's ``nodes_by_depth``, and its
per-position counters (by depth along the accepted branch) feed a_i and r_i as a
chain's do.

Sparse data is shrunk toward a prior: a language's estimates toward the estimates of
all languages together (a new file type starts from the global statistics), and
those toward the previous position's estimate (positions never reached borrow from
the last one seen). A small share of steps (``explore``) use a longer ceiling than
the best one, so that a file type whose history grows can earn a longer k back; its
cost is bounded: at the default 4%, a wasted exploration round at k = 2 on this CPU
(t(3) ≈ 2 t(1), docs/design.md, 'Reference measurements') costs at most 4% of plain speed.

The arithmetic is ours; the objective is the one of SpecDec++ / the "optimal
speculation length" literature (expected accepted tokens per unit of cost), applied
to a measured, non-flat cost t(n), as a CPU Target needs (docs/design.md, 'The tuner').
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from assistd.decoding.calibration import calibration
from assistd.ground.costmodel import CostModel, context_bucket
from assistd.ground.ledger import Ledger
from storage.ledger_store import HALF_LIFE_S, MAX_COST_SAMPLES, MAX_STEPS

K_MAX = 16
EXPLORE = 0.04
COST_PRIOR = 5.0  # forwards that make a t(n) point trusted on its own
OUTLIER = 3.0  # a generation's forward times above 3x the model are clipped there
PRIOR_WEIGHT = 8.0  # pseudo-rounds a prior counts for
# Before any data, optimism: a new proposer or file type is tried with a long ceiling
# (the proposer still cuts its own drafts) until measurements say otherwise.
GENERIC_A1, GENERIC_R1 = 0.9, 0.9


def target_key(target) -> str:
    """The identity of a Target's speed: backend, model file (name and size), device,
    threads. Two Targets with one key share a cost model and ledger rows."""
    path = Path(str(target.model_path))
    try:
        size = path.stat().st_size if path.is_file() else 0
    except OSError:
        size = 0
    threads = getattr(target, "n_threads", None)
    return f"{target.backend}:{path.name}:{size}:{target.device}:t{threads}"


@dataclass(frozen=True)
class Estimate:
    """The tuner's view of one (language, proposer): arrays indexed by k = 0..k_max
    (``a`` and ``r`` by position i = 1..k_max at index i-1)."""

    k: int  # the best ceiling
    expected_tokens: list[float]  # E[committed tokens per step | k]
    expected_ms: list[float]  # E[ms per step | k]
    a: list[float]  # smoothed conditional acceptance a_i
    r: list[float]  # smoothed P(draft reaches i | reached i-1)
    draft_ms: list[float]  # propose() ms for a draft of L tokens, L = 0..k_max
    rounds: float  # rounds of data behind it (decayed)
    steps: float

    @property
    def rates(self) -> list[float]:
        """Expected committed tokens per ms for each k."""
        return [t / ms for t, ms in zip(self.expected_tokens, self.expected_ms)]

    @property
    def speedups(self) -> list[float]:
        """Expected speedup over plain decoding for each k (rate(k) / rate(0))."""
        plain = self.rates[0]
        return [x / plain for x in self.rates]

    @property
    def cumulative(self) -> list[float]:
        """A_i = Π_{j<=i} a_j from the smoothed estimates."""
        return np.cumprod(self.a).tolist()

    def as_dict(self) -> dict:
        return {"k": self.k, "expected_speedup": self.speedups[self.k],
                "speedup_by_k": [round(x, 4) for x in self.speedups],
                "a": [round(x, 4) for x in self.a], "r": [round(x, 4) for x in self.r],
                "rounds": self.rounds, "steps": self.steps}


def _ratio_smoothed(num: list[float], den: list[float], prior: list[float] | None,
                    first: float, k_max: int, w: float) -> list[float]:
    out, prev = [], first
    for i in range(k_max):
        p = prior[i] if prior is not None else prev
        n = num[i] if i < len(num) else 0.0
        d = max(den[i] if i < len(den) else 0.0, n)
        x = (n + w * p) / (d + w)
        out.append(min(1.0, max(0.0, x)))
        prev = out[-1]
    return out


def estimate(ledger: Ledger, cost: CostModel, *, k_max: int = K_MAX,
             prior: Estimate | None = None, prior_weight: float = PRIOR_WEIGHT,
             context: int | None = None) -> Estimate:
    """Predict committed tokens and ms per step for every ceiling k = 0..k_max from a
    ledger (decayed counters), and pick the best k (ties: the smaller). See the module
    docstring for the formulas. ``prior`` (the global estimate) fills sparse data;
    ``context``: tokens in the KV cache the steps run after (None: the cost model's
    reference context)."""
    acc, reach = ledger.accepted_per_position, ledger.reached_per_position
    stops = ledger.ceiling_stops
    get = lambda xs, i: xs[i] if i < len(xs) else 0.0  # noqa: E731
    reach_den = [ledger.propose_calls] + [get(reach, i) - get(stops, i) for i in range(k_max - 1)]
    a = _ratio_smoothed(acc, ledger.tried_per_position, prior.a if prior else None,
                        GENERIC_A1, k_max, prior_weight)
    r = _ratio_smoothed(reach, reach_den, prior.r if prior else None, GENERIC_R1, k_max,
                        prior_weight)

    # propose() ms by draft length: measured means, else the prior's, else the mean
    # per call; past the longest measured length it grows in proportion (a draft
    # model's time is per token; a lookup's is tiny anyway).
    counts = [ledger.propose_calls - ledger.rounds] + list(ledger.steps_by_len[1:])
    measured = {L: ledger.draft_ms_by_len[L] / c for L, c in enumerate(counts)
                if c >= 1 and L < len(ledger.draft_ms_by_len)}
    per_call = ledger.draft_ms / ledger.propose_calls if ledger.propose_calls >= 1 else 0.0
    draft_ms = []
    for L in range(k_max + 1):
        if L in measured:
            draft_ms.append(measured[L])
        elif prior is not None:
            draft_ms.append(prior.draft_ms[L])
        elif measured and L > max(measured):
            last = max(measured)
            draft_ms.append(measured[last] * (L + 1) / (last + 1))
        else:
            draft_ms.append(per_call)

    round_ms = cost.table(k_max, context=context)
    # Token trees: a round of depth L verified nodes_by_depth / rounds of that depth
    # nodes (L for a chain), and its forward costs t(nodes + 1), not t(L + 1).
    nodes = ledger.nodes_by_depth
    for L in range(1, min(k_max, len(nodes)) + 1):
        rounds_at = get(reach, L - 1) - get(reach, L)  # rounds whose depth is exactly L
        if rounds_at >= 0.5 and nodes[L - 1] > L * rounds_at:
            round_ms[L] = cost.t_ms(nodes[L - 1] / rounds_at + 1, context=context)
    p_ge = np.concatenate([[1.0], np.cumprod(r)])  # P(len >= i), i = 0..k_max
    gain = p_ge[1:] * np.cumprod(a)  # P(len >= i and 1..i accepted)
    step_ms = np.asarray(draft_ms) + round_ms  # a step whose draft has L tokens
    tokens, ms = [1.0], [float(round_ms[0])]
    for k in range(1, k_max + 1):
        p_len = p_ge[: k + 1].copy()
        p_len[:k] -= p_ge[1 : k + 1]  # P(len = L | ceiling k)
        tokens.append(1.0 + float(gain[:k].sum()))
        ms.append(float(p_len @ step_ms[: k + 1]))
    rates = [t / m for t, m in zip(tokens, ms)]
    best = int(np.argmax(rates))  # first maximum: the smaller k on ties
    return Estimate(k=best, expected_tokens=tokens, expected_ms=ms, a=a, r=r,
                    draft_ms=draft_ms, rounds=float(ledger.rounds), steps=float(ledger.steps))


class Tuner:
    """Chooses draft ceilings from the ledger and records what they did.

    store:   a :class:`storage.ledger_store.LedgerStore` to load from and persist to,
             or None (in memory only).
    target:  the Target's key (:func:`target_key`).
    cost:    the cost model to start from when the store has no times for this
             Target (see :meth:`open`, which calibrates); measured times replace it.
    k_max:   the largest ceiling considered (tokens).
    explore: share of steps that try a longer ceiling than the best (0 = never).
    seed:    for the exploration draws.
    now:     the time (s since epoch) to decay the stored counters to [default: now].
    learn_costs: False keeps ``cost`` as it is: generations teach acceptance only, not
             forward times (a choice that must not depend on how busy the machine is).

    ``calibration`` (str) says where the seed t(n) came from (see :meth:`open`).
    """

    def __init__(self, store, target: str, cost: CostModel, *, k_max: int = K_MAX,
                 explore: float = EXPLORE, seed: int | None = None, now: float | None = None,
                 learn_costs: bool = True):
        if k_max < 1 or not 0 <= explore < 1:
            raise ValueError("k_max must be >= 1 and explore in [0, 1)")
        self.store, self.target, self.k_max, self.explore = store, target, k_max, explore
        self.learn_costs = learn_costs
        self.rng = random.Random(seed)
        self._seed_cost = cost
        self._ledgers: dict[tuple[str, str], Ledger] = {}  # (language, proposer) -> counters
        # (n_tokens, context bucket) -> [ms_sum, count, context tokens sum]
        self._costs: dict[tuple[int, int], list[float]] = {}
        self._cache: dict[tuple, Estimate] = {}
        self._as_of: dict[tuple[str, str], float] = {}  # when each sum was last decayed
        if store is not None:
            loaded_at = time.time() if now is None else now
            for row in store.rows(target=target, now=loaded_at):
                key = (row.language_id, row.proposer)
                self._ledgers.setdefault(key, Ledger()).add(row.ledger)
                self._as_of[key] = loaded_at
            for key, (mean, count, ctx) in store.cost_points(target, now=loaded_at).items():
                self._costs[key] = [mean * count, count, ctx * count]
        self._cost_model = None
        self.calibration = "given"  # how the seed t(n) was got (set by open)

    @classmethod
    def open(cls, store, target_obj, *, calibrate: bool = True, use_cache: bool = True,
             **kwargs) -> Tuner:
        """A tuner for a loaded Target. If the store holds no forward times for it yet,
        seed them from the calibration cache of this Target and machine
        (:mod:`assistd.decoding.calibration`), else calibrate t(n)
        (:meth:`CostModel.calibrate`, ~3 s for the embedded model on 2 quiet CPU cores)
        and cache it; either way store it. ``calibrate=False`` starts from the reference
        CPU's figures (:meth:`CostModel.brief`) instead; ``use_cache=False`` calibrates
        afresh and leaves the cache alone. How t(n) was got is in :attr:`calibration`:
        ``"stored"``, ``"cache FILE"``, ``"calibrated in S s ..."`` or ``"reference"``.
        A store with times at the reference context only (written before t(n, context))
        gets the calibration's longer contexts added (``"stored; context levels from
        ..."``)."""
        key = target_key(target_obj)
        stored = store.cost_points(key) if store is not None else {}
        have = (1, 0) in stored
        seed_cost, how = CostModel.brief(), "stored" if have else "reference"
        if calibrate and not (have and any(b > 0 for _, b in stored)):
            seed_cost, got = calibration(target_obj, use_cache=use_cache)
            if have:
                how = f"stored; context levels from {got}" if seed_cost.levels else "stored"
            else:
                how = got
            if store is not None:
                if not have:
                    store.add_costs(key, seed_cost.points, context=seed_cost.context)
                for context, points in seed_cost.levels.items():
                    store.add_costs(key, points, context=context)
        tuner = cls(store, key, seed_cost, **kwargs)
        tuner.calibration = how
        if not have and calibrate and store is None:
            tuner.seed_costs(seed_cost)
        return tuner

    def seed_costs(self, cost: CostModel, weight: float = 3.0) -> None:
        """Count ``cost``'s points, at every context level, as ``weight`` measured
        forwards each (in memory only: :meth:`open` stores a calibration through the
        store instead)."""
        for context, points in {cost.context: cost.points, **cost.levels}.items():
            for n, ms in points.items():
                c = self._costs.setdefault((int(n), context_bucket(context)), [0.0, 0.0, 0.0])
                c[0] += ms * weight
                c[1] += weight
                c[2] += context * weight
        self._cost_model = None
        self._cache.clear()

    # -- the cost model ------------------------------------------------------

    def cost_model(self) -> CostModel:
        """t(n, context) from measured forwards: one level per context bucket that has
        any, at the bucket's mean context, falling back to the seed model where nothing
        was measured. A point with few forwards is shrunk toward a prior
        (``COST_PRIOR`` pseudo-forwards): for the shortest context the line through its
        well-measured points (with t(1); else the seed), for a longer one the model of
        the shorter contexts at its context (its well-measured points stand as they
        are): one slow exploration round at n = 6 must not
        make every ceiling past 5 look bad. A longer context's token counts without data
        come from that prior too, and what it measured at small n lifts the larger ones
        (:class:`CostModel`). Made non-decreasing in n and in the context."""
        if self._cost_model is None:
            self._cost_model = self._learned_costs()
        return self._cost_model

    def _learned_costs(self) -> CostModel:
        cells: dict[int, dict[int, tuple[float, float]]] = {}  # bucket -> {n: (mean, count)}
        mean_ctx: dict[int, list[float]] = {}  # bucket -> [context sum, count]
        for (n, bucket), (s, c, ctx) in self._costs.items():
            if c > 0 and s > 0:  # a forward measured at 0 ms (a clock too coarse) is none
                cells.setdefault(bucket, {})[n] = (s / c, c)
                m = mean_ctx.setdefault(bucket, [0.0, 0.0])
                m[0], m[1] = m[0] + ctx, m[1] + c
        if not cells:
            return self._seed_cost
        levels: dict[int, dict[int, float]] = {}
        below: CostModel | None = None
        for bucket in sorted(cells):
            data = cells[bucket]
            context = int(round(mean_ctx[bucket][0] / mean_ctx[bucket][1]))
            if levels:  # buckets partition the contexts; rounding must not merge two
                context = max(context, max(levels) + 1)
            solid = {n: m for n, (m, c) in data.items() if c >= COST_PRIOR}
            if below is None and 1 in data:  # the shortest context: its own line (the raw
                # means, as they are, while nothing is solid)
                prior = CostModel(_monotone(solid if 1 in solid else
                                            {n: m for n, (m, _) in data.items()})).t_ms
            else:  # a longer one: the shape of the shorter contexts at this context (a
                # bucket of plain steps alone must not price a round at n x t(1)); its
                # solid points stand as measured
                model = below if below is not None else self._seed_cost
                shape = lambda n, m=model, c=context: m.t_ms(n, c)  # noqa: E731
                prior = lambda n, f=shape: solid.get(n) or f(n)  # noqa: E731
            knots = set(data) | {1} | ({int(n) for n in below._knots} if below else set())
            levels[context] = _monotone({
                n: (data[n][0] * data[n][1] + COST_PRIOR * prior(n)) / (data[n][1] + COST_PRIOR)
                if n in data else prior(n) for n in knots})
            first = min(levels)
            below = CostModel(levels[first], context=first,
                              levels={c: pts for c, pts in levels.items() if c != first})
        return CostModel(below.points, source=f"measured:{self.target}", context=below.context,
                         levels=below.levels)

    # -- choosing ------------------------------------------------------------

    def global_estimate(self, proposer: str, context: int | None = None) -> Estimate:
        """The estimate from every language of ``proposer`` together (a new file type's
        prior), for steps after ``context`` tokens (None: the reference context)."""
        key = ("*", proposer, context)
        if key not in self._cache:
            total = Ledger()
            for (_, prop), led in self._ledgers.items():
                if prop == proposer:
                    total.add(led)
            self._cache[key] = estimate(total, self.cost_model(), k_max=self.k_max,
                                        context=context)
        return self._cache[key]

    def estimate(self, proposer: str, language: str | None,
                 context: int | None = None) -> Estimate:
        """The estimate for one language id (None: "plaintext") and proposer, its sparse
        data filled from :meth:`global_estimate`, for steps after ``context`` tokens of
        KV cache (the prompt's length; None: the cost model's reference context)."""
        key = (language or "plaintext", proposer, context)
        if key not in self._cache:
            glob = self.global_estimate(proposer, context)
            mine = self._ledgers.get(key[:2])
            self._cache[key] = glob if mine is None else estimate(
                mine, self.cost_model(), k_max=self.k_max, prior=glob, context=context)
        return self._cache[key]

    def choose(self, proposer: str, language: str | None, context: int | None = None) -> int:
        """The best ceiling for this language and proposer after ``context`` tokens
        (0 = plain decoding)."""
        return self.estimate(proposer, language, context).k

    def policy(self, proposer: str, language: str | None,
               context: int | None = None) -> Callable[[], int]:
        """A per-step ceiling for :func:`assistd.decoding.engine.generate` (``ceiling=``): the best
        k for a prompt of ``context`` tokens (None: the reference context), and with
        probability ``explore`` a longer one (2k, at least 2, at most k_max)."""
        best = self.choose(proposer, language, context)
        longer = min(self.k_max, max(2, 2 * best))
        if longer == best or not self.explore:
            return lambda: best
        rand, eps = self.rng.random, self.explore
        return lambda: longer if rand() < eps else best

    # -- recording -----------------------------------------------------------

    def record(self, scope: str | None, language: str | None, proposer: str,
               ledger: Ledger, now: float | None = None) -> None:
        """Add one generation's ledger: in memory, and persisted in one transaction."""
        language = language or "plaintext"
        now = time.time() if now is None else now
        key = (language, proposer)
        # The in-memory sums fade and are capped like the persisted rows.
        old = self._ledgers.get(key, Ledger())
        total = old.scaled(_decay(now - self._as_of.get(key, now), self.store))
        total.add(ledger)
        cap = self.store.max_steps if self.store is not None else MAX_STEPS
        self._ledgers[key] = total.scaled(cap / total.steps) if total.steps > cap else total
        self._as_of[key] = now
        costs = self._forward_times(ledger) if self.learn_costs else {}
        for key, (ms_sum, steps, ctx_sum) in costs.items():
            c = self._costs.setdefault(key, [0.0, 0.0, 0.0])
            c[0] += ms_sum
            c[1] += steps
            c[2] += ctx_sum
            if c[1] > MAX_COST_SAMPLES:  # as the store: recent forwards weigh most
                scale = MAX_COST_SAMPLES / c[1]
                c[0], c[1], c[2] = c[0] * scale, MAX_COST_SAMPLES, c[2] * scale
        self._cache.clear()
        self._cost_model = None
        if self.store is not None:
            self.store.add(scope or "", language, proposer, self.target, ledger, now=now,
                           costs=costs)

    def _forward_times(self, ledger: Ledger) -> dict[tuple[int, int], tuple[float, float, float]]:
        """``{(n_tokens, context bucket): (ms sum, forwards, context tokens sum)}`` of a
        generation (:meth:`Ledger.forward_times`), each mean clipped to ``OUTLIER``
        times the current t(n, its mean context): one generation on a machine that was
        busy for a moment (another process holding the cores; measured here: a forward
        of 11 ms taking seconds) must not teach the tuner that drafting never pays."""
        model = self.cost_model() if any(n == 1 for n, _ in self._costs) else None
        out = {}
        for (n, bucket), (ms, steps, ctx) in ledger.forward_times().items():
            if model is not None:
                ms = min(ms, OUTLIER * model.t_ms(n, ctx / steps) * steps)
            out[(n, bucket)] = (ms, steps, ctx)
        return out


def _monotone(points: dict[int, float]) -> dict[int, float]:
    """The running maximum over n: a forward over more tokens never takes less time."""
    out, top = {}, 0.0
    for n in sorted(points):
        top = max(top, points[n])
        out[n] = top
    return out


def _decay(age_s: float, store) -> float:
    half_life = store.half_life_s if store is not None else HALF_LIFE_S
    return 0.5 ** (max(0.0, age_s) / half_life)


def env_seed() -> int | None:
    """``ASSISTD_TUNER_SEED`` (for reproducible exploration in benchmarks), else None."""
    v = os.environ.get("ASSISTD_TUNER_SEED")
    return int(v) if v and v.isdigit() else None
