"""Migration m007: the Target's forward times gain their context (t(n, context))."""

from __future__ import annotations

import sqlite_utils

from assistd.decoding.tuner import Tuner
from assistd.ground.costmodel import CostModel
from storage.ledger_store import LedgerStore
from storage.migrations import MIGRATIONS, m007_target_costs_context
from storage.store import HistoryStore


def _database_before_m007(path):
    """A history database as the assistd before t(n, context) left it: m001..m006 applied,
    forward times by n_tokens alone."""
    db = sqlite_utils.Database(path)
    db["_assistd_migrations"].create({"name": str, "applied_utc": float}, pk="name")
    names = [name for name, _ in MIGRATIONS]
    for name, fn in MIGRATIONS[: names.index("m007_target_costs_context")]:
        fn(db)
        db["_assistd_migrations"].insert({"name": name, "applied_utc": 0.0})
    db["target_costs"].insert_all([
        {"target": "T", "n_tokens": 1, "ms_sum": 110.0, "count": 10.0, "updated_utc": 0.0},
        {"target": "T", "n_tokens": 9, "ms_sum": 430.0, "count": 10.0, "updated_utc": 0.0},
        {"target": "U", "n_tokens": 1, "ms_sum": 40.0, "count": 2.0, "updated_utc": 0.0}])
    db.conn.commit()
    db.conn.close()


def test_old_forward_times_become_the_reference_context(tmp_path):
    """After m007 an old database's forward times are the reference context (bucket 0, 64 tokens
    each) and read as before; new times land in their own context bucket; running m007 again
    changes nothing."""
    path = tmp_path / "old.db"
    _database_before_m007(path)
    store = HistoryStore(path)  # migrates
    ls = LedgerStore(store)
    assert ls.cost_points("T", now=0.0) == {(1, 0): (11.0, 10.0, 64.0), (9, 0): (43.0, 10.0, 64.0)}
    assert ls.costs("U", now=0.0) == {1: (20.0, 2.0)}
    # Read as before: the old rows are t(n) at the reference context.
    cm = Tuner(ls, "T", CostModel.brief(), now=0.0).cost_model()
    assert cm.t_ms(9) == 43.0 and cm.levels == {} and cm.t_ms(9, 3000) == 43.0
    # New forwards land beside them, by context bucket.
    ls.add_costs("T", {1: 30.0}, weight=2.0, now=0.0, context=1500)
    assert ls.cost_points("T", now=0.0)[(1, 1024)] == (30.0, 2.0, 1500.0)
    assert ls.cost_points("T", now=0.0)[(1, 0)] == (11.0, 10.0, 64.0)
    # Idempotent: run again (a crash before its name was recorded), nothing changes.
    m007_target_costs_context(store.db)
    assert len(ls.cost_points("T", now=0.0)) == 3
    store.close()
    assert LedgerStore(HistoryStore(path)).cost_points("U", now=0.0) == {(1, 0): (20.0, 2.0, 64.0)}


def test_an_old_database_gets_the_calibrations_context_levels(target, tmp_path, monkeypatch):
    """A history whose times predate t(n, context) keeps them and gains the calibration's
    longer context (from the cache, or measured), unless this machine is too busy to
    measure one (then it has only its stored times, as before)."""
    from assistd.decoding.tuner import target_key

    monkeypatch.setenv("ASSISTD_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "old.db"
    _database_before_m007(path)
    ls = LedgerStore(HistoryStore(path))
    key = target_key(target)
    ls.add_costs(key, {1: 11.0, 9: 43.0})  # as the old Tuner.open stored it
    tuner = Tuner.open(ls, target)
    points = ls.cost_points(key)
    assert points[(1, 0)][0] == 11.0  # the stored reference times are kept as they were
    if tuner.calibration == "stored":  # a busy machine's calibration: no long level
        assert all(b == 0 for _, b in points)
    else:
        assert tuner.calibration.startswith("stored; context levels from ")
        assert {b for _, b in points} == {0, 256}
        assert sorted(tuner.cost_model().levels) == [320]
        assert Tuner.open(ls, target).calibration == "stored"  # once only
    ls.store.close()
