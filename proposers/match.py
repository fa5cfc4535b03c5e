"""Matching kernels shared by the lookup proposers: pure functions on token arrays.

Each takes int64 token arrays and returns arrays; none keeps state. Worked examples
in the docstrings run as doctests.
"""

from __future__ import annotations

import math

import numpy as np

from proposers.index import MAX_DEPTH, SEP, Occurrences

_EXACT_BELOW = 32  # candidate count under which live match lengths are computed at once


def match_lengths(tokens: np.ndarray, ends: np.ndarray, tail: np.ndarray, max_n: int) -> np.ndarray:
    """Length of the common suffix of ``tokens[:e]`` and ``tail``, per candidate end ``e``.

    tokens: int64 ``[N]``; ends: int64 ``[c]`` (exclusive end of each occurrence,
    i.e. where its continuation starts); tail: int64 ``[t]``. Returns int64 ``[c]``,
    each at most ``min(max_n, t)``.

    >>> match_lengths(np.array([1, 2, 3, 4, 2, 3]), np.array([3, 6]), np.array([9, 2, 3]), 4)
    array([2, 2])
    """
    n = min(max_n, len(tail))
    if n == 0 or len(ends) == 0:
        return np.zeros(len(ends), dtype=np.int64)
    idx = ends[:, None] - 1 - np.arange(n)[None, :]  # [c, n]
    valid = idx >= 0
    got = tokens[np.where(valid, idx, 0)]
    want = tail[::-1][:n]
    eq = (got == want[None, :]) & valid
    return np.cumprod(eq, axis=1).sum(axis=1)


def frequent_path(cont: np.ndarray, max_len: int, min_prob: float,
                  prior: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Follow the most frequent continuation through ``cont`` (int64 ``[c, d]``, SEP-padded).

    At depth j the rows still on the path vote with their token; the winner (ties: the
    smaller id) gets probability ``count / (rows + prior)``, rows that ended count in
    the denominator. Stops at ``max_len``, when no row continues, or when the
    product of probabilities would fall below ``min_prob``. Returns
    ``(tokens int64 [L], probs float [L])``.

    Worked example: rows [5, 6], [5, 7], [5, 6] -> 5 (3/3), then 6 (2/3).

    >>> t, p = frequent_path(np.array([[5, 6], [5, 7], [5, 6]]), 4, 0.1)
    >>> t.tolist(), [round(float(x), 3) for x in p]
    ([5, 6], [1.0, 0.667])
    """
    toks: list[int] = []
    probs: list[float] = []
    rows = cont
    cum = 1.0
    for j in range(min(max_len, cont.shape[1])):
        if len(rows) == 1:  # one occurrence left: the rest of it, each step count 1/1
            rest = rows[0, j : min(max_len, cont.shape[1])]
            stop = np.flatnonzero(rest == SEP)
            rest = rest[: stop[0]] if len(stop) else rest
            p = 1.0 / (1.0 + prior)
            for t in rest.tolist():
                if cum * p < min_prob:
                    break
                cum *= p
                toks.append(t)
                probs.append(p)
            break
        col = rows[:, j]
        if col[0] != SEP and (col == col[0]).all():  # all rows agree: no vote needed
            p = len(col) / (len(col) + prior)
            if cum * p < min_prob:
                break
            cum *= p
            toks.append(int(col[0]))
            probs.append(p)
            continue
        vals, counts = np.unique(col, return_counts=True)
        if vals[0] == SEP:
            vals, counts = vals[1:], counts[1:]
        if not len(vals):
            break
        i = int(counts.argmax())
        p = float(counts[i]) / (len(col) + prior)
        if cum * p < min_prob:
            break
        cum *= p
        toks.append(int(vals[i]))
        probs.append(p)
        rows = rows[col == vals[i]]
    return np.array(toks, dtype=np.int64), np.array(probs, dtype=np.float64)


def live_occurrences(context: np.ndarray, depth: int, max_depth: int = MAX_DEPTH,
                     limit: int = 256, min_len: int = 1,
                     alpha: float | None = None) -> Occurrences:
    """The longest suffix of ``context`` occurring earlier in it without overlapping
    itself (an occurrence ``[e - m, e)`` ends at or before ``L - m``), with the
    ``depth`` tokens after each occurrence (SEP past the end of the context); empty
    when the match is shorter than ``min_len``; with ``alpha``, at most
    ``floor(alpha * m)`` tokens after each.

    >>> occ = live_occurrences(np.array([1, 2, 3, 4, 2, 3]), 3)
    >>> occ.match_len, occ.cont.tolist()
    (2, [[4, 2, 3]])
    """
    ctx = np.asarray(context, dtype=np.int64)
    L = len(ctx)
    if L < 2 or depth < 1:
        return Occurrences.empty(max(depth, 0))
    ends = np.flatnonzero(ctx[: L - 1] == ctx[L - 1]) + 1  # occurrences of length 1
    m = 1
    while len(ends) > _EXACT_BELOW and m < max_depth:
        ok = ends[(ends - m - 1 >= 0) & (ends <= L - m - 1)]
        ok = ok[ctx[ok - m - 1] == ctx[L - m - 1]]
        if not len(ok):
            break
        ends, m = ok, m + 1
    if len(ends) <= _EXACT_BELOW:
        lengths = np.minimum(match_lengths(ctx, ends, ctx, max_depth), L - ends)
        m = int(lengths.max()) if len(lengths) else 0
        ends = ends[lengths == m]
    if m < max(1, min_len) or not len(ends):
        return Occurrences.empty(depth)
    if alpha is not None:  # a draft capped at alpha * m reads no further
        depth = max(1, min(depth, math.floor(alpha * m + 1e-6)))
    count = len(ends)
    if count > limit:
        ends = ends[-limit:]  # the most recent ones
    idx = ends[:, None] + np.arange(depth)[None, :]
    cont = np.where(idx < L, ctx[np.minimum(idx, L - 1)], SEP)
    return Occurrences(m, count, cont, ends)


def frequent_tree(cont: np.ndarray, max_depth: int, max_nodes: int, min_prob: float,
                  prior: float = 0.0, trust=None,
                  max_leaves: int | None = None) -> list[tuple[tuple[int, ...], float]]:
    """The likeliest continuations through ``cont`` (int64 ``[c, d]``, SEP-padded) as a
    tree, best first: SuffixDecoding's tree expansion (Oliaro et al., arXiv
    2411.04975, section 4) over the occurrences' continuations.

    A node's estimate is ``count(node) / (count(parent) + prior)`` (rows that ended
    count in the denominator, as :func:`frequent_path`), times ``trust[j]`` for a node
    at depth j + 1 when given; its cumulative estimate is the product along its branch.
    Nodes are taken in decreasing cumulative estimate (a max-heap: a child never
    beats its parent, so each node comes after its parent) while it is at least
    ``min_prob``, up to ``max_nodes`` nodes, ``max_depth`` deep, and with ``max_leaves``
    (None: any) branches. Returns ``[(branch tokens, cumulative estimate), ...]`` in
    that order: the first entry is the best first token, and the entries' cumulative
    estimates never increase.

    Worked example: rows [5, 6], [5, 7], [5, 6] -> 5 (1.0), 5 6 (0.667), 5 7 (0.333).

    >>> [(b, round(c, 3)) for b, c in frequent_tree(np.array([[5, 6], [5, 7], [5, 6]]), 4, 8, 0.1)]
    [((5,), 1.0), ((5, 6), 0.667), ((5, 7), 0.333)]
    """
    import heapq

    depth_cap = min(max_depth, cont.shape[1])
    out: list[tuple[tuple[int, ...], float]] = []
    if depth_cap < 1 or max_nodes < 1 or not len(cont):
        return out
    # Heap entries: (-cumulative, order, branch, rows of cont on the branch).
    heap: list = []
    order = 0
    has_child: set[tuple[int, ...]] = set()
    leaves = 0

    def push_children(branch: tuple[int, ...], rows: np.ndarray, cum: float) -> None:
        nonlocal order
        j = len(branch)
        if j >= depth_cap:
            return
        col = rows[:, j]
        vals, counts = np.unique(col, return_counts=True)
        keep = vals != SEP
        scale = cum / (len(col) + prior) * (1.0 if trust is None else float(trust[j]))
        for v, c in zip(vals[keep].tolist(), counts[keep].tolist()):
            p = scale * c
            if p >= min_prob:
                order += 1
                heapq.heappush(heap, (-p, order, branch + (v,), rows, j))

    push_children((), cont, 1.0)
    while heap and len(out) < max_nodes:
        neg, _, branch, rows, j = heapq.heappop(heap)
        parent = branch[:-1]
        adds_leaf = not parent or parent in has_child
        if adds_leaf and max_leaves is not None and leaves >= max_leaves:
            continue
        leaves += int(adds_leaf)
        if parent:
            has_child.add(parent)
        out.append((branch, -neg))
        push_children(branch, rows[rows[:, j] == branch[-1]], -neg)
    return out
