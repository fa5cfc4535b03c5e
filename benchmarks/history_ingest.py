"""History benchmarks: ingest throughput, save-to-visible latency, store size, idle CPU.

    .venv/bin/python benchmarks/history_ingest.py [--stdlib DIR] [--saves 100] [--idle-s 60]

1. Ingest: ``RepoIndexer.scan`` of the Python standard library of this machine (real
   code from outside this project) into a fresh SQLite file with the embedded
   Target's tokenizer, end to end (read, secret redaction, tokenization, SQLite).
   Prints MB/s and tokens/s, the time split, and the store's bytes per token.
   Goal: >= 2 MB/s on one core.
2. Save-to-visible: a watcher thread follows a repository; the main thread saves a
   file (editor-style: write temp + rename) ``--saves`` times, and a separate SQLite
   connection (what a proposer reads through) polls until the new content is
   there. Prints p50/p95/max in ms. Goal: p95 <= 300 ms.
3. Idle CPU of ``assistd index --watch`` on the same repository over ``--idle-s``
   seconds, from /proc/PID/stat (utime + stime). Goal: < 1 %.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from assistd.targets.open import open_target  # noqa: E402
from storage import indexer as indexer_mod  # noqa: E402
from storage.indexer import RepoIndexer  # noqa: E402
from storage.store import HistoryStore  # noqa: E402
from storage.watcher import HistoryWatcher  # noqa: E402


class Timed:
    """Wraps a function and sums its wall time (s)."""

    def __init__(self, fn):
        self.fn, self.s = fn, 0.0

    def __call__(self, *a, **kw):
        t = time.perf_counter()
        try:
            return self.fn(*a, **kw)
        finally:
            self.s += time.perf_counter() - t


def ingest(stdlib: Path, workdir: Path, target) -> None:
    # The standard library proper: a copy without site-packages (third-party code that
    # some Python installs keep inside the stdlib folder), so machines compare.
    copy = workdir / "stdlib"
    shutil.copytree(stdlib, copy, symlinks=True,
                    ignore=shutil.ignore_patterns("site-packages", "dist-packages"))
    stdlib = copy
    db = workdir / "stdlib.db"
    store = HistoryStore(db)
    tok = Timed(target.tokenize)
    red = Timed(indexer_mod.redact)
    indexer_mod.redact = red
    try:
        ix = RepoIndexer(store, stdlib, tok, target.fingerprint)
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        report = ix.scan()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    finally:
        indexer_mod.redact = red.fn
    nbytes = store.db.execute("select sum(num_bytes) from documents").fetchone()[0]
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    size = db.stat().st_size
    mb = nbytes / 1e6
    print(f"## ingest: the Python standard library ({stdlib.name}, without site-packages)")
    print(f"{report.documents} documents, {mb:.1f} MB of text, {report.tokens} tokens;"
          f" skipped {report.skipped_binary} binary, {report.skipped_large} large;"
          f" {report.redactions} secrets redacted")
    print(f"wall {wall:.1f} s (cpu {cpu:.1f} s): {mb / wall:.2f} MB/s, "
          f"{report.tokens / wall:,.0f} tokens/s")
    other = wall - tok.s - red.s
    print(f"split: tokenize {tok.s:.1f} s ({100 * tok.s / wall:.0f}%), redact {red.s:.1f} s"
          f" ({100 * red.s / wall:.0f}%), read + hash + SQLite {other:.1f} s"
          f" ({100 * other / wall:.0f}%)")
    print(f"store: {size / 1e6:.1f} MB on disk = {size / report.tokens:.2f} bytes per"
          f" history token ({4:.0f} of them the token id, the rest text and indexes)")


def latency(workdir: Path, target, saves: int) -> None:
    root = workdir / "repo"
    (root / ".git").mkdir(parents=True)
    f = root / "edit.py"
    f.write_text("x = 0\n")
    db = workdir / "lat.db"
    store_ready = threading.Event()
    stop = threading.Event()

    def run_watcher():
        store = HistoryStore(db)  # the watcher thread owns its connection
        w = HistoryWatcher(store, target.tokenize, target.fingerprint, repos=[root])
        w.start()
        w.scan()
        store_ready.set()
        try:
            w.run(stop, poll_s=0.2)
        finally:
            w.stop()
            store.close()

    th = threading.Thread(target=run_watcher, daemon=True)
    th.start()
    store_ready.wait()
    reader = sqlite3.connect(db)
    lat = []
    body = Path(sysconfig.get_paths()["stdlib"], "json", "decoder.py").read_text()
    for i in range(saves):
        text = f"# save {i}\n" + body
        tmp = root / ".edit.py.tmp"
        t0 = time.perf_counter()
        tmp.write_text(text)
        os.replace(tmp, f)
        while True:
            row = reader.execute(
                "select text from documents where path = 'edit.py'").fetchone()
            if row and row[0].startswith(f"# save {i}\n"):
                break
            time.sleep(0.002)
        lat.append(1000 * (time.perf_counter() - t0))
        time.sleep(0.3)
    stop.set()
    th.join(5)
    a = np.array(lat)
    print(f"## save-to-visible over {saves} editor saves of a {len(body)/1e3:.0f} kB file")
    print(f"p50 {np.percentile(a, 50):.0f} ms, p95 {np.percentile(a, 95):.0f} ms,"
          f" max {a.max():.0f} ms")


def idle_cpu(workdir: Path, idle_s: float) -> None:
    root = workdir / "repo"
    env = dict(os.environ, ASSISTD_DB=str(workdir / "idle.db"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "assistd", "index", str(root), "--watch", "--no-agent-transcripts"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()  # "watching ..." once the initial scan is done
    assert "watching" in line, line

    def ticks():
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)

    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = time.monotonic(), ticks()
    time.sleep(idle_s)
    t1, c1 = time.monotonic(), ticks()
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(10)
    pct = 100 * (c1 - c0) / hz / (t1 - t0)
    print(f"## idle CPU of `assistd index --watch` over {t1 - t0:.0f} s: {pct:.2f} %"
          f" (exit code after Ctrl-C: {rc})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument("--saves", type=int, default=100)
    ap.add_argument("--idle-s", type=float, default=60)
    ap.add_argument("--skip", nargs="*", default=[], choices=["ingest", "latency", "idle"])
    args = ap.parse_args()
    target = open_target(None, n_ctx=512, n_threads=1)
    print(f"machine: {os.cpu_count()} CPUs; Target tokenizer: {target.model_path}")
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        if "ingest" not in args.skip:
            ingest(args.stdlib, work, target)
        if "latency" not in args.skip:
            latency(work, target, args.saves)
        if "idle" not in args.skip:
            idle_cpu(work, args.idle_s)


if __name__ == "__main__":
    main()
