"""HistoryStore: documents and their token ids in SQLite (WAL, one writer, many readers).

Writes that belong together (a document's text and its tokenization) go in one
transaction, so a crash or kill at any moment leaves either the old or the new
version of a document, never half of each.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import platformdirs
import sqlite_utils

from assistd.ground.errors import HistoryError
from storage.migrations import check_current, migrate

TOKEN_DTYPE = np.dtype("<u4")
# The key of a ``transcripts`` row's ``state`` JSON that marks the file forgotten (the
# time, s since epoch); see :meth:`HistoryStore.mark_transcript_forgotten`.
FORGOTTEN_KEY = "assistd_forgotten_utc"


def _with_forgotten(state: str | None, forgotten_utc: float) -> str:
    """A transcript row's ``state`` JSON with the forgotten mark set."""
    try:
        d = json.loads(state or "{}")
    except ValueError:
        d = {}
    if not isinstance(d, dict):
        d = {}
    return json.dumps({**d, FORGOTTEN_KEY: forgotten_utc})


def _create_private(path: Path) -> None:
    """Create the database file 0600 (and a new parent directory 0700) before SQLite
    opens it: the history holds private source text. SQLite gives the -wal and -shm
    files the main file's permissions."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)


def default_db_path() -> Path:
    """``$ASSISTD_DB`` if set, else ``<user data dir>/assistd/history.db`` (platformdirs)."""
    env = os.environ.get("ASSISTD_DB")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("assistd", appauthor=False)) / "history.db"


def encode_tokens(token_ids) -> bytes:
    """Token ids -> compact blob: little-endian uint32, 4 bytes per token."""
    return np.asarray(token_ids, dtype=TOKEN_DTYPE).tobytes()


def decode_tokens(blob: bytes) -> np.ndarray:
    """Blob from :func:`encode_tokens` -> int64 array ``[num_tokens]``."""
    return np.frombuffer(blob, dtype=TOKEN_DTYPE).astype(np.int64)


@dataclass(frozen=True)
class Document:
    """A stored document's metadata (no text, no tokens)."""

    id: int
    scope: str
    path: str
    source_kind: str
    language_id: str
    content_hash: str
    num_bytes: int
    mtime_ns: int


class HistoryStore:
    """The SQLite history. Open with a path; the schema is created or upgraded on open.

    ``read_only``: for a reader beside the writer (vLLM's proposer,
    :mod:`assistd.fleet.vllm_proposer`): SQLite's ``mode=ro``, nothing created or
    migrated, any write fails; the schema must be this assistd's.

    Raises :class:`HistoryError` when the file cannot be opened as a database (read-only:
    also when it does not exist or its schema is another version's).
    """

    def __init__(self, path: str | Path, *, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        self._depth = 0  # nesting of _write(): inner blocks join the outer transaction
        try:
            if read_only:
                conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                       timeout=30, isolation_level=None)
                self.db = sqlite_utils.Database(conn)
                self.db.execute("PRAGMA busy_timeout = 30000")
                check_current(self.db)
                return
            _create_private(self.path)
            # Autocommit mode: write transactions are explicit (see _write), so a
            # read-then-write is never split between two concurrent writers.
            conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
            self.db = sqlite_utils.Database(conn)
            self.db.execute("PRAGMA busy_timeout = 30000")
            self.db.enable_wal()
            self.db.execute("PRAGMA synchronous = NORMAL")
            self.db.execute("PRAGMA foreign_keys = ON")
            # Forgetting is real: deleted text and tokens are overwritten with zeros
            # in the file, not left in free pages until the next VACUUM.
            self.db.execute("PRAGMA secure_delete = ON")
            migrate(self.db)  # idempotent steps: safe when two processes open at once
        except HistoryError:
            raise
        except (sqlite3.DatabaseError, OSError, sqlite_utils.db.AlterError) as e:
            damaged = "not a database" in str(e) or "malformed" in str(e)
            hint = ("move the damaged file aside (`assistd index` rebuilds the history), or "
                    if damaged else "")
            where = ("it must exist, in a folder this process may write (SQLite's -wal and"
                     " -shm files), or the daemon be running" if read_only else
                     "pass --db FILE or set ASSISTD_DB to a writable path")
            raise HistoryError(
                f"cannot open history database {self.path}: {e}; {hint}{where}"
            ) from e

    def close(self) -> None:
        self.db.conn.close()

    def checkpoint(self) -> bool:
        """Copy the WAL into the database file and cut the WAL to 0 bytes (``PRAGMA
        wal_checkpoint(TRUNCATE)``), so the old versions of pages a delete overwrote
        (``secure_delete``) are in neither file while other connections (the daemon's)
        keep it open. Waits up to the busy timeout (30 s) for their reads and writes;
        returns False when one still held the WAL then (it is left as it was)."""
        busy, _, _ = self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return not busy

    @contextmanager
    def _write(self):
        """One write transaction. BEGIN IMMEDIATE takes the write lock up front, so
        concurrent writers (two `assistd index` runs) queue instead of racing.
        Nested blocks join the outermost one: it commits or rolls back all of them."""
        c = self.db.conn
        if self._depth:
            self._depth += 1
            try:
                yield c
            finally:
                self._depth -= 1
            return
        c.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield c
        except BaseException:
            self._depth = 0
            c.execute("ROLLBACK")
            raise
        self._depth = 0
        c.execute("COMMIT")

    transaction = _write

    # -- reads -------------------------------------------------------------

    def documents(self, scope: str, source_kind: str = "repo") -> dict[str, Document]:
        """Documents of one scope and kind, keyed by path."""
        rows = self.db.execute(
            "select id, scope, path, source_kind, language_id, content_hash, num_bytes,"
            " mtime_ns from documents where scope = ? and source_kind = ?",
            [scope, source_kind],
        ).fetchall()
        return {r[2]: Document(*r) for r in rows}

    def tokenized_ids(self, scope: str, fingerprint: str) -> dict[int, str]:
        """document id -> content hash of its tokenization for this tokenizer."""
        rows = self.db.execute(
            "select t.document_id, t.content_hash from tokenizations t"
            " join documents d on d.id = t.document_id"
            " where d.scope = ? and t.tokenizer_fingerprint = ?",
            [scope, fingerprint],
        ).fetchall()
        return dict(rows)

    def token_arrays(self, scope: str, fingerprint: str) -> list[tuple[int, str, np.ndarray]]:
        """All tokenized documents of a scope for one tokenizer: ``(id, path, ids[num_tokens])``.

        Only tokenizations whose content hash matches the document's current hash
        are returned, so a stale tokenization is never used.
        """
        rows = self.db.execute(
            "select d.id, d.path, t.token_ids from documents d"
            " join tokenizations t on t.document_id = d.id"
            " where d.scope = ? and t.tokenizer_fingerprint = ?"
            " and t.content_hash = d.content_hash order by d.id",
            [scope, fingerprint],
        ).fetchall()
        return [(i, p, decode_tokens(b)) for i, p, b in rows]

    def iter_token_arrays(self, scope: str, fingerprint: str, min_id: int = 0):
        """Like :meth:`token_arrays`, streamed and without copies: yields
        ``(id, path, ids uint32[num_tokens])`` (read-only views of the blobs) for
        documents with ``id >= min_id``, in id order."""
        cur = self.db.execute(
            "select d.id, d.path, t.token_ids from documents d"
            " join tokenizations t on t.document_id = d.id"
            " where d.scope = ? and t.tokenizer_fingerprint = ? and d.id >= ?"
            " and t.content_hash = d.content_hash order by d.id",
            [scope, fingerprint, min_id],
        )
        for i, p, b in cur:
            yield i, p, np.frombuffer(b, dtype=TOKEN_DTYPE)

    def token_counts(self, scope: str, fingerprint: str) -> list[tuple[int, int]]:
        """``(id, num_tokens)`` of a scope's documents tokenized by ``fingerprint``, by id."""
        return self.db.execute(
            "select d.id, t.num_tokens from documents d"
            " join tokenizations t on t.document_id = d.id"
            " where d.scope = ? and t.tokenizer_fingerprint = ?"
            " and t.content_hash = d.content_hash order by d.id",
            [scope, fingerprint],
        ).fetchall()

    def scope_summary(self, scope: str, fingerprint: str) -> dict:
        """``{"scope", "documents", "tokens"}`` for the documents usable by this tokenizer."""
        n_docs, n_tokens = self.db.execute(
            "select count(*), coalesce(sum(t.num_tokens), 0) from documents d"
            " join tokenizations t on t.document_id = d.id"
            " where d.scope = ? and t.tokenizer_fingerprint = ?"
            " and t.content_hash = d.content_hash",
            [scope, fingerprint],
        ).fetchone()
        return {"scope": scope, "documents": n_docs, "tokens": n_tokens}

    # -- writes ------------------------------------------------------------

    def put_document(
        self,
        *,
        scope: str,
        path: str,
        source_kind: str,
        language_id: str,
        content_hash: str,
        num_bytes: int,
        mtime_ns: int,
        text: str,
        decoded_with_replacement: bool,
        fingerprint: str,
        token_ids,
        source: str | None = None,
        record_key: str | None = None,
        ordinal: int | None = None,
        record_kind: str | None = None,
        redactions: int = 0,
    ) -> int | None:
        """Insert or replace a document and its tokenization atomically; return its id.

        ``text`` must already be redacted (see :mod:`storage.secrets`); ``redactions``
        counts the secret values replaced in it. Transcript records also give the
        transcript file (``source``), their ``record_key``, ``ordinal`` and ``record_kind``.
        A record of a transcript ``history forget`` forgot is not stored (returns None):
        what the agent appends to it later stays out too, until the file is rewritten.
        """
        now = time.time()
        blob = encode_tokens(token_ids)
        with self._write() as c:  # one transaction: text and tokens change together
            if source_kind == "transcript" and source is not None \
                    and self._forgotten_utc(c, source) is not None:
                return None
            row = c.execute(
                "select id from documents where scope = ? and source_kind = ? and path = ?",
                [scope, source_kind, path],
            ).fetchone()
            if row is None:
                cur = c.execute(
                    "insert into documents (scope, path, source_kind, language_id,"
                    " content_hash, num_bytes, mtime_ns, text, decoded_with_replacement,"
                    " created_utc, updated_utc, source, record_key, ordinal, record_kind,"
                    " redactions) values (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [scope, path, source_kind, language_id, content_hash, num_bytes,
                     mtime_ns, text, int(decoded_with_replacement), now, now, source,
                     record_key, ordinal, record_kind, redactions],
                )
                doc_id = cur.lastrowid
            else:
                doc_id = row[0]
                c.execute(
                    "update documents set language_id = ?, content_hash = ?, num_bytes = ?,"
                    " mtime_ns = ?, text = ?, decoded_with_replacement = ?, updated_utc = ?,"
                    " source = ?, record_key = ?, ordinal = ?, record_kind = ?, redactions = ?"
                    " where id = ?",
                    [language_id, content_hash, num_bytes, mtime_ns, text,
                     int(decoded_with_replacement), now, source, record_key, ordinal,
                     record_kind, redactions, doc_id],
                )
                # Tokenizations of the old text, for any tokenizer, are stale now.
                c.execute("delete from tokenizations where document_id = ?", [doc_id])
            c.execute(
                "insert or replace into tokenizations (document_id, tokenizer_fingerprint,"
                " content_hash, token_ids, num_tokens, created_utc) values (?,?,?,?,?,?)",
                [doc_id, fingerprint, content_hash, blob, len(blob) // 4, now],
            )
            self._log_change(c, doc_id, scope, "put", now)
        return doc_id

    @staticmethod
    def _log_change(c, doc_id: int, scope: str, op: str, now: float) -> None:
        c.execute("insert into changes (document_id, scope, op, utc) values (?,?,?,?)",
                  [doc_id, scope, op, now])

    def add_tokenization(self, doc_id: int, fingerprint: str, content_hash: str, token_ids) -> None:
        """Store the tokenization of an unchanged document for another tokenizer."""
        blob = encode_tokens(token_ids)
        now = time.time()
        with self._write() as c:
            c.execute(
                "insert or replace into tokenizations (document_id, tokenizer_fingerprint,"
                " content_hash, token_ids, num_tokens, created_utc) values (?,?,?,?,?,?)",
                [doc_id, fingerprint, content_hash, blob, len(blob) // 4, now],
            )
            row = c.execute("select scope from documents where id = ?", [doc_id]).fetchone()
            if row is not None:  # an index for this tokenizer must (re)read it
                self._log_change(c, doc_id, row[0], "put", now)

    def document_text(self, doc_id: int) -> str:
        return self.db.execute("select text from documents where id = ?", [doc_id]).fetchone()[0]

    def touch(self, doc_id: int, mtime_ns: int) -> None:
        """Record a new mtime for a document whose content did not change."""
        with self._write() as c:
            c.execute("update documents set mtime_ns = ? where id = ?", [mtime_ns, doc_id])

    def remove_documents(self, doc_ids) -> int:
        """Forget documents and all their tokenizations, atomically; return how many."""
        doc_ids = list(doc_ids)
        if not doc_ids:
            return 0
        now = time.time()
        with self._write() as c:
            for doc_id in doc_ids:
                row = c.execute("select scope from documents where id = ?", [doc_id]).fetchone()
                if row is None:
                    continue
                c.execute("delete from tokenizations where document_id = ?", [doc_id])
                c.execute("delete from documents where id = ?", [doc_id])
                self._log_change(c, doc_id, row[0], "delete", now)
        return len(doc_ids)

    def changes_since(self, seq: int) -> list[tuple[int, int, str, str]]:
        """``(seq, document_id, scope, op)`` rows logged after ``seq``, oldest first.

        An in-memory index remembers the last seq it applied and replays the rest:
        ``put`` means (re)read the document, ``delete`` means drop its tokens. Only the
        last ``storage.retention.CHANGES_KEEP`` rows are kept: an index whose seq is
        older than the first row left must rebuild from the documents.
        """
        return self.db.execute(
            "select seq, document_id, scope, op from changes where seq > ? order by seq", [seq]
        ).fetchall()

    def last_change_seq(self) -> int:
        """The seq of the newest ``changes`` row (0 when there is none)."""
        return self.db.execute("select coalesce(max(seq), 0) from changes").fetchone()[0]

    def first_change_seq(self) -> int | None:
        """The seq of the oldest ``changes`` row still kept, or None."""
        return self.db.execute("select min(seq) from changes").fetchone()[0]

    def document_tokens(self, doc_id: int, fingerprint: str) -> tuple[str, np.ndarray] | None:
        """``(path, ids[num_tokens])`` of one document for one tokenizer, or None when the
        document is gone or has no current tokenization for it."""
        row = self.db.execute(
            "select d.path, t.token_ids from documents d"
            " join tokenizations t on t.document_id = d.id"
            " where d.id = ? and t.tokenizer_fingerprint = ? and t.content_hash = d.content_hash",
            [doc_id, fingerprint],
        ).fetchone()
        return None if row is None else (row[0], decode_tokens(row[1]))

    def mark_indexed(self, scope: str, recursive: bool) -> None:
        with self._write() as c:
            c.execute(
                "insert or replace into scopes (root, indexed_utc, recursive) values (?, ?, ?)",
                [scope, time.time(), int(recursive)],
            )

    def has_scope(self, scope: str) -> bool:
        """Whether the scope has ever been indexed."""
        return self.db.execute("select 1 from scopes where root = ?", [scope]).fetchone() is not None

    def scope_recursive(self, scope: str) -> bool:
        """Whether the scope was last indexed with its subdirectories."""
        row = self.db.execute("select recursive from scopes where root = ?", [scope]).fetchone()
        return bool(row and row[0])

    def mark_used(self, scope: str) -> None:
        """Record that a completion drafted from ``scope`` now (eviction keeps used scopes)."""
        with self._write() as c:
            c.execute("update scopes set last_used_utc = ? where root = ?", [time.time(), scope])

    # -- transcripts ---------------------------------------------------------

    def transcript_state(self, path: str) -> dict | None:
        """The tailing state of a transcript file (a ``transcripts`` row as a dict), or None."""
        rows = list(self.db["transcripts"].rows_where("path = ?", [path]))
        return rows[0] if rows else None

    def save_transcript_state(self, row: dict) -> None:
        """Insert or replace a ``transcripts`` row; call inside the transaction that
        stored the records read up to ``row["offset"]``, so both commit together.
        A forgotten file's mark is kept (:meth:`mark_transcript_forgotten`): only
        :meth:`forget_transcript` (the file was rewritten) drops it."""
        with self._write() as c:
            forgotten = self._forgotten_utc(c, row["path"])
            if forgotten is not None:
                row = {**row, "state": _with_forgotten(row.get("state"), forgotten)}
            cols = list(row)
            c.execute(
                f"insert or replace into transcripts ({', '.join(cols)})"
                f" values ({', '.join('?' for _ in cols)})",
                [row[k] for k in cols],
            )

    def transcript_records(self, source: str) -> dict[str, tuple[int, int, str]]:
        """Records stored from one transcript file: record_key -> (document id, ordinal, scope)."""
        rows = self.db.execute(
            "select record_key, id, ordinal, scope from documents"
            " where source = ? and source_kind = 'transcript'", [source]
        ).fetchall()
        return {k: (i, o, s) for k, i, o, s in rows}

    def mark_transcript_forgotten(self, path: str) -> bool:
        """Mark a transcript file forgotten (``history forget``): its tailing row stays,
        so the records already read do not come back, and no record of it is stored
        again (:meth:`put_document`) while the file is appended to or, for whole-JSON
        formats, saved again (a save repeats the forgotten messages). Its ingester
        drops the row, and the mark with it, when the file is rewritten (truncated,
        replaced by another inode, its head changed). Returns whether a row was marked."""
        with self._write() as c:
            row = c.execute("select state from transcripts where path = ?", [path]).fetchone()
            if row is None:
                return False
            c.execute("update transcripts set state = ? where path = ?",
                      [_with_forgotten(row[0], time.time()), path])
        return True

    def transcript_forgotten(self, path: str) -> bool:
        """Whether ``history forget`` forgot this transcript file since it was last rewritten."""
        return self._forgotten_utc(self.db.conn, path) is not None

    @staticmethod
    def _forgotten_utc(c, path: str) -> float | None:
        """When the transcript file ``path`` was forgotten (s since epoch), or None. The
        mark is a key of the row's ``state`` JSON (parsers restore only their own keys),
        so the schema is unchanged."""
        row = c.execute("select json_extract(state, '$.' || ?) from transcripts"
                        " where path = ? and json_valid(state)", [FORGOTTEN_KEY, path]).fetchone()
        return None if row is None else row[0]

    def forget_transcript(self, source: str) -> int:
        """Drop every record of a transcript file and its tailing state (a forgotten
        file's mark too: it was rewritten); return records dropped."""
        with self._write() as c:
            ids = [r[0] for r in c.execute(
                "select id from documents where source = ? and source_kind = 'transcript'",
                [source]).fetchall()]
            self.remove_documents(ids)
            c.execute("delete from transcripts where path = ?", [source])
        return len(ids)
