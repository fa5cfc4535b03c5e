"""Token-tree evaluation (``Target.evaluate_tree`` / ``keep_path``) on the real models.

Every node's logits row equals the row a chain evaluation of its root path gives
(bit for bit on llama.cpp with exact numerics, in the one-batch path and in the
branch-by-branch fallback; within float rounding on torch); after ``keep_path`` the
cache is what a fresh evaluation of the committed tokens leaves; greedy decoding by
tree rounds commits plain greedy decoding's tokens; bad trees and trees past
``n_ctx`` raise ValueError and leave the cache as it was; other KV sequences are
untouched. Prompts come from this repository's code; trees from the model's own
greedy continuation with wrong siblings at a few depths, and at random.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from assistd.decoding.engine import generate
from assistd.decoding.verify import NEAR_TIE_GAP, greedy_accept_tree, top2_gap
from assistd.ground.numerics import EXACT_PROMISE, first_difference
from assistd.targets.base import TokenTree
from assistd.targets.llama import LlamaTarget
from assistd.targets.open import default_model_path

REPO = Path(__file__).resolve().parents[2]
BRANCHES = 16


def prompt_ids(t, rel: str, n: int) -> list[int]:
    ids = t.tokenize((REPO / rel).read_text(encoding="utf-8"))[:n]
    return ([t.bos_token_id] if t.add_bos else []) + ids


@pytest.fixture(scope="module")
def tree_llama():
    """SmolLM2 on llama.cpp with branch sequence ids: trees in one batch. Exact numerics:
    rows and commits are compared bit for bit, which is exact numerics' promise."""
    t = LlamaTarget(default_model_path(), n_ctx=2048, tree_branches=BRANCHES, numerics="exact")
    yield t
    t.close()


@pytest.fixture(scope="module")
def torch_target(shared_cache_dir):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    pytest.importorskip("transformers", reason="the torch backend needs pip install 'assistd[torch]'")
    from assistd.targets.hf import TorchTarget

    t = TorchTarget(default_model_path(), n_ctx=2048, device="cpu")
    yield t
    t.close()


@pytest.fixture(params=[pytest.param("llama-batch", marks=pytest.mark.exact_numerics),
                        pytest.param("llama-fallback", marks=pytest.mark.exact_numerics),
                        "torch"])
def any_target(request):
    """The one-batch llama.cpp path, the base class's fallback (the session Target,
    no branch ids) and torch. Both llama.cpp Targets pin ``numerics="exact"``: their rows
    are compared bit for bit (marked ``exact_numerics``)."""
    name = {"llama-batch": "tree_llama", "llama-fallback": "target", "torch": "torch_target"}
    return request.getfixturevalue(name[request.param])


def exact(t) -> bool:
    """Whether ``t`` promises bit-identity (the llama.cpp Targets here run exact numerics)."""
    return t.promise == EXACT_PROMISE


# -- trees -------------------------------------------------------------------


def greedy_continuation(t, ids: list[int], n: int) -> list[int]:
    return generate(t, ids, None, max_tokens=n, reuse_prefix=False).tokens


def realistic_tree(root: int, cont: list[int], rng, n_vocab: int, *, wrong_first: bool = False) -> TokenTree:
    """The model's greedy continuation ``cont`` as the main branch below ``root`` (nodes
    1..len(cont), the likeliest branch first as proposers order it), then a wrong
    sibling with a child under it at a few depths; ``wrong_first`` puts the first wrong
    sibling (a child of the root) before the main branch instead."""
    tokens, parents = [root], [-1]

    def add(tok: int, parent: int) -> int:
        tokens.append(int(tok))
        parents.append(parent)
        return len(tokens) - 1

    def wrong(parent: int, right: int) -> None:
        w = int(rng.integers(n_vocab))
        while w == right:
            w = int(rng.integers(n_vocab))
        add(int(rng.integers(n_vocab)), add(w, parent))

    if wrong_first and cont:
        wrong(0, cont[0])
    main = [0]
    for tok in cont:
        main.append(add(tok, main[-1]))
    for d in range(len(cont)):
        if (d in (0, 2, 3) and not (d == 0 and wrong_first)) or rng.random() < 0.2:
            wrong(main[d], cont[d])
    return TokenTree(tuple(tokens), tuple(parents))


def random_tree(root: int, n: int, rng, n_vocab: int) -> TokenTree:
    tokens, parents = [root], [-1]
    for i in range(1, n):
        p = int(rng.integers(i))
        taken = {tokens[c] for c in range(1, i) if parents[c] == p}
        tok = int(rng.integers(n_vocab))
        while tok in taken:
            tok = int(rng.integers(n_vocab))
        tokens.append(tok)
        parents.append(p)
    return TokenTree(tuple(tokens), tuple(parents))


def chain_rows(t, n_cached: int, tree: TokenTree) -> list[tuple[int, np.ndarray]]:
    """(node, row) for every node of every branch, each branch evaluated as a chain."""
    out = []
    for leaf in tree.leaves():
        branch = tree.path_to(leaf)
        t.truncate(n_cached)
        rows = t.evaluate([tree.tokens[i] for i in branch], range(len(branch)))
        out += list(zip(branch, rows))
    t.truncate(n_cached)
    return out


def compare_rows(t, tree_rows: np.ndarray, chains, label: str) -> tuple[float, list[float]]:
    """Exact Targets: bit-identical rows. Torch: within 1e-4 of the row's scale, same
    argmax unless the chain row's top-2 gap is a near-tie. Returns (max diff, near-tie gaps)."""
    worst, ties = 0.0, []
    for node, row in chains:
        got = tree_rows[node]
        diff = float(np.abs(got - row).max())
        worst = max(worst, diff)
        if exact(t):
            assert np.array_equal(got, row), f"{label}: node {node} differs by {diff}"
            continue
        assert diff <= 1e-4 * max(1.0, float(np.abs(row).max())), f"{label}: node {node}: {diff}"
        if got.argmax() != row.argmax():
            ties.append(top2_gap(row))
            assert ties[-1] < NEAR_TIE_GAP, f"{label}: node {node}: argmax differs at gap {ties[-1]}"
    return worst, ties


# -- (1) rows ------------------------------------------------------------------


def test_every_node_row_equals_its_root_path_as_a_chain(any_target):
    """Every node's logits row from one tree evaluation (realistic, wrong-first, random,
    root-only and chain trees) equals the row of its root path evaluated as a chain: bit for
    bit on llama.cpp (exact numerics), on torch within 1e-4 of the row's scale."""
    t = any_target
    rng = np.random.default_rng(23)
    ids = prompt_ids(t, "assistd/decoding/engine.py", 200)
    cont = greedy_continuation(t, ids, 8)
    t.truncate(0)
    t.evaluate(ids[:-1], [])
    trees = {"realistic": realistic_tree(ids[-1], cont, rng, t.n_vocab),
             "realistic, wrong first": realistic_tree(ids[-1], cont, rng, t.n_vocab, wrong_first=True),
             "random 16": random_tree(ids[-1], 16, rng, t.n_vocab),
             "root only": TokenTree((ids[-1],), (-1,)),
             "chain": TokenTree.chain([ids[-1]] + cont)}
    report = []
    for name, tree in trees.items():
        rows = t.evaluate_tree(tree)
        assert rows.shape == (len(tree), t.n_vocab) and rows.dtype == np.float32
        assert t.n_past == len(ids) - 1
        chains = chain_rows(t, len(ids) - 1, tree)  # drops the pending tree first
        worst, ties = compare_rows(t, rows, chains, name)
        report.append(f"{name} ({len(tree)} nodes, {len(tree.leaves())} leaves): max diff {worst:.2e}"
                      + (f", near-tie argmax flips at gaps {ties}" if ties else ""))
    print(f"{t.backend}: " + "; ".join(report))


# -- (2) the cache after keep_path ---------------------------------------------


@pytest.mark.parametrize("wrong_first", [False, True], ids=["path first", "path second"])
def test_cache_after_keep_path_equals_a_fresh_evaluation(any_target, wrong_first):
    """After a tree round and keep_path, the cache holds the kept path and the next row equals a
    fresh evaluation of it (bit for bit on llama.cpp, exact numerics), whichever branch came
    first."""
    t = any_target
    rng = np.random.default_rng(7)
    ids = prompt_ids(t, "assistd/targets/base.py", 200)
    cont = greedy_continuation(t, ids, 6)
    t.truncate(0)
    t.evaluate(ids[:-1], [])
    tree = realistic_tree(ids[-1], cont, rng, t.n_vocab, wrong_first=wrong_first)
    rows = t.evaluate_tree(tree)
    path, bonus = greedy_accept_tree(tree, rows.argmax(1))
    committed = [tree.tokens[i] for i in path]
    assert len(path) >= 3, f"the model's own continuation should be accepted: {path}"
    t.keep_path(path)
    assert t.kv_tokens == ids + committed[1:] and t.n_past == len(ids) + len(path) - 1
    after = t.evaluate([bonus] + cont[:2], range(3))
    t.truncate(0)
    fresh = t.evaluate(ids + committed[1:] + [bonus] + cont[:2], range(len(ids) + len(path) - 1,
                                                                      len(ids) + len(path) + 2))
    diff = float(np.abs(after - fresh).max())
    print(f"{t.backend} {'wrong first' if wrong_first else 'path first'}: path {path}, "
          f"max |after keep_path - fresh| {diff:.2e}")
    if exact(t):
        assert diff == 0.0
    else:
        assert diff <= 1e-4 * max(1.0, float(np.abs(fresh).max()))


# -- (3) greedy decoding by tree rounds ----------------------------------------


def tree_decode(t, ids: list[int], n: int, make_tree) -> tuple[list[int], int]:
    """Greedy decoding where every step is a tree round: (tokens, rounds)."""
    t.truncate(0)
    t.evaluate(ids[:-1], [])
    out, rounds = [], 0
    while len(out) < n:
        tree = make_tree(ids + out)
        rows = t.evaluate_tree(tree)
        path, bonus = greedy_accept_tree(tree, rows.argmax(1))
        t.keep_path(path)
        out += [tree.tokens[i] for i in path[1:]] + [bonus]
        rounds += 1
        assert t.n_past == len(ids) + len(out) - 1  # every committed token but the last
    return out[:n], rounds


@pytest.mark.parametrize("rel", ["assistd/decoding/verify.py", "proposers/base.py"])
def test_tree_rounds_commit_plain_greedy_tokens(any_target, rel):
    """Trees from an oracle that knows plain greedy's output, cut at random depths, with
    wrong siblings before and after the right child and a random subtree: the committed
    tokens are plain greedy's (torch: up to a first difference at a near-tie). The llama.cpp
    Targets pin ``numerics="exact"``."""
    t = any_target
    ids = prompt_ids(t, rel, 200)
    n = 24
    plain = generate(t, ids, None, max_tokens=n, trace=True, reuse_prefix=False)
    ref = plain.tokens
    rng = np.random.default_rng(len(rel))

    def oracle(context: list[int]) -> TokenTree:
        done = len(context) - len(ids)
        cont = ref[done:done + int(rng.integers(0, 7))]
        if cont and rng.random() < 0.3:  # the proposer's guess goes wrong at some depth
            cut = int(rng.integers(len(cont)))
            cont = cont[:cut] + [(cont[cut] + 1) % t.n_vocab]
        return realistic_tree(context[-1], cont, rng, t.n_vocab, wrong_first=bool(rng.random() < 0.5))

    got, rounds = tree_decode(t, ids, len(ref), oracle)
    i = first_difference(ref, got)
    print(f"{t.backend} {rel}: {len(ref)} tokens in {rounds} tree rounds, "
          + ("identical" if i is None else f"first difference at {i}, plain top-2 gap {plain.top2_gaps[i]}"))
    if i is not None:
        assert not exact(t), f"exact numerics: difference at token {i}"
        assert plain.top2_gaps[i] < NEAR_TIE_GAP, f"difference at {i}, gap {plain.top2_gaps[i]}"
    assert rounds < len(ref), "the oracle's branches should be accepted in part"


# -- (4) bad trees ---------------------------------------------------------------


@pytest.mark.parametrize("tokens, parents, match", [
    ((), (), "at least its root"),
    ((1, 2), (-1,), "2 tokens but 1 parents"),
    ((1, 2), (0, 0), "parent must be -1"),
    ((1, 2, 3), (-1, 2, 0), "not an earlier node"),
    ((1, 2, 3), (-1, 0, -1), "not an earlier node"),
    ((1, 2, 2), (-1, 0, 0), "siblings with the same token"),
    ((1, -2), (-1, 0), ">= 0"),
])
def test_malformed_trees_are_refused(tokens, parents, match):
    """TokenTree refuses an empty tree, a parents/tokens length mismatch, a root with a parent,
    a parent that is not an earlier node, two roots, siblings with the same token and a negative
    token, with ValueError saying which."""
    with pytest.raises(ValueError, match=match):
        TokenTree(tokens, parents)


def test_bad_trees_and_trees_past_n_ctx_leave_the_cache_as_it_was(any_target, monkeypatch):
    """An out-of-vocabulary token, more children than branch ids, a keep_path off the tree, a
    second keep_path or a tree past n_ctx raises and leaves the cache and the next logits as
    they were (bit for bit on llama.cpp, exact numerics; within 1e-4 on torch)."""
    t = any_target
    ids = prompt_ids(t, "assistd/decoding/engine.py", 200)
    t.truncate(0)
    t.evaluate(ids[:-1], [])
    root = ids[-1]
    before = t.evaluate([root], [0])[0]
    t.truncate(len(ids) - 1)
    bad = [TokenTree((root, t.n_vocab), (-1, 0))]
    if getattr(t, "tree_branches", 0):
        bad.append(TokenTree((root,) + tuple(range(BRANCHES + 1)), (-1,) + (0,) * (BRANCHES + 1)))
    for tree in bad:
        with pytest.raises(ValueError):
            t.evaluate_tree(tree)
        assert t.kv_tokens == ids[:-1]
    tree = random_tree(root, 6, np.random.default_rng(1), t.n_vocab)
    t.evaluate_tree(tree)
    with pytest.raises(ValueError, match="not a child"):
        t.keep_path([0, 5, 5])
    t.keep_path([0])  # still pending after a bad path
    with pytest.raises(RuntimeError, match="keep_path needs"):
        t.keep_path([0])
    t.truncate(len(ids) - 1)
    after = t.evaluate([root], [0])[0]
    t.evaluate_tree(tree)  # dropped by the next evaluate
    assert t.kv_tokens == ids
    again = t.evaluate([ids[0]], [0])[0]
    t.truncate(len(ids))
    reference = t.evaluate([ids[0]], [0])[0]
    # Past n_ctx (lowered to 5 cells past the cache): a 6-node tree needs one cell more.
    t.truncate(len(ids))
    monkeypatch.setattr(t, "n_ctx", len(ids) + 5)
    with pytest.raises(ValueError, match="exceeds n_ctx"):
        t.evaluate_tree(tree)
    assert t.kv_tokens == ids
    t.evaluate_tree(TokenTree.chain([root, 1, 2, 3, 4]))  # 5 nodes fit
    t.keep_path(range(5))
    assert t.n_past == t.n_ctx
    monkeypatch.undo()
    t.truncate(0)
    if exact(t):
        assert np.array_equal(after, before) and np.array_equal(again, reference)
    else:
        assert np.abs(after - before).max() < 1e-4 and np.abs(again - reference).max() < 1e-4


# -- (5) other sequences -----------------------------------------------------------


def test_branch_ids_are_released_after_each_round(tree_llama):
    """No cell keeps a branch id once the round is settled: keep_path, a dropped tree,
    a failed one."""
    t = tree_llama
    lib, mem = t._lib, t._mem
    ids = prompt_ids(t, "assistd/targets/llama.py", 120)
    t.truncate(0)
    t.evaluate(ids[:-1], [])
    tree = random_tree(ids[-1], 12, np.random.default_rng(2), t.n_vocab)
    spare = range(t.n_seq_max, t.n_seq_max + BRANCHES)
    t.evaluate_tree(tree)
    assert any(lib.llama_memory_seq_pos_max(mem, s) >= 0 for s in spare)
    t.keep_path(tree.path_to(tree.leaves()[-1]))
    assert all(lib.llama_memory_seq_pos_max(mem, s) == -1 for s in spare)
    t.evaluate_tree(tree)
    t.truncate(len(ids) - 1)
    assert all(lib.llama_memory_seq_pos_max(mem, s) == -1 for s in spare)
    assert lib.llama_memory_seq_pos_max(mem, 0) == len(ids) - 2


def test_branch_ids_need_one_sequence():
    """tree_branches with sequences 2 is refused: branch ids need one KV sequence."""
    with pytest.raises(ValueError, match="one KV sequence"):
        LlamaTarget(default_model_path(), n_ctx=256, sequences=2, tree_branches=4)


@pytest.mark.exact_numerics
def test_other_sequences_are_untouched_by_a_tree_round():
    """A 3-sequence Target (trees by the fallback): a tree round in sequence 0 leaves
    sequences 1 and 2 as they were, bit for bit (exact numerics' promise). Target and reference
    pin ``numerics="exact"``."""
    t = LlamaTarget(default_model_path(), n_ctx=512, sequences=3, numerics="exact")
    try:
        a, b = prompt_ids(t, "assistd/decoding/engine.py", 150), prompt_ids(t, "storage/store.py", 100)
        t.use_sequence(1)
        t.evaluate(a, [])
        t.use_sequence(2)
        t.evaluate(b, [])
        t.use_sequence(0)
        t.evaluate(b[:50], [])
        tree = random_tree(b[50], 10, np.random.default_rng(3), t.n_vocab)
        t.evaluate_tree(tree)
        t.use_sequence(1)  # drops the pending tree of sequence 0
        assert t.sequence_tokens(0) == b[:50]
        one = t.evaluate([7], [0])[0]
        t.use_sequence(0)
        t.evaluate_tree(tree)
        t.keep_path(tree.path_to(tree.leaves()[0]))
        t.use_sequence(2)
        two = t.evaluate([7], [0])[0]
        assert t.sequence_tokens(1) == a + [7] and t.sequence_tokens(2) == b + [7]
        ref = LlamaTarget(default_model_path(), n_ctx=512, numerics="exact")
        try:
            assert np.array_equal(ref.evaluate(a + [7], [len(a)])[0], one)
            ref.truncate(0)
            assert np.array_equal(ref.evaluate(b + [7], [len(b)])[0], two)
        finally:
            ref.close()
    finally:
        t.close()


# -- the second architecture -------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_tree_targets(gemma_path, shared_cache_dir):
    """Gemma 3 270M (sliding-window layers) on llama.cpp with branch ids, and on torch."""
    pytest.importorskip("transformers", reason="the torch backend needs pip install 'assistd[torch]'")
    from assistd.targets.hf import TorchTarget

    ts = [LlamaTarget(gemma_path, n_ctx=2048, tree_branches=BRANCHES, numerics="exact"),
          TorchTarget(gemma_path, n_ctx=2048, device="cpu")]
    yield ts
    for t in ts:
        t.close()


@pytest.mark.exact_numerics
def test_gemma_rows_and_cache_past_the_sliding_window(gemma_tree_targets):
    """A 600-token prompt (past Gemma 3's 512-token window): tree rows equal chain rows,
    and greedy tree rounds commit plain greedy's tokens, on both backends. The llama.cpp Target
    pins ``numerics="exact"`` (bit for bit); torch is held to near-ties."""
    for t in gemma_tree_targets:
        rng = np.random.default_rng(5)
        ids = prompt_ids(t, "assistd/decoding/engine.py", 600)
        cont = greedy_continuation(t, ids, 6)
        t.truncate(0)
        t.evaluate(ids[:-1], [])
        tree = realistic_tree(ids[-1], cont, rng, t.n_vocab, wrong_first=True)
        rows = t.evaluate_tree(tree)
        worst, ties = compare_rows(t, rows, chain_rows(t, len(ids) - 1, tree), f"gemma {t.backend}")
        print(f"gemma {t.backend}: {len(tree)} nodes, max diff {worst:.2e}, near-tie flips {ties}")
        plain = generate(t, ids, None, max_tokens=16, trace=True, reuse_prefix=False)
        got, _ = tree_decode(t, ids, len(plain.tokens), lambda c: realistic_tree(
            c[-1], plain.tokens[len(c) - len(ids):len(c) - len(ids) + 4], rng, t.n_vocab,
            wrong_first=True))
        i = first_difference(plain.tokens, got)
        assert i is None or (not exact(t) and plain.top2_gaps[i] < NEAR_TIE_GAP), (t.backend, i)
