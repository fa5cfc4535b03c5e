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
    """40 generic {role, content} JSONL sessions (~60 kB each) and one ~2 MB session."""
    rng = random.Random(7)
    words = ["def", "return", "self", "value", "index", "token", "class", "import", "for",
             "in", "range", "print", "list", "dict", "None", "True", "history", "draft"]
    files = []
    for n, records in [(i, 60) for i in range(40)] + [(99, 2000)]:
        p = root / f"session-{n:02d}.jsonl"
        with open(p, "w") as f:
            for i in range(records):
                f.write(json.dumps({"role": "user", "content": f"question {i}"}) + "\n")
                body = " ".join(rng.choice(words) for _ in range(150))
                f.write(json.dumps({"role": "assistant", "content": f"answer {n}.{i}: {body}"})
                        + "\n")
        files.append(p)
    return files


def _records(db):
    with sqlite3.connect(db) as c:
        return c.execute(
            "select scope, path, content_hash, text from documents order by path").fetchall()


def _check_consistent(db):
    with sqlite3.connect(db) as c:
        assert c.execute("pragma integrity_check").fetchone()[0] == "ok"
        orphans = c.execute(
            "select count(*) from documents d left join tokenizations t on t.document_id = d.id"
            " where t.document_id is null or t.content_hash != d.content_hash").fetchone()[0]
        assert orphans == 0
        dup = c.execute("select count(*) - count(distinct path) from documents").fetchone()[0]
        assert dup == 0


def test_random_kills_never_corrupt_and_restart_completes(tmp_path):
    tdir = tmp_path / "transcripts"
    tdir.mkdir()
    _write_transcripts(tdir)
    repo = make_repo(tmp_path / "repo", {f"m{i}.py": f"def f{i}():\n    return {i}\n" * 30
                                         for i in range(300)})
    cmd = [sys.executable, "-m", "assistd", "index", str(repo), "--transcripts", str(tdir)]

    ref_db = tmp_path / "reference.db"
    ref = subprocess.run(cmd, env=dict(os.environ, ASSISTD_DB=str(ref_db)),
                         capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stderr
    reference = _records(ref_db)
    assert len(reference) > 4000

    db = tmp_path / "killed.db"
    env = dict(os.environ, ASSISTD_DB=str(db))
    rng = random.Random(2026)
    killed_with_progress = 0
    for trial in range(TRIALS):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 2.5))
        finished = proc.poll() is not None
        if not finished:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if db.exists():
            _check_consistent(db)
            killed_with_progress += not finished
        if finished:
            break
    assert killed_with_progress >= 5, "too few kills landed mid-run; make the workload bigger"

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    _check_consistent(db)
    assert _records(db) == reference
