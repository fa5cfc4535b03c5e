"""The Target's token distribution p: the logits processing that plain decoding applies.

Speculative sampling is lossless only if verification draws from exactly the
distribution plain decoding would draw from (docs/design.md, 'Exactness'), so both go through
:func:`target_distribution`. The order is the Hugging Face ``generate`` one:
repetition penalty (over committed tokens only) -> temperature -> top-k -> top-p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Enough candidates to hold the nucleus in almost every row; a row whose nucleus
# is wider falls back to a full sort (exact either way).
_NUCLEUS_PROBE = 256


@dataclass(frozen=True)
class SamplingParams:
    """How the Target picks a token.

    temperature: 0 = greedy (argmax; the other fields are ignored), else logits / T.
    top_k: keep the k most likely tokens (0 = off). top_p: keep the smallest set of
    most likely tokens whose probability reaches top_p (1.0 = off).
    repetition_penalty: CTRL-style (Keskar et al. 2019, as in HF and llama.cpp):
    a positive logit of a token seen in the last ``penalty_last_n`` committed
    tokens is divided by it, a negative one multiplied (1.0 = off).
    seed: seed of the random generator (None = fresh entropy).
    Raises ValueError on out-of-range values.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    penalty_last_n: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:  # also refuses NaN, as do the checks around it
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.penalty_last_n < 0:
            raise ValueError(f"penalty_last_n must be >= 0, got {self.penalty_last_n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def as_dict(self) -> dict:
        if self.greedy:
            return {"temperature": 0.0}
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "repetition_penalty": self.repetition_penalty, "seed": self.seed}


GREEDY = SamplingParams()


class TokenDistribution:
    """A distribution over a support of token ids: ``ids`` int64 ``[m]``, ``probs`` float64 ``[m]``
    (sums to 1, descending order not guaranteed)."""

    __slots__ = ("ids", "probs", "_cdf")

    def __init__(self, ids: np.ndarray, probs: np.ndarray):
        self.ids = ids
        self.probs = probs
        self._cdf = None

    def prob(self, token: int) -> float:
        """p(token); 0.0 outside the support."""
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if len(hit) else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        """Draw one token id by inverse transform sampling (one uniform draw)."""
        if self._cdf is None:
            self._cdf = np.cumsum(self.probs)
        i = int(np.searchsorted(self._cdf, rng.random() * self._cdf[-1], side="right"))
        return int(self.ids[min(i, len(self.ids) - 1)])

    def dense(self, n_vocab: int) -> np.ndarray:
        """float64 ``[n_vocab]`` with zeros outside the support."""
        p = np.zeros(n_vocab)
        p[self.ids] = self.probs
        return p


def apply_repetition_penalty(logits: np.ndarray, recent: Sequence[int], penalty: float) -> np.ndarray:
    """Return a copy of ``logits`` ``[n_vocab]`` with the CTRL penalty on the ids in ``recent``.

    >>> apply_repetition_penalty(np.array([2.0, -2.0, 1.0]), [0, 1, 1], 2.0).tolist()
    [1.0, -4.0, 1.0]
    """
    out = np.array(logits, dtype=np.float64)
    seen = np.unique(np.asarray(recent, dtype=np.int64))
    if len(seen) and penalty != 1.0:
        v = out[seen]
        out[seen] = np.where(v > 0, v / penalty, v * penalty)
    return out


def target_distribution(
    logits: np.ndarray, params: SamplingParams, committed: Sequence[int] = ()
) -> TokenDistribution:
    """The Target's distribution p at one position, from raw logits ``[n_vocab]``.

    ``committed`` are the tokens before this position (prompt and output; only the
    last ``penalty_last_n`` are read, for the repetition penalty). Never pass draft
    tokens that are not yet accepted: penalty state comes from committed tokens only.
    For greedy params the result is a point mass on the argmax.

    >>> d = target_distribution(np.log(np.array([0.5, 0.3, 0.2])), SamplingParams(temperature=1.0, top_p=0.7))
    >>> d.ids.tolist(), np.round(d.probs, 3).tolist()
    ([0, 1], [0.625, 0.375])
    """
    if params.greedy:
        return TokenDistribution(np.array([int(np.argmax(logits))]), np.array([1.0]))
    if params.repetition_penalty != 1.0 and params.penalty_last_n:
        x = apply_repetition_penalty(logits, committed[-params.penalty_last_n :], params.repetition_penalty)
    else:
        x = np.asarray(logits, dtype=np.float64)
    x = x / params.temperature
    n = len(x)
    if params.top_k and params.top_k < n:
        ids = np.argpartition(x, n - params.top_k)[n - params.top_k :]
    else:
        ids = np.arange(n)
    z = x[ids]
    p = np.exp(z - z.max())
    p /= p.sum()
    if params.top_p < 1.0:
        ids, p = _nucleus(ids, p, params.top_p)
    return TokenDistribution(ids.astype(np.int64), p)


def _nucleus(ids: np.ndarray, p: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Smallest most-likely set with mass >= top_p (HF TopPLogitsWarper keeps the same set)."""
    m = len(p)
    if m > _NUCLEUS_PROBE:
        cand = np.argpartition(p, m - _NUCLEUS_PROBE)[m - _NUCLEUS_PROBE :]
        order = cand[np.argsort(-p[cand], kind="stable")]
        if p[order].sum() < top_p:
            order = np.argsort(-p, kind="stable")  # nucleus wider than the probe
    else:
        order = np.argsort(-p, kind="stable")
    mass = np.cumsum(p[order])
    keep = int(np.searchsorted(mass, top_p, side="left")) + 1  # first prefix reaching top_p
    sel = order[: min(keep, len(order))]
    q = p[sel]
    return ids[sel], q / q.sum()
