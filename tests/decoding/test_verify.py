"""Verification kernels on literal arrays."""

import numpy as np

from assistd.decoding.verify import greedy_accept, top2_gap


def test_greedy_accept_stops_at_first_mismatch():
    assert greedy_accept(np.array([5, 6, 7]), np.array([5, 6, 9, 4])) == 2
    assert greedy_accept(np.array([5, 6, 7]), np.array([1, 6, 7, 4])) == 0


def test_greedy_accept_all_then_bonus():
    assert greedy_accept(np.array([5, 6]), np.array([5, 6, 1])) == 2


def test_greedy_accept_later_match_after_mismatch_does_not_count():
    assert greedy_accept(np.array([1, 2, 3]), np.array([1, 9, 3, 0])) == 1


def test_top2_gap():
    assert top2_gap(np.array([0.5, 3.0, 2.75, -1.0], dtype=np.float32)) == 0.25
