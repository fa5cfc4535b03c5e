"""The live watcher: real watchdog observer, real files, real SQLite.

Each test starts a :class:`HistoryWatcher` on a temporary repository, changes files
the way editors, git and shells do, and processes event batches until the store
shows the change (or a deadline passes). A tokenizer double (UTF-8 bytes as ids)
that counts its calls shows what was (re-)tokenized.
"""

from __future__ import annotations

import os
import time

import pytest

from storage.store import HistoryStore
from storage.watcher import HistoryWatcher
from tests.conftest import make_repo

FP = "bytes-v1"


class CountingTokenizer:
    def __init__(self):
        self.texts: list[str] = []

    def __call__(self, text: str) -> list[int]:
        self.texts.append(text)
        return list(text.encode("utf-8"))


@pytest.fixture
def watched(tmp_path):
    """(watcher, store, root, tokenizer) with the initial scan done and watching."""
    root = make_repo(tmp_path / "repo", {
        "a.py": "alpha = 1\n", "src/b.py": "beta = 2\n", ".gitignore": "secret/\n*.log\n",
    })
    store = HistoryStore(tmp_path / "h.db")
    tok = CountingTokenizer()
    w = HistoryWatcher(store, tok, FP, repos=[root], debounce_s=0.05, max_delay_s=0.5)
    w.start()
    w.scan()
    tok.texts.clear()
    yield w, store, root.resolve(), tok
    w.stop()
    store.close()


def paths(store, root):
    return set(store.documents(str(root)))


def text_of(store, root, rel):
    doc = store.documents(str(root)).get(rel)
    return None if doc is None else store.document_text(doc.id)


def settle(w, until, timeout=10.0):
    """Process batches until ``until()`` is true; return the batches processed."""
    batches = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = w.process_batch(timeout=0.2)
        if b is not None:
            batches.append(b)
        if until():
            # drain what is still queued for this change (e.g. a trailing close event)
            while (b := w.process_batch(timeout=0.3)) is not None:
                batches.append(b)
            return batches
    raise AssertionError("the watcher did not reach the expected state in time")


def test_create_modify_delete_reach_the_store(watched):
    """A file created, a file rewritten and a file deleted under a watched repository each reach
    the store."""
    w, store, root, _ = watched
    (root / "c.md").write_text("# new\n")
    settle(w, lambda: "c.md" in paths(store, root))
    (root / "a.py").write_text("alpha = 100\n")
    settle(w, lambda: text_of(store, root, "a.py") == "alpha = 100\n")
    (root / "src/b.py").unlink()
    settle(w, lambda: "src/b.py" not in paths(store, root))
    assert paths(store, root) == {"a.py", "c.md", ".gitignore"}


def test_move_and_directory_move(watched):
    """A renamed file and a renamed folder move their documents: the old paths are gone and the
    text is kept under the new ones."""
    w, store, root, _ = watched
    os.rename(root / "a.py", root / "renamed.py")
    settle(w, lambda: "renamed.py" in paths(store, root) and "a.py" not in paths(store, root))
    os.rename(root / "src", root / "lib")
    settle(w, lambda: "lib/b.py" in paths(store, root))
    assert not any(p.startswith("src/") for p in paths(store, root))
    assert text_of(store, root, "lib/b.py") == "beta = 2\n"


def test_editor_atomic_save_is_one_tokenization(watched):
    """Write a temp file, then rename it over the original (vim, VS Code, JetBrains)."""
    w, store, root, tok = watched
    tmp = root / ".a.py.swp~"
    tmp.write_text("alpha = 'saved'\n")
    os.replace(tmp, root / "a.py")
    settle(w, lambda: text_of(store, root, "a.py") == "alpha = 'saved'\n")
    assert tok.texts == ["alpha = 'saved'\n"]
    assert ".a.py.swp~" not in paths(store, root)


def test_checkout_burst_of_2000_files_is_coalesced(watched):
    """A burst like `git checkout`: 2,000 files created, each written three times
    (open/truncate/write) with its final content; every file is tokenized exactly once."""
    w, store, root, tok = watched
    for i in range(2000):
        p = root / "gen" / f"d{i // 200}" / f"m{i}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            p.write_text(f"value_{i} = {i}\n")
    batches = settle(w, lambda: len(paths(store, root)) == 2003, timeout=120)
    assert len(tok.texts) == 2000
    assert sorted(tok.texts) == sorted(f"value_{i} = {i}\n" for i in range(2000))
    # Coalesced into a handful of batches, not one per event (>= 6,000 events).
    assert sum(b.events for b in batches) >= 2000
    assert len(batches) < 100


def test_ignored_paths_never_reach_the_store(watched):
    """Files under .gitignore'd, built-in ignored (node_modules, .venv, .git, build) and .env
    paths are neither stored nor tokenized."""
    w, store, root, tok = watched
    for rel in ("secret/key.txt", "debug.log", "node_modules/x/index.js", ".venv/lib/site.py",
                ".git/HEAD", "build/out.js", ".env"):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("ignored content\n")
    (root / "visible.py").write_text("seen = True\n")  # a marker that the batch ran
    settle(w, lambda: "visible.py" in paths(store, root))
    assert paths(store, root) == {"a.py", "src/b.py", ".gitignore", "visible.py"}
    assert all("ignored content" not in t for t in tok.texts)


def test_gitignore_change_rescans(watched):
    """Adding src/ to .gitignore rescans the repository and drops src/b.py; a.py stays."""
    w, store, root, _ = watched
    (root / ".gitignore").write_text("secret/\n*.log\nsrc/\n")
    settle(w, lambda: "src/b.py" not in paths(store, root))
    assert "a.py" in paths(store, root)


def test_binary_and_huge_files_are_skipped_live(watched):
    """A binary file and one over max_bytes written while watching are not stored and are
    counted once each as skipped_binary and skipped_large."""
    w, store, root, _ = watched
    w.indexers[0].max_bytes = 1000
    (root / "blob.bin").write_bytes(b"\x00\x01" * 100)
    (root / "huge.txt").write_text("x" * 5000)
    (root / "marker.py").write_text("m = 1\n")
    batches = settle(w, lambda: "marker.py" in paths(store, root))
    assert {"blob.bin", "huge.txt"}.isdisjoint(paths(store, root))
    assert sum(r.skipped_binary for b in batches for r in b.repos) == 1
    assert sum(r.skipped_large for b in batches for r in b.repos) == 1


def test_file_vanishing_mid_scan_is_counted_not_fatal(tmp_path):
    """A file listed by the scan but deleted before it is read (here: deleted by the
    tokenizer while it handles the file before it) is counted as vanished, not unreadable."""
    root = make_repo(tmp_path / "repo", {"a.py": "a = 1\n", "b.py": "b = 2\n"})
    store = HistoryStore(tmp_path / "h.db")

    def tokenize(text):
        if text == "a = 1\n":
            (root / "b.py").unlink()
        return list(text.encode())

    w = HistoryWatcher(store, tokenize, FP, repos=[root])
    (reports, _) = w.scan()
    assert (reports[0].vanished, reports[0].skipped_unreadable) == (1, 0)
    assert set(store.documents(str(root.resolve()))) == {"a.py"}
    store.close()


def test_transcript_appends_are_followed_live(tmp_path):
    """A Claude Code style JSONL session grows line by line; each appended assistant
    record becomes visible, a half-written line waits for its end."""
    import json

    tdir = tmp_path / "claude" / "projects" / "-proj"
    tdir.mkdir(parents=True)
    session = tdir / "s1.jsonl"

    def line(i):
        return json.dumps({
            "type": "assistant", "cwd": str(tmp_path / "proj"), "uuid": f"u{i}",
            "sessionId": "s1", "message": {"id": f"msg_{i}", "role": "assistant",
                                           "content": [{"type": "text", "text": f"reply {i}"}]},
        }) + "\n"

    session.write_text(line(0))
    store = HistoryStore(tmp_path / "h.db")
    w = HistoryWatcher(store, CountingTokenizer(), FP, transcripts=[tmp_path / "claude"])
    w.start()
    try:
        w.scan()

        def texts():
            return sorted(r[0] for r in store.db.execute(
                "select text from documents where source_kind = 'transcript'"))

        assert texts() == ["reply 0"]
        with open(session, "a") as f:
            f.write(line(1))
            half = line(2)
            f.write(half[:20])
            f.flush()
            settle(w, lambda: texts() == ["reply 0", "reply 1"])
            f.write(half[20:])
        settle(w, lambda: texts() == ["reply 0", "reply 1", "reply 2"])
    finally:
        w.stop()
        store.close()


def test_repository_deleted_and_recreated_is_watched_again(tmp_path):
    """`rm -rf repo; git init repo` under --watch: the old watch died with the directory;
    the watcher notices the root is back, watches it again and indexes its files."""
    import shutil

    root = make_repo(tmp_path / "repo", {"a.py": "a = 1\n"}).resolve()
    store = HistoryStore(tmp_path / "h.db")
    w = HistoryWatcher(store, CountingTokenizer(), FP, repos=[root])
    w.start()
    w.scan()
    try:
        shutil.rmtree(root)
        w.process_batch(timeout=1.0)
        w._check_roots()
        assert paths(store, root) == set()
        make_repo(root, {"d.py": "d = 1\n"})
        w._check_roots()  # the run loop does this after every batch or idle second
        assert paths(store, root) == {"d.py"}
        (root / "e.py").write_text("e = 2\n")
        settle(w, lambda: "e.py" in paths(store, root))
    finally:
        w.stop()
        store.close()
