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
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from assistd.ground.errors import InputError

# t(n) measured on this project's reference 2-core CPU (docs/design.md, 'Reference measurements'):
# SmolLM2-135M Q4_1 on llama.cpp, median ms per forward over n tokens.
BRIEF_CPU_POINTS = {1: 11.0, 2: 19.0, 4: 26.0, 8: 43.0, 16: 75.0, 32: 142.0}


@dataclass(frozen=True)
class CostModel:
    """``points``: ``{n_tokens: ms}`` measured forward times, n >= 1."""

    points: dict[int, float]
    source: str = "reference"

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
        return {"source": self.source, "points": {str(k): v for k, v in sorted(self.points.items())}}

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
        """Measure t(n) on ``target``: median of ``repeats`` forwards over n tokens with
        logits for every row (as a round needs), after ``context_tokens`` of context.

        Costs about ``repeats * Σ t(n)`` (~1.6 s for the embedded model on 2 CPU cores).
        The Target's KV cache is left empty.
        """
        bos = target.bos_token_id if target.bos_token_id is not None else 0
        prefix = [bos] + [int(t) for t in target.tokenize("def f(x):\n    return x\n" * 8)]
        prefix = prefix[:context_tokens]
        points = {}
        target.truncate(0)
        target.evaluate(prefix, [])
        for n in sizes:
            batch = (prefix * (n // len(prefix) + 1))[:n]
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                target.evaluate(batch, range(n))
                times.append((time.perf_counter() - t0) * 1000)
                target.truncate(len(prefix))
            # A busy CPU can make a bigger batch look faster; time never shrinks with n.
            points[n] = max(float(np.median(times)), max(points.values(), default=0.0))
        target.truncate(0)
        return cls(points, source=f"calibrated:{target.backend}")
