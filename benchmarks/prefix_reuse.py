"""Time to first token with and without prefix KV reuse across requests.

    .venv/bin/python benchmarks/prefix_reuse.py [--prefix-tokens 2000] [--repeats 5]

An editor sends the same file prefix again and again while the user types. The
first request evaluates the whole prefix; each next request keeps the KV cache up
to the longest common prefix and evaluates only what changed. Measured on the
embedded Target (llama.cpp), greedy, 8 new tokens per request. Reported: median
time to first token (prefill + first decode step) for a cold request (cache
cleared), a repeat of the same prefix, and the prefix with a few characters typed
at the end; ratios are against the cold request in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.decoding.engine import generate  # noqa: E402
from assistd.targets.open import default_model_path  # noqa: E402
from assistd.targets.llama import LlamaTarget  # noqa: E402

STDLIB = Path(json.__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backend", choices=["llama", "torch"], default="llama")
    args = ap.parse_args()

    if args.backend == "torch":
        from assistd.targets.hf import TorchTarget

        target = TorchTarget(default_model_path(), n_ctx=4096, device="cpu")
    else:
        target = LlamaTarget(default_model_path(), n_ctx=4096)
    ids = target.tokenize((STDLIB / "textwrap.py").read_text())[: args.prefix_tokens]
    typed = ids + target.tokenize("\n\ndef shorten_all(texts, width):\n    return [")
    cases = {"cold (cache cleared)": [], "same prefix again": [], "prefix + typed text": []}
    reused = {}
    for _ in range(args.repeats):
        target.truncate(0)
        for name, prompt in zip(cases, (ids, ids, typed)):
            g = generate(target, prompt, None, max_tokens=8)
            cases[name].append(g.ledger.first_token_ms)
            reused[name] = (g.ledger.prompt_tokens_reused, g.ledger.prompt_tokens_evaluated)
    cold = statistics.median(cases["cold (cache cleared)"])
    table = Table(title=f"{args.backend}: time to first token, {len(ids)}-token file prefix, "
                        f"median of {args.repeats}")
    for col in ("request", "prompt tokens reused / evaluated", "first token ms", "x cold"):
        table.add_column(col, justify="right")
    for name, ms in cases.items():
        m = statistics.median(ms)
        r, e = reused[name]
        table.add_row(name, f"{r} / {e}", f"{m:.1f}", f"{m / cold:.3f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
