"""Keep the history within a size budget, and let the user inspect and forget it.

Size of a document = its stored text (``num_bytes``) + 4 bytes per stored token
(all tokenizations). Eviction removes whole documents, least recently used scope
first and, within a scope, least recently updated document first; scopes being
watched or indexed right now are never evicted (a repository that alone exceeds
the budget is reported, not thrashed). Forgetting deletes rows with SQLite's
``secure_delete`` on, so the text is overwritten in the file, and logs each
deletion in ``changes`` so in-memory indexes drop the tokens too.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from assistd.ground.errors import InputError
from storage.store import HistoryStore

DEFAULT_MAX_BYTES = 2 << 30  # 2 GiB of text + tokens
CHANGES_KEEP = 200_000  # rows of the change log kept by vacuum


@dataclass
class EvictionReport:
    budget_bytes: int
    size_before: int
    size_after: int
    documents_evicted: int
    over_budget: bool  # still over: the protected scopes alone exceed the budget

    def as_dict(self) -> dict:
        return asdict(self)


_SIZE_SQL = (
    "select coalesce(sum(d.num_bytes), 0) + 4 * coalesce(sum("
    "(select coalesce(sum(t.num_tokens), 0) from tokenizations t where t.document_id = d.id)"
    "), 0) from documents d"
)


def history_bytes(store: HistoryStore) -> int:
    """Text bytes + 4 bytes per stored token, over all documents."""
    return store.db.execute(_SIZE_SQL).fetchone()[0]


def enforce_budget(store: HistoryStore, max_bytes: int = DEFAULT_MAX_BYTES,
                   protect=(), keep_since_utc: float | None = None) -> EvictionReport:
    """Evict documents until the history fits in ``max_bytes``; never from ``protect``
    scopes, and never a document stored at or after ``keep_since_utc`` (what the run
    that enforces the budget has just indexed, e.g. transcript records of other scopes)."""
    size = before = history_bytes(store)
    evicted = 0
    if size > max_bytes:
        protect = list(protect)
        marks = ",".join("?" for _ in protect) or "''"
        rows = store.db.execute(
            "select d.id, d.num_bytes + 4 * coalesce((select sum(t.num_tokens) from"
            " tokenizations t where t.document_id = d.id), 0)"
            " from documents d left join scopes s on s.root = d.scope"
            f" where d.scope not in ({marks}) and d.updated_utc < ?"
            " order by coalesce(s.last_used_utc, s.indexed_utc, 0), d.updated_utc, d.id",
            [*protect, keep_since_utc if keep_since_utc is not None else float("inf")],
        ).fetchall()
        victims = []
        for doc_id, nbytes in rows:
            if size <= max_bytes:
                break
            victims.append(doc_id)
            size -= nbytes
        with store.transaction():
            evicted = store.remove_documents(victims)
            store.db.execute(
                "delete from scopes where root not in (select distinct scope from documents)"
                f" and root not in ({marks})", protect)
    with store.transaction() as c:  # the change log only needs a recent window
        c.execute("delete from changes where seq <= (select max(seq) from changes) - ?",
                  [CHANGES_KEEP])
    return EvictionReport(max_bytes, before, size, evicted, size > max_bytes)


def stats(store: HistoryStore) -> dict:
    """Totals by source kind, plus the database file's size (bytes)."""
    kinds = {}
    for kind, docs, nbytes, redactions in store.db.execute(
        "select source_kind, count(*), coalesce(sum(num_bytes), 0), coalesce(sum(redactions), 0)"
        " from documents group by source_kind order by source_kind"
    ):
        kinds[kind] = {"documents": docs, "bytes": nbytes, "redactions": redactions}
    for kind, tokens in store.db.execute(
        "select d.source_kind, sum(t.num_tokens) from tokenizations t"
        " join documents d on d.id = t.document_id group by d.source_kind"
    ):
        kinds[kind]["tokens"] = tokens
    tf = store.db.execute(
        "select (select count(distinct source) from documents where source_kind = 'transcript'),"
        " coalesce(sum(skipped_malformed), 0), coalesce(sum(skipped_unknown), 0),"
        " coalesce(sum(dropped_blobs), 0) from transcripts").fetchone()
    files = [store.path] + [Path(f"{store.path}{s}") for s in ("-wal", "-shm")]
    return {
        "db": str(store.path),
        "db_bytes": sum(f.stat().st_size for f in files if f.exists()),
        "history_bytes": history_bytes(store),
        "scopes": store.db.execute("select count(distinct scope) from documents").fetchone()[0],
        "kinds": kinds,
        "transcript_files": tf[0],
        "transcript_lines_malformed": tf[1],
        "transcript_records_unknown": tf[2],
        "transcript_blobs_dropped": tf[3],
    }


def sources(store: HistoryStore) -> list[dict]:
    """One row per scope and kind, and one per transcript file."""
    out = []
    for scope, kind, docs, nbytes, tokens, updated, used in store.db.execute(
        "select d.scope, d.source_kind, count(*), sum(d.num_bytes),"
        " coalesce(sum((select sum(num_tokens) from tokenizations t where t.document_id = d.id)), 0),"
        " max(d.updated_utc), s.last_used_utc from documents d left join scopes s on s.root = d.scope"
        " group by d.scope, d.source_kind order by d.scope, d.source_kind"
    ):
        out.append({"type": "scope", "source": scope, "kind": kind, "documents": docs,
                    "bytes": nbytes, "tokens": tokens, "updated_utc": updated,
                    "last_used_utc": used})
    # Records are counted live: forgetting or evicting them keeps the file's row (its
    # offset keeps them from coming back), so the row's own count would go stale.
    for path, fmt, records, offset, malformed, updated in store.db.execute(
        "select t.path, t.format, (select count(*) from documents d where d.source = t.path"
        " and d.source_kind = 'transcript'), t.offset, t.skipped_malformed, t.updated_utc"
        " from transcripts t order by t.path"
    ):
        out.append({"type": "transcript", "source": path, "kind": fmt, "documents": records,
                    "bytes": offset, "skipped_malformed": malformed, "updated_utc": updated})
    return out


def forget(store: HistoryStore, target: str) -> dict:
    """Forget a scope (repository root), a transcript file, or a file or folder inside a
    scope. ``target`` is a path (made absolute) or a scope name as listed by ``sources``;
    an empty or blank one raises :class:`InputError` (it names nothing the user can see,
    yet matched the ledger rows of completions made outside any repository).

    A forgotten transcript file stays forgotten: what is appended to it later is not
    stored either, until it is rewritten (:meth:`HistoryStore.mark_transcript_forgotten`).
    Afterwards the WAL is checkpointed and cut to 0 bytes (:meth:`HistoryStore.checkpoint`),
    so the deleted text, overwritten in the pages (``secure_delete``), has no older copy
    left in ``history.db`` or ``history.db-wal`` though the daemon holds them open.

    Returns ``{"target", "documents", "transcripts", "ledger_rows", "suggestions",
    "checkpointed"}``; documents == 0 means nothing matched; checkpointed False: another
    connection held the WAL past the busy timeout (30 s) and old copies may remain.
    """
    if not target.strip():
        raise InputError("history forget needs a repository, a transcript file, or a file or"
                         " folder of a repository; an empty name names none; see"
                         " `assistd history sources`")
    absolute = os.path.abspath(os.path.expanduser(target))
    with store.transaction() as c:
        n_transcripts = 0
        for name in {target, absolute}:
            n_transcripts += store.mark_transcript_forgotten(name)
        ids = [r[0] for r in c.execute(
            "select id from documents where scope in (?, ?) or source in (?, ?)",
            [target, absolute, target, absolute]).fetchall()]
        if not ids:  # a file or folder inside a scope
            for scope in [r[0] for r in c.execute("select root from scopes")] + \
                    [r[0] for r in c.execute("select distinct scope from documents")]:
                if absolute.startswith(scope.rstrip(os.sep) + os.sep):
                    rel = Path(absolute).relative_to(scope).as_posix()
                    ids += [r[0] for r in c.execute(
                        "select id from documents where scope = ? and source_kind != 'transcript'"
                        " and (path = ? or path like ? escape '\\')",
                        [scope, rel, _like_prefix(rel) + "/%"]).fetchall()]
        ids = sorted(set(ids))
        store.remove_documents(ids)
        # Forgotten transcripts stay forgotten: the tailing offset is kept, so the
        # records already read do not come back, and the mark set above keeps out what
        # is appended later (a rewritten file is read anew).
        c.execute("delete from scopes where root in (?, ?)", [target, absolute])
        # The tuner's counters name the scope (its path, its languages): forgotten too.
        n_ledger = c.execute("delete from ledger where scope in (?, ?)",
                             [target, absolute]).rowcount
        # So do the editor's suggestion events there (paths and outcomes).
        n_suggestions = c.execute("delete from suggestions where scope in (?, ?)",
                                  [target, absolute]).rowcount
    checkpointed = store.checkpoint()  # after the commit: a checkpoint cannot run inside one
    return {"target": target, "documents": len(ids), "transcripts": n_transcripts,
            "ledger_rows": n_ledger, "suggestions": n_suggestions,
            "checkpointed": checkpointed}


def _like_prefix(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def vacuum(store: HistoryStore) -> dict:
    """Trim the change log, checkpoint the WAL and VACUUM; returns file sizes (bytes)."""
    def size():
        return sum(f.stat().st_size for f in
                   [store.path, Path(f"{store.path}-wal")] if f.exists())

    before = size()
    with store.transaction() as c:
        c.execute("delete from changes where seq <= (select max(seq) from changes) - ?",
                  [CHANGES_KEEP])
    store.db.execute("VACUUM")
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return {"db": str(store.path), "bytes_before": before, "bytes_after": size()}
