"""Greedy acceptance of a token tree (``verify.greedy_accept_tree``) and the tree type.

Pure functions on small arrays: a chain tree gives :func:`greedy_accept`'s answer; on
random trees the path is the deepest node whose every token is the Target's argmax at
its parent (unique, since siblings differ), found here by brute force.
"""

from __future__ import annotations

import numpy as np
import pytest

from assistd.decoding.verify import greedy_accept, greedy_accept_tree
from assistd.targets.base import TokenTree


def random_tree(rng, n: int, vocab: int = 6) -> TokenTree:
    tokens, parents = [int(rng.integers(vocab))], [-1]
    for i in range(1, n):
        p = int(rng.integers(i))
        free = sorted(set(range(vocab)) - {tokens[c] for c in range(1, i) if parents[c] == p})
        if not free:
            continue
        tokens.append(int(rng.choice(free)))
        parents.append(p)
    return TokenTree(tuple(tokens), tuple(parents))


def test_a_chain_tree_accepts_as_greedy_accept():
    """On 500 random chains, greedy_accept_tree accepts the path and bonus token that
    greedy_accept gives for the same draft and argmax."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        k = int(rng.integers(0, 8))
        draft = rng.integers(0, 3, k)
        argmax = rng.integers(0, 3, k + 1)
        path, token = greedy_accept_tree(TokenTree.chain([9] + draft.tolist()), argmax)
        j = greedy_accept(draft, argmax)
        assert path == list(range(j + 1)) and token == int(argmax[j])


def test_random_trees_match_brute_force():
    """On 1,000 random trees, greedy_accept_tree returns the deepest node whose whole path
    agrees with the argmax (found by brute force, unique) and that node's argmax as the bonus,
    which none of its children carries."""
    rng = np.random.default_rng(1)
    for _ in range(1000):
        tree = random_tree(rng, int(rng.integers(1, 20)))
        argmax = rng.integers(0, 6, len(tree))
        accepted = [i for i in range(len(tree))
                    if all(tree.tokens[b] == argmax[a] for a, b in zip(tree.path_to(i), tree.path_to(i)[1:]))]
        deepest = max(accepted, key=lambda i: tree.depth[i])
        assert [i for i in accepted if tree.depth[i] == tree.depth[deepest]] == [deepest]
        path, token = greedy_accept_tree(tree, argmax)
        assert path == tree.path_to(deepest) and token == int(argmax[deepest])
        assert all(tree.tokens[c] != token for c in tree.children(deepest))


def test_the_right_child_may_come_second_and_a_leaf_gives_the_bonus():
    """On a worked tree the accepted path follows whichever child the argmax names, first or
    second; a fully accepted leaf yields the argmax after it as bonus; a root alone gives its
    argmax."""
    # root 0 -> {1: 5, 2: 6}; 2 -> {3: 7}; 3 -> {4: 8}
    tree = TokenTree((0, 5, 6, 7, 8), (-1, 0, 0, 2, 3))
    assert greedy_accept_tree(tree, [6, 1, 7, 8, 42]) == ([0, 2, 3, 4], 42)
    assert greedy_accept_tree(tree, [6, 1, 7, 9, 42]) == ([0, 2, 3], 9)
    assert greedy_accept_tree(tree, [3, 1, 7, 8, 42]) == ([0], 3)
    assert greedy_accept_tree(TokenTree((4,), (-1,)), [11]) == ([0], 11)


def test_tree_shape_helpers():
    """TokenTree's depth, leaves (deepest first), path_to, children, len and check_path on a
    6-node tree; bad paths and a probs length mismatch raise ValueError; chain() builds parents
    [-1, 0, 1]."""
    # BFS order: leaves come back depth first.
    tree = TokenTree((0, 1, 2, 3, 4, 5), (-1, 0, 0, 1, 2, 3), probs=(1, .5, .4, .3, .2, .1))
    assert tree.depth == (0, 1, 1, 2, 2, 3)
    assert tree.leaves() == [5, 4] and tree.path_to(5) == [0, 1, 3, 5]
    assert tree.children(0) == [1, 2] and tree.children(5) == []
    assert len(tree) == 6 and tree.check_path((0, 2, 4)) == [0, 2, 4]
    for bad in ([], [1], [0, 3], [0, 1, 4], [0, 9]):
        with pytest.raises(ValueError):
            tree.check_path(bad)
    with pytest.raises(ValueError, match="probs"):
        TokenTree((0, 1), (-1, 0), probs=(1.0,))
    assert TokenTree.chain([3, 4, 5]) == TokenTree((3, 4, 5), (-1, 0, 1))
