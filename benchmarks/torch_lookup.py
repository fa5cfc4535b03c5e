"""Plain vs speculative decoding on the torch Target, against transformers' own prompt
lookup decoding on the same model object, in one run.

    .venv/bin/python benchmarks/torch_lookup.py [--max-tokens 128] [--repeats 3]

Every variant is greedy on the embedded SmolLM2-135M Q4_1 GGUF loaded by
:class:`TorchTarget` (dequantized, float32 on CPU) and the prompts of
``benchmarks/copy_heavy.py``. Our ngram proposer looks up the live context only
(no history), as transformers' prompt lookup does. Reported per variant: end-to-end
ms (prefill + decode, median over repeats), new tokens per end-to-end second, its
ratio to our plain decoding and to transformers' prompt lookup, our acceptance
statistics, and "vs plain": "=" when the tokens equal our plain greedy's, else "@i",
the first differing token (a batched-numerics near-tie, docs/design.md, 'Exactness').
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.decoding.engine import generate  # noqa: E402
from assistd.targets.open import default_model_path  # noqa: E402
from assistd.targets.hf import TorchTarget  # noqa: E402
from benchmarks.copy_heavy import divergence_label, prompts  # noqa: E402
from proposers import make_proposer  # noqa: E402

PEER = "transformers lookup(10, n=2)"


def run_ours(target, ids, proposer, k, max_tokens):
    g = generate(target, ids, proposer, max_tokens=max_tokens, k=k, reuse_prefix=False)  # prefill, as HF
    return g.ledger.total_ms, g.tokens, g.ledger


def run_hf(target, ids, max_tokens, **lookup):
    """transformers' ``generate`` on the Target's own model object, greedy, fresh KV cache."""
    import torch

    input_ids = torch.tensor([ids], device=target.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
            max_new_tokens=max_tokens, eos_token_id=sorted(target.eos_token_ids),
            pad_token_id=target.tokenizer.pad_token_id or 0, **lookup,
        )
    ms = (time.perf_counter() - t0) * 1000
    return ms, out[0, len(ids):].tolist(), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto", help="torch device [default: auto]")
    args = ap.parse_args()

    t0 = time.perf_counter()
    target = TorchTarget(default_model_path(), n_ctx=2048, device=args.device)
    load_s = time.perf_counter() - t0
    variants = {
        "plain": lambda ids, n: run_ours(target, ids, None, 0, n),
        "ngram k=8, cap 1/2 match (default)": lambda ids, n: run_ours(
            target, ids, make_proposer("ngram", history=None, alpha=0.5), 8, n),
        "ngram k=16, no cap": lambda ids, n: run_ours(
            target, ids, make_proposer("ngram", history=None), 16, n),
        "transformers plain": lambda ids, n: run_hf(target, ids, n),
        PEER: lambda ids, n: run_hf(target, ids, n, prompt_lookup_num_tokens=10,
                                    max_matching_ngram_size=2),
    }
    console = Console(width=150)
    console.print(f"torch Target: {target.device} {target.dtype}, {target.n_threads} threads, "
                  f"loaded in {load_s:.1f} s (cache: {target.cache_dir})")
    for name, text in prompts().items():
        ids = target.tokenizer(text, add_special_tokens=False).input_ids  # ChatML markers as tokens
        table = Table(title=f"{name}: {len(ids)} prompt tokens, up to {args.max_tokens} new tokens, "
                            f"median of {args.repeats}")
        for col in ("variant", "end-to-end ms", "new tokens", "tok/s", "x plain", "x tf lookup",
                    "acceptance", "mean acc. len", "coverage", "vs plain"):
            table.add_column(col, justify="right")
        # Warm up once, then interleave the variants in every repeat, so that drift
        # in the machine's speed (other load, frequency) hits all of them alike.
        for run in variants.values():
            run(ids, 4)
        results = {vname: [] for vname in variants}
        for _ in range(args.repeats):
            for vname, run in variants.items():
                results[vname].append(run(ids, args.max_tokens))
        ms = {vname: statistics.median(r[0] for r in runs) for vname, runs in results.items()}
        tps = {vname: len(results[vname][0][1]) / (ms[vname] / 1000) for vname in results}
        f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        for vname, runs in results.items():
            led = runs[0][2]
            stats = (led.acceptance_rate, led.mean_acceptance_length, led.coverage) if led else (None,) * 3
            table.add_row(
                vname, f"{ms[vname]:.0f}", str(len(runs[0][1])), f"{tps[vname]:.1f}",
                f"{tps[vname] / tps['plain']:.2f}", f"{tps[vname] / tps[PEER]:.2f}",
                *map(f, stats), divergence_label(results["plain"][0][1], runs[0][1]),
            )
        console.print(table)


if __name__ == "__main__":
    main()
