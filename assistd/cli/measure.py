"""The measuring commands: ``replay`` (recorded outputs through each proposer, offline),
``bench`` (every arm on a live Target, one ledger), ``stats`` (what the tuner learnt)
and ``peers`` (the optional peers they compare against)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from assistd.cli.app import cli
from assistd.cli.options import (KChoice, backend_option, db_option, json_option, model_option,
                                 n_ctx_option, nodes_option, numerics_option, tree_option)
from assistd.cli.render import emit, progress
from assistd.ground.errors import InputError
from assistd.ground.options import parse_k


@cli.group()
def peers():
    """Optional peers for `replay` and `bench`, built into the user cache on request.

    \b
    Example:
        assistd peers build arctic
    """


@peers.command("build")
@click.argument("name", type=click.Choice(["arctic"]))
@click.option("--sdist", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A local arctic_inference-0.3.0.tar.gz instead of pip's download from PyPI.")
def peers_build(name, sdist):
    """Build Arctic Inference 0.3.0's SuffixDecoding (peer:arctic, peer:arctic-tree).

    Downloads the sdist with pip, builds its csrc/suffix_decoding with CMake and nanobind
    (a C++20 compiler is needed; about 30 s) and keeps the module in the user cache;
    a second call reuses it.

    \b
    Example:
        assistd peers build arctic
        assistd replay session.jsonl --proposer peer:arctic --proposer peer:arctic-tree
    """
    from assistd.measure.arctic import build
    from proposers.arctic import built_module, load

    reused = built_module() is not None
    path = build(sdist, log=lambda m: click.echo(m, err=True))
    load()  # a module that is there but does not load: InputError, with the fix
    click.echo(f"{'already built' if reused else 'built'}: {path}")


@cli.command()
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--git", "git_repo", type=click.Path(path_type=Path), default=None,
              help="Also replay a repository's history: each text file a commit adds or"
                   " changes is a model turn, its older versions are in the history.")
@click.option("--git-commits", type=click.IntRange(1), default=20, show_default=True,
              help="With --git: how many of the last (first-parent) commits, oldest first.")
@click.option("--rewrite", "rewrite", type=click.Path(exists=True, path_type=Path), default=None,
              metavar="PATH",
              help="Replay real edits instead (a git repository, or agent transcripts): the"
                   " edited text is the output, the text before the edit the prediction;"
                   " arms suffix, the peers' prompt lookup, prediction, prediction+suffix"
                   " and the oracle, with the file in the prompt and only in the prediction.")
@click.option("--proposer", "proposers", multiple=True, metavar="NAME",
              help="Proposer to replay; repeat for several. [default: every registered one"
                   " except draft_model and peer:arctic(-tree), other peers included;"
                   " those need `assistd peers build arctic`]")
@click.option("--k", "k", type=click.IntRange(1, 64), default=16, show_default=True,
              help="Draft length ceiling per round.")
@click.option("--cost-model", default="calibrate", show_default=True,
              metavar="reference|flat|calibrate|FILE",
              help="The Target's forward time t(n): the reference 2-core CPU's figures"
                   " (docs/design.md; 'brief' is the old name), flat (any round costs one"
                   " forward, as on a GPU), measured on the Target now (~2 s), or a JSON"
                   " file {\"points\": {\"1\": 11.0, ...}}.")
@tree_option
@nodes_option
@click.option("--model", type=click.Path(path_type=Path), default=None,
              help="GGUF file of the Target: its tokenizer, and its speed with --cost-model"
                   " calibrate. [default: the embedded SmolLM2-135M-Instruct Q4_1]")
@json_option()
def replay(files, git_repo, git_commits, rewrite, proposers, k, cost_model, tree, nodes, model,
           as_json):
    """Replay recorded outputs through each proposer, offline, as the decoder would.

    The recorded model turns stand in for the Target's output (an oracle): at each
    position the proposer drafts from everything before it, the draft's common
    prefix with the recording is accepted, and the round commits that plus one
    token; non-model turns (prompts, tool results) join the context without
    drafting. Each replayed turn then joins the history, so later sessions draft
    from earlier ones. FILES are transcripts of any supported format (or folders
    of them), replayed in the order given. Reports per proposer D, C, R, plain
    steps, acceptance rate, mean acceptance length, coverage, tokens per call,
    modeled speedup on the cost model t(n), per-position acceptance and
    propose() latency. The peers `peer:llama-cpp-python-pld` and
    `peer:transformers-pld` run in the same pass on the same tokens.

    \b
    Examples:
        assistd replay ~/.claude/projects/myproj/*.jsonl --cost-model reference
        assistd replay run.traj --proposer suffix --proposer peer:llama-cpp-python-pld --json
        assistd replay --git . --git-commits 50 --k 8
        assistd replay transcripts/ --proposer suffix --proposer peer:suffixdecoding \\
            --tree both --nodes 64 --cost-model flat
        assistd replay --rewrite . --cost-model reference
    """
    from assistd.cli.replay_table import print_replay
    from assistd.measure.replay import replay_report

    if cost_model == "brief":  # the old name: still accepted, said once, plainly
        click.echo("warning: --cost-model brief is now called --cost-model reference", err=True)
        cost_model = "reference"
    if rewrite is not None:
        if files or git_repo is not None or proposers:
            raise click.UsageError("--rewrite replays its own arms on its own inputs: give"
                                   " no FILES, --git or --proposer with it")
        emit(_rewrite_report(rewrite, k, cost_model, model), as_json, print_rewrite_replay)
        return
    update, close = (None, lambda: None) if as_json else progress("replay")
    try:
        report = replay_report(files, git_repo=git_repo, git_commits=git_commits,
                               names=proposers, k=k, cost_model=cost_model, model=model,
                               progress=update, tree=tree, max_nodes=nodes)
    finally:
        close()
    emit(report, as_json, print_replay)


def _rewrite_report(path: Path, k: int, cost_model: str, model) -> dict:
    """``replay --rewrite``'s report (:func:`assistd.measure.replay_rewrite.replay_rewrite`)."""
    from assistd.measure.replay import resolve_cost_model
    from assistd.measure.replay_rewrite import replay_rewrite, rewrite_edits
    from assistd.targets.open import open_target

    edits = rewrite_edits(path)  # a bad input fails before the model loads and calibrates
    target = open_target(model)
    try:
        cost = resolve_cost_model(cost_model, target)
        report = replay_rewrite(edits, path, target.tokenize, cost, k=k)
    finally:
        target.close()
    return {"k": k, "cost_model": cost.as_dict(), **report}


def print_rewrite_replay(report: dict) -> None:
    """One row per case kind and arm: tokens per Target call and the modelled speedup
    (a round of L drafts priced t(L + 1))."""
    click.echo(f"{report['edits']} edits from {report['source']}, k {report['k']},"
               f" cost model {report['cost_model'].get('source')}")
    for kind, v in report["kinds"].items():
        click.echo(f"\n{kind} ({v['cases']} cases, {v['output_tokens']} output tokens)")
        click.echo(f"  {'arm':<28}{'tokens/call':>12}{'speedup':>10}")
        for arm, m in v["arms"].items():
            speed = m.get("modeled_speedup_physical", m.get("modeled_speedup"))
            calls = m.get("tokens_per_call")
            click.echo(f"  {arm:<28}{'-' if calls is None else format(calls, '.2f'):>12}"
                       f"{'-' if speed is None else format(speed, '.2f') + 'x':>10}")


class _BenchK(KChoice):
    """--k for bench: 'auto' or 1..64 (plain decoding is always in the run)."""

    name = "auto|1-64"

    def convert(self, value, param, ctx):
        try:
            v = parse_k(value, what="--k")
        except InputError:  # parse_k names 0..64; bench takes 1..64
            v = None
        if v is None:
            self.fail(f"--k must be 'auto' or a number of tokens 1..64, not {value!r}", param,
                      ctx)
        if v == 0:
            self.fail("0 is plain decoding, which every bench runs anyway; pick 1-64 or auto",
                      param, ctx)
        return v


@cli.command()
@click.option("--workload", "workloads", multiple=True, metavar="NAME|NAME=PATH|PATH",
              help="agent (transcripts), edit (a git history), stdlib (a library of .py"
                   " files), novel (prose requests, code history); NAME=PATH picks the"
                   " source, a bare PATH is guessed (git repo: edit, .py folder: stdlib,"
                   " else transcripts). Repeat for several. [default: all four]")
@click.option("--proposer", "proposers", multiple=True, metavar="NAME",
              help="Proposer arm; repeat for several. [default: ngram, suffix and the peers'"
                   " rules peer:suffixdecoding, peer:llama-cpp-python-pld, peer:transformers-pld]")
@backend_option
@model_option
@click.option("--draft-model", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Add a draft_model arm with this GGUF (same tokenizer).")
@click.option("--k", "k", type=_BenchK(), default="auto", show_default=True,
              help="Draft ceiling of our proposers, or 'auto' (a fresh tuner per workload).")
@click.option("--cases", type=click.IntRange(1), default=6, show_default=True,
              help="Prompts per workload.")
@click.option("--max-tokens", type=click.IntRange(1, 1024), default=96, show_default=True,
              help="Tokens generated per prompt.")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True,
              help="Times each arm runs each prompt (the speedup's spread).")
@click.option("--max-prompt-tokens", type=click.IntRange(16), default=1536, show_default=True,
              help="Prompt window, in tokens.")
@n_ctx_option
@click.option("--threads", type=click.IntRange(1), default=None,
              help="CPU threads of the Target and the library peer. [default: all usable]")
@click.option("--no-library-peer", is_flag=True,
              help="Skip llama-cpp-python's own prompt-lookup decoding (a second model instance).")
@numerics_option
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
              help="Which stdlib files and cursors; the tuner's exploration draws.")
@tree_option
@nodes_option
@json_option("Print the report as one JSON object.")
@click.option("--report", "report_dir", type=click.Path(path_type=Path), default=None,
              help="Write ledger.md, ledger.json, speedup.png and acceptance.png here.")
def bench(workloads, proposers, backend, model, draft_model, k, cases, max_tokens, repeats,
          max_prompt_tokens, n_ctx, threads, no_library_peer, numerics, seed, tree, nodes,
          as_json, report_dir):
    """Measure plain decoding, every proposer and the in-stack peers on one ledger.

    One Target per numerics mode, the same prompts, the arms interleaved: every arm
    under --numerics here, plain decoding under llama.cpp's defaults (plain:llama, the
    baseline of every speedup) and exact numerics (plain:exact) each in a process of
    its own. Prints per workload and arm: tokens/s, speedup over the baseline (min-max
    over repeats), the ceiling this run's t(n) and acceptance allow, acceptance rate,
    mean acceptance length, coverage, per-position acceptance, draft and verify ms per
    token, extra memory, and whether greedy output matched plain decoding.

    \b
    Examples:
        assistd bench
        assistd bench --workload agent=~/.claude/projects/myproj --workload edit=. --report out/
        assistd bench --workload novel --proposer suffix --k 8 --json
        assistd bench --workload agent --proposer suffix --tree both --nodes 64
    """
    import shlex

    from assistd.measure import bench as bench_mod
    from assistd.measure.bench_report import print_ledger, write_report

    specs = list(workloads) or ["agent", "edit", "stdlib", "novel"]
    optional = ()
    if not workloads:
        # The defaults run what this machine has: agent needs transcripts, edit a git
        # repository here; either is left out with a note when missing.
        optional = ("agent", "edit")
    if report_dir is not None:
        _check_writable(report_dir)
    command = "assistd bench " + shlex.join(sys.argv[2:]) if len(sys.argv) > 1 else "assistd bench"
    on_progress, close = _bench_progress()

    def skip(spec: str, reason: str) -> None:
        click.echo(f"note: {spec} left out: {reason}", err=True)

    try:
        report = bench_mod.run(
            specs, proposers=list(proposers) or bench_mod.DEFAULT_PROPOSERS, backend=backend,
            model=model, draft_model=draft_model, k=k, cases=cases, max_tokens=max_tokens,
            repeats=repeats, max_prompt_tokens=max_prompt_tokens, n_ctx=n_ctx,
            n_threads=threads, library_peer=not no_library_peer, numerics=numerics,
            seed=seed, command=command, progress=on_progress, optional=optional,
            on_skip=skip, tree=tree, max_nodes=nodes)
    finally:
        close()
    for warning in report["warnings"]:
        click.echo(f"warning: {warning}", err=True)
    # The report reaches stdout before the files: a folder that fails now loses nothing.
    emit(report, as_json, print_ledger)
    if report_dir is not None:
        for path in write_report(report, report_dir):
            click.echo(f"wrote {path}", err=True)


def _check_writable(directory: Path) -> None:
    """Create ``directory`` and write a probe file there before any work, so that a bad
    --report fails in a second, not after the run. Raises :class:`InputError`."""
    import tempfile

    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".assistd-probe-"):
            pass
    except OSError as e:
        raise InputError(f"--report {directory}: cannot write there ({e.strerror or e});"
                         " pass another output folder") from None


def _bench_progress():
    """``(progress(total) -> step(description, n), close())``: a rich bar on stderr when
    it is a terminal, else a line at every 5% of the generations."""
    if not sys.stderr.isatty():
        def progress_lines(total: int):
            done, every, t0 = 0, max(1, total // 20), time.monotonic()

            def step(description: str, n: int) -> None:
                nonlocal done
                done += n
                if done % every == 0 or done == total:
                    click.echo(f"bench: {done}/{total} generations, {time.monotonic() - t0:.0f} s"
                               f" ({description})", err=True)

            return step

        return progress_lines, lambda: None
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn,
                               TimeRemainingColumn)

    bar = Progress("[progress.description]{task.description}", BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                   console=Console(stderr=True), transient=True)
    bar.start()
    task = bar.add_task("loading", total=None)

    def on_total(total: int):
        bar.update(task, total=total, description="bench")

        def step(description: str, n: int) -> None:
            bar.update(task, advance=n, description=description)

        return step

    return on_total, bar.stop


@cli.command()
@click.option("--scope", default=None, metavar="S",
              help="Only this scope's ledger (a repository root as `assistd history sources`"
                   " lists it, or a path to one). [default: all scopes]")
@json_option()
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE.png",
              help="Also draw the cumulative acceptance A_i per language and the expected"
                   " speedup by draft ceiling k (chosen k marked) into a PNG file.")
@db_option
def stats(scope, as_json, plot, db):
    """What the tuner has learnt, per language id and proposer.

    From the decayed acceptance ledger that every `assistd complete` adds to:
    coverage (rounds / steps), acceptance rate (accepted / drafted tokens), mean
    acceptance length (1 + accepted / rounds), per-position acceptance (conditional
    a_i and cumulative A_i), and the draft ceiling k the tuner picks with its
    expected speedup over plain decoding on the Target's measured cost model. Then
    what editors reported of their suggestions: shown, accepted (whole or partly,
    with the accepted characters), dismissed.

    \b
    Examples:
        assistd stats
        assistd stats --scope ~/src/myproj --json
        assistd stats --plot tuner.png
    """
    from assistd.runtime.runtime import open_store, store_stats
    from assistd.runtime.stats import plot_stats, print_stats, print_user_acceptance

    both = store_stats(open_store(db, create=False), scope=scope)
    report = both["ledger"]
    if plot is not None:
        plot_stats(report, plot)
        click.echo(f"wrote {plot}", err=True)

    def show(_):
        print_stats(report)
        print_user_acceptance(both["user_acceptance"])

    emit({**report, "user_acceptance": both["user_acceptance"]}, as_json, show)
