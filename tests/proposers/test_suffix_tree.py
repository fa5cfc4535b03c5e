"""suffix token trees: the best-first expansion, the proposer's tree drafts, and the
engine's cut of a draft to what a round may verify (``fit_draft``)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from assistd.decoding.engine import fit_draft
from assistd.ground.costmodel import CostModel
from assistd.targets.base import TokenTree
from proposers.base import Draft
from proposers.index import SEP, HistoryIndex
from proposers.match import frequent_tree
from proposers.suffix import TREE_MARGIN, SuffixProposer, best_size

A = np.array
RAW = {"context": 0.0, "history": 0.0}
FLAT = CostModel({1: 10.0, 128: 10.0}, source="flat")


def index_of(*docs, scope="s"):
    h = HistoryIndex()
    for i, ids in enumerate(docs, 1):
        h.put(scope, i, A(ids), f"d{i}")
    return h


def test_best_first_order_limits_and_leaves():
    """Rows after a match: 1 2 5 / 1 2 6 / 1 3 5 / 4 0 0: the root's children 1 (3/4)
    and 4 (1/4); under 1: 2 (2/3 -> 0.5) and 3 (1/3 -> 0.25); under 1 2: 5 and 6 (0.25)."""
    rows = A([[1, 2, 5], [1, 2, 6], [1, 3, 5], [4, 0, 0]])
    got = frequent_tree(rows, 3, 16, 0.0)
    assert [b for b, _ in got][:2] == [(1,), (1, 2)]
    cums = dict(got)
    assert cums[(1,)] == pytest.approx(0.75) and cums[(4,)] == pytest.approx(0.25)
    assert cums[(1, 2, 5)] == pytest.approx(0.25) and cums[(1, 3)] == pytest.approx(0.25)
    assert [c for _, c in got] == sorted((c for _, c in got), reverse=True)
    assert all(b[:-1] in cums or len(b) == 1 for b, _ in got)  # every parent is there
    assert len(frequent_tree(rows, 3, 3, 0.0)) == 3
    assert max(len(b) for b, _ in frequent_tree(rows, 2, 16, 0.0)) == 2
    assert [b for b, _ in frequent_tree(rows, 3, 16, 0.3)] == [(1,), (1, 2)]
    one = frequent_tree(rows, 3, 16, 0.0, max_leaves=1)
    assert [b for b, _ in one] == [(1,), (1, 2), (1, 2, 5)]  # a chain: the likeliest branch
    # SEP (a document's end) counts in the denominator but is never drafted.
    ended = frequent_tree(A([[7, SEP], [7, 8]]), 2, 8, 0.0)
    assert ended == [((7,), 1.0), ((7, 8), 0.5)]


def test_tree_draft_holds_both_continuations_likeliest_first():
    """History: ``10 11 12 13`` twice and ``10 11 20 21`` once. After ``10 11`` a chain
    drafts 12 13; a tree also drafts 20 21 as the second branch, with parents in the
    engine's convention."""
    h = index_of([10, 11, 12, 13], [10, 11, 12, 13], [10, 11, 20, 21])
    p = SuffixProposer(h, use_context=False, match_prior=RAW, tree=True, alpha=2)
    d = p.propose(A([5, 10, 11]), 4, scope="s")
    assert d.is_tree
    assert d.tokens.tolist() == [12, 13, 20, 21] and d.parents.tolist() == [-1, 0, -1, 2]
    assert d.cumulative().tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert d.score == pytest.approx(2.0) and d.depth == 2
    tree = d.tree(11)
    assert tree.tokens == (11, 12, 13, 20, 21) and tree.parents == (-1, 0, 1, 0, 3)
    assert d.source == "history" and d.document == "d2"
    chain = SuffixProposer(h, use_context=False, match_prior=RAW, alpha=2).propose(A([5, 10, 11]), 4, scope="s")
    assert chain.tokens.tolist() == [12, 13] and chain.parents is None


def test_tree_of_one_branch_is_a_chain_and_max_leaves_one_turns_trees_off():
    """A tree draft with a single branch comes back as a chain (no parents); max_leaves 1 turns
    tree mode off."""
    h = index_of([1, 2, 3, 4, 5])
    d = SuffixProposer(h, use_context=False, match_prior=RAW, tree=True, alpha=4).propose(A([1, 2]), 3, scope="s")
    assert d.parents is None and d.tokens.tolist() == [3, 4, 5]
    assert SuffixProposer(h, tree=True, max_leaves=1).tree is False


def test_live_and_history_branches_merge_into_one_tree():
    """The live request continues ``7 8`` with 1; the history with 2: one tree holds both."""
    h = index_of([7, 8, 2, 2, 2])
    p = SuffixProposer(h, match_prior=RAW, tree=True, alpha=4)
    d = p.propose(A([7, 8, 1, 7, 8]), 2, scope="s")
    assert d.is_tree and sorted(d.tokens[d.parents == -1].tolist()) == [1, 2]


def test_the_cost_model_sizes_the_tree():
    """On a flat cost every node pays; on the reference CPU (t(9) ~ 4 t(1)) the
    unlikely siblings are cut, and a tree never pays less than the chain by the
    proposer's own estimates."""
    docs = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], [1, 2, 9, 8, 7, 6], [1, 2, 3, 0, 0, 0]]
    h = index_of(*docs)
    flat = SuffixProposer(h, use_context=False, match_prior=RAW, tree=True, alpha=8, cost=FLAT)
    cpu = SuffixProposer(h, use_context=False, match_prior=RAW, tree=True, alpha=8,
                         cost=CostModel.brief())
    big = flat.propose(A([1, 2]), 8, scope="s")
    small = cpu.propose(A([1, 2]), 8, scope="s")
    assert len(big.tokens) > len(small.tokens) >= 1
    table = CostModel.brief().table(64)
    rng = random.Random(3)
    for _ in range(40):  # random histories: value(tree) >= value(chain) under the model
        docs = [[rng.randrange(6) for _ in range(30)] for _ in range(4)]
        h = index_of(*docs)
        ctx = A([rng.randrange(6) for _ in range(6)])
        kw = dict(use_context=False, cost=CostModel.brief(), min_token_prob=0.0)
        t = SuffixProposer(h, tree=True, **kw).propose(ctx, 8, scope="s")
        c = SuffixProposer(h, **kw).propose(ctx, 8, scope="s")
        value = lambda d: (1 + d.score) / table[len(d.tokens)] if d else 1 / table[0]  # noqa: E731
        assert value(t) >= value(c) - 1e-12


def test_a_tree_proposer_drafts_the_chain_unless_something_else_pays_by_the_margin():
    """Under a cost model a tree proposer returns the chain proposer's own draft (same
    tokens, same estimates) unless its tree or its deeper likeliest branch beats that
    draft's modeled rate by TREE_MARGIN: where no tree pays, trees cost no acceptance."""
    cost = CostModel.brief()
    table = cost.table(64)
    rate = lambda d: (1 + d.score) / table[len(d.tokens)] if d else 1 / table[0]  # noqa: E731
    rng = random.Random(11)
    same = other = 0
    for _ in range(60):  # code-like histories: 2-3 phrases in random order, a few typos
        phrases = [[rng.randrange(30) for _ in range(6)] for _ in range(rng.choice((2, 3)))]
        docs = [[t if rng.random() > 0.03 else rng.randrange(30)
                 for _ in range(10) for t in rng.choice(phrases)] for _ in range(3)]
        h = index_of(*docs)
        ctx = A(rng.choice(phrases) + rng.choice(phrases)[: rng.randrange(1, 7)])
        kw = dict(use_context=False, match_prior=RAW, cost=cost)
        t = SuffixProposer(h, tree=True, **kw).propose(ctx, 12, scope="s")
        c = SuffixProposer(h, **kw).propose(ctx, 12, scope="s")
        if (t is None) == (c is None) and (c is None or (
                t.tokens.tolist() == c.tokens.tolist() and t.parents is None
                and t.probs.tolist() == pytest.approx(c.probs.tolist()))):
            same += 1
        else:
            other += 1
            assert rate(t) >= TREE_MARGIN * rate(c) - 1e-12
    assert same and other  # both cases occur on these histories


class _Unpruned(SuffixProposer):
    """The reference: every node down to min_token_prob expanded."""

    def _expansion_floor(self):
        return self.min_token_prob


@pytest.mark.parametrize("cost", [CostModel.brief(), FLAT,
                                  CostModel({1: 11.0, 2: 22.0, 4: 26.0, 8: 37.0, 64: 300.0})])
def test_the_expansion_floor_never_changes_the_draft(cost):
    """Nodes below the floor the cost model implies are not expanded: the drafts equal
    the fully expanded proposer's on code-like histories (floor > 0 on the CPU curves)."""
    rng = random.Random(5)
    kw = dict(use_context=False, match_prior=RAW, cost=cost, tree=True)
    assert (SuffixProposer(**kw)._expansion_floor() > 0.001) == (cost is not FLAT)
    for _ in range(40):
        phrases = [[rng.randrange(30) for _ in range(6)] for _ in range(rng.choice((2, 3, 4)))]
        docs = [[t if rng.random() > 0.05 else rng.randrange(30)
                 for _ in range(10) for t in rng.choice(phrases)] for _ in range(3)]
        h = index_of(*docs)
        ctx = A(rng.choice(phrases) + rng.choice(phrases)[: rng.randrange(1, 7)])
        got = SuffixProposer(h, **kw).propose(ctx, 12, scope="s")
        want = _Unpruned(h, **kw).propose(ctx, 12, scope="s")
        assert (got is None) == (want is None)
        if want is not None:
            assert got.tokens.tolist() == want.tokens.tolist()
            assert (got.parents is None) == (want.parents is None)
            if want.parents is not None:
                assert got.parents.tolist() == want.parents.tolist()


def test_best_size_is_best_length_for_a_chain():
    """For a chain best_size, on cumulative probabilities, chooses the length best_length
    does."""
    from proposers.suffix import best_length

    probs = [0.9, 0.8, 0.5, 0.9]
    ms = CostModel.brief().table(8).tolist()
    assert best_size(np.cumprod(probs).tolist(), ms) == best_length(probs, ms)


def tree_draft(tokens, parents):
    return Draft(A(tokens), np.full(len(tokens), 0.5), "history", 3, parents=A(parents))


@pytest.mark.parametrize("depth,nodes,leaves,want_tokens,want_parents", [
    (8, 8, None, [1, 2, 3, 4, 5], [-1, 0, 1, 0, -1]),  # as it is
    (1, 8, None, [1, 5], [-1, -1]),  # one token per branch
    (8, 3, None, [1, 2, 3], None),  # the first three: a chain
    (8, 8, 2, [1, 2, 3, 4], [-1, 0, 1, 0]),  # the third branch (5) dropped
    (8, 8, 1, [1, 2, 3], None),  # branch-by-branch Target: the first branch alone
])
def test_fit_draft_cuts_depth_nodes_and_leaves(depth, nodes, leaves, want_tokens, want_parents):
    """fit_draft cuts the tree 1 -> {2 -> 3, 4}, 5 to a depth, a node count or a leaf count,
    keeping a valid tree, or a chain when one branch is left."""
    # 1 -> {2 -> 3, 4}, 5
    d = tree_draft([1, 2, 3, 4, 5], [-1, 0, 1, 0, -1])
    got = fit_draft(d, depth=depth, nodes=nodes, leaves=leaves)
    assert got.tokens.tolist() == want_tokens
    if want_parents is None:
        assert not got.is_tree
    else:
        assert got.parents.tolist() == want_parents
        TokenTree(*zip(*[(0, -1)] + [(t, p + 1) for t, p in zip(got.tokens, got.parents)]))
    assert len(got.probs) == len(got.tokens)


def test_draft_refuses_a_tree_with_q_rows():
    """A Draft with both parents (a tree) and q_rows raises ValueError."""
    with pytest.raises(ValueError, match="q_rows"):
        Draft(A([1, 2]), None, "model", 0, q_rows=np.ones((2, 4)) / 4, parents=A([-1, -1]))
