"""One arm's raw sums over a workload and the rates read from them, for ``assistd bench``
(:mod:`assistd.measure.bench`): a ledger row (:func:`arm_row`), this run's t(n)
(:func:`measured_t`), the chain ceiling it allows (:func:`chain_ceiling`), and the
arithmetic every row must obey (:func:`check_ledger`). The formulas are those of
docs/design.md, "Vocabulary"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from assistd.ground.ledger import Ledger, ratio
from assistd.measure.bench_arms import Arm

@dataclass
class ArmTotals:
    """Raw sums of one arm over a workload: the ledger's counters, and per repeat the
    committed tokens and decode ms (for the speedup's spread)."""

    ledger: Ledger = field(default_factory=Ledger)
    decode_ms: float = 0.0
    committed_by_repeat: dict[int, int] = field(default_factory=dict)
    decode_ms_by_repeat: dict[int, float] = field(default_factory=dict)
    extra_memory_bytes: int = 0
    matches: list[dict] = field(default_factory=list)

    def add(self, repeat: int, committed: int, decode_ms: float, ledger: Ledger | None) -> None:
        if ledger is not None:
            self.ledger.add(ledger)
        else:
            self.ledger.committed_tokens += committed
        self.decode_ms += decode_ms
        self.committed_by_repeat[repeat] = self.committed_by_repeat.get(repeat, 0) + committed
        self.decode_ms_by_repeat[repeat] = self.decode_ms_by_repeat.get(repeat, 0.0) + decode_ms


def tokens_per_s(committed: float, decode_ms: float) -> float | None:
    """Committed tokens per second of decoding.

    >>> tokens_per_s(100, 2000.0)
    50.0
    """
    return ratio(committed, decode_ms / 1000.0)


def arm_row(arm: Arm, t: ArmTotals, baseline: ArmTotals, plain: ArmTotals | None = None,
            t_ms: Callable[[int], float] | None = None) -> dict:
    """One ledger row: the raw sums and every rate computed from them. ``baseline``:
    the arm every speedup is against; ``plain``: the main process's plain arm
    (``speedup_vs_plain``); ``t_ms``: the workload's measured t(n) (the ceiling)."""
    led = t.ledger
    plain = plain or baseline
    tps = tokens_per_s(led.committed_tokens, t.decode_ms)
    base = tokens_per_s(baseline.ledger.committed_tokens, baseline.decode_ms)
    own = tokens_per_s(plain.ledger.committed_tokens, plain.decode_ms)
    per_repeat, tps_per_repeat = [], []
    for r in sorted(t.decode_ms_by_repeat):
        a = tokens_per_s(t.committed_by_repeat[r], t.decode_ms_by_repeat[r])
        b = tokens_per_s(baseline.committed_by_repeat.get(r, 0),
                         baseline.decode_ms_by_repeat.get(r, 0))
        per_repeat.append(None if a is None or not b else a / b)
        tps_per_repeat.append(a)
    spread = [x for x in per_repeat if x is not None]
    library = arm.kind == "peer-library"
    statuses = [m["status"] for m in t.matches]
    gaps = [m["gap"] for m in t.matches if m.get("gap") is not None]
    committed = led.committed_tokens
    ceiling = None
    if t_ms is not None and not library and led.rounds and not led.tree_rounds:
        base_ms = ratio(baseline.ledger.verify_ms, baseline.ledger.committed_tokens)
        if base_ms:
            ceiling = chain_ceiling(led.cumulative_acceptance(), t_ms, base_ms, led.coverage)
    return {
        "arm": arm.name, "kind": arm.kind, "proposer": arm.proposer, "k": arm.k,
        "numerics": arm.numerics,
        "committed_tokens": int(committed),
        "draft_tokens": None if library else int(led.draft_tokens),
        "accepted_tokens": None if library else int(led.accepted_tokens),
        "rounds": None if library else int(led.rounds),
        "plain_steps": None if library else int(led.plain_steps),
        "acceptance_rate": None if library else led.acceptance_rate,
        "mean_acceptance_length": None if library else led.mean_acceptance_length,
        "coverage": None if library else led.coverage,
        # Trees: rounds that branched; draft nodes verified per round (D / R).
        "tree_rounds": None if library else int(led.tree_rounds),
        "nodes_per_round": None if library else ratio(led.draft_tokens, led.rounds),
        "accepted_per_position": [int(x) for x in led.accepted_per_position],
        "reached_per_position": [int(x) for x in led.reached_per_position],
        "tried_per_position": [int(x) for x in led.tried_per_position],
        "conditional_acceptance": led.conditional_acceptance(),
        "draft_ms": None if library else led.draft_ms,
        "verify_ms": None if library else led.verify_ms,
        "decode_ms": t.decode_ms,
        "draft_ms_per_token": None if library else ratio(led.draft_ms, committed),
        "verify_ms_per_token": None if library else ratio(led.verify_ms, committed),
        "tokens_per_s": tps,
        "speedup": None if tps is None or not base else tps / base,
        "speedup_vs_plain": None if tps is None or not own else tps / own,
        "ceiling": ceiling,
        "speedup_min": min(spread) if spread else None,
        "speedup_max": max(spread) if spread else None,
        "speedup_per_repeat": per_repeat,
        "tokens_per_s_per_repeat": tps_per_repeat,
        "extra_memory_bytes": int(t.extra_memory_bytes),
        "output_match": {
            "exact": statuses.count("exact"), "near_tie": statuses.count("near-tie"),
            "differs": statuses.count("differs"), "max_gap": max(gaps) if gaps else None,
            # other kernels (a companion's plain) chose other tokens: not a decoding fault
            "numerics": statuses.count("numerics"),
            # a difference past the near-tie bound that neither the batched re-evaluation
            # nor the replay of the arm's own forwards reproduced
            "unexplained": sum(1 for m in t.matches if m["status"] == "differs"
                               and m.get("batch_argmax") is not True
                               and m.get("replay_argmax") is not True),
            "cases": t.matches,
        },
    }


def measured_t(ledgers: Sequence[Ledger], fallback: Callable[[int], float],
               min_steps: int = 3) -> Callable[[int], float]:
    """This run's t(n) in ms, from the chain forwards of ``ledgers`` (``verify_ms_by_len``
    over ``steps_by_len``; a length needs ``min_steps`` forwards): linear between the
    measured lengths; elsewhere ``fallback`` (the calibrated cost model), shifted to
    meet the nearest measured point.

    >>> t = measured_t([Ledger(steps_by_len=[4, 0, 3], verify_ms_by_len=[40.0, 0, 60.0])],
    ...                lambda n: 10.0 * n)
    >>> [round(t(n), 1) for n in (1, 2, 3, 4)]
    [10.0, 15.0, 20.0, 30.0]
    """
    steps: dict[int, float] = {}
    ms: dict[int, float] = {}
    for led in ledgers:
        for L, (s, m) in enumerate(zip(led.steps_by_len, led.verify_ms_by_len)):
            steps[L + 1] = steps.get(L + 1, 0.0) + s
            ms[L + 1] = ms.get(L + 1, 0.0) + m
    known = sorted(n for n in steps if steps[n] >= min_steps)
    points = {n: ms[n] / steps[n] for n in known}
    if not points:
        return fallback

    def t(n: int) -> float:
        if n in points:
            return points[n]
        lo = max((m for m in known if m < n), default=None)
        hi = min((m for m in known if m > n), default=None)
        if lo is not None and hi is not None:
            w = (n - lo) / (hi - lo)
            return (1 - w) * points[lo] + w * points[hi]
        near = lo if lo is not None else hi
        return points[near] + fallback(n) - fallback(near)

    return t


def chain_ceiling(cumulative: Sequence[float | None], t_ms: Callable[[int], float],
                  base_ms: float, coverage: float | None) -> dict | None:
    """The best speedup over the baseline that a chain of k draft tokens could give with
    this run's cumulative acceptance A_1..A_K and forward times t(n) (ms): a round
    commits E_k = 1 + Σ_{i<=k} A_i tokens in t(k + 1); at coverage c a step is a round
    with probability c, else a plain step of t(1), so

        speedup_k(c) = base_ms · (c·E_k + 1 - c) / (c·t(k + 1) + (1 - c)·t(1))

    with ``base_ms`` the baseline's Target ms per committed token. Returns ``{"full":
    max over k at c = 1, "k_full", "measured": max at the measured coverage, "k"}``
    (None without a measured A_1). Target time only: propose() and the loop's own time
    are what separates an arm from its ceiling. It is the best *fixed* k: an arm that
    drafts long where it is sure and short elsewhere may pass it.

    >>> c = chain_ceiling([0.9, 0.8], lambda n: 10.0 + 4.0 * (n - 1), 10.0, 0.5)
    >>> c["full"], c["k_full"], round(c["measured"], 4), c["k"]
    (1.5, 2, 1.3214, 2)
    """
    best_full = best = (None, 0)
    total = 1.0
    t1 = t_ms(1)
    c = coverage or 0.0
    for k, a in enumerate(cumulative, start=1):
        if a is None:
            break
        total += a
        tk = t_ms(k + 1)
        full = base_ms * total / tk
        at = base_ms * (c * total + 1 - c) / (c * tk + (1 - c) * t1)
        if best_full[0] is None or full > best_full[0]:
            best_full = (full, k)
        if best[0] is None or at > best[0]:
            best = (at, k)
    if best_full[0] is None:
        return None
    return {"full": best_full[0], "k_full": best_full[1], "measured": best[0], "k": best[1]}


def check_ledger(report: dict) -> list[str]:
    """The ledger arithmetic every row must obey; returns the violations (empty = ok).

    committed = C + R + P; acceptance rate = C / D; mean acceptance length = 1 + C / R;
    coverage = R / (R + P); Σ accepted per position = C, Σ reached per position = D
    (a row with tree rounds: <= D, since positions are depths and D counts nodes);
    tokens/s = committed / decode s; speedup = tokens/s / the baseline's; the spread
    brackets nothing outside [min, max] of the per-repeat ratios; the baseline's
    speedup is 1.
    """
    bad = []

    def close(a, b, what, row):
        if a is None or b is None:
            if a is not b:
                bad.append(f"{row}: {what}: {a} vs {b}")
        elif abs(a - b) > 1e-6 * max(1.0, abs(b)):
            bad.append(f"{row}: {what}: {a} != {b}")

    for w in report["workloads"]:
        name = w.get("baseline", "plain")
        plain = next(a for a in w["arms"] if a["arm"] == name)
        base = plain["tokens_per_s"]
        for a in w["arms"]:
            row = f"{w['name']}/{a['arm']}"
            close(a["tokens_per_s"], tokens_per_s(a["committed_tokens"], a["decode_ms"]),
                  "tokens/s", row)
            close(a["speedup"], None if a["tokens_per_s"] is None or not base
                  else a["tokens_per_s"] / base, "speedup", row)
            reps = [x for x in a["speedup_per_repeat"] if x is not None]
            if reps and not (min(reps) == a["speedup_min"] and max(reps) == a["speedup_max"]):
                bad.append(f"{row}: spread is not min/max of the repeats")
            if a["kind"] == "peer-library":
                continue
            C, D, R, P = (a["accepted_tokens"], a["draft_tokens"], a["rounds"], a["plain_steps"])
            if a["committed_tokens"] != C + R + P:
                bad.append(f"{row}: committed {a['committed_tokens']} != C + R + P {C + R + P}")
            close(a["acceptance_rate"], ratio(C, D), "acceptance rate", row)
            close(a["mean_acceptance_length"], 1 + C / R if R else None, "mean acc. len", row)
            close(a["coverage"], ratio(R, R + P), "coverage", row)
            # Per position is by depth: a tree round reaches its depth, verifies its nodes.
            reached, trees = sum(a["reached_per_position"]), a.get("tree_rounds") or 0
            if sum(a["accepted_per_position"]) != C or (reached > D if trees else reached != D):
                bad.append(f"{row}: per-position sums != C, D"
                           + (" (or reached > D)" if trees else ""))
            if R and a["reached_per_position"][0] != R:
                bad.append(f"{row}: every round reaches position 1")
            close(a["draft_ms_per_token"], ratio(a["draft_ms"], a["committed_tokens"]),
                  "draft ms/token", row)
        close(plain["speedup"], 1.0 if base else None, "baseline speedup", f"{w['name']}/{name}")
    return bad
