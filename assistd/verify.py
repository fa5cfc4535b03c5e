"""Verification kernels (BRIEF §3). Pure functions on small arrays."""

from __future__ import annotations

import numpy as np


def greedy_accept(draft: np.ndarray, target_argmax: np.ndarray) -> int:
    """Number of leading draft tokens equal to the Target's greedy choice.

    draft: int ``[k]``; target_argmax: int ``[k + 1]``, the Target's argmax at each
    draft position plus the bonus position. With ``j`` the result, a round commits
    ``draft[:j]`` and then ``target_argmax[j]`` (the correction, or the bonus token
    when ``j == k``).

    >>> greedy_accept(np.array([5, 6, 7]), np.array([5, 6, 9, 4]))
    2
    >>> greedy_accept(np.array([5, 6]), np.array([5, 6, 1]))
    2
    """
    k = len(draft)
    mismatch = np.flatnonzero(draft != target_argmax[:k])
    return int(mismatch[0]) if len(mismatch) else k


def top2_gap(logits: np.ndarray) -> float:
    """Difference between the largest and second-largest logit of a row ``[n_vocab]``."""
    top = np.partition(logits, -2)[-2:]
    return float(top[1] - top[0])
