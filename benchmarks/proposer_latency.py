"""History index benchmarks: propose() latency, memory per token, build and load time.

    .venv/bin/python benchmarks/proposer_latency.py [--tokens 10000000] [--calls 5000]

History: the Python standard library of this machine and the transcripts in
../shared/fixtures/transcripts (when present), tokenized with the embedded Target's
tokenizer (cached in the temp dir), repeated until ``--tokens`` history tokens, and
written to a real SQLite history file as documents.

1. Load: ``HistoryIndex.load`` from that SQLite file (read blobs + build suffix
   arrays). Goal: <= 3 s per 10 M tokens.
2. Memory: the index's arrays (``nbytes``) and the process RSS growth, per history
   token. Goal: <= 16 bytes per token.
3. propose() latency of ``suffix`` (history + live context, the reference CPU's cost model)
   and ``ngram`` over ``--calls`` decode steps: walks of 32 steps (each committing 1-3
   of the file's next tokens) from random cursors in files of the history
   ("in-history": long matches) and in this project's own sources, which are not in
   it ("novel"), each with up to 1,024 tokens of context.
   Goal: p50 <= 0.2 ms, p99 <= 1 ms.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.ground.costmodel import CostModel  # noqa: E402
from assistd.targets.open import open_target  # noqa: E402
from proposers import make_proposer  # noqa: E402
from proposers.index import HistoryIndex  # noqa: E402
from storage.store import HistoryStore  # noqa: E402

FIXTURES = ROOT.parent / "shared" / "fixtures" / "transcripts"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def corpus(target) -> list[tuple[str, np.ndarray]]:
    """(name, token ids) of stdlib .py files and fixture transcripts, cached as .npz."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    if FIXTURES.is_dir():
        files += sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".json", ".md", ".traj"))
    key = hashlib.sha256((target.fingerprint + "".join(map(str, files))).encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"assistd-corpus-{key}.npz"
    if cache.exists():
        z = np.load(cache, allow_pickle=False)
        names = [str(n) for n in z["names"]]
        return list(zip(names, np.split(z["tokens"], z["offsets"][1:-1])))
    out = []
    t0 = time.perf_counter()
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append((str(p), np.array(target.tokenize(text), dtype=np.uint32)))
    print(f"tokenized {len(out)} files in {time.perf_counter() - t0:.0f} s (cached in {cache})")
    offsets = np.concatenate([[0], np.cumsum([len(t) for _, t in out])])
    np.savez(cache, names=np.array([n for n, _ in out]), tokens=np.concatenate([t for _, t in out]),
             offsets=offsets)
    return out


def build_store(path: Path, docs, want: int) -> int:
    store = HistoryStore(path)
    total, rep = 0, 0
    with store.transaction():
        while total < want:
            for name, ids in docs:
                if total >= want:
                    break
                store.put_document(
                    scope="/bench", path=f"{rep}/{name}", source_kind="repo", language_id="python",
                    content_hash=f"{rep}/{name}", num_bytes=len(ids), mtime_ns=0, text="",
                    decoded_with_replacement=False, fingerprint="fp", token_ids=ids)
                total += len(ids)
            rep += 1
    store.close()
    return total


def percentiles(ms: list[float]) -> str:
    a = np.array(ms)
    return f"p50 {np.percentile(a, 50):.3f} ms  p99 {np.percentile(a, 99):.3f} ms  max {a.max():.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--context", type=int, default=1024)
    args = ap.parse_args()
    target = open_target(None, n_ctx=256)
    docs = corpus(target)
    print(f"corpus: {len(docs)} files, {sum(len(t) for _, t in docs):,} tokens")
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "h.db"
        total = build_store(db, docs, args.tokens)
        print(f"history: {total:,} tokens in {db.stat().st_size / 1e6:.0f} MB of SQLite")
        store = HistoryStore(db)
        rss0 = rss_bytes()
        index = HistoryIndex()
        t0 = time.perf_counter()
        index.load(store, "/bench", "fp")
        load_s = time.perf_counter() - t0
        try:  # hand freed load-time buffers back to the OS before measuring what stays
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        rss1 = rss_bytes()
        store.close()
        n = index.tokens("/bench")
        print(f"load: {load_s:.2f} s for {n:,} tokens = {load_s * 1e7 / n:.2f} s per 10 M tokens"
              f" (goal <= 3)")
        print(f"memory: index arrays {index.nbytes / n:.2f} B/token, RSS growth"
              f" {(rss1 - rss0) / n:.2f} B/token (goal <= 16)")

        rng = random.Random(0)
        own = [p for p in sorted(ROOT.rglob("*.py")) if ".venv" not in p.parts]
        novel = [np.array(target.tokenize(p.read_text()), dtype=np.int64) for p in own]
        novel = [t for t in novel if len(t) > 64]
        known = [t.astype(np.int64) for _, t in docs if len(t) > 64]
        cost = CostModel.brief()
        proposers = {
            "suffix": make_proposer("suffix", history=index, cost=cost),
            "suffix (no cost model)": make_proposer("suffix", history=index),
            "ngram": make_proposer("ngram", history=index, alpha=0.5),
        }
        for kind, pool in (("in-history", known), ("novel", novel)):
            # Decode walks: from a random cursor, 32 steps that each commit 1-3 of the
            # file's next tokens (as rounds do), so consecutive calls share a prefix.
            contexts = []
            while len(contexts) < args.calls:
                t = rng.choice(pool)
                end = rng.randrange(16, len(t))
                start = max(0, end - args.context)  # the request's prompt, then it grows
                for _ in range(32):
                    if end > len(t) or len(contexts) >= args.calls:
                        break
                    contexts.append(t[start:end])
                    end += rng.randint(1, 3)
            for name, prop in proposers.items():
                ms, drafted = [], 0
                for ctx in contexts:
                    t0 = time.perf_counter()
                    d = prop.propose(ctx, 16, scope="/bench")
                    ms.append((time.perf_counter() - t0) * 1000)
                    drafted += d is not None
                print(f"propose {name:24s} {kind:10s}: {percentiles(ms)}  drafts {drafted}/{len(ms)}")


if __name__ == "__main__":
    main()
