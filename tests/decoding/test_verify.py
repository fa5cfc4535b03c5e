"""Verification kernels on literal arrays."""

import numpy as np

from assistd.decoding.verify import greedy_accept, top2_gap


def test_greedy_accept_stops_at_first_mismatch():
    """greedy_accept counts draft tokens up to the first that differs from the Target's argmax
    (2; 0 when the first differs)."""
    assert greedy_accept(np.array([5, 6, 7]), np.array([5, 6, 9, 4])) == 2
    assert greedy_accept(np.array([5, 6, 7]), np.array([1, 6, 7, 4])) == 0


def test_greedy_accept_all_then_bonus():
    """A draft the argmax agrees with throughout is accepted whole (2 of 2)."""
    assert greedy_accept(np.array([5, 6]), np.array([5, 6, 1])) == 2


def test_greedy_accept_later_match_after_mismatch_does_not_count():
    """A match after the first mismatch does not count: [1, 2, 3] against [1, 9, 3] accepts
    1."""
    assert greedy_accept(np.array([1, 2, 3]), np.array([1, 9, 3, 0])) == 1


def test_top2_gap():
    """top2_gap is the largest logit minus the second ([0.5, 3.0, 2.75, -1.0]: 0.25)."""
    assert top2_gap(np.array([0.5, 3.0, 2.75, -1.0], dtype=np.float32)) == 0.25
