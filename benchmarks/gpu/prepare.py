"""Make the GPU run's inputs here, on the CPU, and check that every run fits 64 MiB.

    .venv/bin/python benchmarks/gpu/prepare.py            # all of it
    .venv/bin/python benchmarks/gpu/prepare.py check --carry PATH ...   # the budget only

1. ``inputs/acceptance.json`` (small, committed): ``assistd replay --json`` per workload
   (``agents``: the shared agent transcripts but aider's 1.9 MB file; ``git``: this
   repository's last commits), each under two guide cost models (the proposers that use
   t(n), ``suffix``, choose their draft lengths by it): ``reference``, the reference CPU,
   and ``gpu``, a GPU-shaped curve (``inputs/gpu_guide.json``: a flat stand-in until
   ``--guide-from LEDGER`` takes a measured one). Only the counters the modeled speedup
   needs are kept.
2. ``payload/wheels/``: the packages the GPU machine lacks (it has torch, transformers,
   accelerate, safetensors, tokenizers, numpy; offline): wheels for CPython 3.12 on
   x86_64 and aarch64, the versions installed here.
3. ``payload/partN/``: SmolLM2-135M's GGUF (98 MB, does not fit one run) cut into as
   many parts as runs need, one per run; ``inputs/weights.json`` their manifest.
4. The budget of each run, working tree plus what it carries, against 64 MiB; exit 2
   when one is over.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]
import payload  # noqa: E402

PAYLOAD = HERE / "payload"
INPUTS = HERE / "inputs"
WHEELS = ("pydivsufsort", "gguf", "platformdirs")  # what the Target, engine and suffix import
PLATFORMS = {"x86_64": ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64"],
             "aarch64": ["manylinux_2_17_aarch64", "manylinux2014_aarch64", "manylinux_2_28_aarch64"]}
AGENT_FORMATS = ("claude-code", "codex", "gemini-cli", "mini-swe-agent", "openhands", "swe-agent")
# A GPU-shaped stand-in (ms; only the shape matters to a proposer): t(64) = 1.5 t(1).
GPU_GUIDE = {"source": "stand-in: flat GPU-shaped curve, not a measurement",
             "points": {"1": 10.0, "2": 10.1, "4": 10.3, "8": 10.6, "16": 11.2, "32": 12.5, "64": 15.0}}
KEEP = ("draft_tokens", "accepted_tokens", "rounds", "plain_steps", "committed_tokens",
        "acceptance_rate", "mean_acceptance_length", "coverage", "tokens_per_call",
        "rounds_by_draft_len", "modeled_speedup_physical")
MARGIN = 2**20  # per run: room for the tree to grow a little between prepare and run


def replay(args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "assistd", "replay", *args, "--k", "16", "--json"]
    print("  $", " ".join(cmd[1:]), flush=True)
    return json.loads(subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout)


def acceptance(transcripts: Path, git_commits: int, guide_from: Path | None) -> None:
    guide = GPU_GUIDE
    if guide_from is not None:
        guide = measured_guide(json.loads(guide_from.read_text()))
    guide_path = INPUTS / "gpu_guide.json"
    guide_path.write_text(json.dumps(guide, indent=1) + "\n")
    workloads = {
        "agents": [str(transcripts / f) for f in AGENT_FORMATS if (transcripts / f).is_dir()],
        "git": ["--git", ".", "--git-commits", str(git_commits)],
    }
    out = {"k": 16, "gpu_guide": guide, "workloads": {}}
    for name, inputs in workloads.items():
        if not inputs:
            print(f"  {name}: no inputs (no {transcripts}); left out")
            continue
        guides = {}
        for guide_name, spec in (("reference", "reference"), ("gpu", str(guide_path.relative_to(REPO)))):
            # Chains and token trees of each tree-capable proposer, in one pass.
            report = replay([*inputs, "--cost-model", spec, "--tree", "both", "--nodes", "64"])
            guides[guide_name] = {"cost_model": report["cost_model"], "proposers": {
                p: {k: m[k] for k in KEEP} for p, m in report["proposers"].items()}}
            inp = report["inputs"]
        out["workloads"][name] = {
            "inputs": {k: inp[k] for k in ("sessions", "model_tokens", "tokens", "git_commits")},
            "guides": guides}
    (INPUTS / "acceptance.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"  wrote {INPUTS / 'acceptance.json'} ({payload.size_of(INPUTS / 'acceptance.json')} bytes)")


def measured_guide(ledger: dict, context: int = 1024) -> dict:
    """A guide cost model from a GPU ledger: SmolLM2's measured t(n) at ``context``."""
    sweeps = ledger["sweeps"]
    s = sweeps.get("smollm2-135m/real") or sweeps["smollm2-135m/random"]
    ctx = min(s["points"], key=lambda c: abs(int(c) - context))
    gpu = ledger["runs"][-1].get("gpu")
    return {"source": f"measured: {s['model']} {s['weights']} on {gpu}, ctx {ctx}",
            "points": s["points"][ctx]}


def wheels(dest: Path) -> None:
    if dest.is_dir():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    pins = [f"{name}=={metadata.version(name)}" for name in WHEELS]
    for arch, platforms in PLATFORMS.items():
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "--dest", str(dest), *pins]
        for p in platforms:
            cmd += ["--platform", p]
        print(f"  pip download {' '.join(pins)} ({arch})", flush=True)
        subprocess.run(cmd, check=True)
    for whl in sorted(dest.glob("*.whl")):
        print(f"    {whl.name} {whl.stat().st_size / 1024:.0f} KiB")


def runs_plan(tree: int, wheels_bytes: int, gguf_bytes: int) -> int:
    """Runs the weights need: each carries the wheels and one part."""
    room = payload.LIMIT - tree - wheels_bytes - MARGIN
    if room <= 0:
        raise payload.BudgetError(f"the working tree ({tree / payload.MIB:.1f} MiB) and the wheels "
                                  f"leave no room under {payload.LIMIT / payload.MIB:.0f} MiB")
    return math.ceil(gguf_bytes / room)


def check(carry_sets: list[list[Path]]) -> int:
    """Print each run's budget; 2 when one is over (the message says by how much)."""
    tree = sum(f.stat().st_size for f in payload.tree_files(REPO))
    print(f"working tree: {tree / payload.MIB:.2f} MiB ({len(payload.tree_files(REPO))} files)")
    status = 0
    for i, carry in enumerate(carry_sets, 1):
        carried = {str(p): payload.size_of(p) for p in carry}
        try:
            total = payload.check_budget(tree, carried)
            print(f"run {i}: {total / payload.MIB:.2f} MiB of {payload.LIMIT / payload.MIB:.0f} MiB: "
                  + ", ".join(f"{Path(p).name} {b / payload.MIB:.2f} MiB" for p, b in carried.items()))
        except payload.BudgetError as e:
            print(f"run {i}: REFUSED: {e}")
            status = 2
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="?", choices=["all", "check"], default="all")
    ap.add_argument("--carry", type=Path, nargs="*", default=[], help="check: the paths one run carries")
    ap.add_argument("--transcripts", type=Path,
                    default=REPO.parent / "shared" / "fixtures" / "transcripts")
    ap.add_argument("--git-commits", type=int, default=10)
    ap.add_argument("--guide-from", type=Path,
                    help="a GPU ledger.json: its measured t(n) guides the replay")
    ap.add_argument("--skip-replay", action="store_true", help="keep inputs/acceptance.json as it is")
    args = ap.parse_args(argv)
    if args.what == "check":
        return check([args.carry])

    print("1. acceptance (assistd replay)")
    if not args.skip_replay:
        acceptance(args.transcripts, args.git_commits, args.guide_from)
    print("2. wheels")
    wheels(PAYLOAD / "wheels")
    print("3. weights")
    from assistd.targets.open import default_model_path

    gguf = Path(default_model_path())
    tree = sum(f.stat().st_size for f in payload.tree_files(REPO))
    n = runs_plan(tree, payload.size_of(PAYLOAD / "wheels"), gguf.stat().st_size)
    for old in PAYLOAD.glob("part*"):
        shutil.rmtree(old)
    manifest = payload.split(gguf, [PAYLOAD / f"part{i}" for i in range(1, n + 1)])
    (INPUTS / "weights.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"  {gguf.name} ({gguf.stat().st_size / payload.MIB:.1f} MiB) in {n} parts: {n} runs")
    print("4. budget")
    status = check([[PAYLOAD / "wheels", PAYLOAD / f"part{i}"] for i in range(1, n + 1)])
    if status == 0:
        print(DEVICE_STEPS.format(carries="\n".join(
            f"   run {i}: carry [benchmarks/gpu/payload/wheels, benchmarks/gpu/payload/part{i}]"
            + ("  command: " + (RUN_SHAPES if i == 1 else "true") if i < n else "  command: " + RUN_REST)
            for i in range(1, n + 1))))
    return status


RUN = ("ASSISTD_CACHE_DIR=benchmarks/gpu/payload/cache timeout -s INT {t} python3 benchmarks/gpu/run.py "
       "--device cuda --sizes full --out benchmarks/gpu/out --sections {s} --budget-s {b}; "
       "cp -r benchmarks/gpu/out/. \"$OUT\"/")
RUN_SHAPES = RUN.format(t=300, s="shapes", b=200)
RUN_REST = RUN.format(t=330, s="real,modeled", b=230)
DEVICE_STEPS = """
On the GPU machine (each run carries the wheels and one part; the parts stay there while
it is warm, and the last run puts the GGUF together):
{carries}
Each run leaves its ledger in benchmarks/gpu/out there and returns it; the last one's
ledger holds every section. Plot here: python benchmarks/gpu/run.py --plot-only DIR"""


if __name__ == "__main__":
    sys.exit(main())
