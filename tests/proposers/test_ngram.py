"""ngram proposer: matching kernels on tiny literal arrays, then the proposer."""

import numpy as np
import pytest

from proposers import available, make_proposer
from proposers.index import HistoryIndex
from proposers.ngram import NgramProposer, lookup_context, match_lengths, pick

A = np.array


def test_match_lengths_counts_common_suffix():
    """match_lengths counts how many tokens before each candidate position equal the context's
    tail ([1,2,3,4,2,3] vs tail [9,2,3]: 2 and 2), capped at max_n."""
    assert match_lengths(A([1, 2, 3, 4, 2, 3]), A([3, 6]), A([9, 2, 3]), 4).tolist() == [2, 2]
    assert match_lengths(A([7, 2, 3]), A([3]), A([7, 2, 3]), 2).tolist() == [2]  # capped at max_n


def test_pick_longest_then_policy():
    """pick takes the longest match, breaking ties by policy (recent: the last, earliest: the
    first); no candidates give (-1, 0)."""
    assert pick(A([3, 8, 12]), A([2, 4, 4]), "recent") == (12, 4)
    assert pick(A([3, 8, 12]), A([2, 4, 4]), "earliest") == (8, 4)
    assert pick(A([], dtype=np.int64), A([], dtype=np.int64), "recent") == (-1, 0)


def test_context_lookup_worked_example():
    """Context [1,2,3,4,2,3], n 2, k 4 -> draft [4, 2, 3] (it stops at the live end)."""
    p = NgramProposer(min_n=2, max_n=4)
    d = p.propose(A([1, 2, 3, 4, 2, 3]), 4)
    assert d.tokens.tolist() == [4, 2, 3]
    assert d.source == "context" and d.match_len == 2


def test_tail_never_matches_itself():
    """A context whose tail occurs nowhere else gets no draft."""
    assert lookup_context(A([1, 2, 3, 4, 5]), 2, 4, "recent") == (-1, 0)
    assert NgramProposer(min_n=2).propose(A([1, 2, 3, 4, 5]), 4) is None


def test_overlapping_occurrence_is_cut_to_non_overlap():
    """[5,5,5,5]: the occurrence ending at 2 matches 2 tokens without overlapping the tail."""
    end, length = lookup_context(A([5, 5, 5, 5]), 2, 4, "recent")
    assert (end, length) == (2, 2)


def test_longest_match_wins_over_recency():
    """A 3-token match earlier in the context beats a more recent 2-token one: the draft
    continues the full match ([9, 8])."""
    ctx = A([1, 2, 3, 9, 8, 2, 3, 7, 1, 2, 3])  # tail [1,2,3]: full match at 3, 2-match at 7
    d = NgramProposer(min_n=2, max_n=4).propose(ctx, 2)
    assert d.tokens.tolist() == [9, 8] and d.match_len == 3


def _index(*docs, scope="s"):
    h = HistoryIndex()
    for i, (name, ids) in enumerate(docs, 1):
        h.put(scope, i, A(ids), name)
    return h


def test_history_lookup_and_document_boundary():
    """[11, 12] occurs in a.py; what follows stops at the end of a.py."""
    p = NgramProposer(_index(("a.py", [10, 11, 12, 13]), ("b.py", [20, 21, 22])), min_n=2, max_n=8)
    d = p.propose(A([5, 11, 12]), 5, scope="s")
    assert d.tokens.tolist() == [13] and d.source == "history"
    assert d.document == "a.py" and d.match_len == 2


def test_history_draft_beats_shorter_context_match():
    """A 3-token match in the history beats a 2-token match in the context: the draft is the
    history's [4, 5, 6], with its source and document named."""
    p = NgramProposer(_index(("lib.py", [1, 2, 3, 4, 5, 6])), min_n=2, max_n=8)
    d = p.propose(A([9, 2, 3, 7, 1, 2, 3]), 3, scope="s")  # context has [2,3] (2), history [1,2,3] (3)
    assert d.tokens.tolist() == [4, 5, 6]
    assert d.source == "history" and d.document == "lib.py" and d.match_len == 3


def test_no_match_across_documents():
    """The separator between documents never matches: [3, 20] spans a.py|b.py and is absent."""
    p = NgramProposer(_index(("a.py", [1, 2, 3]), ("b.py", [20, 21, 22])), min_n=2, max_n=4)
    assert p.propose(A([3, 20]), 4, scope="s") is None


def test_occurrence_policy_recent_earliest_frequent():
    """[1, 2] is followed by 7 (twice, early) then 8 (once, latest): each policy picks its own."""
    ctx = A([1, 2, 7, 0, 1, 2, 7, 0, 1, 2, 8, 0, 1, 2])
    pick_ = {pol: NgramProposer(min_n=2, max_n=2, policy=pol).propose(ctx, 1).tokens.tolist()
             for pol in ("recent", "earliest", "frequent")}
    assert pick_ == {"recent": [8], "earliest": [7], "frequent": [7]}
    hist = _index(("a", [1, 2, 7]), ("b", [1, 2, 7]), ("c", [1, 2, 8]))
    got = {pol: NgramProposer(hist, min_n=2, max_n=2, policy=pol).propose(A([5, 1, 2]), 1, scope="s")
           for pol in ("recent", "earliest", "frequent")}
    assert {p: (d.tokens.tolist(), d.document) for p, d in got.items()} == {
        "recent": ([8], "c"), "earliest": ([7], "a"), "frequent": ([7], "b")}


def test_context_shorter_than_window_and_empty_history():
    """A context shorter than min_n drafts nothing; with an empty history index the context
    alone still drafts."""
    assert NgramProposer(min_n=3).propose(A([1, 2]), 4) is None
    assert NgramProposer(HistoryIndex(), min_n=2).propose(A([1, 2, 1, 2]), 4, scope="s").tokens.tolist() == [1, 2]


def test_registry_and_bad_parameters():
    """ngram is registered by name; an unknown name raises KeyError listing the known ones;
    min_n > max_n or an unknown policy raises ValueError."""
    assert "ngram" in available()
    assert isinstance(make_proposer("ngram"), NgramProposer)
    with pytest.raises(KeyError, match="known: .*ngram"):
        make_proposer("nope")
    with pytest.raises(ValueError):
        NgramProposer(min_n=3, max_n=2)
    with pytest.raises(ValueError, match="policy"):
        NgramProposer(policy="latest")
