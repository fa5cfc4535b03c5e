"""suffix: frequency-scored continuations of the longest matching context suffix.

After SuffixDecoding (Oliaro et al., arXiv 2411.04975) as implemented in Arctic
Inference: find the longest suffix of the context (up to 64 tokens) that occurs
earlier, in the live request or in the scope's history; among everything that
followed its occurrences follow the most frequent continuation, token by token. A
token's estimated probability is count(child) / count(parent) along that path;
the draft stops once the product falls below ``min_token_prob`` and is capped at
``min(k, alpha * match_len)``. The draft from the live request and the draft from
the history compete on score (Σ of the cumulative estimates, the expected number
of accepted tokens).

Two steps beyond SuffixDecoding. The count ratios are discounted by the match
length they rest on (a 1-token match is weak evidence, a 32-token match strong; see
MATCH_PRIOR). And with a cost model t(n, context) of the Target, the draft is
cut to the length L that maximises expected committed tokens per millisecond,
``(1 + Σ_{i≤L} A_i) / t(L + 1)`` with A_i the cumulative estimate, and no draft at
all (a plain step) when L = 0 wins. On a CPU, where t(9) ≈ 4 t(1) (docs/design.md,
'Reference measurements'), this is what keeps weak matches from costing time.
"""

from __future__ import annotations

import math

import numpy as np

from assistd.ground.costmodel import REFERENCE_CONTEXT, CostModel, context_bucket
from proposers.base import Draft, Proposer, register
from proposers.index import MAX_DEPTH, HistoryIndex, Occurrences
from proposers.match import frequent_path, frequent_tree, live_occurrences


def best_length(probs, round_ms) -> int:
    """The draft length L in [0, len(probs)] that maximises expected committed tokens
    per ms, ``(1 + Σ_{i≤L} Π_{j≤i} probs_j) / round_ms[L]``; ``round_ms[L]`` is the
    cost of a round with L draft tokens (``[0]``: a plain step). Ties: the shorter.

    Worked example with the reference CPU costs (11, 19, ~23 ms for 0, 1, 2 drafts):
    a sure pair of tokens pays (3 / 23 > 1 / 11), a 50% guess does not (1.5 / 19).

    >>> best_length([1.0, 1.0], [11.0, 19.0, 22.5])
    2
    >>> best_length([0.5], [11.0, 19.0])
    0
    """
    # A plain loop: L <= 64, and numpy's per-call overhead would dominate here.
    best, best_rate = 0, 1.0 / round_ms[0]
    cum = expected = 1.0
    for n, p in enumerate(probs[: len(round_ms) - 1], 1):
        cum *= p
        expected += cum
        rate = expected / round_ms[n]
        if rate > best_rate:
            best, best_rate = n, rate
    return best


# Trust in a continuation after a match of m tokens: (m + j) / (m + j + c) for draft
# token j, c per source. Fitted on `assistd replay` of the shared transcripts (oracle
# acceptance by match length, SmolLM2 tokenizer): after a 1-token match the live
# context's most frequent continuation was accepted 40% of the time (c = 1.5), the
# history's 20% (c = 4); after 16 tokens, 90% and 94%. Tuning c over 0.5..5 on the
# same replay moved the modeled speedup (physical cost) between 1.07 and 1.13; 1.5 / 4
# is in the flat top. The tuner (assistd/decoding/tuner.py) caps drafts per language from measured
# acceptance on top of it; learning c itself per language is not done yet.
MATCH_PRIOR = {"context": 1.5, "history": 4.0}

# (alpha, min_token_prob) defaults. Chains: SuffixDecoding's max_spec_factor 1 and
# min_token_prob 0.1. Trees: a node down to a 0.1% estimate, 4 tokens deep per matched
# token; the node budget and the cost model cut the rest. Fitted on `assistd replay` of
# the shared transcripts (223,116 model tokens, flat cost, 64 nodes, k 16): tokens per
# Target call 2.64 with the chain defaults, 3.40 with these, 3.44 with alpha 16.
CHAIN_DEFAULTS = (1.0, 0.1)
TREE_DEFAULTS = (4.0, 0.001)
# Under a cost model, a tree proposer drafts a tree only when its expected rate beats
# both its likeliest branch's and the chain proposer's own draft's by this factor, and
# that branch only when it beats the chain draft by it. The cost model prices a tree
# round as a chain of as many tokens, but `assistd bench --tree both` on this CPU
# (llama.cpp, stdlib workload, 172 tree rounds at a 5% margin) measured ~10 ms more per
# tree round (the branches' KV bookkeeping) and trees at 0.91x chains; at 25% the flat
# replay keeps 3.29 tokens per Target call (3.39 at 5%). A measured per-Target tree
# overhead would replace this factor.
TREE_MARGIN = 1.25


@register
class SuffixProposer(Proposer):
    """SuffixDecoding over the live request and a :class:`HistoryIndex`.

    history:        the scope's history index, or None (live request only).
    max_depth:      longest context suffix matched, in tokens.
    alpha:          draft cap per matched token: at most ``floor(alpha * match_len)``
                    tokens deep (SuffixDecoding's max_spec_factor) [default: 1, trees 4].
    min_token_prob: stop when the cumulative estimate falls below it [default: 0.1,
                    trees 0.001].
    prior:          pseudo-count added to every denominator; > 0 makes rare evidence
                    less sure (1 occurrence -> 1 / (1 + prior)).
    match_prior:    ``{"context": c, "history": c}``: each count ratio is multiplied by
                    ``(m + j) / (m + j + c)`` for draft token j after an m-token match
                    (short matches are weak evidence; see MATCH_PRIOR). 0 = raw ratios,
                    as SuffixDecoding has them.
    cost:           the Target's cost model; when given, each draft is cut to the
                    length with the best expected tokens per ms (maybe none).
    use_context:    also draft from the live request.
    tree:           draft token trees (:func:`proposers.match.frequent_tree`): the
                    likeliest continuations of both sources in one tree, best first by
                    cumulative estimate, sized by the cost model like a chain (so a
                    chain, or nothing, where that pays more).
    max_nodes:      tree node budget per round (tokens verified in one forward).
    max_leaves:     branches a tree may have (the Target's ``tree_leaves``; None: any).
    """

    name = "suffix"

    def __init__(self, history: HistoryIndex | None = None, *, max_depth: int = MAX_DEPTH,
                 alpha: float | None = None, min_token_prob: float | None = None,
                 prior: float = 0.0,
                 cost: CostModel | None = None, use_context: bool = True, min_match: int = 1,
                 match_prior: dict[str, float] | None = None, tree: bool = False,
                 max_nodes: int = 64, max_leaves: int | None = None):
        # Trees: the node budget and the cost model size the round, so the floors that
        # keep a chain short are far lower (TREE_DEFAULTS).
        chain_alpha, chain_floor = TREE_DEFAULTS if tree and max_leaves != 1 else CHAIN_DEFAULTS
        alpha = chain_alpha if alpha is None else alpha
        min_token_prob = chain_floor if min_token_prob is None else min_token_prob
        if max_depth < 1 or alpha <= 0 or not 0 <= min_token_prob <= 1 or prior < 0:
            raise ValueError("need max_depth >= 1, alpha > 0, 0 <= min_token_prob <= 1, prior >= 0")
        if max_nodes < 1 or (max_leaves is not None and max_leaves < 1):
            raise ValueError("need max_nodes >= 1 and max_leaves >= 1 (or None)")
        self.tree = tree and max_leaves != 1
        # The chain a tree must beat is the chain proposer's own draft, at its floors.
        self._chain_floors = CHAIN_DEFAULTS if self.tree else (alpha, min_token_prob)
        self.max_nodes, self.max_leaves = max_nodes, max_leaves
        self.history, self.max_depth, self.alpha = history, max_depth, alpha
        self.min_token_prob, self.prior, self.cost = min_token_prob, prior, cost
        self.use_context, self.min_match = use_context, max(1, min_match)
        self.match_prior = {**MATCH_PRIOR, **(match_prior if match_prior is not None else {})}
        self._width = max(MAX_DEPTH, max_nodes) if self.tree else MAX_DEPTH
        self._by_bucket: dict[int, tuple[list[float] | None, dict[str, int]]] = {}
        self._round_ms, self._min_len, self._chain_min_len = self._costs(None)

    def _costs(self, context: int | None):
        """Round costs ``[L] -> ms`` after ``context`` tokens (t(n, context), cached per
        context bucket at the bucket's lower bound) and, per source, the shortest match
        whose best imaginable continuation (every count ratio 1) could pay there, at
        this proposer's alpha and at the chain floors' (shorter matches are not even
        read)."""
        key = -1 if context is None else context_bucket(context)
        if key not in self._by_bucket:
            at = None if context is None else max(key, REFERENCE_CONTEXT)
            self._round_ms = (self.cost.table(self._width, context=at).tolist()
                              if self.cost is not None else None)
            chain_alpha = self._chain_floors[0]
            self._by_bucket[key] = (
                self._round_ms,
                {src: self._shortest_paying(c, self.alpha) for src, c in self.match_prior.items()},
                {src: self._shortest_paying(c, chain_alpha) for src, c in self.match_prior.items()})
        return self._by_bucket[key]

    def _shortest_paying(self, c: float, alpha: float) -> int:
        if self._round_ms is None:
            return self.min_match
        for m in range(self.min_match, self.max_depth + 1):
            n = min(MAX_DEPTH, math.floor(alpha * m + 1e-6))
            upper = [(m + j) / (m + j + c) for j in range(n)]
            if n and best_length(upper, self._round_ms) > 0:
                return m
        return self.max_depth + 1

    def _path(self, occ: Occurrences, k: int, source: str):
        """``(tokens, probs, score)`` of the most frequent continuation at the chain
        floors, or None."""
        alpha, floor = self._chain_floors
        if occ.match_len < max(self.min_match, self._chain_min_len[source]) or not len(occ.cont):
            return None
        cap = min(k, math.floor(alpha * occ.match_len + 1e-6))
        if cap < 1:
            return None
        tokens, probs = frequent_path(occ.cont, cap, floor, self.prior)
        if not len(tokens):
            return None
        c = self.match_prior[source]
        if c:  # token j extends a match of m + j tokens: trust it (m + j) / (m + j + c)
            m = occ.match_len + np.arange(len(tokens))
            probs = probs * (m / (m + c))
        score, cum, n = 0.0, 1.0, 0
        for p in probs.tolist():
            cum *= p
            if cum < floor:
                break
            score += cum
            n += 1
        if n == 0:
            return None
        return tokens[:n], probs[:n], score

    def _occurrences(self, context: np.ndarray, depth: int, scope: str | None):
        """``[(source, Occurrences)]`` of the live request and the history, as enabled."""
        out = []
        if self.use_context:
            out.append(("context", live_occurrences(context, depth, self.max_depth,
                                                    min_len=self._min_len["context"],
                                                    alpha=self.alpha)))
        if self.history is not None:
            out.append(("history", self.history.find(scope, context, depth, self.max_depth,
                                                     self._min_len["history"], self.alpha)))
        return out

    def propose(self, context: np.ndarray, k: int, *, scope: str | None = None,
                language: str | None = None) -> Draft | None:
        if k < 1:
            return None
        context = np.asarray(context, dtype=np.int64)
        # The forward will follow len(context) - 1 cached tokens: price rounds there.
        self._round_ms, self._min_len, self._chain_min_len = self._costs(len(context) - 1)
        depth = min(k, MAX_DEPTH)
        found = self._occurrences(context, depth, scope)
        if self.tree:
            return self._propose_tree(found, k)
        return self._chain(found, k)

    def _chain(self, found, k: int) -> Draft | None:
        """The chain draft: each source's most frequent continuation at the chain
        floors, the better score of the two, cut by the cost model."""
        best, source, occ = None, "", None
        if self.use_context:
            source, occ = found[0]
            best = self._path(occ, k, "context")
        if self.history is not None:
            hist = found[-1][1]
            h = self._path(hist, k, "history")
            if h is not None and (best is None or h[2] > best[2]):
                best, source, occ = h, "history", hist
        if best is None:
            return None
        tokens, probs, _ = best
        if self._round_ms is not None:
            n = best_length(probs.tolist(), self._round_ms)
            if n == 0:
                return None
            tokens, probs = tokens[:n], probs[:n]
        document = None
        if source == "history":  # the most recent document on the drafted path
            on_path = np.flatnonzero((occ.cont[:, : len(tokens)] == tokens[None, :]).all(axis=1))
            document = occ.name(int(on_path[np.argmax(occ.recency[on_path])]))
        return Draft(tokens=tokens, probs=probs, source=source, match_len=occ.match_len,
                     document=document)

    def _propose_tree(self, found, k: int) -> Draft | None:
        """The tree draft: both sources' best-first nodes merged (a branch both sources
        have keeps the higher estimate), the best ``N`` of them by cumulative estimate
        with ``N`` the size whose round pays most under the cost model, laid out depth
        first with the likeliest child first."""
        nodes: dict[tuple[int, ...], tuple[float, str]] = {}
        occs = {}
        floor = self._expansion_floor()
        for source, occ in found:
            if occ.match_len < self.min_match or not len(occ.cont):
                continue
            cap = min(k, math.floor(self.alpha * occ.match_len + 1e-6))
            c = self.match_prior[source]
            m = occ.match_len + np.arange(max(cap, 0))
            trust = m / (m + c) if c else None
            for branch, cum in frequent_tree(occ.cont, cap, self.max_nodes, floor,
                                             self.prior, trust):
                if cum > nodes.get(branch, (0.0, ""))[0]:
                    nodes[branch] = (cum, source)
            occs[source] = occ
        if not nodes:
            return None
        # Best first; a parent before its children (ties: the shorter branch first).
        ranked = sorted(nodes.items(), key=lambda kv: (-kv[1][0], len(kv[0])))
        chosen, has_child, leaves = [], set(), 0
        taken = set()
        for branch, (cum, source) in ranked:
            if len(chosen) >= self.max_nodes:
                break
            parent = branch[:-1]
            if parent and parent not in taken:
                continue
            adds_leaf = not parent or parent in has_child
            if adds_leaf and self.max_leaves is not None and leaves >= self.max_leaves:
                continue
            leaves += int(adds_leaf)
            if parent:
                has_child.add(parent)
            taken.add(branch)
            chosen.append((branch, cum, source))
        if self._round_ms is not None:
            # Three candidates: the chain proposer's own draft (the default), the
            # tree's likeliest branch alone (deeper: the tree's floors) and the tree,
            # each cut by the cost model. One that differs from the chain must beat
            # what it replaces by TREE_MARGIN: the siblings' and the deep nodes'
            # estimates err high (see TREE_MARGIN). So where no tree pays, a tree
            # proposer drafts exactly what the chain proposer would.
            ms = self._round_ms
            chain = self._chain(found, k)
            cum = [] if chain is None else np.cumprod(chain.probs).tolist()
            branch, kids = [], {}
            for item in chosen:
                kids.setdefault(item[0][:-1], item)  # the first (likeliest) child only
            while (nxt := kids.get(branch[-1][0] if branch else ())) is not None:
                branch.append(nxt)
            n = best_size([c for _, c, _ in chosen], ms)
            m = best_size([c for _, c, _ in branch], ms)
            rate = lambda xs, k: (1 + sum(c for _, c, _ in xs[:k])) / ms[k]  # noqa: E731
            r_chain = (1 + sum(cum)) / ms[len(cum)]
            r_branch, r_tree = rate(branch, m), rate(chosen, n)
            if n and r_tree >= TREE_MARGIN * max(r_chain, r_branch):
                chosen = chosen[:n]
            elif m and r_branch >= TREE_MARGIN * r_chain:
                chosen = branch[:m]
            else:
                return chain
        return _tree_draft(chosen, occs)

    def _expansion_floor(self) -> float:
        """The lowest cumulative estimate worth expanding. Under a cost model, the last
        node N of the best round has c_N / (t(N) - t(N-1)) >= that round's rate > 1 / t(0)
        (adding it raised the rate, and a mediant lies between its parts), and the nodes
        before it have larger estimates: so no node below min_n (t(n) - t(n-1)) / t(0) is
        in the best round, and none is expanded (the chosen draft is the same)."""
        floor = self.min_token_prob
        if self._round_ms is not None:
            ms = self._round_ms[: self.max_nodes + 1]
            floor = max(floor, min(np.diff(ms), default=0.0) / ms[0])
        return floor


def best_size(cumulative, round_ms) -> int:
    """How many of a round's candidate tokens to verify: the N in [0, len(cumulative)]
    that maximises ``(1 + Σ_{i<N} cumulative_i) / round_ms[N]``, for candidates in
    decreasing estimate (each after its parent) and ``round_ms[N]`` the cost of a
    forward over N draft tokens. :func:`best_length` is the chain case.

    >>> best_size([1.0, 0.5, 0.5], [11.0, 19.0, 22.5, 25.0])
    3
    """
    best, best_rate, expected = 0, 1.0 / round_ms[0], 1.0
    for n, c in enumerate(cumulative[: len(round_ms) - 1], 1):
        expected += c
        rate = expected / round_ms[n]
        if rate > best_rate:
            best, best_rate = n, rate
    return best


def _tree_draft(chosen, occs) -> Draft:
    """A :class:`Draft` from ``[(branch, cumulative, source)]`` (each branch after its
    parent): depth first, children by decreasing estimate; a chain when it is one."""
    cum = {b: c for b, c, _ in chosen}
    kids: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for b, _, _ in chosen:
        kids.setdefault(b[:-1], []).append(b)
    tokens, parents, probs, index = [], [], [], {}
    stack = sorted(kids.get((), []), key=lambda b: -cum[b])[::-1]
    while stack:
        b = stack.pop()
        index[b] = len(tokens)
        parent = b[:-1]
        tokens.append(b[-1])
        parents.append(index[parent] if parent else -1)
        probs.append(cum[b] / cum[parent] if parent else cum[b])
        stack.extend(sorted(kids.get(b, []), key=lambda x: -cum[x])[::-1])
    first = chosen[0]
    source = first[2]
    occ = occs[source]
    parents_arr = np.array(parents, dtype=np.int64)
    chain = bool((parents_arr == np.arange(-1, len(tokens) - 1)).all())
    tokens_arr = np.array(tokens, dtype=np.int64)
    document = None
    if source == "history":  # the most recent document on the first branch
        branch = [tokens[0]]
        for i in range(1, len(tokens)):
            if parents[i] != i - 1:
                break
            branch.append(tokens[i])
        b = np.array(branch[: occ.cont.shape[1]], dtype=np.int64)  # its source may end sooner
        on = np.flatnonzero((occ.cont[:, : len(b)] == b[None, :]).all(axis=1))
        if len(on):
            document = occ.name(int(on[np.argmax(occ.recency[on])]))
    return Draft(tokens=tokens_arr, probs=np.array(probs), source=source,
                 match_len=occ.match_len, document=document,
                 parents=None if chain else parents_arr)
