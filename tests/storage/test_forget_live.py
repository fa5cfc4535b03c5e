"""`assistd history forget` beside a live history: another connection (the daemon's) holding
the database open, the transcript follower still tailing the forgotten file, an empty name.

Real SQLite files, real CLI subprocesses for the forget, the real watcher and ingester on
real transcript files, and one real ``assistd serve``. A tokenizer double (UTF-8 bytes as
ids) stands in for the model where the daemon is not running.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.indexer import index_repository
from storage.ingest import TranscriptIngester
from storage.retention import forget
from storage.store import HistoryStore
from storage.watcher import HistoryWatcher
from tests.conftest import make_repo
from tests.daemon_helpers import start_daemon, wait_for

ROOT = Path(__file__).resolve().parents[2]  # the checkout: what `python -c` imports
FP = "bytes-v1"
FORGET_ME = "FORGET_ME_MARKER_7f3a"
AFTER = "AFTER_FORGET_MARKER_51c2"
REWRITTEN = "REWRITTEN_MARKER_9d04"


def tok(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def assistd(*args, db: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m assistd ARGS --db DB`` in a process of its own, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "assistd", *map(str, args), "--db", str(db)],
                          capture_output=True, text=True, timeout=120, env=env)


def marker_counts(db: Path, marker: str) -> dict[str, int]:
    """Occurrences of ``marker`` in the raw bytes of the database file and of its WAL."""
    out = {}
    for side in ("", "-wal"):
        p = Path(f"{db}{side}")
        out[p.name] = p.read_bytes().count(marker.encode()) if p.exists() else 0
    return out


def claude_line(uuid: str, msg_id: str, text: str, cwd: Path) -> str:
    """One Claude Code JSONL line: an assistant text response recorded in ``cwd``."""
    return json.dumps({"type": "assistant", "uuid": uuid, "sessionId": "s1", "cwd": str(cwd),
                       "message": {"id": msg_id, "role": "assistant", "model": "m",
                                   "content": [{"type": "text", "text": text}]}}) + "\n"


def stored_texts(db: Path) -> list[str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        return [t for (t,) in c.execute("select text from documents")]


def tailed_to_end(store: HistoryStore, path: Path) -> bool:
    """Whether the follower has read ``path`` up to its current size."""
    row = store.transcript_state(str(path))
    return row is not None and row["offset"] == path.stat().st_size


def settle(w: HistoryWatcher, until, timeout: float = 10.0) -> None:
    """Process the watcher's batches until ``until()`` holds (then drain the rest)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        w.process_batch(timeout=0.2)
        if until():
            while w.process_batch(timeout=0.3) is not None:
                pass
            return
    raise AssertionError("the watcher did not reach the expected state in time")


# -- 1. forgotten text leaves both files while another process holds them -------------


# A process that holds the history the way the daemon does: one HistoryStore opened
# for good, the repository indexed through it; then one command a line from stdin.
HOLDER = """
import sys
from pathlib import Path

from storage.indexer import index_repository
from storage.store import HistoryStore

db, repo = sys.argv[1:]
tok = lambda text: list(text.encode("utf-8"))
store = HistoryStore(db)
index_repository(store, Path(repo), tok, "bytes-v1")
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "checkpoint":  # an automatic checkpoint's doing: copies in history.db too
        store.db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    elif cmd == "write":  # the daemon carries on: a read and a write of its own
        store.put_document(scope=repo, path="h.py", source_kind="repo", language_id="python",
                           content_hash="h", num_bytes=6, mtime_ns=0, text="h = 3\\n",
                           decoded_with_replacement=False, fingerprint="bytes-v1",
                           token_ids=tok("h = 3\\n"))
    print(" ".join(sorted(store.documents(repo))), flush=True)
"""


@pytest.mark.parametrize("checkpointed_before", [False, True], ids=["in-wal", "in-db"])
def test_forget_leaves_no_copy_in_db_or_wal_while_another_process_holds_them(
        tmp_path, checkpointed_before):
    """Another process holds the history open as the daemon does (its connection keeps
    SQLite's shared lock, so the forgetting process is never the last one out and its
    close neither checkpoints nor deletes the WAL). It indexed the repository: the pages
    with the marker are in the WAL (in-wal) or, after a checkpoint, in history.db as well
    (in-db). `history forget REPO/f.py` returns, and then the marker is in neither file
    (before the fix the WAL kept the old pages, and history.db its copy, until the daemon
    stopped); the holder goes on reading and writing, and a kept file's text is there."""
    repo = make_repo(tmp_path / "fgrepo", {"f.py": f"X = '{FORGET_ME}'\n" * 50,
                                          "g.py": "KEPT_TEXT = 2\n"}).resolve()
    db = tmp_path / "history.db"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(repo)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        if checkpointed_before:
            holder.stdin.write("checkpoint\n")
            holder.stdin.flush()
            assert holder.stdout.readline().split() == ["f.py", "g.py"]
            assert marker_counts(db, FORGET_ME)["history.db"] > 0
        assert sum(marker_counts(db, FORGET_ME).values()) > 0

        p = assistd("history", "forget", repo / "f.py", "--json", db=db)
        assert p.returncode == 0, p.stderr
        assert marker_counts(db, FORGET_ME) == {"history.db": 0, "history.db-wal": 0}
        out = json.loads(p.stdout)
        assert (out["documents"], out["checkpointed"]) == (1, True)

        holder.stdin.write("write\n")
        holder.stdin.flush()
        assert holder.stdout.readline().split() == ["g.py", "h.py"]
        assert marker_counts(db, FORGET_ME) == {"history.db": 0, "history.db-wal": 0}
        assert sum(marker_counts(db, "KEPT_TEXT").values()) > 0
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert holder.returncode == 0


def test_forget_reports_a_checkpoint_another_reader_blocks(tmp_path, monkeypatch):
    """A reader that keeps a read transaction open past the busy timeout stops the WAL
    from being cut: forget still deletes, and says ``checkpointed: False`` (the CLI then
    warns) instead of claiming the text is gone from the files."""
    repo = make_repo(tmp_path / "r", {"f.py": f"X = '{FORGET_ME}'\n"}).resolve()
    db = tmp_path / "history.db"
    writer = HistoryStore(db)
    index_repository(writer, repo, tok, FP)
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("select count(*) from documents").fetchone()  # holds its snapshot
    try:
        writer.db.execute("PRAGMA busy_timeout = 100")  # not 30 s in a test
        out = forget(writer, str(repo / "f.py"))
        assert (out["documents"], out["checkpointed"]) == (1, False)
    finally:
        reader.execute("COMMIT")
        reader.close()
    assert writer.checkpoint()  # the reader let go: now it completes
    assert marker_counts(db, FORGET_ME) == {"history.db": 0, "history.db-wal": 0}
    writer.close()


def test_the_cli_warns_when_a_reader_kept_the_wal(tmp_path, monkeypatch):
    """`history forget` whose checkpoint another reader blocked still forgets (exit 0) but
    warns on stderr, naming the file and `history vacuum`, and says so in its JSON. The
    reader is real; the busy timeout is cut to 0.1 s so the test does not wait 30 s."""
    from click.testing import CliRunner

    from assistd.cli import cli

    repo = make_repo(tmp_path / "r", {"f.py": f"X = '{FORGET_ME}'\n"}).resolve()
    db = tmp_path / "history.db"
    store = HistoryStore(db)
    index_repository(store, repo, tok, FP)
    store.close()
    real_checkpoint = HistoryStore.checkpoint

    def impatient(self):
        self.db.execute("PRAGMA busy_timeout = 100")
        return real_checkpoint(self)

    monkeypatch.setattr(HistoryStore, "checkpoint", impatient)
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("select count(*) from documents").fetchone()
    try:
        res = CliRunner().invoke(cli, ["history", "forget", str(repo / "f.py"), "--json",
                                       "--db", str(db)])
    finally:
        reader.execute("COMMIT")
        reader.close()
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["checkpointed"] is False
    assert "warning" in res.stderr and str(db) in res.stderr and "history vacuum" in res.stderr


# -- 2. a forgotten transcript stays forgotten while the agent appends ---------------------


@pytest.fixture
def followed(tmp_path):
    """(watcher, store, transcript, project): the real follower tailing a Claude Code
    session of 2 records in ``project``, scanned and watching."""
    proj = make_repo(tmp_path / "proj", {"a.py": "a = 1\n"}).resolve()
    tdir = tmp_path / "tx"
    tdir.mkdir()
    session = tdir / "claude.jsonl"
    session.write_text(claude_line("a1", "msg_1", f"first {FORGET_ME}", proj)
                       + claude_line("a2", "msg_2", "second reply", proj))
    store = HistoryStore(tmp_path / "history.db")
    w = HistoryWatcher(store, tok, FP, transcripts=[tdir], debounce_s=0.05, max_delay_s=0.5)
    w.start()
    w.scan()
    assert len(store.transcript_records(str(session))) == 2
    yield w, store, session, proj
    w.stop()
    store.close()


def test_appends_to_a_forgotten_transcript_are_not_ingested(followed):
    """After `history forget SESSION` (another process), the agent appends a response and
    continues an earlier message (same message id): the follower reads past them (its
    offset reaches the end) but stores no record; neither the appended text nor the
    forgotten one is in the history or in the file's bytes."""
    w, store, session, proj = followed
    db = store.path
    p = assistd("history", "forget", session, "--json", db=db)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["documents"] == 2

    with session.open("a") as f:
        f.write(claude_line("a3", "msg_3", f"new {AFTER}", proj))
        f.write(claude_line("a4", "msg_1", f"more of msg_1 {AFTER}", proj))
    settle(w, lambda: tailed_to_end(store, session))
    assert store.transcript_records(str(session)) == {}
    assert not any(AFTER in t or FORGET_ME in t for t in stored_texts(db))
    assert store.transcript_forgotten(str(session))  # the next append stays out too
    with session.open("a") as f:
        f.write(claude_line("a5", "msg_4", f"later {AFTER}", proj))
    settle(w, lambda: tailed_to_end(store, session))
    assert store.transcript_records(str(session)) == {}
    store.checkpoint()
    assert marker_counts(db, AFTER) == {"history.db": 0, "history.db-wal": 0}
    assert marker_counts(db, FORGET_ME) == {"history.db": 0, "history.db-wal": 0}


def test_a_forgotten_transcript_rewritten_as_a_new_file_is_read_again(followed):
    """The docs' exception: a forgotten transcript that is rewritten (a new file moved in
    at its path: another inode) is a new session and is read from byte 0, its mark gone."""
    w, store, session, proj = followed
    assert forget(store, str(session))["documents"] == 2
    tmp = session.with_suffix(".tmp")
    tmp.write_text(claude_line("b1", "msg_9", f"rewritten {REWRITTEN}", proj))
    os.replace(tmp, session)
    settle(w, lambda: bool(store.transcript_records(str(session))))
    assert [t for t in stored_texts(store.path) if REWRITTEN in t] == [f"rewritten {REWRITTEN}"]
    assert not store.transcript_forgotten(str(session))
    assert not any(FORGET_ME in t for t in stored_texts(store.path))


def test_a_forgotten_transcript_truncated_and_written_again_is_read_again(tmp_path):
    """Same inode, shrunk (truncated and a shorter session written): a rewrite, read anew;
    before that, an append to the forgotten file was kept out (the ingester alone, as
    `assistd index --transcripts` runs it)."""
    proj = make_repo(tmp_path / "proj", {"a.py": "a = 1\n"}).resolve()
    session = tmp_path / "claude.jsonl"
    session.write_text(claude_line("a1", "msg_1", f"first {FORGET_ME} " + "x" * 200, proj))
    store = HistoryStore(tmp_path / "history.db")
    ing = TranscriptIngester(store, tok, FP)
    assert ing.ingest(session).records_put == 1
    assert forget(store, str(session))["documents"] == 1
    with session.open("a") as f:
        f.write(claude_line("a2", "msg_2", f"appended {AFTER}", proj))
    ing.ingest(session)
    assert store.transcript_records(str(session)) == {}
    session.write_text(claude_line("b1", "msg_9", REWRITTEN, proj))  # shorter: truncated
    assert ing.ingest(session).rewritten == 1
    assert [t for t in stored_texts(store.path) if REWRITTEN in t] == [REWRITTEN]
    store.close()


def test_a_forgotten_whole_json_session_saved_again_stays_forgotten(tmp_path):
    """A whole-JSON session (Gemini CLI's legacy format) is rewritten by every save, each
    save repeating the messages before: after forget, the next save (one message more)
    brings back neither the forgotten message nor the new one."""
    session = tmp_path / "session-1.json"

    def save(*messages):
        session.write_text(json.dumps({"sessionId": "s1", "projectHash": "0" * 64,
                                       "messages": [{"id": f"m{i}", "type": "gemini",
                                                     "content": m}
                                                    for i, m in enumerate(messages)]}))

    save(f"plan {FORGET_ME}")
    store = HistoryStore(tmp_path / "history.db")
    ing = TranscriptIngester(store, tok, FP)
    assert ing.ingest(session).formats == {"gemini_json": 1}
    assert forget(store, str(session))["documents"] == 1
    save(f"plan {FORGET_ME}", f"next {AFTER}")
    ing.ingest(session)
    assert store.transcript_records(str(session)) == {}
    assert stored_texts(store.path) == []
    store.close()


# -- 3. an empty name is no forget target ------------------------------------------------


@pytest.mark.parametrize("name", ["", "   "])
def test_forget_of_an_empty_or_blank_name_is_refused_and_deletes_nothing(tmp_path, name):
    """`history forget ""` matched the tuner's ledger rows of completions made outside any
    repository (scope "", a name no doc lists as a forget target) and deleted them. An
    empty or blank name now exits 2 with one line saying why, and every row stays."""
    repo = make_repo(tmp_path / "r", {"f.py": "f = 1\n"}).resolve()
    db = tmp_path / "history.db"
    store = HistoryStore(db)
    index_repository(store, repo, tok, FP)
    for lang in ("python", "markdown"):
        store.db.execute("insert into ledger (scope, language_id, proposer, target, counters,"
                         " updated_utc) values ('', ?, 'suffix', 't', '{}', 0)", [lang])
    store.close()
    p = assistd("history", "forget", name, db=db)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "empty name" in lines[0] and "history sources" in lines[0], p.stderr
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        assert c.execute("select count(*) from ledger where scope = ''").fetchone() == (2,)
        assert c.execute("select count(*) from documents").fetchone() == (1,)


# -- the daemon itself -------------------------------------------------------------------------


def test_forget_beside_a_running_daemon(tmp_path):
    """`assistd serve --repo R --transcripts TX` running: `history forget R/f.py` and
    `history forget TX/claude.jsonl` return, and both markers are gone from history.db
    and history.db-wal at once (not only after the daemon stops); then the agent appends
    to the forgotten session and the daemon's follower reads it (its offset reaches the
    end) without storing it."""
    repo = make_repo(tmp_path / "fgrepo", {"f.py": f"X = '{FORGET_ME}'\n" * 20,
                                          "g.py": "g = 1\n"}).resolve()
    tdir = tmp_path / "tx"
    tdir.mkdir()
    session = tdir / "claude.jsonl"
    session.write_text(claude_line("a1", "msg_1", f"chat {REWRITTEN}", repo))
    d = start_daemon(tmp_path / "d", "--repo", str(repo), "--transcripts", str(tdir))
    try:
        assert wait_for(lambda: d.status().get("watcher", {}).get("state") == "watching")
        assert sum(marker_counts(d.db, FORGET_ME).values()) > 0
        assert sum(marker_counts(d.db, REWRITTEN).values()) > 0
        env, outs = d.env(), []
        for target in (repo / "f.py", session):
            p = assistd("history", "forget", target, "--json", db=d.db, env=env)
            assert p.returncode == 0, p.stderr
            outs.append(json.loads(p.stdout))
        assert marker_counts(d.db, FORGET_ME) == {"history.db": 0, "history.db-wal": 0}
        assert marker_counts(d.db, REWRITTEN) == {"history.db": 0, "history.db-wal": 0}
        assert [o.get("checkpointed") for o in outs] == [True, True]

        with session.open("a") as f:
            f.write(claude_line("a2", "msg_2", f"new {AFTER}", repo))

        def offset():
            with sqlite3.connect(f"file:{d.db}?mode=ro", uri=True) as c:
                return c.execute("select offset from transcripts where path = ?",
                                 [str(session)]).fetchone()[0]

        assert wait_for(lambda: offset() == session.stat().st_size, timeout=30)
        assert not any(AFTER in t for t in stored_texts(d.db))
    finally:
        d.stop()
