"""suffix proposer and the history index: literal cases, then the index against brute force.

The index is checked against a brute-force search over the current documents after
random interleavings of add / replace / forget, with tiny segment sizes so that
sealing, merging, tombstones and rebuilds all happen.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from assistd.ground.costmodel import CostModel
from proposers import make_proposer
from proposers.index import SEP, HistoryIndex
from proposers.match import frequent_path, live_occurrences
from proposers.suffix import SuffixProposer, best_length
from storage.store import HistoryStore

A = np.array
RAW = {"context": 0.0, "history": 0.0}  # raw count ratios, as SuffixDecoding has them


def index_of(*docs, scope="s", **kw):
    h = HistoryIndex(**kw)
    for i, ids in enumerate(docs, 1):
        h.put(scope, i, A(ids), f"d{i}")
    return h


# -- literal cases -------------------------------------------------------------


def test_most_frequent_continuation_beats_the_most_recent():
    """[1, 2] is followed by 3 twice and by 4 once (the latest): suffix proposes 3, p = 2/3."""
    h = index_of([1, 2, 3], [1, 2, 3], [1, 2, 4])
    d = SuffixProposer(h, use_context=False, match_prior=RAW).propose(A([9, 1, 2]), 1, scope="s")
    assert d.tokens.tolist() == [3] and d.probs.tolist() == pytest.approx([2 / 3])
    assert d.source == "history" and d.match_len == 2 and d.document == "d2"


def test_probability_is_product_of_count_ratios_and_stops_below_min_token_prob():
    """Rows after [7, 8]: 1 2 5 / 1 2 6 / 1 3 5 / 0 0 0. Path 1 (3/4), 2 (2/3), then 5 or 6
    at 1/2 each: cumulative 0.75, 0.5, 0.25; min_token_prob 0.3 stops before the third."""
    h = index_of([7, 8, 1, 2, 5], [7, 8, 1, 2, 6], [7, 8, 1, 3, 5], [7, 8, 0, 0, 0])
    p = SuffixProposer(h, use_context=False, min_token_prob=0.3, alpha=4, match_prior=RAW)
    d = p.propose(A([7, 8]), 8, scope="s")
    assert d.tokens.tolist() == [1, 2]
    assert np.cumprod(d.probs).tolist() == pytest.approx([0.75, 0.5])
    d = SuffixProposer(h, use_context=False, min_token_prob=0.2, alpha=4, match_prior=RAW).propose(A([7, 8]), 8, scope="s")
    assert d.tokens.tolist() == [1, 2, 5]  # a 1-1 tie: the smaller id


def test_draft_is_capped_at_alpha_times_match_length():
    """The draft is at most alpha x match length tokens (match 2: alpha 1, 2, 0.5 give 2, 4, 1);
    under one token, no draft."""
    h = index_of(list(range(10, 30)))
    for alpha, want in ((1.0, 2), (2.0, 4), (0.5, 1)):
        d = SuffixProposer(h, alpha=alpha, use_context=False, match_prior=RAW).propose(A([0, 11, 12]), 16, scope="s")
        assert d.match_len == 2 and len(d.tokens) == want
    assert SuffixProposer(h, alpha=0.4, use_context=False, match_prior=RAW).propose(A([0, 12]), 16, scope="s") is None


def test_live_context_never_matches_its_own_tail():
    """The live context never matches its own tail, and a self-overlapping match is cut so as
    not to overlap ([5,5,5,5]: match 2)."""
    assert live_occurrences(A([1, 2, 3, 4, 5]), 4).match_len == 0
    occ = live_occurrences(A([5, 5, 5, 5]), 4)  # cut to 2 tokens so as not to overlap
    assert occ.match_len == 2 and occ.cont.tolist() == [[5, 5, SEP, SEP]]
    assert SuffixProposer(match_prior=RAW).propose(A([1, 2, 3, 4, 5]), 4) is None


def test_empty_history_short_context_and_unknown_scope():
    """An empty history with a one-token or empty context, or k 0, drafts nothing; an unknown
    scope falls back to the live context."""
    p = SuffixProposer(HistoryIndex())
    assert p.propose(A([1]), 4, scope="s") is None
    assert p.propose(A([], dtype=np.int64), 4) is None
    assert p.propose(A([1, 2, 3, 1, 2]), 4, scope="nowhere").tokens.tolist() == [3, 1]
    assert p.propose(A([1, 2, 3, 1, 2]), 0) is None


def test_live_request_and_history_compete_on_score():
    """The context says [1, 2] -> 9 0 once. With prior 1, three agreeing history
    occurrences (score 0.75 + 0.56) beat it (0.5 + 0.25); a history split 1:1 between two
    continuations (0.5 + 0.5) loses to it (1 + 1) without a prior."""
    ctx = A([1, 2, 9, 0, 1, 2])
    h = index_of([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    d = SuffixProposer(h, prior=1.0, match_prior=RAW).propose(ctx, 3, scope="s")
    assert d.source == "history" and d.tokens.tolist() == [3, 4]  # capped at alpha * 2
    d = SuffixProposer(index_of([1, 2, 3, 4], [1, 2, 5, 4])).propose(ctx, 3, scope="s")
    assert d.source == "context" and d.tokens.tolist() == [9, 0]


def test_cost_model_cuts_drafts_that_do_not_pay():
    """Reference CPU costs (CostModel.brief()): a coin-flip token never pays; a sure run of 8 does."""
    cost = CostModel.brief()
    table = cost.table(16)
    table = table.tolist()
    assert best_length([0.5], table) == 0
    assert best_length([1.0] * 8, table) == 8
    assert best_length([1.0, 1.0, 0.1, 0.1], table) == 2
    h = index_of([1, 2, 3, 4], [1, 2, 5, 6])
    assert SuffixProposer(h, cost=cost, use_context=False, match_prior=RAW).propose(A([1, 2]), 4, scope="s") is None
    assert SuffixProposer(h, use_context=False, match_prior=RAW).propose(A([1, 2]), 4, scope="s") is not None


def test_frequent_path_counts_ended_rows_in_the_denominator():
    """frequent_path counts continuations that ended in its denominator ([4,SEP], [4,7], [4,7]:
    probabilities 1 then 2/3) and applies a prior (one row, prior 1: 0.5 each)."""
    t, p = frequent_path(A([[4, SEP], [4, 7], [4, 7]]), 4, 0.0)
    assert t.tolist() == [4, 7] and p.tolist() == pytest.approx([1.0, 2 / 3])
    t, p = frequent_path(A([[4, 5, 6]]), 8, 0.0, prior=1.0)
    assert t.tolist() == [4, 5, 6] and p.tolist() == pytest.approx([0.5, 0.5, 0.5])


def test_registered_with_bad_parameters_refused():
    """suffix is registered by name; alpha 0 raises ValueError."""
    assert isinstance(make_proposer("suffix"), SuffixProposer)
    with pytest.raises(ValueError):
        SuffixProposer(alpha=0, match_prior=RAW)


# -- the index against brute force -----------------------------------------------


def brute_find(docs: dict[int, list[int]], context: list[int], depth: int, max_depth: int = 64):
    """Longest suffix of ``context`` (<= max_depth) found in any doc, and the sorted rows of
    the ``depth`` tokens after each occurrence (SEP past a document's end)."""
    best, rows = 0, []
    for m in range(1, min(max_depth, len(context)) + 1):
        pat = context[-m:]
        found = []
        for ids in docs.values():
            for e in range(m, len(ids) + 1):
                if ids[e - m : e] == pat:
                    row = ids[e : e + depth]
                    found.append(tuple(row + [SEP] * (depth - len(row))))
        if not found:
            break
        best, rows = m, found
    return best, sorted(rows)


def test_index_matches_brute_force_after_random_add_replace_forget():
    """400 random operations over two scopes (small alphabet, tiny segments): after each,
    find() and propose() equal a brute-force search over the documents that exist now."""
    rng = random.Random(7)
    index = HistoryIndex(tail_tokens=40, max_segments=3, max_occurrences=10_000)
    truth: dict[str, dict[int, list[int]]] = {"a": {}, "b": {}}
    next_id = 1
    for step in range(400):
        op = rng.random()
        scope = rng.choice("ab")
        docs = truth[scope]
        if op < 0.45 or not docs:
            ids = [rng.randrange(6) for _ in range(rng.randrange(1, 60))]
            index.put(scope, next_id, A(ids), str(next_id))
            docs[next_id] = ids
            next_id += 1
        elif op < 0.75:
            d = rng.choice(list(docs))
            ids = [rng.randrange(6) for _ in range(rng.randrange(1, 60))]
            index.put(scope, d, A(ids), str(d))
            docs[d] = ids
        else:
            d = rng.choice(list(docs))
            assert index.remove(d)
            del docs[d]
        ctx = [rng.randrange(7) for _ in range(rng.randrange(1, 12))]
        for i in range(6):
            if i % 3 == 0:  # a fresh context, then two that extend it as decoding does
                ctx = [rng.randrange(7) for _ in range(rng.randrange(1, 12))]
            else:
                ctx = ctx + [rng.randrange(7) for _ in range(rng.randrange(1, 4))]
            occ = index.find(scope, A(ctx), 5)
            m, rows = brute_find(docs, ctx, 5)
            assert occ.match_len == m, (step, ctx)
            assert sorted(map(tuple, occ.cont.tolist())) == rows, (step, ctx)
            d = SuffixProposer(index, use_context=False, min_token_prob=0.0, match_prior=RAW).propose(A(ctx), 5, scope=scope)
            if m == 0:
                assert d is None
            else:
                want = frequent_path(A(rows), min(5, m), 0.0)[0].tolist()
                assert (d.tokens.tolist() if d else []) == want
        assert {k: v[1].tolist() for k, v in index.documents(scope).items()} == docs


def test_forgotten_document_is_gone_from_every_structure():
    """After remove(), a document's distinctive tokens are in no array of the index and are
    never proposed, whether it sat in the tail or in a sealed segment."""
    for tail_tokens in (1_000, 4):  # tail, then sealed segments
        index = HistoryIndex(tail_tokens=tail_tokens)
        index.put("s", 1, A([1, 2, 3, 4]), "keep")
        index.put("s", 2, A([1, 2, 900, 901, 902]), "secret")
        assert index.find("s", A([1, 2]), 3).count == 2
        index.remove(2)
        sc = index._scopes["s"]
        arrays = [seg.rev for seg in sc.segments]
        if sc.tail_segment is not None:
            arrays.append(sc.tail_segment.rev)
        arrays += [t[2] for t in sc.tail.values()]
        assert not any(np.isin(a.astype(np.int64), [900, 901, 902]).any() for a in arrays)
        d = SuffixProposer(index, match_prior=RAW).propose(A([1, 2]), 4, scope="s")
        assert d.tokens.tolist() == [3, 4]
        assert index.find("s", A([900]), 2).match_len == 0


def test_scopes_are_isolated():
    """Each scope drafts from its own documents only; an unknown scope, or no scope with several
    indexed, drafts nothing."""
    index = HistoryIndex()
    index.put("a", 1, A([1, 2, 3, 4]), "a.py")
    index.put("b", 2, A([1, 2, 7, 8]), "b.py")
    p = SuffixProposer(index, use_context=False, match_prior=RAW)
    assert p.propose(A([1, 2]), 2, scope="a").tokens.tolist() == [3, 4]
    assert p.propose(A([1, 2]), 2, scope="b").tokens.tolist() == [7, 8]
    assert p.propose(A([1, 2]), 2, scope="c") is None
    assert p.propose(A([1, 2]), 2) is None  # no scope named and more than one: none


def test_memory_budget_drops_the_least_recently_used_scope():
    """Past max_tokens (120 > 100) the least recently used scope is evicted and counted."""
    index = HistoryIndex(max_tokens=100)
    index.put("old", 1, A(range(60)), "x")
    index.put("new", 2, A(range(60)), "y")  # 120 > 100: "old" goes
    assert index.scopes() == ["new"] and index.evictions == 1


def _put(store, scope, path, ids):
    return store.put_document(
        scope=scope, path=path, source_kind="repo", language_id="python", content_hash=str(ids),
        num_bytes=len(ids), mtime_ns=0, text=" ".join(map(str, ids)),
        decoded_with_replacement=False, fingerprint="fp", token_ids=ids)


def test_index_follows_the_sqlite_history(tmp_path):
    """Loaded from a real SQLite file, then kept in step through the changes log:
    a replaced file, a new file, a forgotten file, another scope untouched."""
    store = HistoryStore(tmp_path / "h.db")
    a = _put(store, "/r", "a.py", [1, 2, 3])
    b = _put(store, "/r", "b.py", [4, 5, 6])
    _put(store, "/other", "c.py", [1, 2, 9])
    index = HistoryIndex()
    assert index.load(store, "/r", "fp") == 6
    _put(store, "/r", "a.py", [1, 2, 4])  # replaced
    c = _put(store, "/r", "new.py", [7, 8])
    store.remove_documents([b])
    _put(store, "/other", "d.py", [5])
    assert index.sync(store) == 4
    docs = {d: v[1].tolist() for d, v in index.documents("/r").items()}
    assert docs == {a: [1, 2, 4], c: [7, 8]}
    assert index.scopes() == ["/r"]
    assert SuffixProposer(index, use_context=False, match_prior=RAW).propose(A([1, 2]), 1, scope="/r").tokens.tolist() == [4]
    assert index.sync(store) == 0
    store.close()


# -- the SuffixDecoding peer -------------------------------------------------------


def test_suffixdecoding_peer_counts_the_context_own_tail():
    """Arctic's per-request tree holds the context itself, so the tail's own occurrence
    (with nothing after it) halves the probability of what followed [1, 2] earlier."""
    d = make_proposer("peer:suffixdecoding").propose(A([1, 2, 3, 4, 1, 2]), 4)
    assert d.tokens.tolist() == [3, 4] and d.probs.tolist() == [0.5, 1.0]
    assert d.source == "context" and d.match_len == 2


def test_suffixdecoding_peer_tries_every_match_length():
    """[8, 1, 2] matches 3 tokens at the end of a document (nothing follows) and 2 tokens
    twice: the peer drafts from the 2-token match; suffix, longest match only, does not."""
    h = index_of([1, 2, 3, 4, 5, 6], [8, 1, 2])
    d = make_proposer("peer:suffixdecoding", history=h).propose(A([8, 1, 2]), 4, scope="s")
    assert d.tokens.tolist() == [3, 4] and d.match_len == 2 and d.source == "history"
    assert SuffixProposer(h, use_context=False, match_prior=RAW).propose(A([8, 1, 2]), 4, scope="s") is None


def test_short_matches_are_trusted_less_than_long_ones():
    """Default match prior: one occurrence after a 1-token history match is worth
    1 / (1 + 4) = 0.2, after a 16-token match 16 / 20 = 0.8 (then rising along the draft)."""
    h = index_of(list(range(100, 140)))
    p = SuffixProposer(h, use_context=False, alpha=4, min_token_prob=0.0)
    short = p.propose(A([7, 100]), 1, scope="s")
    long_ = p.propose(A(list(range(100, 116))), 2, scope="s")
    assert short.probs.tolist() == pytest.approx([0.2])
    assert long_.probs.tolist() == pytest.approx([16 / 20, 17 / 21])


def test_matches_too_short_to_pay_are_not_read():
    """With the reference CPU costs, a history match under 7 tokens (context: 3) cannot pay
    even if every occurrence agrees, so no draft comes from it; 7 tokens can."""
    p = SuffixProposer(index_of(list(range(100, 140))), cost=CostModel.brief(), use_context=False)
    assert p._min_len == {"context": 3, "history": 7}
    assert p.propose(A(list(range(100, 106))), 16, scope="s") is None
    assert p.propose(A(list(range(100, 107))), 16, scope="s").tokens[0] == 107


def test_memory_held_beside_the_target_is_reported():
    """The history index's arrays count as the proposer's memory (6 bytes a token here)."""
    h = index_of(list(range(100, 200)))
    h.find("s", A([100, 101]), 2)  # builds the tail segment
    assert SuffixProposer(h).memory_bytes == h.nbytes >= 6 * 100
    assert SuffixProposer().memory_bytes == 0
