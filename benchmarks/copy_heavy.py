"""Plain vs speculative decoding on copy-heavy prompts, against llama-cpp-python's own
prompt-lookup decoding (the in-stack peer), in one run.

    .venv/bin/python benchmarks/copy_heavy.py [--max-tokens 128] [--repeats 3]

Every variant is greedy on the same Target (the embedded SmolLM2-135M Q4_1) and the
same prompts. Reported: end-to-end ms (prefill + decode, median over repeats) and
our decode-only tokens/s, each with its ratio to plain decoding in the same run.
"vs plain" is "=" when the tokens equal plain greedy's, else "@i", the first
differing token (a batched-numerics near-tie, docs/design.md, 'Exactness'; the tests check the gap).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.decoding.engine import generate  # noqa: E402
from assistd.targets.open import default_model_path  # noqa: E402
from assistd.targets.llama import LlamaTarget  # noqa: E402
from assistd.ground.costmodel import CostModel  # noqa: E402
from assistd.ground.numerics import first_difference  # noqa: E402
from proposers.index import HistoryIndex  # noqa: E402
from proposers.ngram import NgramProposer  # noqa: E402
from proposers.suffix import SuffixProposer  # noqa: E402
from harness.texts import COPY_HEAVY  # noqa: E402


def chat(user: str, assistant: str) -> str:
    """SmolLM2-Instruct's ChatML template."""
    return (f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}")


def prompts() -> dict[str, str]:
    """Copy-heavy prompts (the Target's output mostly repeats text in its context) and one
    novel prompt (nothing to copy: speculation must cost next to nothing there)."""
    ledger = (ROOT / "assistd/ground/ledger.py").read_text()
    body = ledger[ledger.index("@dataclass"): ledger.index("    def record_plain_step")]
    walk = (ROOT / "storage/walk.py").read_text()
    base = (ROOT / "proposers/base.py").read_text()
    return {
        # An agent that just read a file and writes it back with one small change.
        "agent-rewrite": chat(
            "Here is storage/walk.py:\n```python\n" + walk + "```\nRename the variable `spec`"
            " to `gitignore_spec` and reply with the whole updated file.",
            "```python\n"),
        # A file re-typed below itself (an editor buffer holding two copies while editing).
        "retype-file": base + "\n\n# --- copy being edited ---\n" + base[: base.index("class Draft")],
        # Nothing to copy: prose.
        "novel-prose": chat("Write a short story about a lighthouse keeper who finds a"
                            " message in a bottle.", ""),
        # A file that repeats a block: the third copy is to be completed.
        "repeated-functions": COPY_HEAVY,
        # An agent asked to re-emit code it was shown (ChatML, as SmolLM2-Instruct expects).
        "re-emit-code": (
            "<|im_start|>user\nHere is a Python class:\n```python\n" + body
            + "```\nRepeat it exactly, with no changes.<|im_end|>\n"
            "<|im_start|>assistant\n```python\n"
        ),
    }


def divergence_label(a, b) -> str:
    """The table's "first diff" cell: "=" when equal, "prefix" when one stops early,
    else "@i" (the first differing token)."""
    i = first_difference(a, b)
    return "=" if i is None else "prefix" if i == min(len(a), len(b)) else f"@{i}"


def run_ours(target, ids, proposer, k, max_tokens):
    g = generate(target, ids, proposer, max_tokens=max_tokens, k=k)
    return g.ledger.total_ms, g.ledger.tokens_per_s, g.tokens, g.ledger


def run_peer(llm, text, max_tokens):
    # No reset: llama-cpp-python keeps the longest common prompt prefix in its KV
    # cache, as our Target does, so neither side re-prefills between repeats.
    t0 = time.perf_counter()
    out = llm.create_completion(text, max_tokens=max_tokens, temperature=0.0, top_k=1)
    ms = (time.perf_counter() - t0) * 1000
    return ms, out["usage"]["completion_tokens"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true", help="skip llama-cpp-python's prompt lookup")
    args = ap.parse_args()

    model = default_model_path()
    target = LlamaTarget(model, n_ctx=2048)
    # The history: this repository's Python files, as `assistd complete` would index them.
    docs = [(str(p.relative_to(ROOT)), np.array(target.tokenize(p.read_text())))
            for p in sorted(ROOT.glob("*/*.py"))]
    history = HistoryIndex()
    for i, (name, ids) in enumerate(docs):
        history.put("repo", i, ids, name)
    cost = CostModel.brief()
    variants = {"plain": (None, 0)}
    variants["suffix k=16, cost model (default)"] = (SuffixProposer(history, cost=cost), 16)
    variants["suffix k=16, no cost model, raw ratios"] = (
        SuffixProposer(history, match_prior={"context": 0, "history": 0}), 16)
    variants["ngram k=8, cap 1/2 match"] = (NgramProposer(history, alpha=0.5), 8)
    variants["ngram k=8, no cap"] = (NgramProposer(history), 8)
    peer = peer_plain = None
    if not args.no_peer:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        common = dict(model_path=str(model), n_ctx=2048, n_threads=target._llm.n_threads,
                      n_batch=512, verbose=False)
        peer_plain = llama_cpp.Llama(**common)
        peer = llama_cpp.Llama(**common, logits_all=True,
                               draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))

    console = Console(width=140)
    for name, text in prompts().items():
        ids = target._llm.tokenize(text.encode(), add_bos=False, special=True)
        table = Table(title=f"{name}: {len(ids)} prompt tokens, {args.max_tokens} new tokens, "
                            f"median of {args.repeats}")
        for col in ("variant", "end-to-end ms", "x plain", "decode tok/s", "x plain",
                    "acceptance", "mean acc. len", "coverage", "vs plain"):
            table.add_column(col, justify="right")
        # Warm up once, then interleave the variants in every repeat, so that drift
        # in the machine's speed (other load, frequency) hits all of them alike.
        run_ours(target, ids, None, 0, 16)
        if peer is not None:
            run_peer(peer_plain, text, 4)
            run_peer(peer, text, 4)
        results = {vname: [] for vname in variants}
        peer_runs = {"llama-cpp-python plain": [], "llama-cpp-python PromptLookup(10)": []}
        for _ in range(args.repeats):
            for vname, (prop, k) in variants.items():
                results[vname].append(run_ours(target, ids, prop, k, args.max_tokens))
            if peer is not None:
                peer_runs["llama-cpp-python plain"].append(run_peer(peer_plain, text, args.max_tokens))
                peer_runs["llama-cpp-python PromptLookup(10)"].append(run_peer(peer, text, args.max_tokens))
        base_ms = statistics.median(r[0] for r in results["plain"])
        base_tps = statistics.median(r[1] for r in results["plain"])
        base_tokens = results["plain"][0][2]
        for vname, runs in results.items():
            ms = statistics.median(r[0] for r in runs)
            tps = statistics.median(r[1] for r in runs)
            led = runs[0][3]
            f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
            table.add_row(vname, f"{ms:.0f}", f"{base_ms / ms:.2f}", f"{tps:.1f}",
                          f"{tps / base_tps:.2f}", f(led.acceptance_rate),
                          f(led.mean_acceptance_length), f(led.coverage),
                          divergence_label(base_tokens, runs[0][2]))
        if peer is not None:
            for pname, runs in peer_runs.items():
                ms = statistics.median(r[0] for r in runs)
                table.add_row(pname, f"{ms:.0f}", f"{base_ms / ms:.2f}", "-", "-", "-", "-",
                              "-", "-")
        console.print(table)


if __name__ == "__main__":
    main()
