"""Issue 34 (hardening), class 7: what indexing skips or changes is counted, each thing
once. A break-it pass found a FIFO inside a repository skipped without being counted, a
lone surrogate stored as U+FFFD not counted as ``decoded_with_replacement``, and one
line nested too deep counted both as malformed and as too deep.

Real FIFOs (``os.mkfifo``), real transcript files, a real SQLite history."""

from __future__ import annotations

import json
import os

import pytest

from storage.indexer import RepoIndexer, index_repository
from storage.ingest import TranscriptIngester
from storage.walk import NOT_REGULAR
from tests.conftest import make_repo

pytestmark = pytest.mark.timeout(120)  # a FIFO opened for reading would block: a backstop

FP = "bytes-v1"
DEEP = 100_000


def tok(text):
    return list(text.encode("utf-8"))


def texts(store, source):
    return sorted(t for (t,) in store.db.execute(
        "select text from documents where source = ?", [str(source)]))


def test_a_fifo_inside_a_repository_is_counted_not_read(store, tmp_path):
    """FIFOs in a repository (top level, a subfolder, one named .py) are counted as refused
    not_regular and never opened, on a full index, a watcher's update of a new FIFO or of a
    folder moved in, and a non-recursive index; ignored folders and .git are not walked."""
    repo = make_repo(tmp_path / "r", {"a.py": "x = 1\n", "sub/b.py": "y = 2\n",
                                      ".gitignore": "ignored/\n"})
    os.mkfifo(repo / "pipe")
    os.mkfifo(repo / "sub" / "fifo.py")
    (repo / "ignored").mkdir()
    os.mkfifo(repo / "ignored" / "pipe")  # an ignored folder is not walked: not counted
    os.mkfifo(repo / ".git" / "pipe")
    report = index_repository(store, repo, tok, FP)
    assert report.refused == {NOT_REGULAR: 2}
    assert report.documents == 3  # a.py, sub/b.py, .gitignore
    indexer = RepoIndexer(store, repo, tok, FP)
    indexer.scan()
    os.mkfifo(repo / "later")  # a watcher's event names it
    assert indexer.update(["later"]).refused == {NOT_REGULAR: 1}
    (repo / "new").mkdir()
    os.mkfifo(repo / "new" / "pipe")  # a folder moved in, a FIFO inside
    assert indexer.update(["new"]).refused == {NOT_REGULAR: 1}
    assert index_repository(store, repo, tok, FP, recursive=False).refused == {NOT_REGULAR: 2}


def test_a_lone_surrogate_stored_as_replacement_is_counted(store, tmp_path):
    """JSON's ``"\\ud800"`` is valid UTF-8 text but decodes to a lone surrogate, which is
    stored as U+FFFD: that line is read with replacement, as invalid UTF-8 is."""
    lines = [json.dumps({"role": "assistant", "content": "fine"}).encode(),
             b'{"role": "assistant", "content": "lone \\ud800 high"}',
             b'{"role": "assistant", "content": "lone \\udfff low"}',
             b'{"role": "assistant", "content": "a pair \\ud83d\\ude00 is no replacement"}',
             b'{"role": "assistant", "content": "an escaped backslash \\\\ud800 is text"}',
             b'{"role": "assistant", "content": "bad \xff byte"}']
    path = tmp_path / "chat.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    report = TranscriptIngester(store, tok, FP).ingest(path)
    stored = texts(store, path)
    assert "lone \ufffd high" in stored and "lone \ufffd low" in stored
    assert "a pair \U0001F600 is no replacement" in stored
    assert "an escaped backslash \\ud800 is text" in stored
    assert report.decoded_with_replacement == 3  # two surrogates, one bad byte
    # Appended later: the next pass counts only its own lines.
    with open(path, "a") as f:
        f.write('{"role": "assistant", "content": "again \\udc00"}\n')
    assert TranscriptIngester(store, tok, FP).ingest(path).decoded_with_replacement == 1


def test_a_lone_surrogate_in_a_whole_json_transcript_is_counted(store, tmp_path):
    """A Gemini CLI session (one JSON document) with a lone surrogate stores U+FFFD in its place
    and counts one decoded_with_replacement."""
    path = tmp_path / "session-1.json"  # a Gemini CLI session: one JSON document
    doc = {"sessionId": "s", "projectHash": "h", "messages": [
        {"id": "1", "type": "gemini", "content": "lone \ud800 in a document"},
        {"id": "2", "type": "gemini", "content": "fine"}]}
    path.write_text(json.dumps(doc))  # json.dumps escapes the surrogate: valid UTF-8
    report = TranscriptIngester(store, tok, FP).ingest(path)
    assert report.files == 1 and "lone \ufffd in a document" in texts(store, path)
    assert report.decoded_with_replacement == 1


def test_a_line_nested_too_deep_is_counted_once(store, tmp_path):
    """In a JSONL transcript two lines nested too deep and two malformed lines are each counted
    once (skipped_too_deep 2, skipped_malformed 2, the stored counter agreeing) and the good
    record is kept."""
    path = tmp_path / "chat.jsonl"
    deep = '{"role": "assistant", "content": ' + "[" * DEEP + "]" * DEEP + "}"
    path.write_text("\n".join([json.dumps({"role": "assistant", "content": "kept"}), deep,
                               '{"role": "assistant", "content": ', "[" * DEEP, "7"]) + "\n")
    report = TranscriptIngester(store, tok, FP).ingest(path)
    assert texts(store, path) == ["kept"]
    # Two too deep, two malformed (cut JSON, a number): four lines, each counted once.
    assert (report.skipped_too_deep, report.skipped_malformed) == (2, 2)
    row = store.db.execute("select skipped_malformed from transcripts where path = ?",
                           [str(path)]).fetchone()
    assert row[0] == 2  # the stored counter agrees


def test_a_file_deleted_during_a_scan_is_counted_as_vanished_not_unreadable(store, tmp_path):
    """Files listed by the walk and deleted before they are read (a tester deleted files
    while `assistd index` ran and saw them as "unreadable") are counted as vanished, and
    the summary line says so."""
    from assistd.cli.history import _repo_line

    repo = make_repo(tmp_path / "r", {"a.py": "x = 1\n", "b.py": "y = 2\n", "c.py": "z = 3\n"})

    def delete_the_rest(done, total):
        if done == 1:  # after a.py: b.py and c.py were listed, now gone
            (repo / "b.py").unlink()
            (repo / "c.py").unlink()

    report = RepoIndexer(store, repo, tok, FP).scan(delete_the_rest)
    assert (report.vanished, report.skipped_unreadable) == (2, 0)
    assert report.documents == 1
    assert "0 unreadable, 2 vanished;" in _repo_line(report)


def test_assistd_index_says_what_it_did_not_read_once(tmp_path):
    """`assistd index` (real CLI, real model) on a repository holding FIFOs: the line that
    counts them is printed once (it was printed by the summary and logged to stderr)."""
    import subprocess
    import sys

    repo = make_repo(tmp_path / "r", {"a.py": "x = 1\n"})
    os.mkfifo(repo / "p1")
    os.mkfifo(repo / "p2")
    env = dict(os.environ, ASSISTD_DB=str(tmp_path / "cli.db"))
    proc = subprocess.run([sys.executable, "-m", "assistd", "index", str(repo)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert out.count(NOT_REGULAR) == 1, out
    assert f"{repo.resolve()}: 2 not read: {NOT_REGULAR}" in proc.stdout


def test_a_repeated_refusal_warning_is_told_formatted_at_exit(tmp_path):
    """The daemon's rate limit keys a warning by its template; what it says at exit of
    the repeats it held back is the message as logged ('/r: 2 file(s) not read: ...'),
    never the template ('%s: %d file(s) not read: %s')."""
    import logging

    from assistd.ground.logs import RateLimitFilter

    limit = RateLimitFilter(window_s=3600)
    repo = make_repo(tmp_path / "r", {"a.py": "x = 1\n"})
    os.mkfifo(repo / "p1")
    os.mkfifo(repo / "p2")
    indexer_log = logging.getLogger("storage.indexer")
    handler = logging.FileHandler(tmp_path / "daemon.log")
    handler.addFilter(limit)
    indexer_log.addHandler(handler)
    told = logging.getLogger("assistd.test.exit")
    told.propagate = False
    told.setLevel(logging.INFO)
    told.addHandler(handler)
    try:
        from storage.store import HistoryStore
        store = HistoryStore(tmp_path / "h.db")
        for _ in range(2):  # a rescan: the same warning again, held back
            index_repository(store, repo, tok, FP)
        store.close()
        limit.log_pending(told)
    finally:
        indexer_log.removeHandler(handler)
        told.removeHandler(handler)
        handler.close()
    lines = (tmp_path / "daemon.log").read_text().splitlines()
    message = f"{repo.resolve()}: 2 file(s) not read: {NOT_REGULAR}"
    assert lines == [message,
                     f"storage.indexer: {message!r} was repeated 1 more times, not logged"]
