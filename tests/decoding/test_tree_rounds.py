"""Token-tree rounds through ``generate`` on the real embedded model, both backends.

Greedy: tree rounds commit plain greedy decoding's tokens (bit for bit on llama.cpp
with exact numerics and ``tree_branches``; on torch up to near-ties, the gap
reported), with ``suffix``'s own trees over this repository's history and with trees
made from plain decoding's continuation plus wrong siblings (so that rounds branch and
accept deep); after the run the KV cache equals a fresh evaluation of the committed
tokens. Sampling: the first two committed tokens of one-round completions whose tree
draft has a likely, an unlikely and an off-support branch follow the Target's p (χ²).
The Target-level versions are in tests/targets/test_tree_eval.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from assistd.decoding.engine import generate
from assistd.decoding.verify import NEAR_TIE_GAP
from assistd.ground.numerics import EXACT_PROMISE, first_difference
from assistd.ground.sampling import SamplingParams, target_distribution
from proposers.base import Draft, Proposer
from proposers.suffix import SuffixProposer
from tests.decoding.test_exactness import history_for, text_prompts
from tests.ground.test_sampling import ALPHA
from tests.targets.test_tree_eval import torch_target, tree_llama  # noqa: F401 (fixtures)


@pytest.fixture(params=[pytest.param("llama", marks=pytest.mark.exact_numerics), "torch"])
def tree_target(request):
    """SmolLM2 on llama.cpp with 16 branch ids (one batch a tree), and on torch. The
    llama.cpp one pins ``numerics="exact"``: its commits and cache are compared with plain
    decoding's bit for bit (marked ``exact_numerics``)."""
    return request.getfixturevalue("tree_llama" if request.param == "llama" else "torch_target")


class ReferenceTree(Proposer):
    """Trees around a known continuation ``ref`` of ``prompt``: a wrong first child
    before the right branch (up to k deep), and a wrong sibling with a child of its own
    under the right branch at depths 2 and 4, so every round branches."""

    name = "test:reference-tree"

    def __init__(self, prompt: list[int], ref: list[int], n_vocab: int, seed: int = 0):
        self.n0, self.ref, self.n_vocab = len(prompt), ref, n_vocab
        self.rng = np.random.default_rng(seed)

    def _other(self, avoid: int) -> int:
        t = int(self.rng.integers(self.n_vocab))
        return t if t != avoid else (t + 1) % self.n_vocab

    def propose(self, context, k, **_):
        truth = self.ref[len(context) - self.n0:][:k]
        if not truth:
            return None
        tokens, parents = [self._other(truth[0]), self._other(-1)], [-1, 0]
        right = []
        for d, tok in enumerate(truth):
            tokens.append(tok)
            parents.append(right[-1] if right else -1)
            right.append(len(tokens) - 1)
        for d in (1, 3):
            if d < len(truth):
                tokens.append(self._other(truth[d]))
                parents.append(right[d - 1])
                tokens.append(self._other(-1))
                parents.append(len(tokens) - 2)
        return Draft(np.array(tokens, dtype=np.int64), None, "test", 0,
                     parents=np.array(parents, dtype=np.int64))


def _check_greedy(label, t, reference, got, gaps):
    i = first_difference(reference.tokens, got.tokens)
    if i is None:
        return
    gap = reference.top2_gaps[i] if i < len(reference.top2_gaps) else None
    if t.promise == EXACT_PROMISE or gap is None or gap >= NEAR_TIE_GAP:
        pytest.fail(f"{label}: first difference at token {i}, plain top-2 gap {gap}")
    gaps.append(gap)


def test_greedy_tree_rounds_equal_plain_greedy(tree_target):
    """Both proposers' tree rounds commit plain greedy's tokens on real prompts; the
    reference trees branch every round and accept most of their right branch. The llama.cpp
    Target pins ``numerics="exact"``: no difference allowed; torch: near-ties only."""
    t = tree_target
    prompts = text_prompts(t)
    if t.backend == "torch":  # ~10 tokens/s on 2 cores: two prompts, shorter
        prompts = {k: v[:300] for k, v in list(prompts.items())[1:]}
    n = 24
    suffix = SuffixProposer(history_for(t), tree=True, max_nodes=32, max_leaves=t.tree_leaves)
    gaps, branched = [], 0
    for name, ids in prompts.items():
        reference = generate(t, ids, None, max_tokens=n, trace=True, reuse_prefix=False)
        g = generate(t, ids, ReferenceTree(ids, reference.tokens, t.n_vocab), max_tokens=n, k=8)
        _check_greedy(f"{t.backend} {name} reference trees", t, reference, g, gaps)
        led = g.ledger
        assert led.tree_rounds == led.rounds >= 1 and led.committed_tokens == len(g.tokens)
        assert led.accepted_tokens >= (n - led.rounds) // 2, led.as_dict()
        branched += led.tree_rounds
        s = generate(t, ids, suffix, max_tokens=n, k=8, scope="repo")
        _check_greedy(f"{t.backend} {name} suffix trees", t, reference, s, gaps)
        branched += s.ledger.tree_rounds
    print(f"{t.backend}: {branched} tree rounds, near-tie differences at gaps {gaps}")


def test_kv_after_tree_rounds_equals_a_fresh_evaluation(tree_target):
    """After a generation by tree rounds the cache holds exactly the committed tokens:
    the next token's logits equal those of evaluating prompt + output afresh. Bit for bit on
    llama.cpp (it pins ``numerics="exact"``), within 1e-4 on torch."""
    t = tree_target
    ids = list(text_prompts(t).values())[1][:250]
    reference = generate(t, ids, None, max_tokens=16, reuse_prefix=False)
    g = generate(t, ids, ReferenceTree(ids, reference.tokens, t.n_vocab, seed=3),
                 max_tokens=16, k=6)
    assert g.ledger.tree_rounds >= 1
    committed = ids + g.tokens
    assert t.kv_tokens == committed[:-1]  # the last committed token is evaluated next
    after = t.evaluate([committed[-1]], [0])[0]
    t.truncate(0)
    fresh = t.evaluate(committed, [len(committed) - 1])[0]
    diff = float(np.abs(after - fresh).max())
    print(f"{t.backend}: max |logits after tree rounds - fresh| = {diff:.2e}")
    if t.promise == EXACT_PROMISE:  # (tree_llama runs exact numerics)
        assert diff == 0.0
    else:
        assert diff <= 1e-4 * max(1.0, float(np.abs(fresh).max()))


def _chisquare_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson χ² p-value, bins expected under 5 lumped into one."""
    from scipy.stats import chisquare

    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.fixture(scope="module")
def sampling_case(tree_llama):
    """Real rows for one tree round at T=1, top-k 5 after a code prompt: p1 at the last
    prompt token, p2[y1] after each of its 5 tokens, and the roots a tree drafts: the
    likeliest token (right), the 4th likeliest (wrong) and one outside the support."""
    t = tree_llama
    params = SamplingParams(temperature=1.0, top_k=5)
    ids = t.tokenize("import os\n\n\ndef read_config(path):\n    with open(path) as f:\n       ")
    t.truncate(0)
    t.evaluate(ids[:-1], [])
    p1 = target_distribution(t.evaluate([ids[-1]], [0])[0], params)
    assert len(p1.ids) == 5
    p2 = {}
    for y1 in p1.ids.tolist():
        t.truncate(len(ids) - 1)
        p2[y1] = target_distribution(t.evaluate([ids[-1], y1], [1])[0], params)
    order = p1.ids[np.argsort(-p1.probs)].tolist()
    off = next(x for x in range(t.n_vocab) if p1.prob(x) == 0)
    return ids, params, p1, p2, {"right": order[0], "wrong": order[3], "off-support": off}


def random_tree(rng, firsts, p2, off):
    """A depth-2 draft: a random subset of the roots (shuffled), each with one child
    drawn from its own support or one token outside it."""
    names = [k for k in firsts if rng.random() < 0.7] or ["off-support"]
    rng.shuffle(names)
    roots = [firsts[k] for k in names]
    kids = []
    for r in roots:
        pool = p2[r].ids.tolist() if r in p2 else [1, 2, 3, 4, 5]
        kids.append(int(rng.choice(pool + [off + 1])))
    return names, roots, kids


def pair_pvalue(pairs, p1, p2) -> float:
    keys = [(a, b) for a in p1.ids.tolist() for b in p2[a].ids.tolist()]
    index = {k: i for i, k in enumerate(keys)}
    assert all(pair in index for pair in pairs), "a committed pair outside the support"
    observed = np.bincount([index[pr] for pr in pairs], minlength=len(keys)).astype(float)
    expected = np.array([p1.prob(a) * p2[a].prob(b) for a, b in keys]) * len(pairs)
    return _chisquare_pvalue(observed, expected)


def test_tree_sampling_kernel_on_real_rows(sampling_case):
    """60,000 rounds of ``sample_accept_tree`` on the real rows, a random depth-2 tree
    each (right, wrong and off-support branches): the first two committed tokens follow
    p(y1) p(y2 | y1); where the round committed one token, y2 is the next round's
    plain draw, as in the engine."""
    from assistd.decoding.verify import sample_accept_tree
    from assistd.targets.base import TokenTree

    ids, _, p1, p2, firsts = sampling_case
    off = firsts["off-support"]
    rng = np.random.default_rng(12)
    pairs = []
    for _ in range(60_000):
        _, roots, kids = random_tree(rng, firsts, p2, off)
        tree = TokenTree((ids[-1], *roots, *kids),
                         (-1, *[0] * len(roots), *range(1, len(roots) + 1)))
        dists = {0: p1, **{i + 1: p2.get(r) for i, r in enumerate(roots)}}
        # A leaf's row gives the third token, not checked here: any distribution will do.
        path, y = sample_accept_tree(tree, lambda i: dists.get(i) or p1, rng)
        committed = [tree.tokens[i] for i in path[1:]] + [y]
        if len(committed) == 1:
            committed.append(p2[y].sample(rng))
        pairs.append(tuple(committed[:2]))
    pvalue = pair_pvalue(pairs, p1, p2)
    print(f"tree sampling kernel: chi2 p-value {pvalue:.3g}")
    assert pvalue > ALPHA


def test_sampling_with_tree_drafts_through_the_engine(tree_llama, sampling_case):
    """300 three-token completions through generate() at T=1, top-k 5, each with a
    random depth-2 tree (right, wrong and off-support branches) in its first round:
    the first two committed tokens follow p(y1) p(y2 | y1) (χ² over the 25 pairs)."""
    t = tree_llama
    ids, params, p1, p2, firsts = sampling_case
    off = firsts["off-support"]
    rng = np.random.default_rng(11)

    class Tree(Proposer):
        name = "test:tree"

        def __init__(self, roots, kids):
            self.roots, self.kids = roots, kids

        def propose(self, context, k, **_):
            if len(context) != len(ids):
                return None  # the first round only
            tokens = list(self.roots) + list(self.kids)
            parents = [-1] * len(self.roots) + list(range(len(self.roots)))
            return Draft(np.array(tokens), None, "test", 0, parents=np.array(parents))

    pairs, seen = [], {name: 0 for name in firsts}
    for n in range(300):
        names, roots, kids = random_tree(rng, firsts, p2, off)
        for k in names:
            seen[k] += 1
        g = generate(t, ids, Tree(roots, kids), max_tokens=3, k=2,
                     sampling=SamplingParams(temperature=1.0, top_k=5, seed=n))
        assert g.ledger.rounds >= 1 and g.ledger.tree_rounds == int(len(roots) > 1)
        pairs.append(tuple(g.tokens[:2]))
    pvalue = pair_pvalue(pairs, p1, p2)
    print(f"tree sampling in the engine: branches drafted {seen}, chi2 p-value {pvalue:.3g}")
    assert pvalue > ALPHA
