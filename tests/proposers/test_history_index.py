"""`assistd index`: incremental tokenization of a repository into a real SQLite file.

Uses a tokenizer double (UTF-8 bytes as ids) so these tests exercise the store and
the walker alone; the real-model path is covered in test_cli.py.
"""

import os
import sqlite3

import pytest

from storage.indexer import index_repository
from storage.migrations import MIGRATIONS, migrate
from storage.store import HistoryStore, decode_tokens
from tests.conftest import make_repo

FP = "bytes-v1"


def byte_tokens(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def run(store, root, **kw):
    return index_repository(store, root, byte_tokens, FP, **kw)


def paths(store, root):
    return set(store.documents(str(root.resolve())))


def test_index_twice_retokenizes_nothing_then_exactly_one(store, tmp_path):
    """Indexing a 3-file repository tokenizes 3; a second run tokenizes none; after one file
    changes, only that one, and its stored tokens are the new bytes."""
    root = make_repo(tmp_path / "r", {"a.py": "x = 1\n", "b.md": "# b\n", "src/c.js": "let c;\n"})
    first = run(store, root)
    assert (first.tokenized, first.documents) == (3, 3)
    second = run(store, root)
    assert (second.tokenized, second.unchanged, second.tokens) == (0, 3, 0)
    (root / "src/c.js").write_text("let c = 2;\n")
    third = run(store, root)
    assert (third.tokenized, third.unchanged) == (1, 2)
    arrays = {p: ids for _, p, ids in store.token_arrays(str(root.resolve()), FP)}
    assert bytes(arrays["src/c.js"].tolist()) == b"let c = 2;\n"


def test_touched_but_identical_file_is_not_retokenized(store, tmp_path):
    """A file whose mtime changed but whose content did not is counted unchanged, not tokenized
    again."""
    root = make_repo(tmp_path / "r", {"a.py": "x = 1\n"})
    run(store, root)
    st = (root / "a.py").stat()
    os.utime(root / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    report = run(store, root)
    assert (report.tokenized, report.unchanged) == (0, 1)


def test_gitignored_files_never_enter_history(store, tmp_path):
    """Root and nested .gitignore rules (with a ! exception), .git/info/exclude and node_modules
    keep files out: only .gitignore, app.py, pkg/.gitignore, pkg/keep.log and pkg/mod.py are
    stored."""
    root = make_repo(tmp_path / "r", {
        ".gitignore": "*.log\nsecret/\n",
        "app.py": "print(1)\n",
        "debug.log": "noise\n",
        "secret/key.txt": "hunter2\n",
        "pkg/.gitignore": "generated.py\n!keep.log\n",
        "pkg/generated.py": "x\n",
        "pkg/keep.log": "kept\n",
        "pkg/mod.py": "y\n",
        "node_modules/dep/index.js": "z\n",
    })
    (root / ".git" / "info").mkdir()
    (root / ".git" / "info" / "exclude").write_text("local.txt\n")
    (root / "local.txt").write_text("mine\n")
    run(store, root)
    assert paths(store, root) == {".gitignore", "app.py", "pkg/.gitignore", "pkg/keep.log", "pkg/mod.py"}


def test_binary_large_and_non_utf8_files(store, tmp_path):
    """A PNG is skipped as binary, a file over max_bytes as large, a Latin-1 file is stored
    decoded with replacement; a second run skips the binary again without tokenizing."""
    root = make_repo(tmp_path / "r", {
        "img.png": b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
        "big.txt": "a" * 5000,
        "latin1.txt": "caf\xe9\n".encode("latin-1"),
        "ok.txt": "fine\n",
    })
    report = run(store, root, max_bytes=4096)
    assert report.skipped_binary == 1
    assert report.skipped_large == 1
    assert report.decoded_with_replacement == 1
    assert paths(store, root) == {"latin1.txt", "ok.txt"}
    again = run(store, root, max_bytes=4096)
    assert again.skipped_binary == 1 and again.tokenized == 0


def test_deleted_file_is_forgotten_with_its_tokens(store, tmp_path):
    """A file deleted from the repository is counted removed and its document and tokenization
    are deleted."""
    root = make_repo(tmp_path / "r", {"a.py": "a\n", "b.py": "b\n"})
    run(store, root)
    (root / "b.py").unlink()
    report = run(store, root)
    assert report.removed == 1
    assert paths(store, root) == {"a.py"}
    n = store.db.execute("select count(*) from tokenizations").fetchone()[0]
    assert n == 1


def test_other_tokenizer_gets_its_own_tokenization(store, tmp_path):
    """A different fingerprint never reads foreign ids: it tokenizes the stored text anew."""
    root = make_repo(tmp_path / "r", {"a.py": "ab\n"})
    run(store, root)
    report = index_repository(store, root, lambda t: [ord(c) + 1000 for c in t], "other-v1")
    assert report.tokenized == 1
    mine = store.token_arrays(str(root.resolve()), FP)[0][2].tolist()
    theirs = store.token_arrays(str(root.resolve()), "other-v1")[0][2].tolist()
    assert mine == [97, 98, 10] and theirs == [1097, 1098, 1010]


def test_symlink_loop_and_vanished_target_do_not_stop_indexing(store, tmp_path):
    """A symlink loop and a dangling symlink are passed over: the one real file is indexed."""
    root = make_repo(tmp_path / "r", {"a.py": "a\n"})
    os.symlink(root, root / "loop")
    os.symlink(root / "missing.py", root / "dangling.py")
    report = run(store, root)
    assert paths(store, root) == {"a.py"}
    assert report.documents == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of permissions")
def test_unreadable_file_is_counted(store, tmp_path):
    """A file without read permission is counted as skipped_unreadable."""
    root = make_repo(tmp_path / "r", {"a.py": "a\n", "locked.py": "b\n"})
    (root / "locked.py").chmod(0)
    report = run(store, root)
    assert report.skipped_unreadable == 1


def test_token_blob_is_compact_uint32(store, tmp_path):
    """Token ids are stored as a little-endian uint32 blob: 4 bytes a token, 'abc' decoding to
    [97, 98, 99]."""
    root = make_repo(tmp_path / "r", {"a.py": "abc"})
    run(store, root)
    blob, n = store.db.execute("select token_ids, num_tokens from tokenizations").fetchone()
    assert len(blob) == 4 * n == 12
    assert decode_tokens(blob).tolist() == [97, 98, 99]


def _schema(db) -> dict:
    return {t: [(c.name, c.type, c.notnull, c.default_value) for c in db[t].columns]
            for t in sorted(db.table_names()) if t != "_assistd_migrations"}


def test_schema_from_blank_and_rerun_is_idempotent(tmp_path):
    """Migrations build the documented columns; re-running them changes nothing."""
    s = HistoryStore(tmp_path / "h.db")
    cols = {t: [c.name for c in s.db[t].columns] for t in ("scopes", "documents", "tokenizations")}
    assert cols["documents"] == [
        "id", "scope", "path", "source_kind", "language_id", "content_hash", "num_bytes",
        "mtime_ns", "text", "decoded_with_replacement", "created_utc", "updated_utc",
        "source", "record_key", "ordinal", "record_kind", "redactions", "last_used_utc",
    ]
    assert cols["tokenizations"] == [
        "document_id", "tokenizer_fingerprint", "content_hash", "token_ids", "num_tokens",
        "created_utc",
    ]
    assert cols["scopes"] == ["root", "indexed_utc", "recursive", "last_used_utc"]
    assert set(s.db.table_names()) >= {"transcripts", "changes"}
    before = _schema(s.db)
    assert migrate(s.db) == []
    for _, fn in MIGRATIONS:  # a crash after a migration ran but before it was recorded
        fn(s.db)
    assert _schema(s.db) == before
    assert s.db.execute("pragma journal_mode").fetchone()[0] == "wal"
    s.close()


def test_upgrade_from_oldest_schema_equals_blank(tmp_path):
    """A database written by the first release (m001 only, with a document in it) is
    upgraded to exactly the schema a blank database gets, keeping its rows."""
    import sqlite3

    import sqlite_utils

    old = sqlite_utils.Database(sqlite3.connect(tmp_path / "old.db", isolation_level=None))
    old["_assistd_migrations"].create({"name": str, "applied_utc": float}, pk="name")
    MIGRATIONS[0][1](old)
    old["_assistd_migrations"].insert({"name": MIGRATIONS[0][0], "applied_utc": 0.0})
    old["documents"].insert({"scope": "/r", "path": "a.py", "source_kind": "repo",
                             "content_hash": "h", "text": "x = 1\n"})
    old.conn.close()

    upgraded = HistoryStore(tmp_path / "old.db")
    blank = HistoryStore(tmp_path / "blank.db")
    assert _schema(upgraded.db) == _schema(blank.db)
    row = upgraded.db.execute("select path, text, redactions from documents").fetchone()
    assert row == ("a.py", "x = 1\n", 0)
    upgraded.close()
    blank.close()


def test_database_file_is_private(tmp_path):
    """The history is created 0600 (and its new directory 0700): it holds private source."""
    import stat

    s = HistoryStore(tmp_path / "new" / "h.db")
    s.db.execute("create table if not exists t (x)")  # force the -wal file into being
    assert stat.S_IMODE((tmp_path / "new" / "h.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    for side in ("h.db-wal", "h.db-shm"):
        p = tmp_path / "new" / side
        if p.exists():
            assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, side
    s.close()


def test_corrupt_database_is_a_clear_error(tmp_path):
    """A file that is not SQLite raises HistoryError ('cannot open history database', 'move the
    damaged file aside') and is left byte for byte as it was."""
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    from assistd.ground.errors import HistoryError

    with pytest.raises(HistoryError, match="cannot open history database") as e:
        HistoryStore(bad)
    assert "move the damaged file aside" in str(e.value)
    assert bad.read_bytes() == b"this is not sqlite" * 100  # nothing lost or overwritten


def test_language_ids_are_recorded(store, tmp_path):
    """Documents get LSP language ids from their names: python, typescript, makefile, and
    plaintext for an unknown extension."""
    root = make_repo(tmp_path / "r", {"a.py": "a", "b.ts": "b", "Makefile": "all:", "c.xyz": "c"})
    run(store, root)
    got = {d.path: d.language_id for d in store.documents(str(root.resolve())).values()}
    assert got == {"a.py": "python", "b.ts": "typescript", "Makefile": "makefile", "c.xyz": "plaintext"}


def test_non_recursive_scope_indexes_only_the_top_directory(store, tmp_path):
    """Outside a git repository `complete` indexes only the file's own directory."""
    root = tmp_path / "loose"
    (root / "deep").mkdir(parents=True)
    (root / "notes.txt").write_text("n\n")
    (root / "deep" / "other.txt").write_text("o\n")
    run(store, root, recursive=False)
    assert paths(store, root) == {"notes.txt"}


def test_non_utf8_file_name_is_skipped_and_counted(store, tmp_path):
    """A file name that is not UTF-8 is skipped and counted as skipped_unreadable."""
    root = make_repo(tmp_path / "r", {"a.py": "a\n"})
    with open(os.path.join(os.fsencode(root), b"bad\xffname.py"), "wb") as f:
        f.write(b"x = 1\n")
    report = run(store, root)
    assert paths(store, root) == {"a.py"}
    assert report.skipped_unreadable == 1


def test_fifo_is_skipped_not_read(store, tmp_path):
    """A named pipe would block a read forever: only regular files are indexed."""
    root = make_repo(tmp_path / "r", {"a.py": "a\n"})
    os.mkfifo(root / "pipe.py")
    run(store, root)
    assert paths(store, root) == {"a.py"}


def test_concurrent_indexers_on_one_database(tmp_path):
    """Writers queue on BEGIN IMMEDIATE: no UNIQUE-constraint race, one row per file."""
    import threading

    root = make_repo(tmp_path / "r", {f"m{i}.py": f"x = {i}\n" * 20 for i in range(300)})
    db = tmp_path / "h.db"
    HistoryStore(db).close()
    errors = []

    def worker():
        s = HistoryStore(db)
        try:
            run(s, root)
        except Exception as e:  # noqa: BLE001 - the assertion below reports it
            errors.append(e)
        finally:
            s.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = HistoryStore(db)
    assert s.db.execute("select count(*) from documents").fetchone()[0] == 300
    assert s.db.execute("select count(*) from tokenizations").fetchone()[0] == 300
    s.close()


def execute_sql(path, statement):
    conn = sqlite3.connect(path)
    conn.execute(statement)
    conn.commit()
    conn.close()


def test_foreign_and_newer_databases_are_refused(tmp_path):
    """A database with another program's tables, or with a migration this assistd does not know,
    is refused with a HistoryError that says which."""
    from assistd.ground.errors import HistoryError

    other = tmp_path / "other.db"
    execute_sql(other, "create table documents (title text)")
    with pytest.raises(HistoryError, match="not an assistd history database"):
        HistoryStore(other)

    newer = tmp_path / "newer.db"
    HistoryStore(newer).close()
    execute_sql(newer, "insert into _assistd_migrations values ('m999_future', 0)")
    with pytest.raises(HistoryError, match="newer assistd"):
        HistoryStore(newer)


def test_scope_remembers_recursive_indexing(store, tmp_path):
    """A scope records whether it was last indexed recursively or not."""
    root = tmp_path / "loose"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "x.py").write_text("x\n")
    run(store, root, recursive=True)
    assert store.scope_recursive(str(root.resolve()))
    run(store, root, recursive=False)
    assert not store.scope_recursive(str(root.resolve()))
