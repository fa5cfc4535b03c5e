"""`assistd bench` on the real embedded Target, tiny workloads of real text.

The short run's report is checked three ways: it is valid JSON / Markdown / PNG, its
numbers obey the ledger arithmetic (``check_ledger``, itself shown to catch a broken row),
and every greedy arm's output equals plain decoding's up to near-ties, with the gap seen.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from assistd.measure.bench import Arm, ArmTotals, Bench, arms_for, check_ledger, first_difference
from assistd.measure.bench_workloads import Case
from assistd.ground.costmodel import CostModel
from assistd.decoding.engine import generate
from assistd.measure.bench_workloads import edit_cursor, parse_spec
from assistd.ground.errors import InputError
from assistd.decoding.verify import NEAR_TIE_GAP

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e",
                    *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def edit_repo(tmp_path_factory) -> Path:
    """Two commits of this project's ledger module: the second renames a method in the
    middle, so the rest of the file is unchanged and in the history (the old version).
    The module as of one commit (tests/data/edit), not the live file: what the model
    writes after the cursor, and so whether a tree pays, follows the text."""
    repo = tmp_path_factory.mktemp("edit")
    _git(repo, "init", "-q")
    text = (ROOT / "tests" / "data" / "edit" / "ledger.py.txt").read_text()
    (repo / "ledger.py").write_text(text)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    assert text.count("def record_plain_step(") == 1
    (repo / "ledger.py").write_text(text.replace("def record_plain_step(", "def plain_step("))
    _git(repo, "commit", "-qam", "second")
    return repo


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    """A small 'library': this project's proposer modules."""
    lib = tmp_path_factory.mktemp("lib")
    for p in sorted((ROOT / "proposers").glob("*.py")):
        shutil.copy(p, lib / p.name)
    return lib


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, edit_repo, library):
    out = tmp_path_factory.mktemp("report")
    cmd = [sys.executable, "-m", "assistd", "bench",
           "--workload", f"edit={edit_repo}", "--workload", f"agent={ROOT / 'tests/data/replay'}",
           "--workload", f"stdlib={library}", "--workload", f"novel={ROOT / 'tests/data/transcripts'}",
           "--cases", "1", "--max-tokens", "24", "--repeats", "2", "--max-prompt-tokens", "400",
           "--report", str(out / "r"), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), out / "r", proc.stderr


def test_short_run_writes_valid_json_markdown_and_png(short_run):
    """A short `assistd bench --report` writes ledger.json (the printed report), ledger.md with
    a section per workload, and two PNG plots, and prints progress as lines ending at 72/72
    generations."""
    report, out, stderr = short_run
    assert sorted(p.name for p in out.iterdir()) == [
        "acceptance.png", "ledger.json", "ledger.md", "speedup.png"]
    assert json.loads((out / "ledger.json").read_text()) == report
    md = (out / "ledger.md").read_text()
    for w in ("agent", "edit", "stdlib", "novel"):
        assert f"### {w}" in md
    assert "assistd bench" in md and "llama-cpp-python PLD (library)" in md
    for png in ("speedup.png", "acceptance.png"):
        data = (out / png).read_bytes()
        assert data[:8] == PNG and len(data) > 5000
    assert "wrote" in stderr
    # Not a terminal: progress comes as lines, the last one at the end of the run.
    total = 4 * 9 * 2  # workloads x arms x repeats (1 case each)
    assert f"bench: {total}/{total} generations" in stderr


def test_short_run_has_every_arm_and_workload(short_run):
    """The short run has the four workloads, each with the nine arms in order (plain under fast
    numerics, llama and exact in companion processes, the proposers and peers); the edit
    workload's history drafts accepted tokens; the library peer's extra memory is n_ctx x
    n_vocab float32."""
    report, _, _ = short_run
    assert [w["name"] for w in report["workloads"]] == ["edit", "agent", "stdlib", "novel"]
    # The default numerics (fast) in this process; llama.cpp's defaults (the baseline)
    # and exact numerics each in a companion process of their own.
    expected = ["plain", "plain:llama", "plain:exact", "ngram", "suffix", "peer:suffixdecoding",
                "peer:llama-cpp-python-pld", "peer:transformers-pld",
                "llama-cpp-python PLD (library)"]
    assert report["settings"]["numerics"] == "fast" and report["baseline"] == "plain:llama"
    assert report["settings"]["companions"] == ["llama", "exact"]
    for w in report["workloads"]:
        assert w["cases"] == 1 and w["history_tokens"] > 0, w["name"]
        assert [a["arm"] for a in w["arms"]] == expected
        for a in w["arms"]:
            assert a["committed_tokens"] >= 2 * 1, (w["name"], a["arm"])  # 2 repeats
            assert len(a["speedup_per_repeat"]) == 2
    # The edit case's history is the file's old version: the history proposers draft
    # from it and the Target accepts some (how many depends on the cost model suffix
    # calibrated, which a busy machine changes: asserted over the three).
    edit = report["workloads"][0]
    from_history = [a for a in edit["arms"] if a["arm"] in ("ngram", "suffix", "peer:suffixdecoding")]
    assert sum(a["accepted_tokens"] for a in from_history) > 0
    # The library peer's extra memory is its logits_all buffer: n_ctx x n_vocab float32.
    lib = edit["arms"][-1]
    assert lib["extra_memory_bytes"] == report["target"]["n_ctx"] * 49152 * 4
    assert lib["acceptance_rate"] is None and lib["tokens_per_s"] > 0


def test_short_run_obeys_the_ledger_arithmetic(short_run):
    """Every arm of the short run obeys the ledger arithmetic; speedups are against the
    plain:llama baseline's tokens/s; a drafting arm has a ceiling, a plain arm none; each
    workload reports t(1), t(2), t(8)."""
    report, _, _ = short_run
    assert check_ledger(report) == []
    for w in report["workloads"]:
        arms = {a["arm"]: a for a in w["arms"]}
        assert w["baseline"] == "plain:llama"
        base = arms["plain:llama"]
        assert base["speedup"] == pytest.approx(1.0) and base["draft_tokens"] == 0
        assert base["numerics"] == "llama" and arms["plain"]["numerics"] is None
        assert arms["plain"]["speedup_vs_plain"] == pytest.approx(1.0)
        for a in w["arms"]:  # every speedup is against the baseline's tokens/s
            if a["tokens_per_s"]:
                assert a["speedup"] == pytest.approx(a["tokens_per_s"] / base["tokens_per_s"])
            if a["kind"] == "plain" or not a["rounds"]:
                assert a["ceiling"] is None, a["arm"]
            else:
                c = a["ceiling"]
                assert c["measured"] > 0 and c["full"] > 0 and c["k"] >= 1 and c["k_full"] >= 1
        assert set(w["t_ms"]) >= {"1", "2", "8"} and w["t_ms"]["1"] > 0


def test_check_ledger_catches_a_broken_row(short_run):
    """check_ledger reports an arm whose committed tokens break C + R + P or whose acceptance
    rate disagrees with its counters."""
    report = copy.deepcopy(short_run[0])
    arm = next(a for a in report["workloads"][0]["arms"] if a["arm"] == "ngram")
    arm["committed_tokens"] += 1
    arm["acceptance_rate"] = 0.123
    problems = check_ledger(report)
    assert any("C + R + P" in p for p in problems)
    assert any("acceptance rate" in p for p in problems)


def test_greedy_output_matches_plain_up_to_near_ties(short_run):
    """The bench's own output check as a test: a difference under the default (fast)
    numerics is reproduced by replaying the arm's own forwards (the batch-argmax
    promise), a near-tie is below the one frozen bound, a companion's plain is compared
    as other kernels, and with exact numerics (llama.cpp) nothing differs."""
    report, _, _ = short_run
    assert report["settings"]["near_tie_gap"] == NEAR_TIE_GAP
    for w in report["workloads"]:
        for a in w["arms"]:
            m = a["output_match"]
            if a["kind"] == "peer-library":  # llama-cpp-python's own loop: reported only
                print(w["name"], a["arm"], m)
                continue
            assert m["unexplained"] == 0, (w["name"], a["arm"], m["cases"])
            for c in m["cases"]:
                if c["status"] == "differs":
                    assert c["replay_argmax"] is True, (w["name"], a["arm"], c)
            assert m["exact"] + m["near_tie"] + m["differs"] + m["numerics"] == w["cases"]
            if a["numerics"] is None:
                assert m["numerics"] == 0
            for c in m["cases"]:
                if c["status"] == "near-tie":
                    assert c["gap"] is not None and c["gap"] < NEAR_TIE_GAP, c
            if report["target"]["backend"] == "llama" and report["settings"]["numerics"] == "exact":
                assert m["exact"] == w["cases"], (w["name"], a["arm"], m["cases"])


def test_workload_specs():
    """parse_spec reads a workload name, name=PATH, or a bare path (a folder of .py files is
    stdlib, of transcripts agent); an unknown name or a missing path is an InputError saying
    which."""
    assert parse_spec("agent") == ("agent", None)
    assert parse_spec(f"stdlib={ROOT / 'proposers'}") == ("stdlib", ROOT / "proposers")
    assert parse_spec(str(ROOT / "proposers")) == ("stdlib", ROOT / "proposers")
    assert parse_spec(str(ROOT / "tests/data/replay")) == ("agent", ROOT / "tests/data/replay")
    with pytest.raises(InputError, match="neither a workload"):
        parse_spec("nope")
    with pytest.raises(InputError, match="does not exist"):
        parse_spec("edit=/nonexistent/repo")


def test_edit_cursor_goes_after_the_first_change_followed_by_unchanged_lines():
    """edit_cursor puts the cursor after the first changed (or inserted) line that has unchanged
    lines after it; a change only at the end gives None."""
    old = "a\nb\nc\nd\ne\nf\n"
    new = "a\nB\nc\nd\ne\nf\n"
    assert edit_cursor(old, new) == len("a\nB\n")
    # A change at the very end has nothing unchanged after it.
    assert edit_cursor(old, "a\nb\nc\nd\ne\nF\n") is None
    # A pure insertion counts as a change too.
    assert edit_cursor(old, "a\nb\nNEW\nc\nd\ne\nf\n") == len("a\nb\nNEW\n")


def test_arms_and_their_errors():
    """arms_for builds plain first, then each proposer or peer with its k (10 for the PLD peers)
    and the library peer; an unknown proposer, or draft_model without --draft-model, is an
    InputError."""
    arms = arms_for(["suffix", "peer:llama-cpp-python-pld"], "auto",
                    library_peer="llama-cpp-python PLD (library)")
    assert [(a.name, a.kind, a.k) for a in arms] == [
        ("plain", "plain", 0), ("suffix", "proposer", "auto"),
        ("peer:llama-cpp-python-pld", "peer-rule", 10),
        ("llama-cpp-python PLD (library)", "peer-library", 10)]
    with pytest.raises(InputError, match="unknown proposer"):
        arms_for(["nope"], 8, library_peer=None)
    with pytest.raises(InputError, match="--draft-model"):
        arms_for(["draft_model"], 8, library_peer=None)
    assert first_difference([1, 2, 3], [1, 2]) == 2


@pytest.mark.parametrize("args, message", [
    (["--workload", "nope"], "neither a workload"),
    (["--workload", "stdlib", "--proposer", "nope"], "unknown proposer"),
    (["--workload", "stdlib", "--k", "0"], "0 is plain decoding"),
    (["--workload", "stdlib", "--k", "99"], "a number of tokens 1..64, not '99'"),
    (["--workload", "edit=/nonexistent"], "does not exist"),
])
def test_cli_refuses_bad_settings_with_one_line(args, message):
    """`assistd bench` with an unknown workload or proposer, k 0 or 99, or a missing repository
    exits 2 with one message and no traceback."""
    proc = subprocess.run([sys.executable, "-m", "assistd", "bench", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("sub", ["", "sub"])
def test_cli_refuses_an_unwritable_report_folder_before_the_run(tmp_path, sub):
    """--report at a file, or under one: refused before the model loads (a folder that
    failed after the run used to lose the whole run, its --json output included)."""
    f = tmp_path / "file"
    f.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "assistd", "bench", "--workload", "stdlib",
                           "--report", str(f / sub) if sub else str(f), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "cannot write there" in proc.stderr, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr


def test_binary_files_are_no_library_and_an_empty_repository_no_history(tmp_path, target):
    """A library folder of binary .py files is refused (no .py text file), a text file is taken;
    a repository without commits is refused as an edit workload."""
    from assistd.measure.bench_workloads import edit_workload, library_files

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "a.py").write_bytes(bytes(range(256)) * 80)  # NULs: binary
    with pytest.raises(InputError, match="no .py text file"):
        library_files(lib)
    (lib / "b.py").write_text("x = 1\n")
    assert library_files(lib)[1] == [lib / "b.py"]
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    with pytest.raises(InputError, match="has no commits yet"):
        edit_workload(target, repo, 1, 100)


def test_drift_is_warned_about(short_run):
    """drift_warnings warns when an arm drafted nothing yet sped up, t(1) is implausible,
    calibration fell back on a busy machine, the baseline's tokens/s drifted between repeats
    beyond DRIFT, t(2) < t(1), or plain ran off the baseline."""
    from assistd.measure.bench import drift_warnings

    report = copy.deepcopy(short_run[0])
    arm = next(a for a in report["workloads"][0]["arms"] if a["arm"] == "ngram")
    arm.update(rounds=0, speedup_vs_plain=2.0)
    report["cost_model"]["points"]["1"] = 900.0
    warnings = drift_warnings(report)
    assert any("drafted nothing" in w and "2.00x" in w for w in warnings)
    assert any("t(1) = 900 ms" in w for w in warnings)
    # A newcomer's run on a busy machine: suffix at 0.06x plain, the calibration said
    # "busy machine", and no warning was printed.
    report["cost_model"]["note"] = "busy machine (t(2) = 230.6 t(1)): reference curve scaled"
    assert any(w.startswith("calibration: busy machine") for w in drift_warnings(report))
    # The baseline itself sped up between repeats of the same prompts (seen: the VM's
    # plain decoding moved between 70 and 115 tokens/s within 18 minutes, unwarned).
    w = report["workloads"][0]
    base = next(a for a in w["arms"] if a["arm"] == w["baseline"])
    base["tokens_per_s_per_repeat"] = [100.0, 110.0]  # within DRIFT: no warning
    assert not any(m.startswith(f"{w['name']}: the baseline ran") for m in drift_warnings(report))
    base["tokens_per_s_per_repeat"] = [70.0, 104.0]
    assert any(m.startswith(f"{w['name']}: the baseline ran at 70 to 104 tokens/s")
               for m in drift_warnings(report))
    # A newcomer's drifted run: t(2) measured under t(1), and the ceiling built on it.
    w["t_ms"] = {"1": 60.6, "2": 33.8, "4": 40.0}
    assert any(m.startswith(f"{w['name']}: t(2) = 33.8 ms < t(1) = 60.6 ms") and "ceiling" in m
               for m in drift_warnings(report))
    # The main process's plain arm against the baseline (the same kernels for one token)
    plain = next(a for a in w["arms"] if a["arm"] == "plain")
    plain["speedup"] = 1.63
    assert any(m.startswith(f"{w['name']}: plain ran at 1.63x the baseline")
               for m in drift_warnings(report))


def test_torch_backend_runs_transformers_own_prompt_lookup(library):
    """On the torch backend the library peer is transformers' generate() with
    prompt_lookup_num_tokens=10 on the Target's own model object."""
    pytest.importorskip("torch", reason="the torch backend needs pip install 'assistd[torch]'")
    proc = subprocess.run(
        [sys.executable, "-m", "assistd", "bench", "--backend", "torch",
         "--workload", f"stdlib={library}", "--proposer", "suffix", "--cases", "1",
         "--max-tokens", "12", "--repeats", "1", "--max-prompt-tokens", "300", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (w,) = report["workloads"]
    assert [a["arm"] for a in w["arms"]] == [
        "plain", "suffix", "transformers prompt lookup (library)"]
    assert report["target"]["backend"] == "torch"
    assert check_ledger(report) == []
    for a in w["arms"]:
        assert a["committed_tokens"] >= 1 and a["tokens_per_s"] > 0
        if a["kind"] == "peer-library":
            # transformers' own loop, not ours: its match is reported, not asserted (it
            # has differed from greedy at a top-2 gap of 0.22 here).
            print("transformers prompt lookup:", a["output_match"])
        else:
            assert a["output_match"]["differs"] == 0, (a["arm"], a["output_match"])


def test_a_wrong_token_is_reported_as_differs_and_a_copy_as_exact(target):
    """The output check can fail: an 'arm' whose token at the plain decoder's most certain
    position is replaced differs (wide gap, and the batched Target disagrees too)."""
    prompt = [target.bos_token_id] + target.tokenize("def add(a, b):\n    return")
    plain = generate(target, prompt, None, max_tokens=16, k=0, trace=True)
    j = max(range(len(plain.tokens)), key=lambda i: plain.top2_gaps[i])
    assert plain.top2_gaps[j] > 1.0
    wrong = list(plain.tokens)
    wrong[j] = (wrong[j] + 1) % target.n_vocab
    arms = [Arm("plain", "plain", None, 0), Arm("copy", "proposer", "x", 8),
            Arm("wrong", "proposer", "x", 8)]
    bench = Bench(target, arms, max_tokens=16, repeats=1, cost=CostModel.brief())
    totals = {a.name: ArmTotals() for a in arms}
    case = Case("add", prompt, "python")
    bench._match(case, {"plain": plain.tokens, "copy": list(plain.tokens), "wrong": wrong}, totals)
    assert totals["copy"].matches[0]["status"] == "exact"
    (m,) = totals["wrong"].matches
    assert m["status"] == "differs" and m["first_diff"] == j
    assert m["gap"] == pytest.approx(plain.top2_gaps[j], abs=1e-3) and m["batch_argmax"] is False


def test_the_history_index_is_built_before_the_timed_runs():
    """Documents put in the history leave the index to build at the first lookup; the
    bench does that lookup untimed, before the arms."""
    import numpy as np

    from proposers import make_proposer
    from proposers.index import HistoryIndex

    index = HistoryIndex()
    index.put("bench:x", 1, np.arange(1, 400, dtype=np.int64) % 97, "doc")
    assert index._scopes["bench:x"].tail_dirty
    suffix = make_proposer("suffix", history=index)
    Bench._warm({"suffix": suffix}, Case("c", [5, 6, 7, 8], "python"), "bench:x")
    assert not index._scopes["bench:x"].tail_dirty


def test_novel_workload_names_the_source_it_used(target, tmp_path, monkeypatch):
    """With no transcripts to read, the requests are module docstrings and the source
    says so (it once said "transcripts' first user messages" for the fallback too)."""
    from assistd.measure.bench_workloads import novel_workload

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    w = novel_workload(target, None, 2, 256, library=ROOT / "proposers")
    assert w.source == f"module docstrings of the library {ROOT / 'proposers'}" and w.cases
    empty = tmp_path / "t.jsonl"
    empty.write_text('{"role": "user", "content": "hi"}\n')  # too short to be a request
    w = novel_workload(target, empty, 2, 256, library=ROOT / "proposers")
    assert w.source.startswith("module docstrings of the library")


def test_tree_arms():
    """--tree both: each proposer with a tree mode twice (chain arm first), at its own k;
    NAME+tree by name; a proposer without a tree mode is refused."""
    arms = arms_for(["suffix", "ngram", "peer:suffixdecoding"], "auto", library_peer=None,
                    tree="both")
    assert [(a.name, a.kind, a.proposer, a.k, a.tree) for a in arms] == [
        ("plain", "plain", None, 0, False), ("suffix", "proposer", "suffix", "auto", False),
        ("suffix+tree", "proposer", "suffix", "auto", True),
        ("ngram", "proposer", "ngram", "auto", False),
        ("peer:suffixdecoding", "peer-rule", "peer:suffixdecoding", 16, False),
        ("peer:suffixdecoding+tree", "peer-rule", "peer:suffixdecoding", 16, True)]
    assert [a.name for a in arms_for(["suffix+tree"], 8, library_peer=None)] == [
        "plain", "suffix+tree"]
    with pytest.raises(InputError, match="has no tree mode"):
        arms_for(["ngram+tree"], 8, library_peer=None)


@pytest.mark.exact_numerics
def test_tree_run_on_llama_opens_branch_ids_and_matches_plain(edit_repo):
    """A short `bench --tree both` on the edit workload: the Target is opened with
    branch ids (one batch a tree), the tree arms run tree rounds and count them, their
    output equals plain decoding's (exact numerics), and the ledger arithmetic holds. The run
    pins ``--numerics exact``."""
    # --numerics exact: output equal to plain decoding's is exact numerics' promise.
    cmd = [sys.executable, "-m", "assistd", "bench", "--numerics", "exact",
           "--workload", f"edit={edit_repo}",
           "--proposer", "suffix", "--proposer", "peer:suffixdecoding", "--tree", "both",
           "--nodes", "32", "--k", "8", "--cases", "1", "--max-tokens", "32", "--repeats", "1",
           "--max-prompt-tokens", "400", "--no-library-peer", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    s = report["settings"]
    assert (s["tree"], s["max_nodes"], s["tree_branches"]) == ("both", 32, 16)
    arms = {a["arm"]: a for a in report["workloads"][0]["arms"]}
    assert list(arms) == ["plain", "plain:llama", "suffix", "suffix+tree",
                          "peer:suffixdecoding", "peer:suffixdecoding+tree"]
    assert arms["suffix"]["tree_rounds"] == 0 and arms["peer:suffixdecoding"]["tree_rounds"] == 0
    assert arms["peer:suffixdecoding+tree"]["tree_rounds"] > 0, arms["peer:suffixdecoding+tree"]
    for a in arms.values():
        if a["numerics"] is None:  # plain:llama (the baseline) runs other kernels
            assert a["output_match"]["exact"] == 1, (a["arm"], a["output_match"])
        if a["rounds"]:
            assert a["nodes_per_round"] == pytest.approx(a["draft_tokens"] / a["rounds"])
    assert check_ledger(report) == []


def test_replaying_an_arms_forwards_reproduces_every_token_it_committed(tmp_path):
    """The batch-argmax promise, checked the way the bench checks it: a speculative run
    under the default (fast) numerics past the 512-cell cache view, where one-token
    steps round otherwise than batches, then each committed token is the Target's
    argmax when the run's own forwards are replayed shape for shape."""
    from assistd.targets.llama import LlamaTarget
    from assistd.targets.open import default_model_path
    from proposers import make_proposer
    from proposers.index import HistoryIndex

    target = LlamaTarget(default_model_path(), n_ctx=2048, numerics="fast")
    try:
        text = (ROOT / "assistd/decoding/engine.py").read_text()
        ids = target.tokenize(text)
        prompt = [target.bos_token_id] + ids[:700]  # a cache view past 512 cells
        index = HistoryIndex()
        index.put("s", 1, np.asarray(ids, dtype=np.int64), "engine.py")
        suffix = make_proposer("suffix", history=index)
        g = generate(target, prompt, suffix, max_tokens=40, k=8, scope="s")
        assert g.ledger.rounds >= 1 and g.ledger.plain_steps >= 1  # both shapes ran
        assert sum(kept for _, kept in g.shapes) == len(g.tokens)
        bench = Bench(target, [Arm("plain", "plain", None, 0)], max_tokens=40, repeats=1,
                      cost=CostModel.brief())
        replayed = [bench._replay_argmax(prompt, g.tokens, g.shapes, j)
                    for j in range(len(g.tokens))]
        assert replayed == g.tokens
        # and it can fail: a token that is not the Target's choice is not reproduced
        wrong = list(g.tokens)
        wrong[5] = (wrong[5] + 1) % target.n_vocab
        assert bench._replay_argmax(prompt, wrong, g.shapes, 5) != wrong[5]
    finally:
        target.close()


def test_the_ceiling_is_the_best_chain_over_the_baseline():
    """chain_ceiling by hand: A = (0.9, 0.72), t(n) = 10 + 4 (n - 1) ms, a baseline of
    12 ms a token: k = 2 commits 2.62 tokens in 18 ms (1.747x), k = 1 1.9 in 14
    (1.629x); at coverage 0.5 k = 2 gives 12 (0.5 * 2.62 + 0.5) / (0.5 * 18 + 0.5 * 10)."""
    from assistd.measure.bench import chain_ceiling, measured_t

    c = chain_ceiling([0.9, 0.72, None], lambda n: 10 + 4 * (n - 1), 12.0, 0.5)
    assert c["k_full"] == 2 and c["full"] == pytest.approx(12 * 2.62 / 18)
    assert c["k"] == 2 and c["measured"] == pytest.approx(12 * (0.5 * 2.62 + 0.5) / 14)
    assert chain_ceiling([None], lambda n: 10.0, 12.0, 1.0) is None
    # t(n) from ledgers: lengths with too few forwards fall back to the model's shape
    from assistd.ground.ledger import Ledger

    t = measured_t([Ledger(steps_by_len=[10, 1, 5], verify_ms_by_len=[100.0, 99.0, 150.0])],
                   lambda n: 5.0 * n)
    assert (t(1), t(3), t(2), t(5)) == (10.0, 30.0, 20.0, 40.0)


def test_a_companion_decodes_plainly_under_its_own_numerics():
    """The companion process answers the pipe protocol: llama.cpp's defaults run there
    (a mode this process, which already runs fast/exact Targets, could not host), and
    an error is an answer, not an exit."""
    from assistd.measure.bench_companion import Companion

    c = Companion(None, n_ctx=512, threads=None, numerics="llama")
    try:
        assert c.promise == "batch-argmax" and c.threads >= 1
        prompt = [1] + list(range(300, 340))
        c.prefill(prompt)
        out = c.run(prompt, 6)
        assert 1 <= out["committed"] == len(out["tokens"]) <= 6 and out["decode_ms"] > 0
        assert out["counters"]["plain_steps"] == out["committed"]
        with pytest.raises(RuntimeError, match="unknown op"):
            c.ask(op="nonsense")
        assert c.run(prompt, 2)["committed"] >= 1  # still serving
    finally:
        c.close()
    assert c.proc.returncode == 0


def test_a_tuned_arm_drafts_priced_by_the_t_n_its_loop_measured(target):
    """As Runtime.plan does for a completion, each generation of a tuned arm gets a
    proposer priced by the tuner's cost model, which learns t(n) from the loop's own
    forwards; the startup calibration (here the reference curve) only seeds it."""
    from assistd.decoding.tuner import Tuner, target_key
    from assistd.runtime.runtime import Runtime
    from proposers.index import HistoryIndex
    from harness.texts import COPY_HEAVY

    seed = CostModel.brief()
    tuner = Tuner(None, target_key(target), seed)
    tuner.seed_costs(seed)
    rt = Runtime(target, None, tuner=tuner, index=HistoryIndex())
    arm = Arm("suffix", "proposer", "suffix", "auto")
    bench = Bench(target, [Arm("plain", "plain", None, 0), arm], max_tokens=24, repeats=1,
                  cost=seed)
    priced = []
    build = bench._proposer
    bench._proposer = lambda a, index, cost: priced.append(cost) or build(a, index, cost)
    case = Case("copy", [target.bos_token_id] + target.tokenize(COPY_HEAVY), "python")
    learned = []  # the tuner's model after each generation
    for _ in range(2):
        bench._run(arm, case, build(arm, rt.index, seed), rt, "bench:x")
        learned.append(tuner.cost_model())
    assert len(priced) == 2
    # The first generation had nothing measured yet and got the seed; the second, what
    # the first one's forwards taught the tuner: a level at the context they ran at
    # (the prompt's and on). Compared as models, not as t(1) values: t is
    # non-decreasing in the context, so on a machine faster than the reference CPU
    # the learned level is raised to the seed's (CI's: t(1) 10.0 ms, priced 11.0).
    assert (priced[0].points, priced[0].levels) == (seed.points, {})
    assert priced[1] == learned[0] and learned[0].source.startswith("measured:")
    assert min(learned[0].levels) >= len(case.prompt)
    assert learned[1] != learned[0]  # and the second one's forwards count too
