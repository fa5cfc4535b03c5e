"""`assistd index` and `assistd history ...` end to end: real CLI subprocesses (real model
for the tokenizer), real repositories and transcript files, real SQLite files.

Transcript data: ``tests/data/history/generic_chat.jsonl`` (generic ``{role, content}``
chat, 2 assistant records) and ``tests/data/history/claude_session.jsonl`` (Claude Code,
3 records: a text response, its Write tool call, a second response). Both carry
``@CWD@`` where the project directory goes; :func:`write_transcripts` fills it in.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import stat
import string
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from storage.retention import enforce_budget, history_bytes
from storage.store import HistoryStore
from tests.conftest import make_repo

DATA = Path(__file__).resolve().parents[1] / "data" / "history"
HISTORY_COMMANDS = ("stats", "sources", "forget", "vacuum")

# What the two transcripts hold (model output only), by file.
GENERIC_RECORDS = ['def greet(name):\n    return f"hello {name}"\n',
                   "Done: greet() is in sub/b.py."]
CLAUDE_RECORDS = ["I will add helper.py with one function.",
                  "def helper():\n    return 42\n",
                  "Added helper(); it returns 42."]

REPO_FILES = {
    "a.py": "def add(a, b):\n    return a + b\n",
    "README.md": "# demo\n\nA tiny project.\n",
    "sub/b.py": "def greet(name):\n    return name\n",
}


def assistd(*args, db=None, check=True, timeout=120):
    """Run ``python -m assistd ARGS`` (``--db`` omitted: ``$ASSISTD_DB`` of the test)."""
    cmd = [sys.executable, "-m", "assistd", *map(str, args)]
    if db is not None:
        cmd += ["--db", str(db)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc


def assistd_json(*args, db=None):
    return json.loads(assistd(*args, "--json", db=db).stdout)


def write_transcripts(folder: Path, cwds: dict[str, Path]) -> Path:
    """Copy the transcript fixtures into ``folder``, each with its project dir from
    ``cwds`` (file name -> directory) in place of ``@CWD@``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, cwd in cwds.items():
        text = (DATA / name).read_text().replace("@CWD@", json.dumps(str(cwd))[1:-1])
        (folder / name).write_text(text)
    return folder


def project(tmp_path, extra=None):
    """(repo, transcripts folder): a 3-file repo, the generic chat recorded in its
    ``sub/`` folder (resolved to the repo root), the Claude session in its root."""
    repo = make_repo(tmp_path / "proj", {**REPO_FILES, **(extra or {})}).resolve()
    tdir = write_transcripts(tmp_path / "agent-logs", {"generic_chat.jsonl": repo / "sub",
                                                       "claude_session.jsonl": repo})
    return repo, tdir


def index(repo, tdir, db, *extra):
    return assistd_json("index", repo, "--transcripts", tdir, "--no-agent-transcripts",
                        *extra, db=db)


def rows(db, sql, params=()):
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        return c.execute(sql, params).fetchall()


def file_bytes(db: Path) -> bytes:
    """The main database file and its WAL (if any), as raw bytes."""
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())


def checkpoint(db: Path) -> None:
    c = sqlite3.connect(db)
    try:
        assert c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # not busy
    finally:
        c.close()


def random_marker() -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(40))


# -- index + sources -------------------------------------------------------------------


def test_index_repo_and_transcripts_reports_both_and_scopes_records_to_the_repo(tmp_path):
    """`assistd index REPO --transcripts DIR --json` on the 3-file repo and the two
    transcript fixtures: the JSON has the repository report (3 documents tokenized) and
    the transcript report (2 files, one per format, 5 records); every record lands in the
    repo's scope (cwd = the repo, or its sub/ folder), so `history sources --json` shows
    exactly two scope rows for the repo (kind repo, kind transcript) plus one row per
    transcript file. The DB the CLI created (from $ASSISTD_DB) is 0600."""
    repo, tdir = project(tmp_path)
    db = Path(os.environ["ASSISTD_DB"])
    assert not db.exists()
    out = index(repo, tdir, None)

    assert out["scope"] == str(repo)  # the one-repository shape at top level
    assert len(out["repositories"]) == 1
    r = out["repositories"][0]
    assert r["scope"] == str(repo)
    assert (r["documents"], r["tokenized"], r["unchanged"], r["removed"]) == (3, 3, 0, 0)
    assert r["tokens"] > 0 and r["tokens"] == out["tokens"]
    t = out["transcripts"]
    assert t["files"] == 2 and t["unknown_format"] == 0
    assert t["formats"] == {"generic_jsonl": 1, "claude_code": 1}
    assert t["records_put"] == len(GENERIC_RECORDS) + len(CLAUDE_RECORDS) == 5
    assert t["records_removed"] == 0 and t["skipped_malformed"] == 0 and t["tokens"] > 0
    assert out["eviction"]["documents_evicted"] == 0 and not out["eviction"]["over_budget"]
    assert out["eviction"]["size_before"] == out["eviction"]["size_after"] > 0

    src = assistd_json("history", "sources")
    scopes = [s for s in src if s["type"] == "scope"]
    assert [(s["source"], s["kind"], s["documents"]) for s in scopes] == [
        (str(repo), "repo", 3), (str(repo), "transcript", 5)]
    assert scopes[0]["tokens"] == r["tokens"] and scopes[1]["tokens"] == t["tokens"]
    files = {s["source"]: (s["kind"], s["documents"]) for s in src if s["type"] == "transcript"}
    assert files == {str(tdir / "generic_chat.jsonl"): ("generic_jsonl", 2),
                     str(tdir / "claude_session.jsonl"): ("claude_code", 3)}

    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    for side in ("-wal", "-shm"):
        p = Path(f"{db}{side}")
        if p.exists():
            assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, side


def test_cli_creates_a_private_database_in_a_new_directory(tmp_path, monkeypatch):
    """The first CLI command that writes on a new $ASSISTD_DB path (here `index`) creates
    the directory 0700 and the database file 0600: the history holds private source
    text. A command that only reads or prunes (`history stats`, `stats`) refuses a
    missing file and creates nothing: a mistyped --db made an empty database."""
    db = tmp_path / "fresh" / "dir" / "history.db"
    monkeypatch.setenv("ASSISTD_DB", str(db))
    for args in (["history", "stats"], ["history", "sources"], ["stats"]):
        r = assistd(*args, check=False)
        assert r.returncode == 2 and f"no history database at {db}" in r.stderr, r.stderr
        assert not db.parent.parent.exists()
    (tmp_path / "empty").mkdir()
    assistd_json("index", tmp_path / "empty", "--no-agent-transcripts")
    s = assistd_json("history", "stats")
    assert s["db"] == str(db) and s["kinds"] == {} and s["history_bytes"] == 0
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700


# -- stats -----------------------------------------------------------------------------


def test_history_stats_counts_documents_tokens_and_bytes_per_kind(tmp_path):
    """`history stats --json` after indexing the 3-file repo and the 2 transcripts:
    per kind, documents and bytes are what was written (file sizes; the records' UTF-8
    text), tokens are what `index` reported and what the token blobs in the SQLite file
    hold; history_bytes = bytes + 4 * tokens; 2 transcript files."""
    repo, tdir = project(tmp_path)
    db = tmp_path / "h.db"
    out = index(repo, tdir, db)
    s = assistd_json("history", "stats", db=db)

    # Straight from the file: token blobs are 4 bytes per token.
    blob_tokens = dict(rows(db, "select d.source_kind, sum(length(t.token_ids)) / 4"
                                " from tokenizations t join documents d on d.id = t.document_id"
                                " group by d.source_kind"))
    sql_bytes = dict(rows(db, "select source_kind, sum(length(cast(text as blob)))"
                              " from documents group by source_kind"))
    repo_bytes = sum(len(v.encode()) for v in REPO_FILES.values())
    record_bytes = sum(len(x.encode()) for x in GENERIC_RECORDS + CLAUDE_RECORDS)

    assert set(s["kinds"]) == {"repo", "transcript"}
    assert s["kinds"]["repo"]["documents"] == 3
    assert s["kinds"]["repo"]["bytes"] == repo_bytes == sql_bytes["repo"]
    assert s["kinds"]["repo"]["tokens"] == out["tokens"] == blob_tokens["repo"]
    assert s["kinds"]["transcript"]["documents"] == 5
    assert s["kinds"]["transcript"]["bytes"] == record_bytes == sql_bytes["transcript"]
    assert s["kinds"]["transcript"]["tokens"] == out["transcripts"]["tokens"] \
        == blob_tokens["transcript"]
    assert s["kinds"]["repo"]["redactions"] == s["kinds"]["transcript"]["redactions"] == 0
    assert s["history_bytes"] == repo_bytes + record_bytes + 4 * (
        blob_tokens["repo"] + blob_tokens["transcript"]) == out["eviction"]["size_after"]
    assert s["scopes"] == 1 and s["transcript_files"] == 2
    assert s["transcript_lines_malformed"] == 0 and s["transcript_records_unknown"] == 0
    assert s["db"] == str(db) and s["db_bytes"] >= db.stat().st_size > 0


# -- forget ------------------------------------------------------------------------------


def test_forget_scope_removes_its_documents_and_tokens_and_logs_deletes(tmp_path):
    """`history forget REPO --json` removes every document of the scope (3 repo files and
    the 5 transcript records attached to it), their tokenizations and the scope row, and
    logs one `delete` in `changes` per document (what in-memory indexes follow)."""
    repo, tdir = project(tmp_path)
    db = tmp_path / "h.db"
    index(repo, tdir, db)
    ids = sorted(r[0] for r in rows(db, "select id from documents where scope = ?", [str(repo)]))
    assert len(ids) == 8
    seq = rows(db, "select max(seq) from changes")[0][0]

    out = assistd_json("history", "forget", repo, db=db)
    assert out == {"target": str(repo), "documents": 8, "transcripts": 0, "ledger_rows": 0,
                   "suggestions": 0, "checkpointed": True}

    assert rows(db, "select count(*) from documents") == [(0,)]
    assert rows(db, "select count(*) from tokenizations") == [(0,)]
    assert rows(db, "select count(*) from scopes where root = ?", [str(repo)]) == [(0,)]
    store = HistoryStore(db)
    try:
        log = store.changes_since(seq)
    finally:
        store.close()
    assert [(d, s, op) for _, d, s, op in log] == [(i, str(repo), "delete") for i in ids]
    assert [s for s in assistd_json("history", "sources", db=db) if s["type"] == "scope"] == []


def test_forget_a_file_then_a_folder_inside_a_scope_removes_only_them(tmp_path):
    """`history forget REPO/a.py` removes that one document (and its tokens) and nothing
    else; then `history forget REPO/sub` removes the folder's sub/b.py but not the
    transcript records attached to the scope, nor README.md; the scope stays."""
    repo, tdir = project(tmp_path)
    db = tmp_path / "h.db"
    index(repo, tdir, db)

    def repo_paths():
        return {p for (p,) in rows(db, "select path from documents where source_kind = 'repo'")}

    a_id = rows(db, "select id from documents where path = 'a.py'")[0][0]
    out = assistd_json("history", "forget", repo / "a.py", db=db)
    assert out == {"target": str(repo / "a.py"), "documents": 1, "transcripts": 0,
                   "ledger_rows": 0, "suggestions": 0, "checkpointed": True}
    assert repo_paths() == {"README.md", "sub/b.py"}
    assert rows(db, "select count(*) from tokenizations where document_id = ?", [a_id]) == [(0,)]
    assert rows(db, "select op from changes where document_id = ? order by seq desc limit 1",
                [a_id]) == [("delete",)]

    out = assistd_json("history", "forget", repo / "sub", db=db)
    assert out["documents"] == 1
    assert repo_paths() == {"README.md"}
    assert rows(db, "select count(*) from documents where source_kind = 'transcript'") == [(5,)]
    assert rows(db, "select count(*) from scopes where root = ?", [str(repo)]) == [(1,)]


def test_forget_a_transcript_file_removes_its_records_only(tmp_path):
    """`history forget DIR/claude_session.jsonl --json` removes that file's 3 records
    (and their tokens); the generic chat's 2 records and the repo files stay. Afterwards
    `history sources` no longer credits the forgotten file with documents."""
    repo, tdir = project(tmp_path)
    db = tmp_path / "h.db"
    index(repo, tdir, db)
    claude = tdir / "claude_session.jsonl"
    ids = [i for (i,) in rows(db, "select id from documents where source = ?", [str(claude)])]
    assert len(ids) == 3

    out = assistd_json("history", "forget", claude, db=db)
    assert out == {"target": str(claude), "documents": 3, "transcripts": 1,
                   "ledger_rows": 0, "suggestions": 0, "checkpointed": True}
    assert rows(db, "select count(*) from documents where source = ?", [str(claude)]) == [(0,)]
    assert rows(db, f"select count(*) from tokenizations where document_id in"
                    f" ({','.join('?' * len(ids))})", ids) == [(0,)]
    assert rows(db, "select count(*) from documents where source = ?",
                [str(tdir / "generic_chat.jsonl")]) == [(2,)]
    assert rows(db, "select count(*) from documents where source_kind = 'repo'") == [(3,)]

    src = assistd_json("history", "sources", db=db)
    scope_rows = {(s["source"], s["kind"]): s["documents"] for s in src if s["type"] == "scope"}
    assert scope_rows == {(str(repo), "repo"): 3, (str(repo), "transcript"): 2}
    claude_rows = [s for s in src if s["type"] == "transcript" and s["source"] == str(claude)]
    assert all(s["documents"] == 0 for s in claude_rows), claude_rows


def test_forget_unknown_source_exits_2_with_one_line_message(tmp_path):
    """`history forget` of a path that is in no scope and no transcript exits with code 2
    and one line on stderr naming it and pointing to `history sources`; nothing is
    deleted."""
    repo, tdir = project(tmp_path)
    db = tmp_path / "h.db"
    index(repo, tdir, db)
    unknown = tmp_path / "elsewhere" / "nothing.py"
    p = assistd("history", "forget", unknown, db=db, check=False)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert str(unknown) in lines[0] and "history sources" in lines[0]
    assert rows(db, "select count(*) from documents") == [(8,)]


def test_forgotten_text_is_overwritten_in_the_file_then_vacuumed(tmp_path):
    """Forgetting is real: two files under private/ hold distinct 40-character random
    strings (one small file, one ~40 KB that spills into overflow pages), and so does the
    one assistant record of an extra transcript, private_chat.jsonl. All are in the DB
    file's bytes after indexing; after `history forget REPO/private`, `history forget
    DIR/private_chat.jsonl` and a WAL checkpoint from this test's connection, none occurs
    anywhere in the main file (secure_delete overwrote them), and after `history vacuum
    --json` none is in the DB or its -wal; a kept file's string still is."""
    small, large, chat, kept = (random_marker() for _ in range(4))
    filler = "".join(f"value_{i} = {i} * {i}\n" for i in range(2500))
    repo, tdir = project(tmp_path, {
        "private/note.txt": f"# marker {small}\n",
        "private/big.py": f"{filler}# marker {large}\n{filler}",
        "kept.txt": f"# marker {kept}\n",
    })
    private_chat = tdir / "private_chat.jsonl"
    private_chat.write_text(json.dumps({"role": "assistant", "cwd": str(repo),
                                        "content": f"The marker is {chat} here."}) + "\n")
    db = tmp_path / "h.db"
    index(repo, tdir, db)
    checkpoint(db)
    raw = file_bytes(db)
    for marker in (small, large, chat, kept):
        assert marker.encode() in raw, "the marker never reached the DB (redacted?)"

    assert assistd_json("history", "forget", repo / "private", db=db)["documents"] == 2
    assert assistd_json("history", "forget", private_chat, db=db)["documents"] == 1
    checkpoint(db)
    raw = db.read_bytes()
    for name, marker in (("small file", small), ("large file", large), ("record", chat)):
        assert marker.encode() not in raw, f"forgotten {name} left in the main file"

    v = assistd_json("history", "vacuum", db=db)
    assert v["db"] == str(db) and v["bytes_after"] > 0
    raw = file_bytes(db)
    for marker in (small, large, chat):
        assert marker.encode() not in raw
    assert kept.encode() in raw
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]


# -- retention ---------------------------------------------------------------------------


def _put(store, scope, path, nbytes, ntokens, updated_utc):
    doc_id = store.put_document(
        scope=scope, path=path, source_kind="repo", language_id="plaintext",
        content_hash=f"h-{scope}-{path}", num_bytes=nbytes, mtime_ns=1, text="x" * nbytes,
        decoded_with_replacement=False, fingerprint="test-fp", token_ids=range(ntokens))
    store.db.execute("update documents set updated_utc = ? where id = ?", [updated_utc, doc_id])
    return doc_id


def _two_scopes(store):
    """Scope /old (used long ago) and /new (used now): 2 documents of 100 bytes + 25
    tokens (= 200 bytes each) apiece; in /old, o1.py was updated before o2.py."""
    ids = {}
    for scope, used in (("/old", 1_000.0), ("/new", time.time())):
        store.mark_indexed(scope, True)
        store.db.execute("update scopes set last_used_utc = ? where root = ?", [used, scope])
        for n, upd in ((1, 10.0), (2, 20.0)):
            ids[f"{scope}/{n}"] = _put(store, scope, f"{scope[1]}{n}.py", 100, 25, upd)
    assert history_bytes(store) == 800
    return ids


def _scope_docs(store, scope):
    return sorted(p for (p,) in store.db.execute(
        "select path from documents where scope = ?", [scope]))


def test_budget_evicts_least_recently_used_scope_first(store):
    """enforce_budget on /old (last used long ago) and /new (just now), 200 bytes per
    document: a 600-byte budget evicts only /old's least recently updated document
    (o1.py); a 400-byte budget then evicts the rest of /old and drops its scope row;
    each eviction is a `delete` in the change log; /new is untouched."""
    ids = _two_scopes(store)
    seq = store.changes_since(0)[-1][0]

    r = enforce_budget(store, 600)
    assert (r.budget_bytes, r.size_before, r.size_after, r.documents_evicted,
            r.over_budget) == (600, 800, 600, 1, False)
    assert _scope_docs(store, "/old") == ["o2.py"]

    r = enforce_budget(store, 400)
    assert (r.size_before, r.size_after, r.documents_evicted, r.over_budget) == \
        (600, 400, 1, False)
    assert _scope_docs(store, "/old") == [] and not store.has_scope("/old")
    assert _scope_docs(store, "/new") == ["n1.py", "n2.py"] and store.has_scope("/new")
    assert history_bytes(store) == 400
    assert store.db.execute("select count(*) from tokenizations").fetchone()[0] == 2
    assert [(d, s, op) for _, d, s, op in store.changes_since(seq)] == [
        (ids["/old/1"], "/old", "delete"), (ids["/old/2"], "/old", "delete")]

    r = enforce_budget(store, 400)  # fits: nothing to do
    assert (r.documents_evicted, r.over_budget, r.size_after) == (0, False, 400)


def test_protected_scope_is_never_evicted_and_over_budget_is_reported(store):
    """With /old protected (it is being indexed) and a 300-byte budget, /new is evicted
    although it was used more recently, /old keeps both documents, and the report says
    over_budget (400 bytes left); protecting both scopes evicts nothing, still over."""
    _two_scopes(store)
    r = enforce_budget(store, 300, protect=["/old", "/new"])
    assert (r.size_before, r.size_after, r.documents_evicted, r.over_budget) == \
        (800, 800, 0, True)
    assert history_bytes(store) == 800

    r = enforce_budget(store, 300, protect=["/old"])
    assert (r.size_before, r.size_after, r.documents_evicted, r.over_budget) == \
        (800, 400, 2, True)
    assert _scope_docs(store, "/old") == ["o1.py", "o2.py"] and store.has_scope("/old")
    assert _scope_docs(store, "/new") == [] and not store.has_scope("/new")
    assert history_bytes(store) == 400


def test_index_with_max_history_mb_evicts_the_older_scope_not_the_indexed_one(tmp_path):
    """`assistd index BIG --max-history-mb 1` where BIG alone is over 1 MiB of text +
    tokens and an older scope (last used long ago, 3 documents) is in the history: the
    older scope is evicted, every file of BIG stays (it is protected while indexed), and
    the JSON eviction report says 3 evicted, still over budget."""
    db = tmp_path / "h.db"
    store = HistoryStore(db)
    try:
        store.mark_indexed("/src/older", True)
        store.db.execute("update scopes set last_used_utc = 1000.0 where root = '/src/older'")
        for n in range(3):
            _put(store, "/src/older", f"m{n}.py", 2_000, 500, 10.0 + n)
    finally:
        store.close()
    body = "".join(f"def handler_{i}(request, limit={i}):\n    return request.get('k{i}')\n"
                   for i in range(3000))  # ~170 KB per file
    big = make_repo(tmp_path / "big", {f"mod{n}.py": body.replace("handler", f"h{n}")
                                       for n in range(4)}).resolve()

    out = assistd_json("index", big, "--no-agent-transcripts", "--max-history-mb", 1, db=db)
    ev = out["eviction"]
    assert out["documents"] == 4 and out["tokenized"] == 4
    assert ev["budget_bytes"] == 1 << 20
    assert ev["documents_evicted"] == 3 and ev["over_budget"] is True
    assert rows(db, "select count(*) from documents where scope = '/src/older'") == [(0,)]
    assert rows(db, "select count(*) from scopes where root = '/src/older'") == [(0,)]
    assert rows(db, "select path from documents where scope = ? order by path",
                [str(big)]) == [(f"mod{n}.py",) for n in range(4)]
    store = HistoryStore(db)
    try:
        assert history_bytes(store) == ev["size_after"] > 1 << 20
        assert ev["size_before"] == ev["size_after"] + 3 * (2_000 + 4 * 500)
    finally:
        store.close()


# -- watch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_index_watch_picks_up_a_new_file_and_stops_cleanly_on_signal(tmp_path, sig):
    """`assistd index REPO --watch --no-agent-transcripts` as a subprocess: after
    "watching" on stderr, a file created in the repo appears as a document in the DB
    (read-only polling, 30 s at most); SIGINT (Ctrl-C) or SIGTERM (a service manager) then
    ends the process within 10 s with exit code 0 and "stopped" on stderr, and the DB
    passes `PRAGMA integrity_check`."""
    repo = make_repo(tmp_path / "proj", REPO_FILES).resolve()
    db = tmp_path / "h.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "assistd", "index", str(repo), "--watch",
         "--no-agent-transcripts", "--db", str(db)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    watching = threading.Event()

    def read_stderr():
        for line in proc.stderr:
            err.append(line)
            if "watching" in line:
                watching.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert watching.wait(60), "".join(err)
        (repo / "live_added.py").write_text("def live():\n    return 'added while watching'\n")
        deadline = time.monotonic() + 30
        found = []
        while time.monotonic() < deadline and not found:
            found = rows(db, "select text from documents where scope = ? and path = ?",
                         [str(repo), "live_added.py"])
            time.sleep(0.2)
        assert found == [("def live():\n    return 'added while watching'\n",)], "".join(err)
        proc.send_signal(sig)
        rc = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=5)
    assert rc == 0, "".join(err)
    assert "stopped" in "".join(err)
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]


# -- self-documentation ------------------------------------------------------------------------


def test_every_history_command_has_help_with_an_example():
    """`assistd history --help` lists stats, sources, forget and vacuum, and each one's
    `--help` exits 0, offers --json and shows an example invocation of that command."""
    top = assistd("history", "--help").stdout
    for name in HISTORY_COMMANDS:
        assert name in top
    missing = []
    for name in HISTORY_COMMANDS:
        text = assistd("history", name, "--help").stdout
        assert "--json" in text, name
        if "Example" not in text or f"assistd history {name}" not in text:
            missing.append(name)
    assert missing == [], f"`assistd history X --help` without an example: {missing}"


def test_history_json_outputs_parse_on_an_empty_history(tmp_path):
    """On a new, empty history, `history stats|sources|vacuum --json` each print one
    JSON value on stdout (an object, an array, an object) with zero counts."""
    db = tmp_path / "empty.db"
    HistoryStore(db).close()  # made by `index`, an editor or the daemon
    s = json.loads(assistd("history", "stats", "--json", db=db).stdout)
    assert s["kinds"] == {} and s["scopes"] == 0 and s["history_bytes"] == 0
    assert json.loads(assistd("history", "sources", "--json", db=db).stdout) == []
    v = json.loads(assistd("history", "vacuum", "--json", db=db).stdout)
    assert set(v) == {"db", "bytes_before", "bytes_after"} and v["db"] == str(db)


def test_budget_never_evicts_what_the_run_just_stored(tmp_path):
    """Transcript records indexed by this run (in other scopes than the repository) are
    kept even when the budget is tight; older documents go instead (newcomer report:
    a run with --max-history-mb evicted the aider records it had just read)."""
    import time as _time

    store = HistoryStore(tmp_path / "h.db")
    for scope, when in (("/old", 1.0), ("/new", None)):
        store.put_document(scope=scope, path="a.txt", source_kind="repo", language_id="plaintext",
                           content_hash=scope, num_bytes=100, mtime_ns=0, text="x" * 100,
                           decoded_with_replacement=False, fingerprint="fp", token_ids=[1] * 25)
        if when is not None:
            store.db.execute("update documents set updated_utc = ? where scope = ?", [when, scope])
    cutoff = _time.time() - 0.5
    report = enforce_budget(store, 150, protect=(), keep_since_utc=cutoff)
    assert report.documents_evicted == 1
    assert [r[0] for r in store.db.execute("select scope from documents")] == ["/new"]
    # Nothing else can go: still over budget, and the fresh document stays.
    report = enforce_budget(store, 10, protect=(), keep_since_utc=cutoff)
    assert report.documents_evicted == 0 and report.over_budget
    store.close()
