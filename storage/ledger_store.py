"""The persisted acceptance ledger and the Target's measured forward times, decayed.

Each generation's :class:`assistd.ground.ledger.Ledger` is added, in one write transaction,
to the row of its (scope, language id, proposer, Target); its verify times go to
the Target's cost table by tokens per forward and context bucket
(:func:`assistd.ground.costmodel.context_bucket`), with the context summed so that each
cell knows its mean context. A kill at any moment leaves either
the row before or after the generation, never half of it (SQLite WAL, BEGIN
IMMEDIATE, as every write of :class:`storage.store.HistoryStore`).

Decay, so that old behaviour fades: counters are stored as of ``updated_utc`` and
multiplied by ``0.5 ** (age / half_life_s)`` before anything is added or read
(exponential forgetting in time). A row is also capped at ``max_steps`` decode steps
(older counts scaled down), so a busy file type still follows a change within a few
thousand steps. Rates are never stored: they are computed on read (docs/design.md, 'The ledger').
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

from assistd.ground.costmodel import REFERENCE_CONTEXT, context_bucket
from assistd.ground.ledger import Ledger
from storage.store import HistoryStore

HALF_LIFE_S = 7 * 24 * 3600.0  # a week
MAX_STEPS = 20_000.0  # decode steps one ledger row remembers, at most
MAX_COST_SAMPLES = 2_000.0  # forwards one cost point remembers, at most


@dataclass(frozen=True)
class LedgerRow:
    scope: str
    language_id: str
    proposer: str
    target: str
    ledger: Ledger  # decayed to the time of the read
    updated_utc: float


class LedgerStore:
    """Ledger rows and Target costs in a :class:`HistoryStore`'s database.

    half_life_s: time for old counts to weigh half (s); max_steps: cap on the decode
    steps one row remembers. Raises what the store raises (:class:`HistoryError`).
    """

    def __init__(self, store: HistoryStore, *, half_life_s: float = HALF_LIFE_S,
                 max_steps: float = MAX_STEPS):
        if half_life_s <= 0 or max_steps <= 0:
            raise ValueError("half_life_s and max_steps must be positive")
        self.store, self.half_life_s, self.max_steps = store, half_life_s, max_steps

    def decay(self, age_s: float) -> float:
        return 0.5 ** (max(0.0, age_s) / self.half_life_s)

    # -- writes ------------------------------------------------------------

    def add(self, scope: str, language_id: str, proposer: str, target: str, ledger: Ledger,
            now: float | None = None, costs: dict | None = None) -> None:
        """Add one generation's decode counters and its forward times to the Target's
        cost table, in one transaction. ``costs``: ``{(n_tokens, context bucket): (ms
        sum, forwards, context tokens sum)}``, or ``{n_tokens: (ms sum, forwards)}`` at
        the reference context; default: :meth:`Ledger.forward_times`."""
        now = time.time() if now is None else now
        key = [scope or "", language_id or "plaintext", proposer, target]
        with self.store.transaction() as c:
            row = c.execute(
                "select counters, updated_utc from ledger where scope = ? and language_id = ?"
                " and proposer = ? and target = ?", key).fetchone()
            total = Ledger()
            old = _parse(row[0]) if row is not None and _number(row[1]) else None
            if old is not None:  # a damaged row is replaced, not fatal
                total = old.scaled(self.decay(now - row[1]))
            total.add(ledger)
            if total.steps > self.max_steps:
                total = total.scaled(self.max_steps / total.steps)
            c.execute(
                "insert or replace into ledger (scope, language_id, proposer, target, counters,"
                " updated_utc) values (?, ?, ?, ?, ?, ?)",
                key + [json.dumps(total.counters()), now])
            for (n, bucket), (ms_sum, count, ctx_sum) in _by_context(
                    ledger.forward_times() if costs is None else costs).items():
                self._add_cost(c, target, n, ms_sum, count, now, bucket, ctx_sum)

    def add_costs(self, target: str, points: dict[int, float], weight: float = 3.0,
                  now: float | None = None, context: int = REFERENCE_CONTEXT) -> None:
        """Seed the cost table with measured ``{n_tokens: ms}`` after ``context`` tokens
        (a calibration level), each counted as ``weight`` forwards, so that online data
        soon outweighs it."""
        now = time.time() if now is None else now
        bucket = context_bucket(context)
        with self.store.transaction() as c:
            for n, ms in points.items():
                self._add_cost(c, target, int(n), ms * weight, weight, now, bucket,
                               context * weight)

    def _add_cost(self, c, target: str, n: int, ms_sum: float, count: float, now: float,
                  bucket: int, ctx_sum: float):
        row = c.execute("select ms_sum, count, context_sum, updated_utc from target_costs"
                        " where target = ? and n_tokens = ? and context_bucket = ?",
                        [target, n, bucket]).fetchone()
        if row is not None and all(_number(x) for x in row):
            f = self.decay(now - row[3])
            ms_sum, count, ctx_sum = ms_sum + row[0] * f, count + row[1] * f, ctx_sum + row[2] * f
        if count > MAX_COST_SAMPLES:
            scale = MAX_COST_SAMPLES / count
            ms_sum, count, ctx_sum = ms_sum * scale, MAX_COST_SAMPLES, ctx_sum * scale
        c.execute("insert or replace into target_costs (target, n_tokens, context_bucket,"
                  " ms_sum, count, context_sum, updated_utc) values (?, ?, ?, ?, ?, ?, ?)",
                  [target, n, bucket, ms_sum, count, ctx_sum, now])

    # -- reads -------------------------------------------------------------

    def rows(self, *, target: str | None = None, scope: str | None = None,
             proposer: str | None = None, now: float | None = None) -> list[LedgerRow]:
        """Ledger rows matching the given keys, decayed to ``now``."""
        now = time.time() if now is None else now
        where, args = [], []
        for col, val in (("target", target), ("scope", scope), ("proposer", proposer)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        sql = ("select scope, language_id, proposer, target, counters, updated_utc from ledger"
               + (" where " + " and ".join(where) if where else "")
               + " order by language_id, proposer, scope")
        out = []
        for s, lang, prop, tgt, counters, updated in self.store.db.execute(sql, args).fetchall():
            led = _parse(counters)
            if led is None or not _number(updated) or not all(
                    isinstance(x, str) for x in (s, lang, prop, tgt)):
                continue  # damaged (edited by hand, another program): skipped, not fatal
            out.append(LedgerRow(s, lang, prop, tgt, led.scaled(self.decay(now - updated)),
                                 updated))
        return out

    def costs(self, target: str, now: float | None = None) -> dict[int, tuple[float, float]]:
        """``{n_tokens: (mean ms, decayed forwards)}`` measured for ``target`` at the
        reference context (bucket 0); :meth:`cost_points` has every context."""
        return {n: (ms, cnt) for (n, b), (ms, cnt, _) in self.cost_points(target, now).items()
                if b == 0}

    def cost_points(self, target: str, now: float | None = None,
                    ) -> dict[tuple[int, int], tuple[float, float, float]]:
        """``{(n_tokens, context bucket): (mean ms, decayed forwards, mean context
        tokens)}`` measured for ``target``; damaged rows are skipped."""
        now = time.time() if now is None else now
        rows = self.store.db.execute(
            "select n_tokens, context_bucket, ms_sum, count, context_sum, updated_utc"
            " from target_costs where target = ?", [target]).fetchall()
        return {(n, b): (ms / cnt, cnt * self.decay(now - upd), ctx / cnt)
                for n, b, ms, cnt, ctx, upd in rows
                if isinstance(n, int) and n >= 1 and isinstance(b, int) and b >= 0
                and all(_number(x) for x in (ms, cnt, ctx, upd))
                and cnt > 0 and ms > 0 and ctx >= 0 and math.isfinite(ms / cnt)}

    def forget_scope(self, scope: str) -> int:
        """Delete the ledger rows of ``scope`` (``history forget``); returns how many."""
        with self.store.transaction() as c:
            return c.execute("delete from ledger where scope = ?", [scope]).rowcount

    def targets(self) -> list[str]:
        return [r[0] for r in self.store.db.execute(
            "select distinct target from target_costs union select distinct target from ledger"
            " order by 1").fetchall()]


def _by_context(costs: dict) -> dict[tuple[int, int], tuple[float, float, float]]:
    """``costs`` keyed by ``(n_tokens, bucket)``; a bare ``n_tokens`` key (times without
    a context) is the reference context's."""
    out = {}
    for key, value in costs.items():
        if isinstance(key, tuple):
            out[key] = tuple(value)
        else:
            ms_sum, count = value[:2]
            out[(int(key), context_bucket(REFERENCE_CONTEXT))] = (
                ms_sum, count, count * REFERENCE_CONTEXT)
    return out


def _parse(counters) -> Ledger | None:
    """A stored row's counters, or None when they are not the JSON this module wrote."""
    try:
        data = json.loads(counters)
        led = Ledger.from_counters(data)
    except (TypeError, ValueError, AttributeError):
        return None
    values = [getattr(led, n) for n in Ledger.COUNTERS]
    values += [x for n in Ledger.ARRAYS for x in getattr(led, n)]
    return led if all(math.isfinite(x) and x >= 0 for x in values) else None


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
