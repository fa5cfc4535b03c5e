"""benchmarks/fleet.py: the split into agents, the token clock, what a history sees and
when, and that its arms add up to `assistd replay`'s walk on the real transcripts.

The proposer is the real `suffix`; the clock and visibility checks use literal token
arrays, the rest small real transcripts tokenized by the embedded Target."""

from __future__ import annotations

import doctest
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from assistd.measure.replay import (
    ReplayCounts, TokenizedSession, build_proposer, replay_proposer, resolve_cost_model,
    tokenize_sessions,
)
from assistd.measure.replay_inputs import InputReport, transcript_sessions
from tests.conftest import FIXTURES, needs_fixtures

REPO = Path(__file__).resolve().parents[2]
FLAT = resolve_cost_model("flat", None)
# Small real sessions, none a prefix of another (as codemie's turn-1/turn-2 files are).
SMALL = ("claude-code/simonw__sample_session.jsonl",
         "claude-code/daaain__representative_messages.synthetic.jsonl",
         "openhands/openhands__basic.json",
         "codex/codemie__incremental__turn-2.jsonl")


def load_fleet():
    """benchmarks/fleet.py (a script, not a package) as a module."""
    spec = importlib.util.spec_from_file_location("bench_fleet", REPO / "benchmarks" / "fleet.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


fleet = load_fleet()


def session(name, *turns):
    """A session of literal turns: ``(tokens, is_model)`` pairs."""
    parts, spans, pos = [], [], 0
    for tokens, is_model in turns:
        parts.append(np.asarray(tokens, dtype=np.int64))
        spans.append((pos, pos + len(tokens), is_model, None))
        pos += len(tokens)
    return TokenizedSession(name, np.concatenate(parts), spans)


def totals(counts: ReplayCounts):
    led = counts.ledger
    return (led.draft_tokens, led.accepted_tokens, led.rounds, led.plain_steps,
            led.committed_tokens)


def test_split_round_robin_and_bounds():
    """split_streams deals sessions round robin over 1..n streams (5 over 2: [0, 2, 4], [1, 3]);
    other stream counts raise ValueError; the script's doctests pass."""
    assert doctest.testmod(fleet).failed == 0  # the script's docstring examples
    assert fleet.split_streams(5, 2) == [[0, 2, 4], [1, 3]]
    assert fleet.split_streams(3, 3) == [[0], [1], [2]]
    assert fleet.split_streams(3, 1) == [[0, 1, 2]]
    for bad in (0, 4):
        with pytest.raises(ValueError, match="between 1 and the 3 sessions"):
            fleet.split_streams(3, bad)


def test_clock_counts_model_tokens_only():
    """The fleet clock advances by model tokens only (prompts take no time): agents run side by
    side and the clock ends at 5."""
    # Agent 0: a prompt (no time), model turns of 3 and 2 tokens; agent 1: one of 4.
    a = session("a", ([1, 2], False), ([3, 4, 5], True), ([6], False), ([7, 8], True))
    b = session("b", ([9, 9, 9, 9], True))
    events = fleet.schedule([a, b], [[0], [1]])
    assert [(e.start, e.end, e.agent, e.turn) for e in events] == [
        (0, 3, 0, 1), (0, 4, 1, 0), (3, 5, 0, 3)]
    assert fleet.fleet_clock(events) == 5


def test_a_turn_is_visible_to_other_agents_only_once_it_ended():
    """A shared history lets an agent draft from another agent's turn only once that turn has
    ended on the clock; silos never do; committed tokens are the recording's whatever the
    arm."""
    rng = np.random.default_rng(0)
    text = rng.integers(100, 5000, 60)
    filler = lambda n: rng.integers(5000, 9000, n)  # noqa: E731 (tokens nobody repeats)
    # Agent 1 writes agent 0's 60 tokens again, after 80 tokens of its own: it starts at
    # clock 80, after agent 0's turn ended (60). Starting at 40 instead, it cannot see it.
    late = [session("a", (filler(5), False), (text, True)),
            session("b", (filler(80), True), (filler(5), False), (text, True))]
    early = [late[0], session("b", (filler(40), True), (filler(5), False), (text, True))]

    def tokens_per_call(sessions, shared):
        res = fleet.run_arm(sessions, [[0], [1]], shared=shared, restart_at=None, k=16, cost=FLAT)
        return fleet.arm_report(res, FLAT)

    shared, silo = tokens_per_call(late, True), tokens_per_call(late, False)
    assert shared["drafts_by_source"].get("history", 0) > 0
    assert "history" not in silo["drafts_by_source"]
    assert shared["tokens_per_call"] > silo["tokens_per_call"]
    assert "history" not in tokens_per_call(early, True)["drafts_by_source"]
    # Committed tokens are the recording's model tokens, whatever the arm.
    assert shared["committed_tokens"] == silo["committed_tokens"] == 60 + 80 + 60


@pytest.fixture(scope="module")
def real(target):
    if not FIXTURES.is_dir():
        pytest.skip(f"real transcripts not present at {FIXTURES}")
    return tokenize_sessions(transcript_sessions([FIXTURES / p for p in SMALL], InputReport()),
                             target.tokenize)


def replay_alone(sessions):
    return replay_proposer(lambda h: build_proposer("suffix", h, FLAT), sessions, 16)


@needs_fixtures
def test_one_agent_is_assistd_replay(real):
    """One stream of every real session gives the counts of assistd replay; a restart at the
    start changes nothing."""
    got = fleet.run_arm(real, fleet.split_streams(len(real), 1), shared=False, restart_at=None,
                        k=16, cost=FLAT)
    assert totals(got.counts) == totals(replay_alone(real))
    # A restart at the very start empties histories that are empty: nothing changes.
    again = fleet.run_arm(real, [list(range(len(real)))], shared=True, restart_at=0, k=16,
                          cost=FLAT)
    assert again.restarts == 1 and totals(again.counts) == totals(got.counts)


@needs_fixtures
def test_silos_are_each_session_replayed_alone(real):
    """Silos (one stream per session, no sharing) sum to each session replayed alone; shared or
    not, every agent commits exactly the recording's model tokens."""
    n = len(real)
    silo = fleet.run_arm(real, fleet.split_streams(n, n), shared=False, restart_at=None, k=16,
                         cost=FLAT)
    alone = [totals(replay_alone([s])) for s in real]
    assert totals(silo.counts) == tuple(int(sum(col)) for col in zip(*alone))
    # Shared or not, every agent commits exactly the recording's model tokens.
    shared = fleet.run_arm(real, fleet.split_streams(n, n), shared=True, restart_at=None, k=16,
                           cost=FLAT)
    assert shared.counts.ledger.committed_tokens == silo.counts.ledger.committed_tokens \
        == sum(s.model_tokens for s in real)


@needs_fixtures
def test_report_and_store_cost_on_real_sessions(real, target):
    """fleet_report on real sessions gives every arm per stream count with tokens per call in
    1..17 and coverage in 0..1; store_cost counts the history's tokens, documents and propose
    calls."""
    report = fleet.fleet_report(real, [1, 2], 16, FLAT, progress=lambda line: None)
    assert set(report[1]) == {"streams", "clock_tokens", "silo", "silo+restart"}
    assert set(report[2]) == {"streams", "clock_tokens", *fleet.ARMS}
    for arm in fleet.ARMS:
        r = report[2][arm]
        assert 1.0 <= r["tokens_per_call"] <= 17 and 0.0 <= r["coverage"] <= 1.0
    cost = fleet.store_cost(real, target.fingerprint, FLAT, calls=200)
    assert cost["history_tokens"] == sum(s.model_tokens for s in real)
    assert cost["documents"] == sum(1 for s in real for t in s.turns if t[2] and t[1] > t[0])
    assert cost["propose_calls"] == 200 and cost["load_ms"] > 0
