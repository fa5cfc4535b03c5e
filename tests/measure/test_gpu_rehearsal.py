"""The GPU benchmark (benchmarks/gpu/) rehearsed on the CPU, so that it is known to run
before a GPU machine is lent: the entry point at small sizes on the real embedded
SmolLM2-135M, its ledger's structure and sanity, and prepare's 64 MiB budget check."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the torch backend needs torch: pip install 'assistd[torch]'")
pytest.importorskip("transformers", reason="the torch backend needs transformers: "
                    "pip install 'assistd[torch]'")

from assistd.ground.costmodel import CostModel  # noqa: E402
from assistd.measure.replay import modeled_speedup  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "benchmarks" / "gpu"


def load(name: str):
    """A module of benchmarks/gpu/ (scripts, not a package) without putting it on sys.path."""
    spec = importlib.util.spec_from_file_location(f"gpu_bench_{name}", GPU / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


modeled, payload = load("modeled"), load("payload")


@pytest.fixture(scope="module")
def ledger(tmp_path_factory, shared_cache_dir):
    """One CPU rehearsal: every section, small sizes, the embedded GGUF (~40 s of CPU on
    2 cores). The budget is generous: a loaded machine must not turn a section partial."""
    out = tmp_path_factory.mktemp("gpu-rehearsal")
    proc = subprocess.run([sys.executable, str(GPU / "run.py"), "--device", "cpu", "--sizes", "small",
                           "--out", str(out), "--budget-s", "1000"],
                          capture_output=True, text=True, timeout=400)
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "ledger.json").read_text()), out


def test_every_section_ran(ledger):
    """The CPU rehearsal of the GPU run has the shapes, real and modeled sections ok and wrote
    its t-ratio plot."""
    data, out = ledger
    assert {name: s["status"] for name, s in data["sections"].items()} == {
        "shapes": "ok", "real": "ok", "modeled": "ok"}
    run = data["runs"][-1]
    assert run["device"] == "cpu" and run["sizes"] == "small" and run["plot"] == "t_ratio.png"
    assert (out / "t_ratio.png").stat().st_size > 0


def test_a_section_past_its_budget_stops_and_leaves_a_partial_ledger(tmp_path):
    """A section past its time budget stops and leaves a ledger marking it partial, with only
    that section run."""
    proc = subprocess.run([sys.executable, str(GPU / "run.py"), "--device", "cpu", "--sizes", "small",
                           "--sections", "shapes", "--models", "smollm2-135m", "--budget-s", "0.001",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "ledger.json").read_text())
    assert data["sections"]["shapes"]["status"] == "partial"
    assert set(data["sections"]) == {"shapes"} and data["runs"][-1]["sections"] == ["shapes"]


def test_t_of_n_is_positive_and_finite_for_every_model_and_context(ledger):
    """Every model's t(n) sweep at contexts 64 and 256 has finite positive times for n 1..17,
    non-decreasing in n; SmolLM2's shapes match its published config."""
    data, _ = ledger
    sweeps = data["sweeps"]
    assert set(sweeps) == {"smollm2-135m/random", "qwen2.5-coder-1.5b/random",
                           "qwen2.5-coder-7b/random", "smollm2-135m/real"}
    for key, s in sweeps.items():
        assert set(s["points"]) == {"64", "256"}, key
        for ctx, points in s["points"].items():
            assert set(points) == {"1", "2", "4", "8", "17"}, (key, ctx)
            ms = [points[n] for n in ("1", "2", "4", "8", "17")]
            assert all(math.isfinite(t) and t > 0 for t in ms), (key, ctx, ms)
            assert ms == sorted(ms), "points are made non-decreasing in n (robust_points)"
    assert data["real"]["float32"]["shape_matches_published"], "configs.py's SmolLM2 numbers"


def test_exactness_is_equal_or_a_near_tie(ledger):
    """The rehearsal's greedy check is identical or near-ties only, with drafts verified and
    accepted; its sampling check matches p while a biased control is rejected."""
    data, _ = ledger
    real = data["real"]["float32"]
    greedy = real["greedy"]
    assert greedy["verdict"] in ("identical", "near-ties only")
    assert len(greedy["rows"]) == 4 and {r["arm"] for r in greedy["rows"]} == {"suffix", "ngram"}
    assert sum(r["rounds"] for r in greedy["rows"]) > 0, "drafts were verified, not only plain steps"
    assert sum(r["accepted_tokens"] for r in greedy["rows"]) > 0
    sampling = real["sampling"]
    assert sampling["verdict"] == "matches p", sampling
    assert sampling["biased_control_pvalue"] <= sampling["alpha"] < sampling["pvalue"]


def test_modeled_speedup_for_every_workload_and_proposer(ledger):
    """The modeled section has a finite positive speedup for every workload, guide, proposer and
    model, one per context."""
    data, _ = ledger
    acceptance = modeled.load()
    rows = data["modeled"]["rows"]
    for workload, w in acceptance["workloads"].items():
        for guide, g in w["guides"].items():
            for proposer in g["proposers"]:
                for model in data["sweeps"]:
                    got = [r for r in rows if (r["workload"], r["guide"], r["proposer"], r["model"])
                           == (workload, guide, proposer, model)]
                    assert len(got) == 2, (workload, guide, proposer, model)  # one per context
                    assert all(r["speedup"] > 0 and math.isfinite(r["speedup"]) for r in got)


def test_modeled_speedup_is_the_replays_physical_formula():
    """benchmarks/gpu/modeled.py re-states assistd replay's formula (the GPU machine lacks
    replay's packages): the same number on every committed workload."""
    cost = CostModel({1: 10.0, 2: 10.2, 8: 11.0, 32: 14.0}, source="test")
    n = 0
    for w in modeled.load()["workloads"].values():
        for g in w["guides"].values():
            for counts in g["proposers"].values():
                ref = modeled_speedup(counts["committed_tokens"], counts["rounds_by_draft_len"],
                                      counts["plain_steps"], cost.round_ms, cost.t_ms(1))
                assert modeled.speedup(counts, cost) == pytest.approx(ref, rel=1e-12)
                n += 1
    assert n >= 10


def test_budget_check_refuses_a_payload_over_64_mib(tmp_path):
    """prepare.py check refuses a 65 MiB carry (exit 2, exceeds 64 MiB) and accepts a small one;
    check_budget raises BudgetError over 64 MiB."""
    big = tmp_path / "weights.part1"
    with big.open("wb") as f:  # sparse: 65 MiB on paper, nothing on disk
        f.truncate(65 * 2**20)
    small = tmp_path / "wheel.whl"
    small.write_bytes(b"x" * 1000)
    prepare = [sys.executable, str(GPU / "prepare.py"), "check", "--carry"]
    over = subprocess.run([*prepare, str(big)], capture_output=True, text=True, timeout=60)
    assert over.returncode == 2 and "REFUSED" in over.stdout and "exceeds 64 MiB" in over.stdout
    fits = subprocess.run([*prepare, str(small)], capture_output=True, text=True, timeout=60)
    assert fits.returncode == 0 and "of 64 MiB" in fits.stdout, fits.stdout
    with pytest.raises(payload.BudgetError, match="exceeds 64 MiB"):
        payload.check_budget(60 * 2**20, {"part": 5 * 2**20})


def test_split_parts_assemble_to_the_same_file(tmp_path):
    """A file split into parts assembles back byte for byte; with a part missing, assembly fails
    naming it."""
    src = tmp_path / "model.gguf"
    src.write_bytes(bytes(range(256)) * 1001)
    manifest = payload.split(src, [tmp_path / "pay" / "part1", tmp_path / "pay" / "part2"])
    assert [p["bytes"] for p in manifest["parts"]] == [128_128, 128_128]
    dest, why = payload.assemble(manifest, tmp_path / "pay", tmp_path / "weights")
    assert why == "" and dest.read_bytes() == src.read_bytes()
    (tmp_path / "pay" / "part2" / "model.gguf.part2").unlink()
    (tmp_path / "weights" / "model.gguf").unlink()
    dest, why = payload.assemble(manifest, tmp_path / "pay", tmp_path / "weights")
    assert dest is None and "part2/model.gguf.part2" in why
