"""peer:suffixdecoding — SuffixDecoding's rule with Arctic Inference 0.3.0's defaults.

A peer, kept so that ``suffix`` is compared with the method it extends in the same
run on the same data (``assistd replay``). It reproduces the rule of Arctic
Inference's ``SuffixTree::speculate`` (csrc/suffix_decoding/suffix_tree.cc) on our
data structures rather than its suffix trees:

- two sources: the request's own tokens (Arctic's per-request tree, which holds the
  prompt and the response so far, so the context's own tail is one of the
  occurrences and counts in the denominators) and the history (Arctic's global tree
  of earlier responses);
- every match length m = 1 .. 63 of the last 64 context tokens is tried; for each,
  the most frequent continuation is followed with probability = product of
  count(child) / count(parent), stopped below ``min_token_prob`` (0.1) and at
  ``min(k, floor(m * max_spec_factor + max_spec_offset))`` (factor 1, offset 0)
  tokens and at the trees' depth of 64 (m + draft length <= 64); the draft with the
  highest score (Σ of the cumulative probabilities) wins, a later (longer) m on ties;
- the two sources' best drafts compete on score, the request's on ties.

Tree mode (``tree=True``, the arm ``peer:suffixdecoding+tree`` of replay and bench; Arctic's
``use_tree_spec``, ``SuffixTree::_speculate_tree``): for each match length the draft
is a token tree grown best first from a max-heap on the cumulative estimate (the
product of count(child) / count(parent) along the branch), children below
``min_token_prob`` pruned, up to ``min(max_nodes, floor(m * max_spec_factor +
max_spec_offset))`` nodes; its score is Σ of every node's cumulative estimate, and
the choice over match lengths and sources is the path mode's. ``max_nodes`` plays
Arctic's ``max_spec_tokens`` (a node budget there); ``k`` caps the depth.

Differences, by necessity: Arctic's global tree also holds the active response (here
the history holds only earlier turns), and history occurrences beyond the index's
``max_occurrences`` are an even sample rather than exact counts. Ties between children
of equal count go to the smaller token id (Arctic: hash-map order).
"""

from __future__ import annotations

import math

import numpy as np

from proposers.base import Draft, Proposer, register
from proposers.index import SEP, HistoryIndex, Occurrences
from proposers.match import frequent_path, frequent_tree, match_lengths

TREE_DEPTH = 64


def _best_over_lengths(rows_for, lengths: range, k: int, factor: float, offset: float,
                       min_prob: float):
    """Best (score, tokens, probs, m) over match lengths; ``rows_for(m)`` gives the
    continuation rows of the m-suffix's occurrences (or None: no occurrence, stop).
    Rows are reused while the occurrence count does not change (same set)."""
    best = (0.0, None, None, 0)
    last_rows, path = None, None
    for m in lengths:
        rows = rows_for(m)
        if rows is None:
            break
        cap = min(k, int(m * factor + offset + 1e-6), TREE_DEPTH - m)
        if cap < 1:
            continue
        if rows is not last_rows:
            path = frequent_path(rows, min(rows.shape[1], TREE_DEPTH - 1), min_prob)
            last_rows = rows
        tokens, probs = path[0][:cap], path[1][:cap]
        score = float(np.cumprod(probs).sum()) if len(tokens) else 0.0
        if len(tokens) and score >= best[0]:
            best = (score, tokens, probs, m)
    return best


def _best_tree_over_lengths(rows_for, lengths: range, k: int, max_nodes: int, factor: float,
                            offset: float, min_prob: float, max_leaves: int | None):
    """Best (score, [(branch, cumulative)], m) over match lengths, tree mode: each m's
    tree is the first ``min(max_nodes, floor(m * factor + offset))`` nodes of the
    best-first expansion (the heap's order does not depend on the budget), at most
    ``min(k, TREE_DEPTH - m)`` deep."""
    best = (0.0, None, 0)
    cache: dict[tuple[int, int], list] = {}
    for m in lengths:
        rows = rows_for(m)
        if rows is None:
            break
        budget = min(max_nodes, int(m * factor + offset + 1e-6))
        depth = min(k, TREE_DEPTH - m, rows.shape[1])
        if budget < 1 or depth < 1:
            continue
        key = (id(rows), depth)
        grown = cache.get(key)
        # Grown only as far as this m's budget asks (short matches get small trees).
        if grown is None or (len(grown[1]) == grown[0] < budget):
            grown = (budget, frequent_tree(rows, depth, budget, min_prob, max_leaves=max_leaves))
            cache[key] = grown
        nodes = grown[1][:budget]
        score = float(sum(c for _, c in nodes))
        if nodes and score >= best[0]:
            best = (score, nodes, m)
    return best


def tree_layout(nodes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tokens, parents, probs)`` of a :class:`Draft` tree from best-first nodes
    ``[(branch tokens, cumulative estimate)]`` (each after its parent): depth first,
    the likeliest child first, ``probs`` the estimate given the parent.

    >>> t, p, q = tree_layout([((5,), 1.0), ((5, 6), 0.5), ((5, 7), 0.25), ((5, 6, 8), 0.5)])
    >>> t.tolist(), p.tolist(), q.tolist()
    ([5, 6, 8, 7], [-1, 0, 1, 0], [1.0, 0.5, 1.0, 0.25])
    """
    cum = dict(nodes)
    kids: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for b, _ in nodes:  # best first, so each list is already likeliest first
        kids.setdefault(b[:-1], []).append(b)
    tokens, parents, probs, index = [], [], [], {}
    stack = kids.get((), [])[::-1]
    while stack:
        b = stack.pop()
        index[b] = len(tokens)
        tokens.append(b[-1])
        parents.append(index[b[:-1]] if len(b) > 1 else -1)
        probs.append(cum[b] / cum[b[:-1]] if len(b) > 1 else cum[b])
        stack.extend(kids.get(b, [])[::-1])
    return (np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64),
            np.array(probs, dtype=np.float64))


@register
class SuffixDecodingPeer(Proposer):
    """SuffixDecoding (Arctic Inference 0.3.0 defaults) over the request and the history."""

    name = "peer:suffixdecoding"

    def __init__(self, history: HistoryIndex | None = None, *, max_spec_factor: float = 1.0,
                 max_spec_offset: float = 0.0, min_token_prob: float = 0.1, tree: bool = False,
                 max_nodes: int = 64, max_leaves: int | None = None):
        if max_nodes < 1 or (max_leaves is not None and max_leaves < 1):
            raise ValueError("need max_nodes >= 1 and max_leaves >= 1 (or None)")
        self.history = history
        self.factor, self.offset, self.min_prob = max_spec_factor, max_spec_offset, min_token_prob
        self.tree = tree and max_leaves != 1  # one leaf: a chain, the path mode
        self.max_nodes, self.max_leaves = max_nodes, max_leaves

    def _best(self, rows_for, ctx_len: int, k: int):
        lengths = range(1, min(ctx_len, TREE_DEPTH))
        if self.tree:
            return _best_tree_over_lengths(rows_for, lengths, k, self.max_nodes, self.factor,
                                           self.offset, self.min_prob, self.max_leaves)
        return _best_over_lengths(rows_for, lengths, k, self.factor, self.offset, self.min_prob)

    def _local(self, ctx: np.ndarray, k: int, depth: int):
        L = len(ctx)
        # Every occurrence of the last token, the context's own end included.
        ends = np.flatnonzero(ctx == ctx[L - 1]) + 1
        lengths = match_lengths(ctx, ends, ctx, TREE_DEPTH - 1)
        idx = ends[:, None] + np.arange(depth)[None, :]
        cont = np.where(idx < L, ctx[np.minimum(idx, L - 1)], SEP)
        cache: dict[int, np.ndarray] = {}

        def rows_for(m: int):
            keep = lengths >= m
            n = int(keep.sum())
            if n == 0:
                return None
            if n not in cache:  # nested sets: equal size means the same set
                cache[n] = cont[keep]
            return cache[n]

        return self._best(rows_for, L, k)

    def _global(self, ctx: np.ndarray, k: int, depth: int, scope):
        cache: dict[int, np.ndarray] = {}

        def rows_for(m: int):
            occ: Occurrences = self.history.find_at(scope, ctx, m, depth)
            if not len(occ.cont):
                return None
            if occ.count not in cache:
                cache[occ.count] = occ.cont
            return cache[occ.count]

        return self._best(rows_for, len(ctx), k)

    def propose(self, context: np.ndarray, k: int, *, scope: str | None = None,
                language: str | None = None) -> Draft | None:
        ctx = np.asarray(context, dtype=np.int64)
        if k < 1 or len(ctx) < 2:
            return None
        depth = min(k, TREE_DEPTH - 1)
        best, source = self._local(ctx, k, depth), "context"
        if self.history is not None:
            g = self._global(ctx, k, depth, scope)
            if g[1] is not None and (best[1] is None or g[0] > best[0]):
                best, source = g, "history"
        if self.tree:
            score, nodes, m = best
            if not nodes or math.isclose(score, 0.0):
                return None
            tokens, parents, probs = tree_layout(nodes)
            chain = bool((parents == np.arange(-1, len(tokens) - 1)).all())
            return Draft(tokens=tokens, probs=probs, source=source, match_len=m,
                         parents=None if chain else parents)
        score, tokens, probs, m = best
        if tokens is None or not len(tokens) or math.isclose(score, 0.0):
            return None
        return Draft(tokens=tokens, probs=probs, source=source, match_len=m)

