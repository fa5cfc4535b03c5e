"""Hostile inputs to the history (issue 21, classes 1 and 2): whole-JSON transcripts with
one bad entry, JSON nested 100,000 levels deep, and files that change under a scan (a
FIFO, a symbolic link out of the repository) -- real files, real FIFOs (``os.mkfifo``),
real links, a real SQLite history.

Swapping a file between the walk and the read uses ``RepoIndexer.scan``'s ``progress``
callback, which runs after each file and after the whole listing was taken: a real
seam of the public API, no mock. Where a regression would hang (a FIFO opened for
reading blocks until a writer comes), the run is a subprocess with a timeout.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest

from storage.indexer import RepoIndexer
from storage.ingest import EMPTY_FOLDER, TranscriptIngester, ingest_paths
from storage.store import HistoryStore
from storage.transcripts import TranscriptError, parser_for
from storage.transcripts.base import MAX_JSON_DEPTH, TooDeep, json_too_deep, loads, prune_deep
from storage.walk import NOT_REGULAR, OUTSIDE, SYMLINK, Refused, open_checked
from tests.conftest import REPO, make_repo

FP = "bytes-v1"
DEEP = 100_000  # levels of nesting: far past Python's recursion limit (1,000)


def tok(text):
    return list(text.encode("utf-8"))


def texts(store, source=None):
    q, args = "select text from documents", []
    if source is not None:
        q, args = q + " where source = ?", [str(source)]
    return sorted(t for (t,) in store.db.execute(q, args))


def run_python(code: str, timeout: float = 120) -> dict:
    """Run ``code`` in a fresh interpreter at the repository root; it prints one JSON
    object. A hang (the bug these guard against) fails on the timeout, never blocks."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- class 1: a bad entry of a whole-JSON transcript loses only that entry -------------------

# One good document per whole-JSON format: its first and last entries say "good zero" and
# "good last"; ``poison`` is an entry whose shape the parser's code cannot walk (a list
# where a string is compared against a set), which used to lose the whole file.
WHOLE = {
    "gemini_json": ({"sessionId": "s", "projectHash": "h", "messages": [
        {"id": "m0", "type": "gemini", "content": "good zero"},
        {"id": "m1", "type": "gemini", "content": [{"text": "hi"}], "toolCalls": [
            {"id": "t", "name": "replace", "args": {"file_path": "a.ts", "new_string": "y"},
             "result": [{"functionResponse": {"response": {"output": "ok"}}}]}]},
        {"id": "u", "type": "user", "content": "q"},
        {"id": "m9", "type": "gemini", "content": "good last"}]},
        ("messages", 2), {"id": "p", "type": ["gemini"], "content": "poison"}),
    "swe_agent": ({"trajectory": [
        {"thought": "good zero", "action": "ls"},
        {"thought": "t", "action": "a", "observation": "o", "state": {"working_dir": "/r"}},
        {"thought": "good last", "action": "x"}],
        "history": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                    {"role": "assistant", "content": "a"}]},
        # a state string nested past the recursion limit used to lose the whole file
        ("trajectory", 1), {"thought": ["poison"], "action": {"poison": 1},
                            "state": "[" * 100_000 + "]" * 100_000}),
    "mini_swe_agent": ({"info": {"mini_version": "1"}, "trajectory_format": "mini-swe-agent-1",
                        "messages": [
        {"role": "assistant", "content": "good zero"},
        {"role": "assistant", "content": "t", "tool_calls": [
            {"id": "c", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "good last"}]},
        ("messages", 2), {"role": ["user"], "content": "poison"}),
    "openhands": ([
        {"id": 0, "source": "agent", "action": "message", "args": {"content": "good zero"}},
        {"id": 1, "source": "agent", "action": "run", "args": {"command": "ls", "thought": "t"}},
        {"id": 2, "source": "user", "action": "message", "args": {"content": "u"}},
        {"id": 9, "source": "agent", "action": "finish", "args": {"final_thought": "good last"}}],
        (2,), {"id": 5, "source": "agent", "action": ["run"], "args": {"command": "poison"}}),
}
ODD = [[], ["x"], {"a": 1}, 7, None, True, 1.5, "s"]


def _paths(value, path=()):
    yield path
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for k, v in items:
        yield from _paths(v, path + (k,))


def _with(doc, path, value):
    doc = copy.deepcopy(doc)
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


@pytest.mark.parametrize("fmt", sorted(WHOLE))
def test_a_poison_entry_is_skipped_and_counted_the_rest_stored(fmt, store, tmp_path):
    """A real poison file per format, through the ingester into SQLite: every good entry
    stored, the bad one counted as malformed where the code had to walk it, the file not
    `unparseable`."""
    doc, where, poison = WHOLE[fmt]
    doc = copy.deepcopy(doc)
    doc_list = doc
    for k in where[:-1]:
        doc_list = doc_list[k]
    doc_list.insert(where[-1], poison)
    path = tmp_path / {"swe_agent": "run.traj", "mini_swe_agent": "run.traj.json",
                       "gemini_json": "session-1.json", "openhands": "events.json"}[fmt]
    path.write_text(json.dumps(doc))
    ing = TranscriptIngester(store, tok, FP)
    report = ing.ingest(path)
    assert (report.files, report.unparseable) == (1, 0), report
    stored = texts(store, path)
    assert "good zero" in stored and "good last" in stored
    assert not any("poison" in t for t in stored)
    parser = parser_for(fmt, context_turns=True)
    shown = [p.text for p in parser.parse(path.read_bytes())]
    assert "good zero" in shown and "good last" in shown
    assert not any("poison" in t for t in shown)
    # Counted where the code had to walk the bad shape: mini-swe-agent reads a non-assistant
    # role only for context turns, and swe_agent's odd step is simply no text.
    assert (report.skipped_malformed, parser.stats.skipped_malformed) == {
        "gemini_json": (1, 1), "openhands": (1, 1), "mini_swe_agent": (0, 1),
        "swe_agent": (0, 0)}[fmt]


@pytest.mark.parametrize("fmt", sorted(WHOLE))
def test_no_odd_value_anywhere_loses_the_file(fmt):
    """Every value of the document replaced in turn by each of ODD, with and without
    context turns: never a TranscriptError (before this fix: 60 such losses over the four
    formats), and an entry other than the one changed keeps its record."""
    doc = WHOLE[fmt][0]
    for ctx in (False, True):
        for path in _paths(doc):
            if len(path) < 2:
                continue  # the top-level shape itself: refusing that is right
            for odd in ODD:
                changed = _with(doc, path, odd)
                try:
                    out = [p.text for p in parser_for(fmt, context_turns=ctx).parse(
                        json.dumps(changed).encode())]
                except TranscriptError as e:
                    pytest.fail(f"{fmt} {path} = {odd!r} lost the file: {e}")
                first = path[0] if fmt == "openhands" else path[1]
                if first not in (0, len(doc if fmt == "openhands" else doc[path[0]]) - 1):
                    assert "good zero" in out and "good last" in out, (path, odd, out)


# -- class 1: JSON nested past MAX_JSON_DEPTH is refused before json.loads --------------------

def test_depth_scan_is_exact_outside_strings():
    """Brackets inside strings (escaped quotes included) do not count; the limit is inclusive."""
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert not json_too_deep(ok) and loads(ok) is not None
    assert json_too_deep("[" + ok + "]")
    assert not json_too_deep(json.dumps({"s": "[{" * 5000, "t": 'a"\\[' * 5000}))
    with pytest.raises(TooDeep, match=str(MAX_JSON_DEPTH)):
        loads(b"[" * DEEP + b"]" * DEEP)
    text, n = prune_deep('{"a": 1, "b": ' + "[" * DEEP + "]" * DEEP + ', "c": [2]}')
    doc = json.loads(text)  # the deep value cut to null at MAX_JSON_DEPTH, the rest intact
    assert n == 1 and doc["a"] == 1 and doc["c"] == [2] and not json_too_deep(text)
    assert text.count("[") == MAX_JSON_DEPTH and "null" in text


@pytest.mark.parametrize("fmt", ["generic_jsonl", "claude_code"])
def test_a_line_nested_100000_deep_is_skipped_the_others_kept(fmt, store, tmp_path):
    """Good, 100,000-deep (as an object and as a bare array), good, and a deep last line
    without its newline: the good lines stored, the deep ones counted as too deep."""
    def line(text):
        if fmt == "generic_jsonl":
            return json.dumps({"role": "assistant", "content": text})
        return json.dumps({"type": "assistant", "uuid": text, "sessionId": "s",
                           "cwd": str(tmp_path),
                           "message": {"id": text, "role": "assistant",
                                       "content": [{"type": "text", "text": text}]}})
    deep = '{"role": "assistant", "content": ' + "[" * DEEP + "]" * DEEP + "}"
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join([line("before"), deep, "[" * DEEP, line("after"), deep]))
    report = TranscriptIngester(store, tok, FP).ingest(path)
    assert texts(store, path) == ["after", "before"]
    assert report.skipped_too_deep == 2  # the unterminated deep last line waits for its newline
    with open(path, "a") as f:
        f.write("\n" + line("later") + "\n")
    report = TranscriptIngester(store, tok, FP).ingest(path)
    assert texts(store, path) == ["after", "before", "later"] and report.skipped_too_deep == 1


@pytest.mark.parametrize("fmt", sorted(WHOLE))
def test_a_whole_document_with_a_deep_value_keeps_its_other_entries(fmt, store, tmp_path):
    """A value nested 100,000 deep inside one entry: replaced by null and counted, the
    file parsed, its good entries stored."""
    doc, where, _ = WHOLE[fmt]
    deep = "[" * DEEP + "]" * DEEP
    marker = '"@@DEEP@@"'
    entries = copy.deepcopy(doc)
    target = entries
    for k in where[:-1]:
        target = target[k]
    target.insert(where[-1], {"id": "d", "type": "gemini", "role": "assistant", "source": "agent",
                              "action": "run", "content": "@@DEEP@@", "args": "@@DEEP@@"})
    path = tmp_path / f"{fmt}.json"
    path.write_text(json.dumps(entries).replace(marker, deep))
    report = TranscriptIngester(store, tok, FP).ingest(path, default_scope="s")
    assert (report.files, report.unparseable) == (1, 0), report
    assert report.skipped_too_deep == 2
    stored = texts(store, path)
    assert "good zero" in stored and "good last" in stored


# -- class 2: files that change under the scan --------------------------------------------

def _swap_after_first(action):
    """A ``progress`` callback that runs ``action`` once, after the first file."""
    def progress(done, total):
        if done == 1:
            action()
    return progress


def test_a_file_swapped_for_a_fifo_during_a_scan_is_refused_not_waited_on(tmp_path):
    """b.txt is listed as a file, then replaced by a real FIFO before it is read: the
    scan (in a subprocess, so a regression fails on its timeout) ends, counts it, and
    stores the other files. A FIFO named .gitignore does not hang the walk either."""
    repo = make_repo(tmp_path / "repo", {"a.txt": "alpha\n", "b.txt": "beta\n", "c.txt": "gamma\n"})
    os.mkfifo(repo / "sub.gitignore")
    (repo / "sub").mkdir()
    os.rename(repo / "sub.gitignore", repo / "sub" / ".gitignore")
    out = run_python(f"""
        import json, os
        from pathlib import Path
        from storage.indexer import RepoIndexer
        from storage.store import HistoryStore
        repo = Path({str(repo)!r})
        store = HistoryStore(Path({str(tmp_path / "h.db")!r}))
        def swap(done, total):
            if done == 1:
                os.remove(repo / "b.txt")
                os.mkfifo(repo / "b.txt")
        ix = RepoIndexer(store, repo, lambda s: list(s.encode()), "fp")
        report = ix.scan(swap)
        docs = sorted(p for (p,) in store.db.execute("select path from documents"))
        print(json.dumps({{"refused": report.refused, "docs": docs}}))
    """)
    # Two not read: b.txt, swapped, and the FIFO named sub/.gitignore, which the walk found.
    assert out == {"refused": {NOT_REGULAR: 2}, "docs": ["a.txt", "c.txt"]}


def test_open_checked_refuses_what_it_opened(tmp_path):
    """A FIFO opens at once and is refused (no writer needed); a link is refused where
    links are not followed, read where they are; a directory is not a regular file."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "f").write_text("text")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    for path, follow, reason in [(fifo, False, NOT_REGULAR), (fifo, True, NOT_REGULAR),
                                 (tmp_path / "link", False, SYMLINK),
                                 (tmp_path, True, NOT_REGULAR)]:
        with pytest.raises(Refused) as err:
            open_checked(path, follow=follow)
        assert err.value.reason == reason
    with open_checked(tmp_path / "link", follow=True) as f:
        assert f.read() == b"text"
    with pytest.raises(Refused) as err:
        open_checked(tmp_path / "link", follow=True, root=tmp_path / "elsewhere")
    assert err.value.reason == OUTSIDE


def test_links_out_of_the_repository_swapped_in_during_a_scan_store_nothing(tmp_path):
    """After the listing, a.txt becomes a link to a secret outside the repository, and
    the directory sub/ a link to an outside directory holding the same names: neither
    outside text reaches the repository's scope; each refusal is counted by reason."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside secret\n")
    (outside / "x.txt").write_text("outside x\n")
    repo = make_repo(tmp_path / "repo", {"0.txt": "zero\n", "a.txt": "alpha\n",
                                         "sub/x.txt": "inside x\n"})
    store = HistoryStore(tmp_path / "h.db")

    def swap():
        (repo / "a.txt").unlink()
        (repo / "a.txt").symlink_to(outside / "secret.txt")
        (repo / "sub").rename(repo / "sub.old")
        (repo / "sub").symlink_to(outside, target_is_directory=True)

    report = RepoIndexer(store, repo, tok, FP).scan(_swap_after_first(swap))
    assert report.refused == {SYMLINK: 1, OUTSIDE: 1}
    assert texts(store) == ["zero\n"]
    store.close()


def test_the_watchers_reread_forgets_a_file_turned_link(tmp_path):
    """A stored file replaced by a link to an outside file, reported by the watcher:
    forgotten, the outside text never read (a link is not history, as in the walk: not
    counted, since repositories hold legitimate links)."""
    outside = tmp_path / "secret.txt"
    outside.write_text("outside secret\n")
    repo = make_repo(tmp_path / "repo", {"a.txt": "alpha\n", "b.txt": "beta\n"})
    store = HistoryStore(tmp_path / "h.db")
    ix = RepoIndexer(store, repo, tok, FP)
    ix.scan()
    (repo / "a.txt").unlink()
    (repo / "a.txt").symlink_to(outside)
    report = ix.update(["a.txt"])
    assert report.refused == {} and report.removed == 1
    assert texts(store) == ["beta\n"]
    store.close()


def test_transcripts_a_fifo_a_fifo_in_a_folder_and_an_empty_folder_are_counted(tmp_path, store):
    """Given paths that cannot be read are counted by reason, not passed over in silence;
    the readable transcript beside them is stored."""
    folder = tmp_path / "sessions"
    folder.mkdir()
    (folder / "chat.jsonl").write_text(json.dumps({"role": "assistant", "content": "kept"}) + "\n")
    os.mkfifo(folder / "pipe.jsonl")
    (folder / "link.jsonl").symlink_to(folder / "chat.jsonl")
    fifo = tmp_path / "given.jsonl"
    os.mkfifo(fifo)
    empty = tmp_path / "empty"
    empty.mkdir()
    report = ingest_paths(store, [fifo, folder, empty], tok, FP)
    assert report.refused == {NOT_REGULAR: 2, SYMLINK: 1, EMPTY_FOLDER: 1}
    assert texts(store) == ["kept"] and report.files == 1


def test_a_transcript_swapped_for_a_fifo_is_refused_by_the_ingester(tmp_path):
    """The ingester (as the watcher calls it for an event) given a FIFO where a transcript
    was: refused and counted at once, in a subprocess with a timeout; the records it had
    stored are kept (a transcript that changes shape is not a deletion)."""
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"role": "assistant", "content": "kept"}) + "\n")
    out = run_python(f"""
        import json, os
        from pathlib import Path
        from storage.ingest import TranscriptIngester
        from storage.store import HistoryStore
        path = Path({str(path)!r})
        store = HistoryStore(Path({str(tmp_path / "h.db")!r}))
        ing = TranscriptIngester(store, lambda s: list(s.encode()), "fp")
        ing.ingest(path)
        path.unlink()
        os.mkfifo(path)
        report = ing.ingest(path)
        texts = [t for (t,) in store.db.execute("select text from documents")]
        print(json.dumps({{"refused": report.refused, "texts": texts}}))
    """)
    assert out == {"refused": {NOT_REGULAR: 1}, "texts": ["kept"]}


def test_assistd_index_tells_the_user_what_it_did_not_read(tmp_path):
    """`assistd index REPO --transcripts FIFO --transcripts EMPTY` (real CLI, real model):
    exits, one line per reason in the text output, counts in the JSON."""
    repo = make_repo(tmp_path / "repo", {"a.py": "x = 1\n"})
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = dict(os.environ, ASSISTD_DB=str(tmp_path / "cli.db"))
    args = [sys.executable, "-m", "assistd", "index", str(repo), "--transcripts", str(fifo),
            "--transcripts", str(empty)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"transcripts: 1 not read: {NOT_REGULAR}" in proc.stdout
    assert f"transcripts: 1 not read: {EMPTY_FOLDER}" in proc.stdout
    assert str(fifo) in proc.stderr and str(empty) in proc.stderr  # the warnings name them
    proc = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=300, env=env)
    assert json.loads(proc.stdout)["transcripts"]["refused"] == {NOT_REGULAR: 1, EMPTY_FOLDER: 1}


def test_the_watcher_sees_a_fifo_created_in_a_transcript_folder_and_moves_on(tmp_path):
    """A live watcher (real inotify events) on a transcript folder where a FIFO named
    like a transcript appears, then a real transcript: the batch that carries the FIFO
    ends (in a subprocess, so a regression fails on its timeout), the FIFO counted, the
    transcript stored."""
    folder = tmp_path / "sessions"
    folder.mkdir()
    out = run_python(f"""
        import json, os, time
        from pathlib import Path
        from storage.store import HistoryStore
        from storage.watcher import HistoryWatcher
        folder = Path({str(folder)!r})
        store = HistoryStore(Path({str(tmp_path / "h.db")!r}))
        w = HistoryWatcher(store, lambda s: list(s.encode()), "fp", transcripts=[folder])
        w.start()
        w.scan()
        os.mkfifo(folder / "pipe.jsonl")
        line = json.dumps({{"role": "assistant", "content": "kept"}})
        (folder / "chat.jsonl").write_text(line + "\\n")
        refused, deadline = {{}}, time.monotonic() + 60
        texts = []
        while not texts and time.monotonic() < deadline:
            batch = w.process_batch(timeout=1)
            if batch is not None:
                for reason, n in batch.transcripts.refused.items():
                    refused[reason] = refused.get(reason, 0) + n
            texts = [t for (t,) in store.db.execute("select text from documents")]
        w.stop()
        print(json.dumps({{"refused": refused, "texts": texts}}))
    """)
    assert out["texts"] == ["kept"]
    assert out["refused"].get(NOT_REGULAR, 0) >= 1  # one per event the FIFO raised
