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
"""

import time
from collections.abc import Callable

import sqlite_utils

from assistd.errors import HistoryError

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
        db["_assistd_migrations"].insert({"name": name, "applied_utc": time.time()}, replace=True)
        applied.append(name)
    return applied
