"""`assistd stats`: the tuner's ledger per language and proposer, as a table, JSON and a plot.

Data: a real SQLite history file per test, filled through the real
:meth:`LedgerStore.add` with ledgers from :meth:`Ledger.record_round` /
:meth:`Ledger.record_plain_step` whose acceptance patterns are known:

- python · suffix, scope A: 10 rounds drafting 4 with all 4 accepted, 10 drafting 4 with
  1 accepted, 5 plain steps (the proposer had nothing): coverage 20/25, acceptance
  50/80, mean length 1 + 50/20, a = [1, 1/2, 1, 1], A = [1, 1/2, 1/2, 1/2];
- python · suffix, scope B: 10 rounds drafting 4 with none accepted, 5 plain steps;
- markdown · suffix, scope A: 10 rounds drafting 2 with 1 accepted, 10 with 0, 20 plain
  steps: a = [1/2, 0], A = [1/2, 0];
- plaintext · suffix, scope A: 10 plain steps, no round: no acceptance at all;
- python · none (plain decoding), scope A: 7 plain steps.

Forward times are like the reference CPU's (t(1) = 11 ms, t(L+1) = 10 + 5 L ms), so the Target's
cost model is measured from the ledger itself.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from assistd.ground.costmodel import CostModel
from assistd.ground.errors import InputError
from assistd.ground.ledger import Ledger
from assistd.runtime.stats import plot_stats, print_stats, stats_report
from assistd.decoding.tuner import K_MAX, Tuner, estimate
from storage.ledger_store import LedgerStore
from storage.store import HistoryStore

TARGET = "llama:smollm2.gguf:100:cpu:t2"
SCOPE_A, SCOPE_B = "/src/a", "/src/b"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def ledger(rounds: list[tuple[int, int, int]], plain: int = 0, proposed: bool = True) -> Ledger:
    """``rounds``: (drafted, accepted, how many); ``plain``: plain steps."""
    led = Ledger()
    for drafted, accepted, n in rounds:
        for _ in range(n):
            led.record_round(drafted, accepted, ceiling=drafted, draft_ms=0.1,
                             verify_ms=10.0 + 5.0 * drafted)
    for _ in range(plain):
        led.record_plain_step(proposed=proposed, draft_ms=0.05 if proposed else 0.0,
                              verify_ms=11.0)
    return led


@pytest.fixture
def ledger_store(tmp_path):
    store = HistoryStore(tmp_path / "h.db")
    yield LedgerStore(store)
    store.close()


@pytest.fixture
def filled(ledger_store):
    add = ledger_store.add
    add(SCOPE_A, "python", "suffix", TARGET, ledger([(4, 4, 10), (4, 1, 10)], plain=5))
    add(SCOPE_B, "python", "suffix", TARGET, ledger([(4, 0, 10)], plain=5))
    add(SCOPE_A, "markdown", "suffix", TARGET, ledger([(2, 1, 10), (2, 0, 10)], plain=20))
    add(SCOPE_A, "plaintext", "suffix", TARGET, ledger([], plain=10))
    add(SCOPE_A, "python", "none", TARGET, ledger([], plain=7, proposed=False))
    return ledger_store


def entry(report: dict, language: str, proposer: str = "suffix") -> dict:
    (e,) = [e for e in report["entries"] if (e["language"], e["proposer"]) == (language, proposer)]
    return e


def curves(ax) -> list:
    """The data lines of an axes: markers are scatters, reference lines are labelled '_...'."""
    return [ln for ln in ax.lines if not ln.get_label().startswith("_")]


def assistd(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "assistd", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_report_numbers_are_the_ledger_arithmetic_summed_over_scopes(filled):
    """All scopes: python · suffix sums scopes A and B (30 rounds, 10 plain steps, D 120,
    C 50); every rate is the docs/design.md formula over those counters."""
    report = stats_report(filled)
    assert report["scope"] is None and report["scopes"] == [SCOPE_A, SCOPE_B]
    assert [(e["language"], e["proposer"]) for e in report["entries"]] == [
        ("markdown", "suffix"), ("plaintext", "suffix"), ("python", "none"),
        ("python", "suffix")]
    py = entry(report, "python")
    approx = pytest.approx
    assert (py["rounds"], py["plain_steps"], py["steps"]) == (approx(30), approx(10), approx(40))
    assert (py["draft_tokens"], py["accepted_tokens"]) == (approx(120), approx(50))
    assert py["coverage"] == approx(30 / 40)  # R / (R + P)
    assert py["acceptance_rate"] == approx(50 / 120)  # C / D
    assert py["mean_acceptance_length"] == approx(1 + 50 / 30)  # 1 + C / R
    # tried: position 1 by all 30 rounds, 2..4 by the 10 + 10 rounds that accepted >= 1
    assert py["tried_per_position"] == approx([30, 20, 10, 10])
    assert py["accepted_per_position"] == approx([20, 10, 10, 10])
    assert py["conditional_acceptance"] == approx([20 / 30, 10 / 20, 1.0, 1.0])
    assert py["cumulative_acceptance"] == approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])

    md = entry(report, "markdown")
    assert md["coverage"] == approx(20 / 40)
    assert md["acceptance_rate"] == approx(10 / 40)
    assert md["mean_acceptance_length"] == approx(1.5)
    assert md["conditional_acceptance"] == approx([0.5, 0.0])
    assert md["cumulative_acceptance"] == approx([0.5, 0.0])

    plain_only = entry(report, "plaintext")
    assert plain_only["coverage"] == 0.0
    assert plain_only["acceptance_rate"] is None and plain_only["mean_acceptance_length"] is None
    assert plain_only["conditional_acceptance"] == [] == plain_only["cumulative_acceptance"]


def test_chosen_k_is_the_tuners_choice_and_plain_decoding_is_k0_speedup_1(filled):
    """Over all scopes k and speedup_by_k are Tuner.estimate's (what `complete --k auto`
    picks); proposer none gets k 0 and speedup 1; the cost model is the measured one."""
    report = stats_report(filled)
    tuner = Tuner(filled, TARGET, CostModel.brief(), explore=0)
    for language in ("python", "markdown", "plaintext"):
        e, est = entry(report, language), tuner.estimate("suffix", language)
        assert e["chosen_k"] == est.k
        assert e["speedup_by_k"] == pytest.approx(est.speedups)
        assert len(e["speedup_by_k"]) == K_MAX + 1 and e["speedup_by_k"][0] == pytest.approx(1)
        assert e["expected_speedup"] == pytest.approx(max(est.speedups))
    assert entry(report, "python")["expected_speedup"] > 1.0
    plain = entry(report, "python", "none")
    assert (plain["chosen_k"], plain["expected_speedup"], plain["speedup_by_k"]) == (0, 1.0, [1.0])
    assert plain["steps"] == pytest.approx(7) and plain["coverage"] == 0.0
    cost = entry(report, "python")["cost_model"]
    assert cost["source"] == f"measured:{TARGET}"
    assert cost["points"] == pytest.approx({"1": 11.0, "3": 20.0, "5": 30.0})


def test_scope_filters_rows_and_shrinks_toward_the_global_prior(filled):
    """--scope B: only B's python row (10 rounds, none accepted); its k comes from
    estimate() over B's ledger with the prior of every suffix row, all scopes."""
    report = stats_report(filled, scope=SCOPE_B)
    assert report["scope"] == SCOPE_B and report["scopes"] == [SCOPE_B]
    assert [(e["language"], e["proposer"]) for e in report["entries"]] == [("python", "suffix")]
    (py,) = report["entries"]
    assert py["rounds"] == pytest.approx(10) and py["plain_steps"] == pytest.approx(5)
    assert py["acceptance_rate"] == 0.0 and py["coverage"] == pytest.approx(10 / 15)
    assert py["conditional_acceptance"] == [0.0, None, None, None]  # 2..4 never verified

    tuner = Tuner(filled, TARGET, CostModel.brief(), explore=0)
    total = Ledger()
    for row in filled.rows(target=TARGET, proposer="suffix"):
        total.add(row.ledger)
    own = Ledger()
    own.add(filled.rows(scope=SCOPE_B)[0].ledger)
    est = estimate(own, tuner.cost_model(), prior=estimate(total, tuner.cost_model()))
    assert py["chosen_k"] == est.k == 0  # nothing accepted here: speculation off
    assert py["speedup_by_k"] == pytest.approx(est.speedups)

    a = stats_report(filled, scope=SCOPE_A)
    assert entry(a, "python")["coverage"] == pytest.approx(20 / 25)
    assert entry(a, "python")["cumulative_acceptance"] == pytest.approx([1, .5, .5, .5])
    assert entry(a, "python")["chosen_k"] >= 1


def test_unknown_scope_names_the_scopes_with_data(filled):
    """stats_report for a scope without ledger rows raises an InputError that lists the scopes
    that have data."""
    with pytest.raises(InputError, match=r"no ledger rows for scope '/nowhere'.*'/src/a'"):
        stats_report(filled, scope="/nowhere")


def test_scope_given_as_a_relative_path_resolves(ledger_store, tmp_path, monkeypatch):
    """A scope given as a relative path resolves against the working directory to the stored
    absolute scope."""
    repo = tmp_path / "repo"
    repo.mkdir()
    ledger_store.add(str(repo), "python", "suffix", TARGET, ledger([(2, 2, 5)]))
    monkeypatch.chdir(tmp_path)
    report = stats_report(ledger_store, scope="repo")
    assert report["scope"] == str(repo) and len(report["entries"]) == 1


def test_plot_has_one_acceptance_curve_per_language_with_rounds(filled, tmp_path):
    """A_i panel: markdown and python (suffix) only; plaintext has no rounds and none has
    no drafts. Speedup panel: one curve per suffix language, a dot at each chosen k."""
    import matplotlib.image

    out = tmp_path / "stats.png"
    report = stats_report(filled)
    fig = plot_stats(report, out)
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    pixels = matplotlib.image.imread(out)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    ax_acc, ax_speed = fig.axes
    acc = {ln.get_label(): ln for ln in curves(ax_acc)}
    assert sorted(acc) == ["markdown", "python"]
    assert list(acc["python"].get_ydata()) == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert list(acc["markdown"].get_xdata()) == [1, 2]
    speed = {ln.get_label(): ln for ln in curves(ax_speed)}
    assert sorted(speed) == ["markdown", "plaintext", "python"]
    assert list(speed["python"].get_xdata()) == list(range(K_MAX + 1))
    marks = [tuple(c.get_offsets()[0]) for c in ax_speed.collections]
    py = entry(report, "python")
    assert len(marks) == 3 and (py["chosen_k"], pytest.approx(py["expected_speedup"])) in marks


def test_plot_labels_language_and_proposer_when_several_proposers(filled, tmp_path):
    """With several proposers the plot labels each curve 'language · proposer'."""
    filled.add(SCOPE_A, "python", "ngram", TARGET, ledger([(3, 2, 6)], plain=2))
    fig = plot_stats(stats_report(filled), tmp_path / "two.png")
    labels = sorted(ln.get_label() for ln in curves(fig.axes[0]))
    assert labels == ["markdown · suffix", "python · ngram", "python · suffix"]


def test_plot_into_a_missing_folder_is_an_input_error(filled, tmp_path):
    """Plotting into a folder that does not exist raises InputError ('does not exist') and
    creates no folder."""
    with pytest.raises(InputError, match="does not exist"):
        plot_stats(stats_report(filled), tmp_path / "no" / "such" / "dir" / "out.png")
    assert not (tmp_path / "no").exists()


def test_print_stats_shows_both_tables_with_units(filled):
    """print_stats shows both tables with units in the headers (coverage (R/S), speedup (×
    plain), ...), python's coverage over both scopes (0.75) and the Target name unmangled by
    emoji codes."""
    from rich.console import Console

    console = Console(width=200, record=True, emoji=False, markup=False)
    print_stats(stats_report(filled), console=console)
    text = console.export_text()
    for header in ("coverage (R/S)", "accept (C/D)", "mean len (tok/round)", "k (tok)",
                   "speedup (× plain)", "per-position acceptance", "python · suffix"):
        assert header in text
    assert "0.75" in text  # python's coverage over both scopes
    assert TARGET in text  # not mangled into emoji


def test_cli_json_is_one_object_with_the_report(filled, tmp_path):
    """`assistd stats --db FILE --json` as a subprocess: one JSON object on stdout."""
    r = assistd("stats", "--db", filled.store.path, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["entries"]) == 4
    assert entry(out, "python")["coverage"] == pytest.approx(0.75)
    r = assistd("stats", "--db", filled.store.path, "--json", "--scope", SCOPE_B)
    assert [e["language"] for e in json.loads(r.stdout)["entries"]] == ["python"]


def test_cli_table_and_plot(filled, tmp_path):
    """`assistd stats --plot FILE` prints the all-scopes table, says it wrote the file, and the
    file is a PNG."""
    out = tmp_path / "tuner.png"
    r = assistd("stats", "--db", filled.store.path, "--plot", out)
    assert r.returncode == 0, r.stderr
    assert "tuner ledger: all scopes" in r.stdout and "markdown" in r.stdout
    assert f"wrote {out}" in r.stderr
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_cli_bad_plot_path_is_one_line_error(filled, tmp_path):
    """`assistd stats --plot` into a missing folder exits 2 with a one-line 'error: cannot write
    the plot ... does not exist', no traceback."""
    r = assistd("stats", "--db", filled.store.path, "--plot", tmp_path / "missing" / "o.png")
    assert r.returncode == 2
    assert r.stderr.startswith("error: cannot write the plot") and "does not exist" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_cli_empty_store_says_so_and_exits_0(tmp_path):
    """`assistd stats` on a history without ledger rows exits 0 saying no ledger yet and to run
    assistd complete; --json gives no entries."""
    db = tmp_path / "empty.db"
    HistoryStore(db).close()  # made by `index`, an editor or the daemon
    r = assistd("stats", "--db", db)
    assert r.returncode == 0, r.stderr
    assert "no ledger yet" in r.stdout and "assistd complete" in r.stdout
    r = assistd("stats", "--db", db, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["entries"] == []


def test_cli_unknown_scope_is_one_line_error(filled):
    """`assistd stats --scope` for a scope without data exits 2 with one line naming the scopes
    with data."""
    r = assistd("stats", "--db", filled.store.path, "--scope", "/nowhere")
    assert r.returncode == 2 and "scopes with data" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_user_acceptance_in_the_table_and_the_json(filled):
    """What editors reported: a 30-character suggestion accepted whole, one partly (12
    of 20 characters, then 8 more: the larger count is kept), one dismissed, one never
    shown: rate (1 + 1) / 3 shown, mean accepted characters (30 + 20) / 2 = 25."""
    from rich.console import Console

    from assistd.runtime.stats import print_user_acceptance
    from storage.suggestions import Served, SuggestionStore

    events = SuggestionStore(filled.store)

    def served(sid, chars):
        return Served(sid, SCOPE_A, "a.py", "python", "suffix", TARGET, "x" * chars)

    events.event(served("whole", 30), "shown")
    events.event(served("whole", 30), "accepted")
    events.event(served("part", 40), "shown")
    events.event(served("part", 40), "partial", accepted_chars=12)
    events.event(served("part", 40), "partial", accepted_chars=20)
    events.event(served("gone", 10), "shown")
    events.event(served("gone", 10), "dismissed")
    events.event(served("unseen", 10), "dismissed")  # dismissed without shown: counts shown
    summary = events.summary()["python"]
    assert (summary["shown"], summary["accepted"], summary["partial"], summary["dismissed"]) \
        == (4, 1, 1, 2)
    assert summary["acceptance_rate"] == pytest.approx(2 / 4)
    assert summary["mean_accepted_chars"] == pytest.approx(25.0)
    console = Console(width=200, record=True, emoji=False, markup=False)
    print_user_acceptance(events.summary(), console=console)
    text = console.export_text()
    assert "partly accepted" in text and "25.0" in text and "0.50" in text
    r = assistd("stats", "--db", filled.store.path, "--json")
    assert json.loads(r.stdout)["user_acceptance"]["python"]["mean_accepted_chars"] == 25.0
    r = assistd("stats", "--db", filled.store.path)
    assert "editor suggestions" in r.stdout and "25.0" in r.stdout
