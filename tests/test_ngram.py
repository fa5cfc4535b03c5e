"""ngram proposer: matching kernels on tiny literal arrays, then the proposer."""

import numpy as np
import pytest

from proposers import available, make_proposer
from proposers.ngram import HistoryIndex, NgramProposer, lookup_context, match_lengths, pick

A = np.array


def test_match_lengths_counts_common_suffix():
    assert match_lengths(A([1, 2, 3, 4, 2, 3]), A([3, 6]), A([9, 2, 3]), 4).tolist() == [2, 2]
    assert match_lengths(A([7, 2, 3]), A([3]), A([7, 2, 3]), 2).tolist() == [2]  # capped at max_n


def test_pick_longest_then_policy():
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
    ctx = A([1, 2, 3, 9, 8, 2, 3, 7, 1, 2, 3])  # tail [1,2,3]: full match at 3, 2-match at 7
    d = NgramProposer(min_n=2, max_n=4).propose(ctx, 2)
    assert d.tokens.tolist() == [9, 8] and d.match_len == 3


def test_history_lookup_and_document_boundary():
    hist = HistoryIndex([("a.py", A([10, 11, 12, 13])), ("b.py", A([20, 21, 22]))], key_n=2)
    assert len(hist) == 7
    end, length = hist.lookup(A([5, 11, 12]), 2, 8, "recent")
    assert (end, length) == (3, 2)
    assert hist.continuation(end, 5).tolist() == [13]  # stops at the end of a.py
    assert hist.document_name(end) == "a.py"
    assert hist.document_name(6) == "b.py"


def test_history_draft_beats_shorter_context_match():
    hist = HistoryIndex([("lib.py", A([1, 2, 3, 4, 5, 6]))], key_n=2)
    p = NgramProposer(hist, min_n=2, max_n=8)
    d = p.propose(A([9, 2, 3, 7, 1, 2, 3]), 3)  # context has [2,3] (2), history has [1,2,3] (3)
    assert d.tokens.tolist() == [4, 5, 6]
    assert d.source == "history:lib.py" and d.match_len == 3


def test_no_match_across_documents():
    """The separator between documents never matches: [3, 20] spans a.py|b.py and is absent."""
    hist = HistoryIndex([("a.py", A([1, 2, 3])), ("b.py", A([20, 21, 22]))], key_n=2)
    assert hist.lookup(A([3, 20]), 2, 4, "recent") == (-1, 0)


def test_registry_and_bad_parameters():
    assert "ngram" in available()
    assert isinstance(make_proposer("ngram"), NgramProposer)
    with pytest.raises(KeyError, match="known: ngram"):
        make_proposer("nope")
    with pytest.raises(ValueError):
        NgramProposer(min_n=3, max_n=2)
    with pytest.raises(ValueError, match="keys 3 tokens"):
        NgramProposer(HistoryIndex([("a", A([1, 2, 3, 4]))], key_n=3), min_n=2)
