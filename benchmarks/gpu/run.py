"""The GPU benchmark of the torch Target, unattended, in one entry point.

    python benchmarks/gpu/run.py --device cuda --sizes full --out benchmarks/gpu/out
    python benchmarks/gpu/run.py --device cpu --sizes small --out /tmp/gpu-rehearsal

Sections, each with its share of ``--budget-s`` (a section past its share stops where it
is and is marked partial; the ledger is rewritten after every section, so a run killed
from outside still leaves the finished ones):

- ``shapes``: t(n, context) of the Target's verify forward on random weights of the
  published shapes in ``configs.py`` (SmolLM2-135M, Qwen2.5-Coder-1.5B and -7B);
- ``real``: the same sweep on SmolLM2-135M's real weights (the embedded GGUF, dequantized
  by transformers), greedy speculative vs plain token by token, and a χ² sampling check,
  in each dtype of ``--dtypes``;
- ``modeled``: the CPU replay's rounds (``inputs/acceptance.json``) priced with every
  measured t(n, context): modeled speedup per workload, proposer and model.

``DIR/ledger.json`` holds the results (merged with a ledger already there: sections not
run now are kept, so two runs on the GPU machine make one ledger) and
``DIR/t_ratio.png`` the plot of t(n)/t(1) per context, when matplotlib is importable
(else ``--plot-only DIR`` draws it from the ledger on another machine). See
``prepare.py`` for what the GPU machine needs beyond the working tree.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]
import payload  # noqa: E402  (stdlib only: safe before the wheels are on sys.path)

SECTIONS = {"shapes": 0.45, "real": 0.5, "modeled": 0.05}  # shares of the time budget
SIZES = {
    "full": dict(ns=[1, 2, 3, 4, 6, 8, 12, 16, 17, 24, 32, 48, 64], contexts=[256, 1024, 2048, 4096],
                 repeats=7, prompts=4, prompt_tokens=700, max_tokens=128, k=16, draws=60_000,
                 budget_s=420),
    "small": dict(ns=[1, 2, 4, 8, 17], contexts=[64, 256], repeats=3, prompts=2, prompt_tokens=256,
                  max_tokens=24, k=8, draws=60_000, budget_s=120),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu [cuda]")
    ap.add_argument("--sizes", choices=sorted(SIZES), default="full")
    ap.add_argument("--out", type=Path, default=HERE / "out", help="ledger and plot folder")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, of: "
                    + ", ".join(SECTIONS))
    ap.add_argument("--budget-s", type=float, help="whole run, seconds [full 420, small 120]")
    ap.add_argument("--models", help="comma-separated names of configs.PUBLISHED [all]")
    ap.add_argument("--dtypes", help="real weights' dtypes [cuda: bfloat16,float32; cpu: float32]")
    ap.add_argument("--gguf", type=Path, help="SmolLM2 GGUF [the embedded package's, else "
                    "assembled from the payload's parts]")
    ap.add_argument("--payload", type=Path, default=HERE / "payload",
                    help="wheels/ and weight parts from prepare.py [benchmarks/gpu/payload]")
    ap.add_argument("--acceptance", type=Path, default=HERE / "inputs" / "acceptance.json")
    ap.add_argument("--plot-only", type=Path, metavar="DIR", help="draw DIR/ledger.json's plot")
    args = ap.parse_args(argv)
    if args.plot_only:
        made = plot(json.loads((args.plot_only / "ledger.json").read_text()), args.plot_only)
        print(made)
        return 0 if made == "t_ratio.png" else 1

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as TorchTarget: see assistd/targets/hf.py
    unpacked = payload.unpack_wheels(args.payload / "wheels", args.payload / "site")
    size = SIZES[args.sizes]
    budget = args.budget_s or size["budget_s"]
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(wanted) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    ledger_path = args.out / "ledger.json"
    ledger = json.loads(ledger_path.read_text()) if ledger_path.is_file() else {"schema": 1}
    run_info = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sizes": args.sizes,
                "sections": wanted, "budget_s": budget, "wheels_unpacked": unpacked,
                **environment(args.device)}
    ledger.setdefault("runs", []).append(run_info)
    ledger.setdefault("sections", {})
    end = time.monotonic() + budget
    t_start = time.monotonic()
    for i, name in enumerate(wanted):
        rest = sum(SECTIONS[s] for s in wanted[i:])
        deadline = time.monotonic() + (end - time.monotonic()) * SECTIONS[name] / rest
        t0 = time.monotonic()
        try:
            status = SECTION_FUNCS[name](ledger, args, size, deadline)
        except Exception as e:  # unattended: record it and go on to the next section
            status = {"status": "error", "reason": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc()[-3000:]}
        status["seconds"] = round(time.monotonic() - t0, 1)
        ledger["sections"][name] = status
        print(f"[gpu bench] {name}: {status['status']} in {status['seconds']} s"
              + (f" ({status['reason']})" if status.get("reason") else ""), flush=True)
        write(ledger, ledger_path)
    run_info["seconds"] = round(time.monotonic() - t_start, 1)
    run_info["plot"] = plot(ledger, args.out)
    write(ledger, ledger_path)
    print(summary(ledger))
    failed = [s for s in wanted if ledger["sections"][s]["status"] == "error"]
    return 1 if failed else 0


def environment(device: str) -> dict:
    import torch
    import transformers

    env = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "cpu_count": os.cpu_count(),
           "machine": platform.machine()}
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   cuda=torch.version.cuda)
    return env


def write(ledger: dict, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ledger, indent=1) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------- sections


def section_shapes(ledger, args, size, deadline) -> dict:
    import torch

    import configs
    import timing

    names = args.models.split(",") if args.models else list(configs.PUBLISHED)
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    small = args.sizes == "small"
    sweeps = ledger.setdefault("sweeps", {})
    done, partial = [], False
    for i, name in enumerate(names):
        # Each model gets an equal share of what is left, so the 7B is not starved.
        share = (deadline - time.monotonic()) / (len(names) - i)
        if share <= 0:
            partial = True
            break
        t0 = time.perf_counter()
        model = configs.random_model(name, small, args.device, dtype)
        build_s = time.perf_counter() - t0
        target = timing.ModelTarget(model, device=args.device,
                                    n_ctx=max(size["contexts"]) + max(size["ns"]) + 1)
        result = timing.sweep(target, size["ns"], size["contexts"], size["repeats"],
                              time.monotonic() + share)
        sweeps[f"{name}/random"] = {
            "model": name, "weights": "random", "source": configs.PUBLISHED[name][2],
            "shrunk_for_cpu": small, "dtype": dtype, "build_s": round(build_s, 2),
            "shape": configs.shape_summary(model.config), **result}
        partial |= result["partial"]
        done.append(name)
        target.close()
        del model, target
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"status": "partial" if partial else "ok", "models": done}


def real_weights(args) -> tuple[Path | None, str]:
    """The SmolLM2 GGUF: ``--gguf``, else the embedded package's, else the payload's parts."""
    if args.gguf:
        return args.gguf, ""
    try:
        from assistd.targets.open import default_model_path

        path = Path(default_model_path())
        if path.is_file():
            return path, ""
    except Exception:  # noqa: BLE001 - the package is not installed here (the GPU machine)
        pass
    manifest = HERE / "inputs" / "weights.json"
    if not manifest.is_file():
        return None, f"no weights: pass --gguf, or run prepare.py to split them ({manifest})"
    return payload.assemble(json.loads(manifest.read_text()), args.payload, args.payload / "weights")


def section_real(ledger, args, size, deadline) -> dict:
    import configs
    import exactness
    import timing
    from assistd.targets.hf import TorchTarget

    gguf, why = real_weights(args)
    if gguf is None:
        return {"status": "skipped", "reason": why}
    dtypes = (args.dtypes.split(",") if args.dtypes else
              ["bfloat16", "float32"] if args.device.startswith("cuda") else ["float32"])
    out = ledger.setdefault("real", {})
    partial = False
    for i, dtype in enumerate(dtypes):
        share = (deadline - time.monotonic()) / (len(dtypes) - i)
        if share <= 0:
            partial = True
            break
        stop = time.monotonic() + share
        t0 = time.perf_counter()
        target = TorchTarget(gguf, device=args.device, dtype=dtype,  # room for the prompts too
                             n_ctx=max(2048, max(size["contexts"]) + max(size["ns"]) + 1))
        entry = {"gguf": gguf.name, "load_s": round(time.perf_counter() - t0, 2),
                 "shape": configs.shape_summary(target.model.config)}
        published = configs.shape_summary(configs.config_for("smollm2-135m", small=False))
        entry["shape_matches_published"] = all(
            entry["shape"][k] == v for k, v in published.items() if k != "model_type")
        try:
            if i == 0:  # the sweep on real weights once, in the dtype users get
                result = timing.sweep(target, size["ns"], size["contexts"], size["repeats"],
                                      time.monotonic() + share / 3)
                ledger.setdefault("sweeps", {})["smollm2-135m/real"] = {
                    "model": "smollm2-135m", "weights": "real", "source": gguf.name,
                    "dtype": dtype, "shape": entry["shape"], **result}
                partial |= result["partial"]
            entry["greedy"] = exactness.greedy(target, size["prompts"], size["prompt_tokens"],
                                               size["max_tokens"], size["k"], stop)
            partial |= entry["greedy"]["partial"]
            entry["sampling"] = exactness.sampling(target, size["draws"])
        finally:
            target.close()
        out[dtype] = entry
    return {"status": "partial" if partial else "ok", "dtypes": list(out)}


def section_modeled(ledger, args, size, deadline) -> dict:
    import modeled

    if not args.acceptance.is_file():
        return {"status": "skipped", "reason": f"no {args.acceptance}: run prepare.py"}
    sweeps = {k: v for k, v in ledger.get("sweeps", {}).items() if v["points"]}
    if not sweeps:
        return {"status": "skipped", "reason": "no t(n, context) measured yet"}
    acceptance = modeled.load(args.acceptance)
    ledger["modeled"] = {"k": acceptance.get("k"), "round_kinds": ["chain"],
                         "trees": "not measured yet (a later issue): timing.measure_round",
                         "rows": modeled.table(acceptance, sweeps)}
    return {"status": "ok", "rows": len(ledger["modeled"]["rows"])}


SECTION_FUNCS = {"shapes": section_shapes, "real": section_real, "modeled": section_modeled}


# ---------------------------------------------------------------- reporting


def summary(ledger: dict) -> str:
    lines = ["t(n)/t(1) at each context (ms of t(1) in brackets):"]
    for key, s in ledger.get("sweeps", {}).items():
        for ctx, pts in s["points"].items():
            t1 = pts.get(1, pts.get("1"))
            ratios = "  ".join(f"{n}:{ms / t1:.2f}" for n, ms in pts.items())
            lines.append(f"  {key:28s} ctx {int(ctx):5d} [{t1:7.2f} ms]  {ratios}")
    for dtype, e in ledger.get("real", {}).items():
        g, smp = e.get("greedy", {}), e.get("sampling", {})
        lines.append(f"exactness {dtype}: greedy {g.get('verdict')} over {len(g.get('rows', []))} "
                     f"runs; sampling {smp.get('verdict')} (p = {smp.get('pvalue', float('nan')):.3g})")
        for arm in sorted({r["arm"] for r in g.get("rows", [])}):
            mine = [r for r in g["rows"] if r["arm"] == arm]
            ratio = sum(r["plain_decode_ms"] for r in mine) / sum(r["arm_decode_ms"] for r in mine)
            lines.append(f"  {arm} decode speed / plain over {len(mine)} prompts: {ratio:.2f}x "
                         f"(accepted {sum(r['accepted_tokens'] for r in mine)} of "
                         f"{sum(r['draft_tokens'] for r in mine)} drafted)")
    rows = ledger.get("modeled", {}).get("rows", [])
    if rows:
        top = {}  # (workload, guide, proposer) -> {model: the row at its largest context}
        for r in rows:
            best = top.setdefault((r["workload"], r["guide"], r["proposer"]), {})
            if r["model"] not in best or r["context"] > best[r["model"]]["context"]:
                best[r["model"]] = r
        models = sorted({r["model"] for r in rows})
        lines.append("modeled speedup at each model's largest context (reference CPU last): "
                     + ", ".join(models))
        for (w, g, p), best in sorted(top.items()):
            cells = "  ".join(f"{best[m]['speedup']:5.2f}" if m in best else "  n/a" for m in models)
            ref = next(iter(best.values()))["speedup_reference_cpu"]
            lines.append(f"  {w:7s} {g:9s} {p:26s} {cells}   {ref:5.2f}")
    return "\n".join(lines)


def plot(ledger: dict, out: Path) -> str:
    """``out/t_ratio.png``: t(n)/t(1) against n, one panel per swept model, one line per
    context. Returns the file name, or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: python benchmarks/gpu/run.py --plot-only DIR elsewhere"
    sweeps = {k: s for k, s in ledger.get("sweeps", {}).items() if s["points"]}
    if not sweeps:
        return "nothing measured"
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4.2 * len(sweeps), 3.6), squeeze=False)
    for ax, (key, s) in zip(axes[0], sweeps.items()):
        for ctx, pts in s["points"].items():
            ns = sorted(int(n) for n in pts)
            t1 = pts.get(1, pts.get("1"))
            ax.plot(ns, [pts.get(n, pts.get(str(n))) / t1 for n in ns], marker=".",
                    label=f"ctx {ctx} (t(1) {t1:.1f} ms)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{key} ({s['dtype']})", fontsize=9)
        ax.set_xlabel("n tokens per forward")
        ax.set_ylabel("t(n) / t(1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    device = ledger.get("runs", [{}])[-1]
    where = device.get("gpu", device.get("device"))
    fig.suptitle(f"torch Target verify forward on {where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "t_ratio.png", dpi=110)
    plt.close(fig)
    return "t_ratio.png"


if __name__ == "__main__":
    sys.exit(main())
