"""Append-only, named, idempotent schema migrations (after simonw/llm ``migrations.py``).

Never edit a migration that has shipped: append a new one. Each migration is
idempotent (``if_not_exists``), so a crash between running it and recording its
name is repaired by running it again.

Schema (version ``m001``):

``scopes``          root (pk, absolute path of a repository), indexed_utc (s since epoch),
                    recursive (0/1: subdirectories indexed too)
``documents``       id, scope, path (relative to scope, POSIX), source_kind
                    (repo|transcript|buffer|generated), language_id (LSP id),
                    content_hash (sha256 hex of the raw bytes), num_bytes, mtime_ns,
                    text (decoded UTF-8, replacement chars where undecodable),
                    decoded_with_replacement (0/1), created_utc, updated_utc;
                    unique (scope, source_kind, path)
``tokenizations``   document_id, tokenizer_fingerprint (pk together), content_hash
                    (of the text that was tokenized), token_ids (little-endian
                    uint32 blob, [num_tokens]), num_tokens, created_utc

Added by ``m002_transcripts_retention``:

``documents``       + source (the file a record came from: the transcript's absolute
                    path; for repo documents null, the path says it), record_key
                    (id of a transcript record within its file), ordinal (order of
                    the record in its file), record_kind (assistant|tool_input),
                    redactions (secret values replaced before storing),
                    last_used_utc (when a proposer last drafted from it; eviction order)
``scopes``          + last_used_utc (when a completion last used the scope)
``transcripts``     path (pk, absolute), format, offset (bytes consumed; the next
                    read starts here), size, mtime_ns, inode, head_sha256 (of the
                    first min(offset, 4096) bytes: a changed head means rewritten),
                    state (the line parser's JSON state at ``offset``), records,
                    skipped_malformed, skipped_unknown, skipped_duplicate,
                    dropped_blobs, redactions, updated_utc
``changes``         seq (autoincrement), document_id, scope, op (put|delete),
                    utc: an append-only log that in-memory indexes follow to
                    update incrementally (written in the same transaction as the
                    change it records)

Added by ``m003_ledger`` (the tuner's persisted, decayed counters; see
``storage/ledger_store.py``):

``ledger``          scope, language_id, proposer, target (the Target's cost key:
                    backend, model file, device, threads), counters (JSON: the raw
                    decode counters of :class:`assistd.ground.ledger.Ledger`, decayed to
                    updated_utc), updated_utc; pk (scope, language_id, proposer, target)
``target_costs``    target, n_tokens (tokens in one forward: draft length + 1), ms_sum,
                    count (both decayed to updated_utc), updated_utc; pk (target, n_tokens)

Added by ``m004_suggestions`` (user acceptance of editor suggestions, kept apart from
the Target's draft acceptance in ``ledger``; see ``storage/suggestions.py``):

``suggestions``     id (pk, the suggestion id the editor echoes), scope, path (relative
                    to scope), language_id, proposer, target, chars (length of the
                    suggestion, characters), shown (0/1), outcome (accepted|partial|
                    dismissed, null while none), accepted_chars, created_utc, updated_utc

Added by ``m005_rescan_secrets`` (stored text re-scanned with the secret rules of issue 21:
provider key formats without keywords, password flags of CLIs, a key alone on the line after
the one naming it, configuration in fenced code blocks; see :func:`rescan_secrets`):

``secret_rescans``  name (pk, the migration that ran the rescan), applied_utc, documents
                    (scanned), changed (documents with new redactions), redactions
                    (values replaced), kinds (JSON: secret type -> count), failed
                    (documents the filter failed on, left as they were)

``m006_rescan_secrets_headers_prose`` (no schema change) re-scans with the rules of issue 21's
second break-it run: HTTP ``Authorization``/API-key headers, passwords in prose, values echoed
into ``--password-stdin`` logins, Azure SAS signatures and account keys, presigned URL
signatures, webhook URLs (Discord, Slack, Teams), Telegram bot URLs; its row in
``secret_rescans`` counts what they found.

Changed by ``m007_target_costs_context`` (t(n, context); see ``assistd/ground/costmodel.py``):

``target_costs``    + context_bucket (tokens: the bucket of the context the forwards ran
                    after, ``costmodel.context_bucket``; part of the pk), context_sum (context
                    tokens summed over the forwards, decayed as count: mean context =
                    context_sum / count); pk (target, n_tokens, context_bucket). Rows from
                    before are the reference context (bucket 0, 64 tokens each).

``m008_rescan_secrets_urls_tables`` (no schema change) re-scans with the rules of issue 34's
break-it pass: passwords in URLs with an empty user, credentials in URL queries, Docker
``config.json`` auths, base64 of a key or of ``user:password``, ``.netrc`` entries in any
file, password and token columns of Markdown tables, a key on a comment line after the
comment naming it, a key cut into two string literals, and Microsoft's provider table.

``m009_rescan_secrets_pairs_notes`` (no schema change) re-scans with the rules of a
newcomer's break-it run: an AWS secret key beside its key id (the id was redacted, the
key kept), short password notes (``pw=PW``, ``(pass: PW)``, ``login: USER / PW``, ``user
U, pass PW``), the default of an environment lookup named or passed as a secret, and a
key cut in two adjacent literals whose first names it.
"""

import json
import logging
import time
from collections.abc import Callable

import sqlite_utils

from assistd.ground.errors import AssistdError, HistoryError

log = logging.getLogger(__name__)

MIGRATIONS: list[tuple[str, Callable[[sqlite_utils.Database], None]]] = []


def migration(fn):
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_documents(db: sqlite_utils.Database) -> None:
    db["scopes"].create({"root": str, "indexed_utc": float, "recursive": int}, pk="root",
                        if_not_exists=True)
    db["documents"].create(
        {
            "id": int,
            "scope": str,
            "path": str,
            "source_kind": str,
            "language_id": str,
            "content_hash": str,
            "num_bytes": int,
            "mtime_ns": int,
            "text": str,
            "decoded_with_replacement": int,
            "created_utc": float,
            "updated_utc": float,
        },
        pk="id",
        not_null={"scope", "path", "source_kind", "content_hash"},
        if_not_exists=True,
    )
    db["documents"].create_index(
        ["scope", "source_kind", "path"], unique=True, if_not_exists=True
    )
    db["tokenizations"].create(
        {
            "document_id": int,
            "tokenizer_fingerprint": str,
            "content_hash": str,
            "token_ids": bytes,
            "num_tokens": int,
            "created_utc": float,
        },
        pk=("document_id", "tokenizer_fingerprint"),
        foreign_keys=[("document_id", "documents", "id")],
        if_not_exists=True,
    )


def _add_columns(db: sqlite_utils.Database, table: str, columns: dict) -> None:
    have = {c.name for c in db[table].columns}
    for name, (col_type, default) in columns.items():
        if name not in have:
            db[table].add_column(name, col_type, not_null_default=default)


@migration
def m002_transcripts_retention(db: sqlite_utils.Database) -> None:
    _add_columns(db, "documents", {
        "source": (str, None), "record_key": (str, None), "ordinal": (int, None),
        "record_kind": (str, None), "redactions": (int, 0), "last_used_utc": (float, None),
    })
    _add_columns(db, "scopes", {"last_used_utc": (float, None)})
    db["documents"].create_index(["source", "ordinal"], if_not_exists=True)
    db["documents"].create_index(["content_hash"], if_not_exists=True)
    db["transcripts"].create(
        {
            "path": str, "format": str, "offset": int, "size": int, "mtime_ns": int,
            "inode": int, "head_sha256": str, "state": str, "records": int,
            "skipped_malformed": int, "skipped_unknown": int, "skipped_duplicate": int,
            "dropped_blobs": int, "redactions": int, "updated_utc": float,
        },
        pk="path", if_not_exists=True,
    )
    db.execute(
        "create table if not exists changes (seq integer primary key autoincrement,"
        " document_id integer not null, scope text not null, op text not null, utc float)"
    )


@migration
def m003_ledger(db: sqlite_utils.Database) -> None:
    db["ledger"].create(
        {"scope": str, "language_id": str, "proposer": str, "target": str, "counters": str,
         "updated_utc": float},
        pk=("scope", "language_id", "proposer", "target"), if_not_exists=True,
    )
    db["target_costs"].create(
        {"target": str, "n_tokens": int, "ms_sum": float, "count": float, "updated_utc": float},
        pk=("target", "n_tokens"), if_not_exists=True,
    )


@migration
def m004_suggestions(db: sqlite_utils.Database) -> None:
    db["suggestions"].create(
        {"id": str, "scope": str, "path": str, "language_id": str, "proposer": str,
         "target": str, "chars": int, "shown": int, "outcome": str, "accepted_chars": int,
         "created_utc": float, "updated_utc": float},
        pk="id", if_not_exists=True,
    )
    db["suggestions"].create_index(["language_id", "outcome"], if_not_exists=True)


@migration
def m005_rescan_secrets(db: sqlite_utils.Database) -> None:
    db["secret_rescans"].create(
        {"name": str, "applied_utc": float, "documents": int, "changed": int,
         "redactions": int, "kinds": str, "failed": int},
        pk="name", if_not_exists=True,
    )
    rescan_secrets(db, "m005_rescan_secrets")


@migration
def m006_rescan_secrets_headers_prose(db: sqlite_utils.Database) -> None:
    rescan_secrets(db, "m006_rescan_secrets_headers_prose")


@migration
def m007_target_costs_context(db: sqlite_utils.Database) -> None:
    # The pk gains a column, which SQLite cannot alter: the table is rebuilt (inside
    # migrate's transaction), its rows the reference context's.
    if "context_bucket" in {c.name for c in db["target_costs"].columns}:
        return
    db.execute("create table target_costs_new (target text, n_tokens integer, context_bucket"
               " integer, ms_sum float, count float, context_sum float, updated_utc float,"
               " primary key (target, n_tokens, context_bucket))")
    # 64 tokens: costmodel.REFERENCE_CONTEXT when this shipped (a migration never changes)
    db.execute("insert into target_costs_new select target, n_tokens, 0, ms_sum, count,"
               " count * 64, updated_utc from target_costs")
    db.execute("drop table target_costs")
    db.execute("alter table target_costs_new rename to target_costs")


@migration
def m008_rescan_secrets_urls_tables(db: sqlite_utils.Database) -> None:
    rescan_secrets(db, "m008_rescan_secrets_urls_tables")


@migration
def m009_rescan_secrets_pairs_notes(db: sqlite_utils.Database) -> None:
    rescan_secrets(db, "m009_rescan_secrets_pairs_notes")


RESCAN_MARK = "rescanned"  # a content_hash no sha256 hex equals: the source is read again
RESCAN_BATCH = 256  # documents read per query (keyset pages by id)


def rescan_secrets(db: sqlite_utils.Database, name: str) -> dict:
    """Redact every stored document again with the current rules of :mod:`storage.secrets`.

    Runs inside the caller's transaction (``migrate``'s): a crash or kill rolls the whole
    rescan back and the next open runs it again, so no document is ever half rescanned.
    The raw text is not stored, so the stored (already redacted) text is what is scanned.
    A document in which something new is found gets the redacted text, its ``redactions``
    raised, and, so that no token can decode to the secret, all its tokenizations deleted,
    a ``put`` in ``changes`` (a live history index drops its tokens) and ``content_hash`` set
    to :data:`RESCAN_MARK`: the next ``assistd index`` (or a completion's scan of the
    repository) re-reads the file, redacts the raw bytes and tokenizes it as it does any
    changed file; a transcript's file is read again from byte 0 (its ``transcripts`` row is
    marked rewritten). A source that is gone leaves the redacted text without tokens.

    Returns the ``secret_rescans`` row written (counts; ``kinds`` as a dict). Idempotent:
    a second run finds nothing new.
    """
    from storage.secrets import redact  # the filter loads detect-secrets: only when needed

    conn = db.conn
    now = time.time()
    out = {"name": name, "applied_utc": now, "documents": 0, "changed": 0, "redactions": 0,
           "kinds": {}, "failed": 0}
    sources: set[str] = set()
    last = 0
    while True:
        rows = conn.execute(
            "select id, scope, path, source_kind, text, source from documents"
            " where id > ? order by id limit ?", [last, RESCAN_BATCH]).fetchall()
        if not rows:
            break
        last = rows[-1][0]
        for doc_id, scope, path, kind, text, source in rows:
            if not text:
                continue
            out["documents"] += 1
            # The file name selects detect-secrets' per-file-type rules, as at ingest.
            filename = "" if kind == "transcript" else path.split("#", 1)[0]
            try:
                r = redact(text, filename=filename)
            except AssistdError:  # its message holds no text; the document stays as it was
                out["failed"] += 1
                log.warning("secrets rescan failed on document %d of %s", doc_id, scope)
                continue
            if not r.count:
                continue
            out["changed"] += 1
            out["redactions"] += r.count
            for k, n in r.kinds.items():
                out["kinds"][k] = out["kinds"].get(k, 0) + n
            conn.execute(
                "update documents set text = ?, redactions = coalesce(redactions, 0) + ?,"
                " content_hash = ?, updated_utc = ? where id = ?",
                [r.text, r.count, RESCAN_MARK, now, doc_id])
            if kind != "repo":  # a repo file's num_bytes is its size on disk, compared on scan
                conn.execute("update documents set num_bytes = ? where id = ?",
                             [len(r.text.encode("utf-8", "surrogatepass")), doc_id])
            conn.execute("delete from tokenizations where document_id = ?", [doc_id])
            conn.execute("insert into changes (document_id, scope, op, utc) values (?,?,?,?)",
                         [doc_id, scope, "put", now])
            if kind == "transcript" and source:
                sources.add(source)
    for source in sorted(sources):
        # Size -1 and an empty head hash: the next pass reads the file again from byte 0.
        conn.execute("update transcripts set size = -1, head_sha256 = '' where path = ?",
                     [source])
    db["secret_rescans"].insert({**out, "kinds": json.dumps(out["kinds"])}, replace=True)
    if out["changed"]:
        log.info("secrets rescan: %d values redacted in %d of %d stored documents",
                 out["redactions"], out["changed"], out["documents"])
    return out


def secret_rescans(db: sqlite_utils.Database) -> list[dict]:
    """The ``secret_rescans`` rows, oldest first (``kinds`` as a dict); [] before m005."""
    if "secret_rescans" not in db.table_names():
        return []
    rows = db.execute("select name, applied_utc, documents, changed, redactions, kinds, failed"
                      " from secret_rescans order by applied_utc").fetchall()
    return [{"name": n, "applied_utc": t, "documents": d, "changed": c, "redactions": r,
             "kinds": json.loads(k or "{}"), "failed": f} for n, t, d, c, r, k, f in rows]


def check_current(db: sqlite_utils.Database) -> None:
    """For a reader that may not write (a read-only open): raise :class:`HistoryError`
    unless every migration this assistd knows, and no other, is applied."""
    tables = set(db.table_names())
    if "_assistd_migrations" not in tables:
        raise HistoryError(f"{db.conn.execute('pragma database_list').fetchone()[2]} is not"
                           " an assistd history database (yet): `assistd index` or the"
                           " daemon creates it")
    done = {row["name"] for row in db["_assistd_migrations"].rows}
    known = {name for name, _ in MIGRATIONS}
    if done != known:
        which = ("a newer assistd wrote it" if done - known
                 else "an older assistd wrote it; open it once with this one to upgrade it")
        raise HistoryError(f"the history database's schema is not this assistd's ({which})")


def migrate(db: sqlite_utils.Database) -> list[str]:
    """Apply every migration not yet recorded; return the names applied now.

    Raises :class:`HistoryError` for a database that another program owns (tables
    but no migration record) or that a newer assistd wrote (unknown migrations).
    """
    tables = set(db.table_names())
    if tables and "_assistd_migrations" not in tables:
        raise HistoryError(
            f"{db.conn.execute('pragma database_list').fetchone()[2]} is not an assistd "
            "history database (it has other tables); pass --db FILE with a new or assistd file"
        )
    # One write transaction (SQLite DDL is transactional): a kill mid-way leaves the file
    # as it was, never half a schema. IMMEDIATE takes the write lock before reading which
    # migrations are done, so two processes opening a new file do not race.
    conn = db.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        db["_assistd_migrations"].create(
            {"name": str, "applied_utc": float}, pk="name", if_not_exists=True
        )
        done = {row["name"] for row in db["_assistd_migrations"].rows}
        unknown = done - {name for name, _ in MIGRATIONS}
        if unknown:
            raise HistoryError(
                f"the history database was written by a newer assistd (migrations "
                f"{', '.join(sorted(unknown))}); upgrade assistd or pass --db FILE"
            )
        applied = []
        for name, fn in MIGRATIONS:
            if name in done:
                continue
            fn(db)
            db["_assistd_migrations"].insert({"name": name, "applied_utc": time.time()},
                                             replace=True)
            applied.append(name)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return applied
