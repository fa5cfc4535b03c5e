"""kill -9 of `assistd index --transcripts ...` at random points, 20 times in a row.

After every kill the SQLite file passes ``PRAGMA integrity_check`` and every stored
record has its tokenization; each restart resumes where the killed run committed,
and the final run leaves exactly the records of an uninterrupted run: none
duplicated, none missing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

from tests.conftest import make_repo

TRIALS = 20


def _write_transcripts(root):
    """20 generic {role, content} JSONL sessions (~60 kB each) and one ~1.2 MB session."""
    rng = random.Random(7)
    words = ["def", "return", "self", "value", "index", "token", "class", "import", "for",
             "in", "range", "print", "list", "dict", "None", "True", "history", "draft"]
    files = []
    for n, records in [(i, 60) for i in range(20)] + [(99, 1200)]:
        p = root / f"session-{n:02d}.jsonl"
        with open(p, "w") as f:
            for i in range(records):
                f.write(json.dumps({"role": "user", "content": f"question {i}"}) + "\n")
                body = " ".join(rng.choice(words) for _ in range(150))
                f.write(json.dumps({"role": "assistant", "content": f"answer {n}.{i}: {body}"})
                        + "\n")
        files.append(p)
    return files


def _tables(c) -> set[str]:
    return {r[0] for r in c.execute("select name from sqlite_master where type = 'table'")}


def _records(db):
    with sqlite3.connect(db) as c:
        if not _tables(c):  # killed before the schema was committed
            return []
        return c.execute(
            "select scope, path, content_hash, text from documents order by path").fetchall()


def _check_consistent(db):
    with sqlite3.connect(db) as c:
        assert c.execute("pragma integrity_check").fetchone()[0] == "ok"
        tables = _tables(c)
        # A kill after the file was opened but before the schema's one transaction
        # committed leaves an empty database (never half a schema); a restart migrates it.
        if not tables:
            return
        assert {"_assistd_migrations", "documents", "tokenizations", "transcripts"} <= tables
        orphans = c.execute(
            "select count(*) from documents d left join tokenizations t on t.document_id = d.id"
            " where t.document_id is null or t.content_hash != d.content_hash").fetchone()[0]
        assert orphans == 0
        dup = c.execute("select count(*) - count(distinct path) from documents").fetchone()[0]
        assert dup == 0


def _wait_for_records(db, proc, target: int) -> None:
    """Poll (read-only, never creating the file) until ``target`` documents are stored or
    the process has exited."""
    while proc.poll() is None:
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1) as c:
                    if c.execute("select count(*) from documents").fetchone()[0] >= target:
                        return
            except sqlite3.OperationalError:
                pass  # schema not created yet, or briefly locked
        time.sleep(0.01)


def test_random_kills_never_corrupt_and_restart_completes(tmp_path):
    """20 trials, each on a fresh database: kill -9 at a random moment of the run (half by
    time, half by stored records), check the file, then let a restart finish and compare
    with an uninterrupted run."""
    tdir = tmp_path / "transcripts"
    tdir.mkdir()
    _write_transcripts(tdir)
    repo = make_repo(tmp_path / "repo", {f"m{i}.py": f"def f{i}():\n    return {i}\n" * 30
                                         for i in range(150)})
    cmd = [sys.executable, "-m", "assistd", "index", str(repo), "--transcripts", str(tdir)]

    ref_db = tmp_path / "reference.db"
    t0 = time.monotonic()
    ref = subprocess.run(cmd, env=dict(os.environ, ASSISTD_DB=str(ref_db)),
                         capture_output=True, text=True, timeout=900)
    run_s = time.monotonic() - t0
    assert ref.returncode == 0, ref.stderr
    reference = _records(ref_db)
    assert len(reference) > 2000

    rng = random.Random(2026)
    stored_at_kill = []
    for trial in range(TRIALS):
        db = tmp_path / f"killed-{trial}.db"
        env = dict(os.environ, ASSISTD_DB=str(db))
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        # Kill at a random point of the work: a random delay in the first trials, then a
        # random number of stored records. The latter keeps the kills spread over the run
        # when the machine is loaded and timing against the reference run says little.
        if trial % 2 == 0:
            time.sleep(rng.uniform(0.05, 1.0) * run_s)
        else:
            _wait_for_records(db, proc, int(rng.uniform(0.05, 0.95) * len(reference)))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if db.exists():
            _check_consistent(db)
            stored_at_kill.append(len(_records(db)))
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr
        _check_consistent(db)
        assert _records(db) == reference, f"trial {trial}: records differ after restart"
        for side in db.parent.glob(f"{db.name}*"):
            side.unlink()
    # The kills landed at many different points of the work, not all before or after it.
    partial = [n for n in stored_at_kill if 0 < n < len(reference)]
    assert len(set(partial)) >= 4, stored_at_kill
