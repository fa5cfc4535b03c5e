"""``assistd stats``: what the tuner has learnt, per language id and proposer.

One job: read the persisted, decayed ledger (:class:`storage.ledger_store.LedgerStore`)
and report, for every (Target, language id, proposer), the rates of docs/design.md,
'Vocabulary', beside the raw counters they come from, the per-position acceptance, and the draft ceiling k the
tuner chooses with its expected speedup. Three sinks read the same report dict: a
``rich`` table (:func:`print_stats`), JSON (the dict itself) and a figure
(:func:`plot_stats`).

Formulas (docs/design.md, 'Vocabulary'; D drafted, C accepted, R rounds, P plain steps, S = R + P):

    coverage               = R / S
    acceptance_rate        = C / D
    mean_acceptance_length = 1 + C / R            (tokens per round, bonus included)
    a_i = accepted_i / tried_i                    (conditional; tried_i = rounds that
                                                   verified position i)
    A_i = Π_{j<=i} a_j                            (cumulative)

The chosen k and ``speedup_by_k`` are :func:`assistd.decoding.tuner.estimate`'s: expected
committed tokens per ms at ceiling k over plain decoding's (k = 0), on the Target's
measured cost model t(n). Over all scopes they are exactly what ``assistd complete
--k auto`` would choose now (:meth:`Tuner.estimate`, shrunk toward all languages of
the proposer). With a scope, that scope's rows are summed per (language, proposer) and
shrunk toward the same global prior (every row of the proposer and Target, all scopes).
Rows of proposer ``none`` (plain decoding) have no acceptance: k 0, speedup 1.

Example: 10 rounds drafting 4 tokens with all 4 accepted, 10 rounds drafting 4 with 1
accepted and 5 plain steps give coverage 20/25 = 0.8, acceptance rate 50/80 = 0.625,
mean acceptance length 1 + 50/20 = 3.5, a = [20/20, 10/20, 10/10, 10/10] and
A = [1, 0.5, 0.5, 0.5].
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from assistd.ground.costmodel import CostModel
from assistd.ground.errors import InputError
from assistd.ground.ledger import Ledger
from assistd.ground.paths import user_path
from assistd.decoding.tuner import Tuner, estimate

PLAIN = "none"  # the proposer name of plain decoding (no drafts)
TABLE_POSITIONS = 8  # draft positions shown in the terminal (JSON has all)


def stats_report(ledger_store, scope: str | None = None, *, now: float | None = None) -> dict:
    """The report over every Target in ``ledger_store``, optionally one scope only.

    ``scope``: a scope as stored (a repository root), or a path that resolves to one;
    ``""`` selects completions made outside any scope. Raises :class:`InputError` when
    the store has rows but none in ``scope`` (naming the scopes it has).

    Returns ``{"db", "scope", "scopes", "entries": [...]}``, one entry per (target,
    language, proposer), sorted; ``entries`` is empty for an empty ledger.
    """
    all_rows = ledger_store.rows(now=now)
    rows = all_rows
    if scope is not None:
        rows = [r for r in all_rows if r.scope == scope]
        if not rows and scope:
            try:
                resolved = os.path.abspath(user_path(scope))
            except InputError:  # ~nosuchuser names no scope
                resolved = scope
            rows = [r for r in all_rows if r.scope == resolved]
            scope = resolved if rows else scope
        if not rows and all_rows:
            known = sorted({r.scope for r in all_rows})
            shown = ", ".join(repr(s) for s in known[:5]) + (" ..." if len(known) > 5 else "")
            raise InputError(f"no ledger rows for scope {scope!r}; scopes with data: {shown}"
                             " (or leave out --scope for all)")
    store_path = getattr(getattr(ledger_store, "store", None), "path", None)
    report = {"db": None if store_path is None else str(store_path), "scope": scope,
              "scopes": sorted({r.scope for r in rows}), "entries": []}
    for target in sorted({r.target for r in rows}):
        tuner = Tuner(ledger_store, target, CostModel.brief(), explore=0)
        cost = tuner.cost_model()
        sums: dict[tuple[str, str], Ledger] = {}
        for r in rows:
            if r.target == target:
                sums.setdefault((r.language_id, r.proposer), Ledger()).add(r.ledger)
        for (language, proposer), led in sorted(sums.items()):
            if proposer == PLAIN:
                k, speedups = 0, [1.0]
            else:
                if scope is None:
                    est = tuner.estimate(proposer, language)
                else:
                    est = estimate(led, cost, k_max=tuner.k_max,
                                   prior=tuner.global_estimate(proposer))
                k, speedups = est.k, est.speedups
            report["entries"].append(_entry(target, language, proposer, led, k, speedups, cost))
    return report


def _entry(target, language, proposer, led: Ledger, k: int, speedups: list[float],
           cost: CostModel) -> dict:
    return {
        "target": target, "language": language, "proposer": proposer,
        # decayed raw counters
        "steps": led.steps, "rounds": led.rounds, "plain_steps": led.plain_steps,
        "draft_tokens": led.draft_tokens, "accepted_tokens": led.accepted_tokens,
        "accepted_per_position": list(led.accepted_per_position),
        "tried_per_position": list(led.tried_per_position),
        # rates on read (module docstring)
        "coverage": led.coverage,
        "acceptance_rate": led.acceptance_rate,
        "mean_acceptance_length": led.mean_acceptance_length,
        "conditional_acceptance": led.conditional_acceptance(),
        "cumulative_acceptance": led.cumulative_acceptance(),
        # the tuner's choice
        "chosen_k": k,
        "expected_speedup": speedups[k],
        "speedup_by_k": list(speedups),
        "cost_model": cost.as_dict(),
    }


def _label(entry: dict, report: dict) -> str:
    """Language, plus the proposer when several are shown, plus the model when several."""
    entries = report["entries"]
    label = entry["language"]
    if len({e["proposer"] for e in entries if e["proposer"] != PLAIN}) > 1:
        label += f" · {entry['proposer']}"
    if len({e["target"] for e in entries}) > 1:
        label += f" · {_short_target(entry['target'])}"
    return label


def _short_target(key: str) -> str:
    parts = key.split(":")  # backend:model file:size:device:threads (tuner.target_key)
    return " ".join([parts[1]] + parts[3:]) if len(parts) > 3 else key


def print_stats(report: dict, console=None) -> None:
    """The report as two ``rich`` tables: rates and the tuner's choice, then per-position
    acceptance (first :data:`TABLE_POSITIONS` positions)."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        # No emoji or markup: a target key like "llama:x.gguf:100:cpu" holds ":100:".
        kw = {"emoji": False, "markup": False, "highlight": False}
        console = Console(**kw) if sys.stdout.isatty() else Console(width=160, **kw)
    entries = report["entries"]
    if not entries:
        where = "" if report["scope"] is None else f" for scope {report['scope']!r}"
        console.print(f"no ledger yet{where}: run `assistd complete` (it records every"
                      " generation's acceptance), then `assistd stats` again")
        return

    def f(x, fmt=".2f"):
        return "n/a" if x is None else format(x, fmt)

    targets = sorted({e["target"] for e in entries})
    scope = "all scopes" if report["scope"] is None else f"scope {report['scope'] or '(none)'}"
    title = f"tuner ledger: {scope}" + (f"; target {targets[0]}" if len(targets) == 1 else "")
    costs = {e["target"]: e["cost_model"] for e in entries}
    cost_text = "; ".join(
        (f"{_short_target(t)}: " if len(targets) > 1 else "") + f"{c['source']} t(n) ms "
        + " ".join(f"{n}:{ms:.1f}" for n, ms in c["points"].items())
        for t, c in costs.items())
    caption = ("counts decayed (half-life 7 days); coverage = rounds / steps; accept = accepted"
               " / drafted tokens; mean len = 1 + accepted / rounds; k = the tuner's draft"
               " ceiling; speedup = expected committed tokens per ms at k over plain"
               f" decoding; cost model {cost_text}")
    table = Table(title=title, caption=caption)
    cols = ["language", "proposer"] + (["target"] if len(targets) > 1 else []) + [
        "steps", "rounds", "coverage (R/S)", "accept (C/D)", "mean len (tok/round)",
        "k (tok)", "speedup (× plain)"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("language", "proposer", "target")
                         else "right", overflow="fold")
    for e in entries:
        table.add_row(e["language"], e["proposer"],
                      *([_short_target(e["target"])] if len(targets) > 1 else []),
                      f"{e['steps']:,.0f}", f"{e['rounds']:,.0f}", f(e["coverage"]),
                      f(e["acceptance_rate"]), f(e["mean_acceptance_length"]),
                      str(e["chosen_k"]), f(e["expected_speedup"]))
    console.print(table)
    with_rounds = [e for e in entries if e["conditional_acceptance"]]
    depth = min(TABLE_POSITIONS, max((len(e["conditional_acceptance"]) for e in with_rounds),
                                     default=0))
    if not depth:
        return
    pos = Table(title="per-position acceptance: conditional a_i, cumulative A_i (i = draft"
                      " position)")
    pos.add_column("language · proposer", overflow="fold")
    pos.add_column("")
    for i in range(1, depth + 1):
        pos.add_column(f"i={i}", justify="right")
    for e in with_rounds:
        for label, key in (("a_i", "conditional_acceptance"), ("A_i", "cumulative_acceptance")):
            cells = [f(x) for x in e[key][:depth]]
            name = f"{e['language']} · {e['proposer']}" if label == "a_i" else ""
            if name and len(targets) > 1:
                name += f" · {_short_target(e['target'])}"
            pos.add_row(name, label, *cells, *[""] * (depth - len(cells)))
    console.print(pos)


def print_user_acceptance(summary: dict, console=None) -> None:
    """Editor suggestions per language id (:meth:`SuggestionStore.summary`) as a ``rich``
    table: shown, accepted, partly accepted, dismissed, the acceptance rate and the mean
    accepted characters per accepted suggestion. Nothing when no editor reported yet."""
    from rich.console import Console
    from rich.table import Table

    if not summary:
        return
    if console is None:
        kw = {"emoji": False, "markup": False, "highlight": False}
        console = Console(**kw) if sys.stdout.isatty() else Console(width=160, **kw)
    table = Table(title="editor suggestions (user acceptance, all scopes)",
                  caption="rate = (accepted + partly accepted) / shown; chars = accepted"
                          " characters per accepted suggestion, whole or partial")
    for col in ("language", "suggestions", "shown", "accepted", "partly accepted",
                "dismissed", "rate", "chars"):
        table.add_column(col, justify="left" if col == "language" else "right")
    for lang, u in summary.items():
        rate, chars = u["acceptance_rate"], u.get("mean_accepted_chars")
        table.add_row(lang, str(u["suggestions"]), str(u["shown"]), str(u["accepted"]),
                      str(u["partial"]), str(u["dismissed"]),
                      "n/a" if rate is None else f"{rate:.2f}",
                      "n/a" if chars is None else f"{chars:.1f}")
    console.print(table)


def plot_stats(report: dict, path: str | Path):
    """Draw the report into ``path`` (PNG, or another format matplotlib knows by its
    extension) and return the matplotlib ``Figure``.

    Left panel: the measured cumulative acceptance A_i against draft position i, one
    line per (language, proposer) with rounds. Right panel: the tuner's expected
    speedup against the ceiling k = 0..k_max, one line per (language, proposer) with a
    proposer, the chosen k marked by a dot (a scatter, not a line); the dotted line at
    1 (label ``_plain``) is plain decoding. Raises :class:`InputError` when ``path``
    cannot be written (folder missing, unknown extension).
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write the plot {path}: folder {parent} does not exist;"
                         " create it or pass another --plot path")
    from matplotlib import rcParams
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(fig)  # render off screen, whatever the default backend
    ax_acc, ax_speed = fig.subplots(1, 2)
    scope = "all scopes" if report["scope"] is None else f"scope {report['scope'] or '(none)'}"
    fig.suptitle(f"assistd tuner ledger, {scope}")
    palette = rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = [e for e in report["entries"] if e["proposer"] != PLAIN]
    for n, e in enumerate(drawn):
        color, label = palette[n % len(palette)], _label(e, report)  # one colour per line
        cum = e["cumulative_acceptance"]
        points = [(i, x) for i, x in enumerate(cum, 1) if x is not None]
        if e["rounds"] > 0 and points:
            xs, ys = zip(*points)
            ax_acc.plot(xs, ys, marker="o", markersize=3, color=color, label=label)
        ks = list(range(len(e["speedup_by_k"])))
        ax_speed.plot(ks, e["speedup_by_k"], color=color, label=label)
        ax_speed.scatter([e["chosen_k"]], [e["expected_speedup"]], color=color, zorder=3, s=30)
    ax_acc.set(title="cumulative acceptance A_i (measured)", xlabel="draft position i",
               ylabel="A_i = P(positions 1..i accepted)", ylim=(-0.02, 1.05))
    for ax in (ax_acc, ax_speed):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_speed.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="_plain")
    ax_speed.set(title="expected speedup by draft ceiling k (dot: chosen k)",
                 xlabel="draft ceiling k (tokens)", ylabel="speedup (× plain decoding)")
    for ax in (ax_acc, ax_speed):
        if [ln for ln in ax.lines if not ln.get_label().startswith("_")]:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    if not Path(path).suffix or not Path(path).stem:
        raise InputError(f"--plot {str(path)!r}: give a file name with an extension, e.g."
                         " tuner.png")
    try:
        fig.savefig(path, dpi=100)
    except ValueError as e:  # an extension matplotlib cannot write
        raise InputError(f"cannot write the plot {path}: {e}; use a .png file") from None
    except OSError as e:
        raise InputError(f"cannot write the plot {path}: {e.strerror or e}; pass another"
                         " --plot path") from None
    return fig
