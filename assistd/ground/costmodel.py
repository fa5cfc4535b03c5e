"""The Target's cost model t(n, context): ms of one forward over n tokens appended
after ``context`` tokens already in the KV cache.

A round with a draft of L tokens evaluates ``[last] + draft``, n = L + 1 tokens;
a plain step evaluates n = 1. Speculation pays only when the tokens a round
commits outweigh its cost: on the reference 2-core CPU t(9) is ~4x t(1)
(docs/design.md, 'Reference measurements'), on a GPU t(n) is nearly flat. And a
forward's attention reads every cached token, so t grows with the context. Measured
here (SmolLM2-135M Q4_1, llama.cpp, exact numerics, 2 cores, a quiet moment) after
1,024 tokens: t(1) 15 ms, t(8) 44, t(32) 144, against 11, 43 and 142 after 64: the
context adds a few ms per forward, most of them to t(1) (a one-token step runs on
one thread under exact numerics), and the bench saw t(1) at 18-22 ms for prompts
of 700-2,000 tokens. Not in proportion to n, so one factor n x context x beta
does not fit.

The model is therefore a grid: measured points ``{n: ms}`` at a few context lengths
(levels), linear in n between points and in the context between levels (bilinear),
past the last point grown with the last segment's slope, past the longest level
with the last slope per context token. Contexts below the shortest level cost what
it does.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from assistd.ground.errors import InputError

# t(n) measured on this project's reference 2-core CPU (docs/design.md, 'Reference measurements'):
# SmolLM2-135M Q4_1 on llama.cpp, median ms per forward over n tokens.
BRIEF_CPU_POINTS = {1: 11.0, 2: 19.0, 4: 26.0, 8: 43.0, 16: 75.0, 32: 142.0}
# A calibrated t(n) above this x n x t(1) is the machine's load, not the Target (implausible).
PLAUSIBLE_PER_TOKEN = 1.5
# Tokens of context behind the reference figures and the calibration's first level.
REFERENCE_CONTEXT = 64
# The calibration's second level (tokens of context) and the sizes measured there: a
# longer one would cost its prefill (~4.5 ms a token on the reference CPU) on a user's
# first start; the tuner learns the contexts the user's prompts really have.
LONG_CONTEXT = 320
LONG_SIZES = (1, 2, 4, 8, 16)

log = logging.getLogger("assistd.costmodel")


def context_bucket(context: int) -> int:
    """The bucket (tokens, its lower bound) that forwards after ``context`` tokens are
    learned in: 0 below 128, else the power of two at or below ``context`` (128, 256,
    512, ...). Buckets keep the learned grid small; each remembers its mean context."""
    c = max(0, int(context))
    return 0 if c < 128 else 1 << (c.bit_length() - 1)


def _tail(ns: np.ndarray, ms: np.ndarray) -> float:
    """A level's slope past its last point (ms per token): its last segment's; with one
    point, t(n) in proportion to n."""
    return float((ms[-1] - ms[-2]) / (ns[-1] - ns[-2]) if len(ns) > 1 else ms[0] / ns[0])


def _curve(ns: np.ndarray, ms: np.ndarray, tail: float, n: float) -> float:
    """t at ``n`` tokens from points ``ms`` at knots ``ns`` (sorted, ns[0] = 1): linear
    between them, ``tail`` ms per token past the last, t(1) below 1."""
    if n > ns[-1]:
        return float(ms[-1] + tail * (n - ns[-1]))
    return float(np.interp(n, ns, ms))


def _checked(points: dict[int, float], what: str) -> tuple[np.ndarray, np.ndarray]:
    xs = sorted(points)
    ys = [points[x] for x in xs]
    if not xs or xs[0] != 1 or any(not math.isfinite(y) or y <= 0 for y in ys):
        raise InputError(
            f"cost model {what}: needs finite positive times (ms) for token counts"
            " >= 1, starting with 1 (a plain step)")
    if any(b < a for a, b in zip(ys, ys[1:])):
        raise InputError(f"cost model {what}: a forward over more tokens cannot"
                         " take less time; measure again on a quiet machine")
    return np.array(xs, dtype=float), np.array(ys, dtype=float)


@dataclass(frozen=True)
class CostModel:
    """``points``: ``{n_tokens: ms}`` measured forward times after ``context`` tokens of
    context (the reference context), n >= 1; ``levels``: more such points at longer
    contexts, ``{context: {n_tokens: ms}}`` (none: t does not depend on the context);
    ``source``: where they come from; ``note``: why they are not a plain measurement ("" when
    they are).

    t is monotone non-decreasing in both arguments everywhere, extrapolation included:
    each level is non-decreasing in n (checked), a level is raised to the level of the
    shorter context wherever it lies below it (measured levels are noisy), and past the
    longest level the slope per context token is made non-decreasing in n (its running
    maximum). Raises :class:`InputError` when a level is not finite, positive,
    starting at n = 1 and non-decreasing in n, or when ``context`` (tokens, >= 0) is
    not shorter than every level's.
    """

    points: dict[int, float]
    source: str = "reference"
    note: str = ""
    context: int = REFERENCE_CONTEXT
    levels: dict[int, dict[int, float]] = field(default_factory=dict)

    def __post_init__(self):
        ns, ms = _checked(self.points, self.source)
        if self.context < 0 or any(c <= self.context for c in self.levels):
            raise InputError(f"cost model {self.source}: the contexts of its levels must be"
                             f" longer than that of its points ({self.context} tokens)")
        grid = {self.context: (ns, ms)}
        for c in sorted(self.levels):
            grid[c] = _checked(self.levels[c], f"{self.source} at {c} tokens of context")
        knots = np.array(sorted({int(n) for xs, _ in grid.values() for n in xs}), dtype=float)
        rows = [np.array([_curve(xs, ys, _tail(xs, ys), n) for n in knots])
                for xs, ys in grid.values()]
        tails = [_tail(xs, ys) for xs, ys in grid.values()]
        for k in range(1, len(rows)):  # never below the level of a shorter context
            rows[k] = np.maximum(rows[k], rows[k - 1])
            tails[k] = max(tails[k], tails[k - 1])
        # Past the longest level: its last slope per context token, made non-decreasing
        # in n so that t stays non-decreasing in n there too (0 with one level).
        far, far_tail = np.zeros_like(rows[0]), 0.0
        if len(grid) > 1:
            cs = list(grid)
            far = np.maximum.accumulate((rows[-1] - rows[-2]) / (cs[-1] - cs[-2]))
            far_tail = (tails[-1] - tails[-2]) / (cs[-1] - cs[-2])
        object.__setattr__(self, "_knots", knots)
        object.__setattr__(self, "_contexts", np.array(list(grid), dtype=float))
        # The levels' rows, then the slope row; each with its slope past the last knot.
        object.__setattr__(self, "_rows", np.array([*rows, far]))
        object.__setattr__(self, "_tails", [*tails, far_tail])
        object.__setattr__(self, "_tables", {})

    def _weights(self, context: int | None) -> tuple[int, float, int, float]:
        """Rows i, j and weights a, b with t(., context) = a row_i + b row_j (row j the
        slope past the longest level, weighted by the tokens past it)."""
        cs = self._contexts
        c = cs[0] if context is None else float(context)
        if len(cs) == 1 or c <= cs[0]:
            return 0, 1.0, 0, 0.0
        if c >= cs[-1]:
            return len(cs) - 1, 1.0, len(cs), float(c - cs[-1])
        j = int(np.searchsorted(cs, c))
        w = float((c - cs[j - 1]) / (cs[j] - cs[j - 1]))
        return j - 1, 1.0 - w, j, w

    def _row(self, i: int, n: float) -> float:
        return _curve(self._knots, self._rows[i], self._tails[i], n)

    def t_ms(self, n_tokens: int, context: int | None = None) -> float:
        """Forward time (ms) over ``n_tokens`` (>= 1) after ``context`` tokens of KV cache
        (None: :attr:`context`, the reference), interpolated."""
        i, a, j, b = self._weights(context)
        ti = a * self._row(i, n_tokens)
        return ti if b == 0.0 else ti + b * self._row(j, n_tokens)

    def round_ms(self, draft_len: int, context: int | None = None) -> float:
        """A round with ``draft_len`` draft tokens (0 = a plain step): t(draft_len + 1, context)."""
        return self.t_ms(draft_len + 1, context)

    def table(self, max_draft: int, context: int | None = None) -> np.ndarray:
        """float ``[max_draft + 1]``: ``round_ms(L, context)`` for L = 0..max_draft. Each
        level's table is computed once; a context's is their weighted sum (a few µs)."""
        i, a, j, b = self._weights(context)
        tables = self._tables.get(max_draft)
        if tables is None:
            tables = np.array([[self._row(r, L + 1) for L in range(max_draft + 1)]
                               for r in range(len(self._rows))])
            tables.setflags(write=False)
            self._tables[max_draft] = tables
        return tables[i].copy() if b == 0.0 else a * tables[i] + b * tables[j]

    def as_dict(self) -> dict:
        """JSON-ready: ``source``, ``points`` (``{"n": ms}``), and where there are levels,
        ``context`` and ``levels`` (``{"context": {"n": ms}}``); ``note`` when there is one."""
        out = {"source": self.source, "points": _str_keys(self.points)}
        if self.levels:
            out["context"] = self.context
            out["levels"] = {str(c): _str_keys(pts) for c, pts in sorted(self.levels.items())}
        return {**out, "note": self.note} if self.note else out

    @classmethod
    def brief(cls) -> CostModel:
        return cls(dict(BRIEF_CPU_POINTS), source="reference")

    @classmethod
    def load(cls, path: Path) -> CostModel:
        """Read ``{"points": {"1": 11.0, ...}}`` (or a bare ``{"1": 11.0}``) from JSON,
        with optional ``"context": 64`` (tokens, of the points) and ``"levels": {"1024":
        {"1": 26.0, ...}}`` (points at longer contexts), as :meth:`as_dict` writes them.

        Raises :class:`InputError` naming the file on a missing file or bad content.
        """
        try:
            raw = json.loads(Path(path).read_text())
            pts = raw.get("points", raw) if isinstance(raw, dict) else None
            points = _numbers(pts)
            full = raw if "points" in raw else {}  # a bare {"1": 11.0} has one level
            levels = {int(c): _numbers(lv) for c, lv in full.get("levels", {}).items()}
            context = full.get("context", REFERENCE_CONTEXT)
            if isinstance(context, bool) or not isinstance(context, int):
                raise ValueError("the context must be a whole number of tokens")
        except FileNotFoundError:
            raise InputError(f"cost model file not found: {path}") from None
        except (ValueError, TypeError, AttributeError) as e:
            raise InputError(
                f"{path}: not a cost model ({e}); expected JSON like"
                ' {"points": {"1": 11.0, "8": 43.0}} (ms per forward over n tokens)'
            ) from None
        # InputError names the file on bad values
        return cls(points, source=str(path), context=context, levels=levels)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n")

    @classmethod
    def calibrate(cls, target, sizes=(1, 2, 4, 8, 16, 32), repeats: int = 5,
                  context_tokens: int = REFERENCE_CONTEXT, long_context: int | None = LONG_CONTEXT,
                  long_sizes=LONG_SIZES, long_repeats: int = 3) -> CostModel:
        """Measure t(n, context) on ``target``: forwards over n tokens with logits for every
        row (as a round needs), after ``context_tokens`` of context, ``repeats`` of each
        size; then (unless ``long_context`` is None or does not fit the Target's window
        beside ``context_tokens``) ``long_repeats`` of each of ``long_sizes`` after
        ``long_context`` tokens, as one level (:attr:`levels`).

        Robust to a busy machine, which only ever adds time: the sizes are measured in
        interleaved passes (a burst of load is spread over all n, not pinned on one) and
        each point is :func:`low_median` (the median of the fastest half), made
        non-decreasing in n. The sizes up to 2 are measured first: if they are already
        :func:`implausible` (seen here with 2 threads on 2 loaded cores: t(2) = 4-9
        t(1), which turns drafting off), or all the sizes are, t(n) is the reference
        CPU's curve scaled to the measured t(1) and ``note`` says why, without a long
        level; the online measurements then correct it (a seed too pessimistic never
        would: at k = 0 only t(1) is measured). An implausible long level is left out
        (and logged). Costs about ``repeats * Σ t(n)`` plus the long context's prefill
        and ``long_repeats * Σ t(n, long_context)`` (~1.6 + ~1.5 s for the embedded
        model on 2 quiet CPU cores); a busy machine is found after ``repeats * (t(1) +
        t(2))``. The Target's KV cache is left empty. Raises ValueError when ``sizes``
        or ``long_sizes`` (token counts) leaves out 1.
        """
        if 1 not in sizes or 1 not in long_sizes:
            raise ValueError("calibration sizes must include 1 (a plain step)")
        bos = target.bos_token_id if target.bos_token_id is not None else 0
        text = "def f(x):\n    return x\n"
        prefix = [bos] + [int(t) for t in target.tokenize(text * 8)]
        prefix = prefix[:context_tokens]
        samples: dict[int, list[float]] = {n: [] for n in sizes}
        target.truncate(0)
        target.evaluate(prefix, [])
        why = None
        for part in ([n for n in sizes if n <= 2], [n for n in sizes if n > 2]):
            _measure(target, prefix, part, repeats, samples)
            points = robust_points({n: ms for n, ms in samples.items() if ms})
            why = implausible(points)
            if why is not None:
                break
        source = f"calibrated:{target.backend}"
        if why is not None:
            target.truncate(0)
            log.warning("calibration of %s implausible (%s): the machine is busy; using the"
                        " reference curve scaled to t(1) = %.1f ms until measured rounds"
                        " correct it", target.backend, why, points[1])
            scale = points[1] / BRIEF_CPU_POINTS[1]
            return cls({n: ms * scale for n, ms in BRIEF_CPU_POINTS.items()}, source=source,
                       note=f"busy machine ({why}): reference curve scaled to the measured t(1)")
        levels = {}
        fits = long_context is not None and long_context + max(long_sizes) < target.n_ctx
        if fits and long_context > len(prefix):
            long = prefix + [int(t) for t in target.tokenize(text * (long_context // 8 + 1))]
            long = long[:long_context]
            target.evaluate(long[len(prefix):], [])
            far: dict[int, list[float]] = {n: [] for n in long_sizes}
            _measure(target, long, long_sizes, long_repeats, far)
            level = robust_points(far)
            why = implausible(level)
            if why is None:
                levels[long_context] = level
            else:
                log.warning("calibration of %s after %d tokens of context implausible (%s):"
                            " left to measured rounds", target.backend, long_context, why)
        target.truncate(0)
        return cls(points, source=source, context=len(prefix), levels=levels)


def _measure(target, prefix: list[int], sizes, repeats: int, samples: dict) -> None:
    """``repeats`` interleaved passes over ``sizes``: forwards over n tokens after
    ``prefix`` (already in the KV cache, kept), ms appended to ``samples[n]``."""
    for _ in range(repeats if sizes else 0):
        for n in sizes:
            batch = (prefix * (n // len(prefix) + 1))[:n]
            t0 = time.perf_counter()
            target.evaluate(batch, range(n))
            samples[n].append((time.perf_counter() - t0) * 1000)
            target.truncate(len(prefix))


def _str_keys(points: dict[int, float]) -> dict[str, float]:
    return {str(n): ms for n, ms in sorted(points.items())}


def _numbers(pts) -> dict[int, float]:
    """``{"n": ms}`` from JSON as ``{n: ms}``; ValueError when a time is not a number."""
    points = {int(k): float(v) for k, v in pts.items() if not isinstance(v, bool)}
    if len(points) != len(pts):
        raise ValueError("times must be numbers")
    return points


def low_median(times_ms) -> float:
    """The median of the fastest half (rounded up) of ``times_ms`` (ms, non-empty).

    Load from other processes only ever adds time, so the slow half is the noise; the
    minimum alone would be one lucky forward, lower than a step usually takes."""
    xs = sorted(float(x) for x in times_ms)
    if not xs:
        raise ValueError("no times to summarise")
    return float(np.median(xs[: (len(xs) + 1) // 2]))


def robust_points(samples: dict[int, list[float]]) -> dict[int, float]:
    """``{n: ms}`` from ``{n: [ms, ...]}`` forward times: :func:`low_median` per n, then
    the running maximum over n (a forward over more tokens never takes less time)."""
    out, top = {}, 0.0
    for n in sorted(samples):
        top = max(top, low_median(samples[n]))
        out[n] = top
    return out


def implausible(points: dict[int, float]) -> str | None:
    """Why ``{n: ms}`` cannot be the Target's own cost (None when it can): some t(n) over
    ``PLAUSIBLE_PER_TOKEN`` x n x t(1). One batch of n tokens does at most the work of n
    one-token forwards (on the reference CPU t(2) = 1.7 t(1), with one thread ~2 t(1),
    on a GPU ~1); more is threads waiting on each other for cores another process holds."""
    t1 = points.get(1)
    if not t1:
        return "no t(1)"
    for n, ms in sorted(points.items()):
        if ms > PLAUSIBLE_PER_TOKEN * n * t1:
            return f"t({n}) = {ms / t1:.1f} t(1)"
    return None
