"""Verification kernels (docs/design.md, 'Exactness'). Pure functions on small arrays."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from assistd.ground.sampling import TokenDistribution
from assistd.targets.base import TokenTree

# The one near-tie bound, for the tests and `assistd bench` alike: greedy speculative
# output may first differ from plain decoding only where plain decoding's top-2 logit
# gap is below this. On llama.cpp with exact numerics batched and one-token logits are
# bit-identical (no difference at all); on torch they differ by float rounding (4.5e-5
# logits measured on Gemma 3 270M, float32 CPU), four orders of magnitude below it.
# Frozen: a difference at a wider gap is a decoding bug, never a reason to raise it.
NEAR_TIE_GAP = 0.1


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


def greedy_accept_tree(tree: TokenTree, target_argmax: Sequence[int] | np.ndarray) -> tuple[list[int], int]:
    """Greedy verification of a token tree (SpecInfer, Miao et al. 2024; Medusa).

    target_argmax: int ``[len(tree)]``, the Target's argmax at every node (from
    :meth:`Target.evaluate_tree`). Walk from the root, each time to the child whose
    token equals the argmax at the current node; stop where no child does. Returns
    ``(path, token)``: node indices from the root (included) to the last accepted node,
    and the Target's argmax there (the correction, or the bonus token at a leaf). A
    round commits ``[tree.tokens[i] for i in path[1:]]`` then ``token``: the longest
    branch that agrees with the Target plus one Target token, which is what greedy
    decoding commits (for a chain, :func:`greedy_accept`).

    >>> tree = TokenTree((9, 5, 6, 7, 8), (-1, 0, 0, 2, 2))  # 9 -> {5, 6 -> {7, 8}}
    >>> greedy_accept_tree(tree, np.array([6, 0, 8, 0, 3]))
    ([0, 2, 4], 3)
    >>> greedy_accept_tree(tree, np.array([4, 0, 8, 0, 3]))
    ([0], 4)
    """
    path = [0]
    while True:
        want = int(target_argmax[path[-1]])
        nxt = next((c for c in tree.children(path[-1]) if tree.tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)


def top2_gap(logits: np.ndarray) -> float:
    """Difference between the largest and second-largest logit of a row ``[n_vocab]``."""
    top = np.partition(logits, -2)[-2:]
    return float(top[1] - top[0])


def sample_accept(draft: Sequence[int], dist: Callable[[int], TokenDistribution],
                  rng: np.random.Generator) -> tuple[int, int]:
    """Speculative sampling for a model-free draft (a point mass q = δ_d).

    ``dist(i)`` is the Target's distribution p at draft position i (i = k: the bonus
    position), called lazily, in order, only for positions reached. At each position
    draw y ~ p: if y == d_i accept and go on, else commit y and stop; if all k are
    accepted commit a bonus draw from p at k. This accepts d_i with probability
    p(d_i) and otherwise samples p with d_i removed and renormalised, so every
    committed token is distributed exactly as in plain sampling (Leviathan et al.
    2023, Thm. 1 with q = δ_d). Returns ``(j, token)``: commit ``draft[:j]`` then ``token``.
    """
    for i, d in enumerate(draft):
        y = dist(i).sample(rng)
        if y != int(d):
            return i, y
    return len(draft), dist(len(draft)).sample(rng)


def sample_accept_tree(tree: TokenTree, dist: Callable[[int], TokenDistribution],
                       rng: np.random.Generator) -> tuple[list[int], int]:
    """Speculative sampling over a model-free token tree (point-mass drafts).

    ``dist(i)`` is the Target's distribution p at node i (the row of
    :meth:`Target.evaluate_tree`), called lazily, only for the nodes reached. From the
    root: draw y ~ p at the current node; if a child carries y, move to it and draw
    again, else commit y and stop (at a leaf, y is the bonus token). Every committed
    token is then a draw from p given exactly the tokens before it, as in plain
    sampling: a child is followed only when the draw equals it, so the tree only
    decides how many draws one forward pays for, never what they are (SpecInfer's
    multi-step speculative sampling with point-mass drafts; Miao et al. 2024, the
    chain case :func:`sample_accept`). Returns ``(path, token)`` as
    :func:`greedy_accept_tree`.
    """
    path = [0]
    while True:
        y = dist(path[-1]).sample(rng)
        nxt = next((c for c in tree.children(path[-1]) if tree.tokens[c] == y), None)
        if nxt is None:
            return path, y
        path.append(nxt)


def sample_accept_with_q(draft: Sequence[int], q_rows: np.ndarray,
                         dist: Callable[[int], TokenDistribution],
                         rng: np.random.Generator) -> tuple[int, int]:
    """Speculative sampling for a draft model with real probabilities (Leviathan et al. 2023).

    ``q_rows``: float ``[k, n_vocab]``, the draft model's distribution at each draft
    position (each row sums to 1 and ``q_rows[i, draft[i]] > 0``). Accept d_i with
    probability min(1, p(d_i) / q(d_i)); on rejection commit a draw from
    normalise(max(0, p − q)) and stop; if all k are accepted commit a bonus draw
    from p at k. Returns ``(j, token)`` as :func:`sample_accept`.
    """
    n_vocab = q_rows.shape[1]
    for i, d in enumerate(draft):
        d = int(d)
        p = dist(i)
        if rng.random() * q_rows[i, d] < p.prob(d):  # u < p/q without dividing
            continue
        residual = np.maximum(p.dense(n_vocab) - q_rows[i], 0.0)
        ids = np.flatnonzero(residual)
        if not len(ids):  # p == q up to rounding: the residual is p itself
            return i, p.sample(rng)
        return i, TokenDistribution(ids, residual[ids] / residual[ids].sum()).sample(rng)
    return len(draft), dist(len(draft)).sample(rng)
