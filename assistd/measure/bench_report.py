"""``assistd bench`` output: the report dict as a terminal table, Markdown, plots and files.

One job: render the report that :mod:`assistd.measure.bench` measures (what ``assistd bench --json``
prints) without changing it. Sinks: ``rich`` tables (:func:`print_ledger`), GitHub
Markdown for README's "Performance" section (:func:`ledger_markdown`), two PNG figures
(:func:`plot_speedup`, :func:`plot_acceptance`) and a folder holding all of them plus the
JSON (:func:`write_report`).

Every number may be ``None`` (no data: a peer library that exposes no acceptance, an arm
that never drafted); it is shown as ``-``. Columns, per arm of a workload:

    tok/s            committed tokens per second of decoding
    speedup          tok/s over the baseline's (plain decoding, llama.cpp's default
                     kernels: ``plain:llama``), whole run (min–max of repeats)
    ceiling          the best chain speedup this run's t(n) and per-position acceptance
                     allow, at the arm's measured coverage / at coverage 1 (``1.31× / 1.52×``)
    accept           acceptance_rate = accepted / drafted tokens
    mean len         mean_acceptance_length = 1 + accepted / rounds (tokens per round)
    coverage         rounds / (rounds + plain steps)
    tree rounds      rounds whose draft was a token tree (only where a tree ran)
    nodes/round      draft tokens (tree nodes) verified per round, D / R (ditto)
    a_1..a_4         conditional acceptance at draft positions 1..4 (accepted_i / tried_i)
    draft, verify    milliseconds per committed token
    extra MiB        memory over plain decoding, MiB (2**20 bytes)
    output match     cases whose text equals plain decoding's; a near-tie differs only
                     where plain decoding's top-2 logits were within ``near_tie_gap``;
                     ``numerics``: a companion's plain, whose other kernels chose other
                     tokens; ``unexplained``: a difference the batched re-evaluation
                     did not reproduce

Example cells: speedup 1.23 over repeats 1.18..1.27 is ``1.23× (1.18–1.27)``; output
match 5 exact, 1 near-tie of 6 is ``5/6 +1 near-tie``; a = [0.82, 0.75, 0.6] is ``.82 .75 .60``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from assistd.ground.errors import InputError

POSITIONS = 4  # conditional acceptances shown in the tables (JSON and plot have all)
HEADERS = ["arm", "tok/s", "speedup (× baseline)", "ceiling", "accept",
           "mean len (tok/round)", "coverage", f"a_1..a_{POSITIONS}", "draft ms/tok",
           "verify ms/tok", "extra MiB", "output match"]
LEGEND = ("speedup = tok/s over the baseline's (plain decoding with llama.cpp's default"
          " kernels on every thread: plain:llama in its own process, or plain under"
          " --numerics llama), whole run (min–max of the repeats); ceiling = the best"
          " fixed-k chain speedup this run's t(n) and per-position acceptance allow, at the"
          " arm's coverage / at coverage 1 (an arm whose k varies may pass it); tok/s ="
          " committed tokens / decode s (prefill excluded); accept = accepted /"
          " drafted tokens; mean len = 1 + accepted / rounds; coverage = rounds / steps;"
          f" a_1..a_{POSITIONS} = conditional acceptance per draft position; ms/tok = per"
          " committed token; output match = cases identical to plain decoding (near-tie:"
          " differs only where plain's top-2 logits are within the gap; numerics: a"
          " companion's plain under other kernels)")
TREE_HEADERS = ["tree rounds", "nodes/round"]  # after coverage, where a tree ran
TREE_LEGEND = ("; tree rounds = rounds whose draft branched; nodes/round = draft tokens (tree"
               " nodes) verified per round; accept is then accepted / verified nodes")


def _f(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _speedup(arm: dict) -> str:
    """``1.23× (1.18–1.27)``; the range is left out when it is missing or a single value."""
    s, lo, hi = arm.get("speedup"), arm.get("speedup_min"), arm.get("speedup_max")
    if s is None:
        return "-"
    text = f"{s:.2f}×"
    if lo is not None and hi is not None and f"{lo:.2f}" != f"{hi:.2f}":
        text += f" ({lo:.2f}–{hi:.2f})"
    return text


def _ceiling(arm: dict) -> str:
    """``1.31× / 1.52×`` (at the measured coverage / at coverage 1), or ``-``."""
    c = arm.get("ceiling")
    if not c:
        return "-"
    return f"{c['measured']:.2f}× / {c['full']:.2f}×"


def _positions(arm: dict) -> str:
    a = (arm.get("conditional_acceptance") or [])[:POSITIONS]
    if all(x is None for x in a):
        return "-"
    return " ".join("-" if x is None else f"{x:.2f}".removeprefix("0") for x in a)


def _mib(n_bytes) -> str:
    return "-" if n_bytes is None else f"{n_bytes / 2**20:.1f}"


def _match(arm: dict) -> tuple[str, str]:
    """(``exact/total`` plus the near-tie count, the ``N DIFFERS`` part or ``""``)."""
    m = arm.get("output_match") or {}
    exact, near, differs, other, unexplained = (
        m.get(k) or 0 for k in ("exact", "near_tie", "differs", "numerics", "unexplained"))
    total = exact + near + differs + other
    if not total:
        return "-", ""
    head = (f"{exact}/{total}" + (f" +{near} near-tie" if near else "")
            + (f" +{other} numerics" if other else ""))
    bad = ([f"{differs} DIFFERS"] if differs else []) + (
        [f"{unexplained} UNEXPLAINED"] if unexplained else [])
    return head, " ".join(bad)


def _cells(arm: dict) -> list[str]:
    """Every column but output match, as text."""
    return [str(arm.get("arm", "?")), _f(arm.get("tokens_per_s"), ".1f"), _speedup(arm),
            _ceiling(arm), _f(arm.get("acceptance_rate")), _f(arm.get("mean_acceptance_length")),
            _f(arm.get("coverage")), _positions(arm), _f(arm.get("draft_ms_per_token")),
            _f(arm.get("verify_ms_per_token")), _mib(arm.get("extra_memory_bytes"))]


def _has_trees(w: dict) -> bool:
    return any(arm.get("tree_rounds") for arm in w.get("arms") or [])


def _headers(w: dict) -> list[str]:
    """HEADERS, with TREE_HEADERS after coverage in a workload where a tree ran."""
    if not _has_trees(w):
        return list(HEADERS)
    i = HEADERS.index("coverage") + 1
    return HEADERS[:i] + TREE_HEADERS + HEADERS[i:]


def _row(arm: dict, trees: bool) -> list[str]:
    """:func:`_cells`, with the tree columns when ``trees``."""
    cells = _cells(arm)
    if trees:
        i = HEADERS.index("coverage") + 1
        tr = arm.get("tree_rounds")
        cells[i:i] = ["-" if tr is None else f"{tr:,}", _f(arm.get("nodes_per_round"))]
    return cells


def _counts(w: dict) -> str:
    """``6 cases, 7,000 prompt tokens, 180,000 history tokens`` (missing counts left out)."""
    counts = [f"{w[k]:,} {label}" for k, label in (("cases", "cases"), ("prompt_tokens",
              "prompt tokens"), ("history_tokens", "history tokens")) if w.get(k) is not None]
    return ", ".join(counts) or "no counts"


def _machine_line(report: dict) -> str:
    m = report.get("machine") or {}
    parts = [m.get("cpu"), m.get("cores") and f"{m['cores']} cores", m.get("platform"),
             m.get("python") and f"Python {m['python']}",
             m.get("llama_cpp_python") and f"llama-cpp-python {m['llama_cpp_python']}",
             m.get("threads") and f"{m['threads']} threads",
             m.get("memory_bytes") and f"{m['memory_bytes'] / 2**30:.1f} GiB RAM"]
    return "machine: " + (", ".join(str(p) for p in parts if p) or "-")


def _target_line(report: dict) -> str:
    t = report.get("target") or {}
    model = t.get("model") and Path(str(t["model"])).name
    parts = [t.get("backend"), model, t.get("n_ctx") and f"n_ctx {t['n_ctx']}",
             t.get("numerics") and f"numerics {t['numerics']}",
             t.get("promise") and f"promise {t['promise']}"]
    return "target: " + (" ".join(str(p) for p in parts if p) or "-")


def _settings_line(report: dict) -> str:
    s = report.get("settings") or {}
    return "settings: " + (", ".join(f"{k}={v}" for k, v in s.items()) or "-")


def print_ledger(report: dict, console=None) -> None:
    """The report as one ``rich`` table per workload (a row per arm, columns as in the
    module docstring), then one line with the machine, target and settings."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if console is None:
        kw = {"emoji": False, "markup": False, "highlight": False}
        console = Console(**kw) if sys.stdout.isatty() else Console(width=200, **kw)
    for w in report.get("workloads") or []:
        table = Table(title=f"{w.get('name', '?')}: {_counts(w)}", title_justify="left")
        trees = _has_trees(w)
        for col in _headers(w):
            table.add_column(col, justify="left" if col in ("arm", "output match") else "right",
                             overflow="fold", no_wrap=col.startswith("a_1"))
        for arm in w.get("arms") or []:
            head, differs = _match(arm)
            match = Text(head)
            if differs:
                match.append(" " + differs, style="bold red")
            table.add_row(*(Text(c) for c in _row(arm, trees)), match)
        console.print(table)
        if w.get("rewrite"):
            headers, rows = rewrite_table(w["rewrite"])
            table = Table(title=f"{w.get('name', '?')}: per case (speedup over"
                          f" {w.get('baseline', 'plain')}; oracle: see docs/edits.md)",
                          title_justify="left")
            for col in headers:
                table.add_column(col, justify="left" if col in ("case", "kind") else "right",
                                 overflow="fold")
            for row in rows:
                table.add_row(*(Text(c) for c in row))
            console.print(table)
    if not report.get("workloads"):
        console.print("no workloads in the report")
    for warning in report.get("warnings") or []:
        console.print(Text(f"warning: {warning}", style="bold yellow"))
    trees = any(_has_trees(w) for w in report.get("workloads") or [])
    console.print(Text(LEGEND + (TREE_LEGEND if trees else ""), style="dim"))
    console.print(Text(f"{_machine_line(report)}; {_target_line(report)}\n"
                       f"{_settings_line(report)}"))


def rewrite_table(rewrite: dict) -> tuple[list[str], list[list[str]]]:
    """The rewrite workload's table: a row per case (kind, overlap, each arm's speedup,
    the oracle's, the prediction arms' ratio to it, place losses / re-finds of the
    prediction+suffix arm), then a row per kind with the geometric means."""
    cases = rewrite.get("cases") or []
    arms = [n for n in (cases[0]["speedup"] if cases else {}) if not n.startswith("plain")]
    pred = [n for n in arms if n.startswith("prediction")]
    headers = (["case", "kind", "overlap", "tokens"] + arms + ["oracle"]
               + [f"{n} / oracle" for n in pred] + ["lost / found"])
    rows = []
    for c in cases:
        place = (c.get("place") or {}).get("prediction+suffix") or (
            c.get("place") or {}).get("prediction") or {}
        rows.append([c["case"][-40:], c["kind"], _f(c.get("overlap")), str(c["output_tokens"])]
                    + [_f(c["speedup"].get(n)) for n in arms] + [_f(c.get("oracle_speedup"))]
                    + [_f(c["to_oracle"].get(n)) for n in pred]
                    + [f"{place.get('losses', '-')} / {place.get('refinds', '-')}"])
    for kind, s in (rewrite.get("summary") or {}).items():
        rows.append([f"geomean ({s['cases']} cases)", kind, _f(s.get("overlap_mean")), ""]
                    + [_f(s["speedup_gmean"].get(n)) for n in arms] + [_f(s.get("oracle_gmean"))]
                    + [_f(s["to_oracle"].get(n)) for n in pred] + [""])
    return headers, rows


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def ledger_markdown(report: dict, level: int = 3) -> str:
    """The report as GitHub Markdown: machine, target, settings and the command to
    reproduce, then a heading (``level`` #s) and a table per workload, then the legend."""
    lines = [f"- {_machine_line(report)}", f"- {_target_line(report)}",
             f"- {_settings_line(report)}"]
    if report.get("started") or report.get("wall_s") is not None:
        lines.append(f"- run: {report.get('started') or '-'}, {_f(report.get('wall_s'), '.0f')} s")
    lines += ["", "```sh", str(report.get("command") or "assistd bench"), "```"]
    lines += [f"\n**Warning:** {_md_cell(x)}" for x in report.get("warnings") or []]
    for w in report.get("workloads") or []:
        lines += ["", f"{'#' * level} {w.get('name', '?')}", ""]
        about = (w.get("description") or "").strip()
        lines.append((about.rstrip(".") + ". " if about else "") + _counts(w)
                     + (f" ({w['history_documents']:,} documents)"
                        if w.get("history_documents") is not None else "") + ".")
        headers, trees = _headers(w), _has_trees(w)
        lines += ["", "| " + " | ".join(headers) + " |",
                  "|" + "|".join("---" if h == "arm" else "---:" for h in headers[:-1]) + "|---|"]
        for arm in w.get("arms") or []:
            head, differs = _match(arm)
            cells = _row(arm, trees) + [head + (f" **{differs}**" if differs else "")]
            lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
        if w.get("rewrite"):
            headers, rows = rewrite_table(w["rewrite"])
            lines += ["", "| " + " | ".join(headers) + " |",
                      "|" + "|".join("---" if h in ("case", "kind") else "---:"
                                     for h in headers) + "|"]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    any_trees = any(_has_trees(w) for w in report.get("workloads") or [])
    lines += ["", LEGEND + (TREE_LEGEND if any_trees else "") + "."]
    return "\n".join(lines) + "\n"


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # the Agg backend, off screen, whatever the default backend
    return fig


def _save(fig, path: Path):
    try:
        fig.savefig(path, dpi=100)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot write {path}: {getattr(e, 'strerror', None) or e};"
                         " pass another output folder") from None
    return fig


def _arm_colors(report: dict, keep) -> dict[str, str]:
    """One colour per arm name, the same in every subplot, in order of first appearance."""
    from matplotlib import rcParams

    palette = rcParams["axes.prop_cycle"].by_key()["color"]
    names = dict.fromkeys(a.get("arm", "?") for w in report.get("workloads") or []
                          for a in w.get("arms") or [] if keep(a))
    return {n: palette[i % len(palette)] for i, n in enumerate(names)}


def plot_speedup(report: dict, path: str | Path):
    """Grouped bars into ``path`` (PNG): speedup over the baseline (× baseline) per
    workload, a bar per arm but the baseline with a min–max whisker over the repeats; the
    dashed line at 1.0 is the baseline. Returns the matplotlib ``Figure``."""
    path, workloads = Path(path), report.get("workloads") or []
    baseline = report.get("baseline", "plain")
    colors = _arm_colors(report, lambda a: a.get("arm") != baseline)
    fig = _figure(max(8.0, 3.5 + 0.5 * max(1, len(workloads)) * max(1, len(colors))), 4.5)
    ax = fig.subplots()
    width = 0.8 / max(1, len(colors))
    for j, (name, color) in enumerate(colors.items()):
        xs, ys, err = [], [], [[], []]
        for i, w in enumerate(workloads):
            arm = next((a for a in w.get("arms") or [] if a.get("arm") == name), None)
            if arm is None or arm.get("speedup") is None:
                continue
            s = arm["speedup"]
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(s)
            err[0].append(max(0.0, s - (arm.get("speedup_min") if arm.get("speedup_min")
                                        is not None else s)))
            err[1].append(max(0.0, (arm.get("speedup_max") if arm.get("speedup_max")
                                    is not None else s) - s))
        bars = ax.bar(xs, ys, width, yerr=err, capsize=3, color=color, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize="x-small", padding=2)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label=f"baseline: {baseline} (1.0)")
    ax.set_xticks(range(len(workloads)), [str(w.get("name", "?")) for w in workloads])
    model = (report.get("target") or {}).get("model")
    ax.set(xlabel="workload", ylabel=f"speedup (× {baseline} tok/s)",
           title="assistd bench: speedup over the baseline"
           + (f"\n{Path(str(model)).name}" if model else ""))
    if not colors:
        ax.text(0.5, 0.5, "no arms besides the baseline", ha="center", va="center",
                transform=ax.transAxes)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path)


def plot_acceptance(report: dict, path: str | Path):
    """One subplot per workload into ``path`` (PNG): conditional acceptance a_i against
    draft position i = 1..N, a line per arm with any measured value (arms that never
    drafted, or whose library does not say, are left out). Returns the ``Figure``."""
    from matplotlib.ticker import MaxNLocator

    path, workloads = Path(path), report.get("workloads") or [{"name": "no workloads"}]

    def measured(a):
        return any(x is not None for x in a.get("conditional_acceptance") or [])

    colors = _arm_colors(report, measured)
    fig = _figure(0.5 + 4.2 * len(workloads), 4.0)
    axes = fig.subplots(1, len(workloads), sharex=True, sharey=True,
                        squeeze=False)[0]
    for ax, w in zip(axes, workloads):
        for arm in w.get("arms") or []:
            if measured(arm):
                pts = [(i, x) for i, x in enumerate(arm["conditional_acceptance"], 1)
                       if x is not None]
                ax.plot(*zip(*pts), marker="o", markersize=3, label=arm.get("arm", "?"),
                        color=colors[arm.get("arm", "?")])
        ax.set(title=str(w.get("name", "?")), xlabel="draft position i", ylim=(-0.02, 1.05))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no drafts", ha="center", va="center", transform=ax.transAxes)
    axes[0].set_ylabel("a_i = accepted_i / tried_i")
    fig.suptitle("assistd bench: conditional acceptance per draft position")
    return _save(fig, path)


def write_report(report: dict, directory: str | Path) -> list[Path]:
    """Write ``ledger.json``, ``ledger.md``, ``speedup.png`` and ``acceptance.png`` into
    ``directory`` (created with its parents) and return their paths. Raises
    :class:`InputError` when the folder cannot be created or written."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        json_path, md_path = directory / "ledger.json", directory / "ledger.md"
        json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        md_path.write_text(ledger_markdown(report), encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot write the bench report into {directory}:"
                         f" {e.strerror or e}; pass another output folder") from None
    speedup_path, acceptance_path = directory / "speedup.png", directory / "acceptance.png"
    plot_speedup(report, speedup_path)
    plot_acceptance(report, acceptance_path)
    return [json_path, md_path, speedup_path, acceptance_path]
