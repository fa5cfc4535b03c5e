"""The Target's cost model t(n): milliseconds of one forward pass over n tokens.

A round with a draft of L tokens evaluates ``[last] + draft``, n = L + 1 tokens;
a plain step evaluates n = 1. Speculation pays only when the tokens a round
commits outweigh its cost: on the reference 2-core CPU t(9) is ~4x t(1)
(docs/design.md, 'Reference measurements'), on a GPU t(n) is nearly flat. Points
are measured medians; between points t is linear, past the last point it grows
with the last segment's slope.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from assistd.ground.errors import InputError

# t(n) measured on this project's reference 2-core CPU (docs/design.md, 'Reference measurements'):
# SmolLM2-135M Q4_1 on llama.cpp, median ms per forward over n tokens.
BRIEF_CPU_POINTS = {1: 11.0, 2: 19.0, 4: 26.0, 8: 43.0, 16: 75.0, 32: 142.0}
# A calibrated t(n) above this x n x t(1) is the machine's load, not the Target (implausible).
PLAUSIBLE_PER_TOKEN = 1.5

log = logging.getLogger("assistd.costmodel")


@dataclass(frozen=True)
class CostModel:
    """``points``: ``{n_tokens: ms}`` measured forward times, n >= 1; ``source``: where
    they come from; ``note``: why they are not a plain measurement ("" when they are)."""

    points: dict[int, float]
    source: str = "reference"
    note: str = ""

    def __post_init__(self):
        xs = sorted(self.points)
        ys = [self.points[x] for x in xs]
        if not xs or xs[0] != 1 or any(not math.isfinite(y) or y <= 0 for y in ys):
            raise InputError(
                f"cost model {self.source}: needs finite positive times (ms) for token counts"
                " >= 1, starting with 1 (a plain step)")
        if any(b < a for a, b in zip(ys, ys[1:])):
            raise InputError(f"cost model {self.source}: a forward over more tokens cannot"
                             " take less time; measure again on a quiet machine")

    def t_ms(self, n_tokens: int) -> float:
        """Forward time over ``n_tokens`` (>= 1), interpolated, in ms."""
        xs = sorted(self.points)
        ys = [self.points[x] for x in xs]
        if len(xs) == 1:
            return ys[0] * n_tokens / xs[0] if n_tokens > xs[0] else ys[0]
        if n_tokens > xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + slope * (n_tokens - xs[-1])
        return float(np.interp(n_tokens, xs, ys))

    def round_ms(self, draft_len: int) -> float:
        """A round with ``draft_len`` draft tokens (0 = a plain step): t(draft_len + 1)."""
        return self.t_ms(draft_len + 1)

    def table(self, max_draft: int) -> np.ndarray:
        """float ``[max_draft + 1]``: ``round_ms(L)`` for L = 0..max_draft."""
        return np.array([self.round_ms(L) for L in range(max_draft + 1)])

    def as_dict(self) -> dict:
        out = {"source": self.source, "points": {str(k): v for k, v in sorted(self.points.items())}}
        return {**out, "note": self.note} if self.note else out

    @classmethod
    def brief(cls) -> CostModel:
        return cls(dict(BRIEF_CPU_POINTS), source="reference")

    @classmethod
    def load(cls, path: Path) -> CostModel:
        """Read ``{"points": {"1": 11.0, ...}}`` (or a bare ``{"1": 11.0}``) from JSON.

        Raises :class:`InputError` naming the file on a missing file or bad content.
        """
        try:
            raw = json.loads(Path(path).read_text())
            pts = raw.get("points", raw) if isinstance(raw, dict) else None
            points = {int(k): float(v) for k, v in pts.items() if not isinstance(v, bool)}
            if len(points) != len(pts):
                raise ValueError("times must be numbers")
        except FileNotFoundError:
            raise InputError(f"cost model file not found: {path}") from None
        except (ValueError, TypeError, AttributeError) as e:
            raise InputError(
                f"{path}: not a cost model ({e}); expected JSON like"
                ' {"points": {"1": 11.0, "8": 43.0}} (ms per forward over n tokens)'
            ) from None
        return cls(points, source=str(path))  # InputError names the file on bad values

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n")

    @classmethod
    def calibrate(cls, target, sizes=(1, 2, 4, 8, 16, 32), repeats: int = 5,
                  context_tokens: int = 64) -> CostModel:
        """Measure t(n) on ``target``: forwards over n tokens with logits for every row
        (as a round needs), after ``context_tokens`` of context, ``repeats`` of each size.

        Robust to a busy machine, which only ever adds time: the sizes are measured in
        interleaved passes (a burst of load is spread over all n, not pinned on one) and
        each point is :func:`low_median` (the median of the fastest half), made
        non-decreasing in n. The sizes up to 2 are measured first: if they are already
        :func:`implausible` (seen here with 2 threads on 2 loaded cores: t(2) = 4-9
        t(1), which turns drafting off), or all the sizes are, t(n) is the reference
        CPU's curve scaled to the measured t(1) and ``note`` says why; the online
        measurements then correct it (a seed too pessimistic never would: at k = 0 only
        t(1) is measured). Costs about ``repeats * Σ t(n)`` (~1.6 s for the embedded
        model on 2 quiet CPU cores); a busy machine is found after ``repeats * (t(1) +
        t(2))``. The Target's KV cache is left empty. Raises ValueError when ``sizes``
        (token counts) leaves out 1.
        """
        if 1 not in sizes:
            raise ValueError("calibration sizes must include 1 (a plain step)")
        bos = target.bos_token_id if target.bos_token_id is not None else 0
        prefix = [bos] + [int(t) for t in target.tokenize("def f(x):\n    return x\n" * 8)]
        prefix = prefix[:context_tokens]
        samples: dict[int, list[float]] = {n: [] for n in sizes}
        target.truncate(0)
        target.evaluate(prefix, [])
        why = None
        for part in ([n for n in sizes if n <= 2], [n for n in sizes if n > 2]):
            for _ in range(repeats if part else 0):
                for n in part:
                    batch = (prefix * (n // len(prefix) + 1))[:n]
                    t0 = time.perf_counter()
                    target.evaluate(batch, range(n))
                    samples[n].append((time.perf_counter() - t0) * 1000)
                    target.truncate(len(prefix))
            points = robust_points({n: ms for n, ms in samples.items() if ms})
            why = implausible(points)
            if why is not None:
                break
        target.truncate(0)
        source = f"calibrated:{target.backend}"
        if why is None:
            return cls(points, source=source)
        log.warning("calibration of %s implausible (%s): the machine is busy; using the"
                    " reference curve scaled to t(1) = %.1f ms until measured rounds correct it",
                    target.backend, why, points[1])
        scale = points[1] / BRIEF_CPU_POINTS[1]
        return cls({n: ms * scale for n, ms in BRIEF_CPU_POINTS.items()}, source=source,
                   note=f"busy machine ({why}): reference curve scaled to the measured t(1)")


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
