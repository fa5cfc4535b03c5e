"""Schema migrations: a blank history and the oldest one upgraded reach the same schema.

The oldest database is ``tests/data/migrations/m001_first_release.sql`` (the first release's
CREATE statements, frozen, with a row in each table) or one built by running ``m001`` alone.
Schemas are compared through SQLite's own pragmas on real files, not the CREATE text.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

from storage.migrations import MIGRATIONS
from storage.store import HistoryStore

FIRST_RELEASE = Path(__file__).parent.parent / "data" / "migrations" / "m001_first_release.sql"


def schema(conn: sqlite3.Connection) -> dict:
    """Every table's columns (name, type, not-null, default, pk position, hidden), indexes (name,
    unique, origin, partial, columns) and foreign keys, keyed by table name."""
    out = {}
    tables = [r[0] for r in conn.execute(
        "select name from sqlite_master where type = 'table' order by name")]
    for t in tables:
        columns = [tuple(r[1:]) for r in conn.execute(f'pragma table_xinfo("{t}")')]
        indexes = sorted(
            (name, unique, origin, partial,
             tuple(c[2] for c in conn.execute(f'pragma index_info("{name}")')))
            for _, name, unique, origin, partial in conn.execute(f'pragma index_list("{t}")'))
        fks = sorted((r[2], r[3], r[4]) for r in conn.execute(f'pragma foreign_key_list("{t}")'))
        out[t] = {"columns": columns, "indexes": indexes, "foreign_keys": fks}
    return out


def first_release_from_sql(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(FIRST_RELEASE.read_text())
    conn.close()


def first_release_from_m001(path: Path) -> None:
    db = sqlite_utils.Database(sqlite3.connect(path))
    db["_assistd_migrations"].create({"name": str, "applied_utc": float}, pk="name")
    name, m001 = MIGRATIONS[0]
    m001(db)
    db["_assistd_migrations"].insert({"name": name, "applied_utc": 0.0})
    db.conn.commit()
    db.conn.close()


def test_the_frozen_first_release_is_what_m001_still_builds(tmp_path):
    """``m001_documents`` has not been edited since it shipped: running it alone gives the
    tables, columns and indexes of the frozen first-release SQL."""
    first_release_from_sql(tmp_path / "frozen.db")
    first_release_from_m001(tmp_path / "m001.db")
    frozen, m001 = (sqlite3.connect(tmp_path / n) for n in ("frozen.db", "m001.db"))
    assert schema(m001) == schema(frozen)
    assert set(schema(frozen)) == {"_assistd_migrations", "scopes", "documents", "tokenizations"}
    frozen.close(), m001.close()


@pytest.mark.parametrize("build_oldest", [first_release_from_sql, first_release_from_m001],
                         ids=["frozen-sql", "m001-alone"])
def test_oldest_schema_upgraded_equals_blank_schema(tmp_path, build_oldest):
    """A database at the oldest schema (m001 only) opened by today's HistoryStore gets every
    later migration and ends with the same tables, columns (names, types, defaults, not-null,
    primary keys), indexes and foreign keys as a blank file migrated from nothing."""
    build_oldest(tmp_path / "old.db")
    HistoryStore(tmp_path / "old.db").close()
    HistoryStore(tmp_path / "blank.db").close()
    old, blank = (sqlite3.connect(tmp_path / n) for n in ("old.db", "blank.db"))
    upgraded = schema(old)
    assert upgraded == schema(blank)
    # The comparison covers what later migrations add, not only m001's tables.
    assert {"transcripts", "changes", "ledger", "target_costs", "suggestions",
            "secret_rescans"} <= set(upgraded)
    assert ("redactions", "INTEGER", 1, "0", 0, 0) in upgraded["documents"]["columns"]
    pk = sorted((pk, name) for name, _, _, _, pk, _ in upgraded["target_costs"]["columns"] if pk)
    assert [name for _, name in pk] == ["target", "n_tokens", "context_bucket"]  # m007
    recorded = [r[0] for r in old.execute("select name from _assistd_migrations order by name")]
    assert recorded == sorted(name for name, _ in MIGRATIONS)
    old.close(), blank.close()
