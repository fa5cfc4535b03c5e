"""Modeled speedup on the measured t(n, context): the CPU replay's rounds times GPU costs.

``inputs/acceptance.json`` (written by ``prepare.py`` from ``assistd replay --json``)
holds, per workload, per guide cost model and per proposer, the raw counters of an
oracle replay: rounds by draft length L, plain steps, committed tokens. Each is priced
with the physical formula of ``assistd replay`` (docs/design.md, "Cost model and
speedup"): committed · t(1) / (Σ_L n_L · t(L + 1) + P · t(1)), t measured at one
context length. A tree round (the ``NAME+tree`` arms) counts under the nodes it
verified, L = nodes, since its one forward costs what a chain of as many tokens does.
"""

from __future__ import annotations

import json
from pathlib import Path

from assistd.ground.costmodel import CostModel

INPUTS = Path(__file__).resolve().parent / "inputs" / "acceptance.json"


def speedup(counts: dict, cost: CostModel) -> float | None:
    """committed · t(1) / (Σ_L n_L · t(L + 1) + P · t(1)); None for no step at all. The
    same number as ``assistd.measure.replay.modeled_speedup`` with ``cost.round_ms``
    (that module needs the history's packages, which the GPU machine lacks)."""
    t1 = cost.t_ms(1)
    total = sum(n * cost.round_ms(L) for L, n in enumerate(counts["rounds_by_draft_len"]) if n)
    total += counts["plain_steps"] * t1
    return counts["committed_tokens"] * t1 / total if total else None


def load(path: Path = INPUTS) -> dict:
    return json.loads(Path(path).read_text())


def table(acceptance: dict, sweeps: dict) -> list[dict]:
    """One row per (workload, guide, proposer, swept model, context): the modeled speedup
    on that model's measured t(n) at that context, with the replay's acceptance figures
    and its speedup on the reference CPU curve for comparison."""
    rows = []
    for workload, w in acceptance["workloads"].items():
        for guide, g in w["guides"].items():
            for proposer, counts in g["proposers"].items():
                base = {"workload": workload, "guide": guide, "proposer": proposer,
                        "acceptance_rate": counts.get("acceptance_rate"),
                        "coverage": counts.get("coverage"),
                        "tokens_per_call": counts.get("tokens_per_call"),
                        "speedup_reference_cpu": speedup(counts, CostModel.brief())}
                for model, s in sweeps.items():
                    for ctx, points in s["points"].items():
                        cost = CostModel({int(n): ms for n, ms in points.items()}, source=model)
                        rows.append({**base, "model": model, "context": int(ctx),
                                     "speedup": speedup(counts, cost)})
    return rows
