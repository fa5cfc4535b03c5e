"""Ledger arithmetic: raw counters and the formulas of docs/design.md, 'Vocabulary'."""

import random

from assistd.ground.ledger import Ledger


def test_empty_ledger_has_null_ratios():
    """An empty ledger reports acceptance rate, mean acceptance length, coverage and tokens/s as
    null, not zero."""
    led = Ledger()
    d = led.as_dict()
    assert d["acceptance_rate"] is None
    assert d["mean_acceptance_length"] is None
    assert d["coverage"] is None
    assert d["tokens_per_s"] is None


def test_random_rounds_keep_invariants():
    """Under 2,000 random rounds and plain steps: C <= D, committed = C + R + P, ratios match."""
    rng = random.Random(7)
    led = Ledger()
    D = C = R = P = 0
    per_pos = [0] * 16
    for _ in range(2000):
        if rng.random() < 0.3:
            led.record_plain_step()
            P += 1
            continue
        k = rng.randint(1, 16)
        a = rng.randint(0, k)
        led.record_round(k, a)
        D, C, R = D + k, C + a, R + 1
        for i in range(a):
            per_pos[i] += 1
    assert led.accepted_tokens <= led.draft_tokens
    assert (led.draft_tokens, led.accepted_tokens, led.rounds, led.plain_steps) == (D, C, R, P)
    assert led.committed_tokens == C + R + P
    assert led.acceptance_rate == C / D
    assert led.mean_acceptance_length == 1 + C / R
    assert led.coverage == R / (R + P)
    assert led.accepted_per_position == per_pos
    assert sum(led.accepted_per_position) == C
    assert led.reached_per_position[0] == R


def test_plain_only_coverage_is_zero_and_acceptance_null():
    """Five plain steps give coverage 0, acceptance rate and mean acceptance length null, and 5
    committed tokens."""
    led = Ledger()
    for _ in range(5):
        led.record_plain_step()
    assert led.coverage == 0.0
    assert led.acceptance_rate is None
    assert led.mean_acceptance_length is None
    assert led.committed_tokens == 5
