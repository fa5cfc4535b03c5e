"""``assistd replay``'s tables: per proposer, and per-position acceptance."""

from __future__ import annotations

import sys


def print_replay(report: dict) -> None:
    """Print :func:`assistd.measure.replay.replay_report`'s ``report`` as rich tables
    (160 columns wide when stdout is not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    def f(x, fmt=".2f"):
        return "n/a" if x is None else format(x, fmt)

    inputs = report["inputs"]
    console = Console() if sys.stdout.isatty() else Console(width=160)
    table = Table(title=f"replay: {inputs['sessions']} sessions, {inputs['model_tokens']:,} of"
                        f" {inputs['tokens']:,} tokens to complete; k ≤ {report['k']};"
                        f" cost model {report['cost_model']['source']}",
                  caption="speedup: committed·t(1) / (Σ rounds t(draft length) + plain·t(1));"
                          " t(L+1): a round costing t(draft length + 1)")
    # Tree columns only where a tree round ran (D then counts nodes verified).
    trees = any(m.get("tree_rounds") for m in report["proposers"].values())
    cols = ["proposer", "D", "C", "R", "plain", "accept", "mean len", "coverage",
            "tok/call", "speedup", "t(L+1)", "p50 ms", "p99 ms"]
    if trees:
        cols[5:5] = ["tree rounds", "nodes/round"]
    for col in cols:
        table.add_column(col, justify="left" if col == "proposer" else "right",
                         overflow="fold")
    for name, m in report["proposers"].items():
        cells = [name, f"{m['draft_tokens']:,}", f"{m['accepted_tokens']:,}",
                 f"{m['rounds']:,}", f"{m['plain_steps']:,}", f(m["acceptance_rate"]),
                 f(m["mean_acceptance_length"]), f(m["coverage"]), f(m["tokens_per_call"]),
                 f(m["modeled_speedup"]), f(m["modeled_speedup_physical"]),
                 f(m["propose_ms_p50"], ".3f"), f(m["propose_ms_p99"], ".3f")]
        if trees:
            cells[5:5] = [f"{m.get('tree_rounds', 0):,}", f(m.get("nodes_per_round"))]
        table.add_row(*cells)
    console.print(table)
    left = {"too large (over 1 MB; `assistd index` leaves them out too)":
            inputs.get("skipped_large", 0),
            "binary": inputs.get("skipped_binary", 0),
            "of no known transcript format": inputs.get("unknown_format", 0)}
    if any(left.values()):
        console.print("not replayed: " + "; ".join(f"{n:,} {why}" for why, n in left.items()
                                                   if n), highlight=False)
    depth = min(8, max((len(m["reached_per_position"]) for m in report["proposers"].values()),
                       default=0))
    if depth:
        pos = Table(title="per-position acceptance: conditional a_i, cumulative A_i")
        pos.add_column("proposer", overflow="fold")
        pos.add_column("")
        for i in range(1, depth + 1):
            pos.add_column(f"i={i}", justify="right")
        for name, m in report["proposers"].items():
            for label, key in (("a_i", "conditional_acceptance"), ("A_i", "cumulative_acceptance")):
                cells = [f(x) for x in m[key][:depth]]
                pos.add_row(name if label == "a_i" else "", label, *cells,
                            *[""] * (depth - len(cells)))
        console.print(pos)
