"""`assistd replay`: the oracle walk, its arithmetic, the peers, the inputs, the CLI.

Walks use a fixed-draft test double on literal token arrays, counted by hand; the peers
are checked token for token against llama-cpp-python and transformers; inputs come from
tests/data/replay/, a three-commit repository made in tmp_path, and the shared real
transcripts (../shared/fixtures/transcripts) when present.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from assistd.ground.costmodel import CostModel
from assistd.ground.errors import InputError
from assistd.measure.replay import (
    SCOPE, ReplayCounts, TokenizedSession, build_proposer, common_prefix_len, default_proposers,
    metrics, modeled_speedup, per_position, replay_proposer, replay_report, tokens_per_call,
    walk_turn,
)
from assistd.measure.replay_inputs import (
    InputReport, git_sessions, transcript_session, transcript_sessions,
)
from proposers import Draft, Proposer, make_proposer
from proposers.peers import cut_at_eos, earliest_lookup
from storage.transcripts import (
    FORMATS, MODEL_KINDS, TOOL_RESULT, USER, apply_ops, parse_all, parser_for,
)
from tests.conftest import FIXTURES, needs_fixtures
from tests.test_cli import assistd, one_line_error

DATA = Path(__file__).parents[1] / "data" / "replay"
BRIEF = CostModel.brief()


class FixedProposer(Proposer):
    """Test double: always proposes the same tokens (cut to the ceiling asked for) and
    records every call's (context length, k, scope, language)."""

    name = "test:fixed"

    def __init__(self, tokens, history=None):
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.calls = []

    def propose(self, context, k, *, scope=None, language=None):
        self.calls.append((len(context), k, scope, language))
        return Draft(tokens=self.tokens[:k], probs=None, source="context", match_len=0) \
            if len(self.tokens) else None


def walk(tokens, start, end, draft, k):
    p = FixedProposer(draft)
    counts = ReplayCounts()
    walk_turn(lambda ctx, kk, lang: p.propose(ctx, kk, language=lang),
              np.asarray(tokens, dtype=np.int64), start, end, k, counts, "python")
    return counts, p


# ---------------------------------------------------------------- the walk, by hand


def test_walk_turn_worked_example():
    """Turn [5, 6, 7, 8], draft always [6, 7, 9], k 3: a round accepting 0 at position 0
    (draft 3), then a round accepting both of a draft cut to 2 at position 1, whose bonus
    is the turn's last token."""
    counts, p = walk([5, 6, 7, 8], 0, 4, [6, 7, 9], 3)
    led = counts.ledger
    assert (led.draft_tokens, led.accepted_tokens, led.rounds, led.plain_steps) == (5, 2, 2, 0)
    assert led.committed_tokens == 4
    assert [(n, k) for n, k, _, _ in p.calls] == [(0, 3), (1, 2)]  # context length, ceiling
    assert led.reached_per_position == [2, 2, 1]
    assert led.accepted_per_position == [1, 1, 0]
    assert counts.tried_per_position == [2, 1, 0]  # position 3 was never tried with 1, 2 in
    assert counts.rounds_by_draft_len == [0, 0, 1, 1]


def test_walk_context_before_the_turn_and_the_last_token_is_plain():
    """Context [1, 2] then turn [3, 3, 3]: drafts [3] are accepted, never past the turn;
    the last token has no room for a draft (k ceiling 0) and is a plain step, no call."""
    counts, p = walk([1, 2, 3, 3, 3], 2, 5, [3, 3, 3, 3], 16)
    led = counts.ledger
    # at 2: ceiling 2, draft [3, 3] all accepted -> commits 3: the whole turn
    assert (led.rounds, led.draft_tokens, led.accepted_tokens, led.plain_steps) == (1, 2, 2, 0)
    assert p.calls == [(2, 2, None, "python")]
    counts, p = walk([1, 2, 3, 4, 3], 2, 5, [3, 3, 3], 16)
    # at 2: draft [3, 3] vs [3, 4]: accepts 1, commits 2 -> at 4 (the last): plain step
    led = counts.ledger
    assert (led.rounds, led.draft_tokens, led.accepted_tokens, led.plain_steps) == (1, 2, 1, 1)
    assert len(p.calls) == 1 and led.committed_tokens == 3


def test_no_draft_is_a_plain_step():
    """A proposer that drafts nothing gives plain steps only: coverage 0, acceptance null, one
    token per call, modeled speedup 1."""
    counts, p = walk([7, 8, 9], 0, 3, [], 4)
    led = counts.ledger
    assert (led.rounds, led.plain_steps, led.committed_tokens) == (0, 3, 3)
    assert len(p.calls) == 2 and counts.propose_ms and len(counts.propose_ms) == 2
    m = metrics(counts, BRIEF)
    assert m["coverage"] == 0 and m["acceptance_rate"] is None and m["tokens_per_call"] == 1
    assert m["modeled_speedup"] == m["modeled_speedup_physical"] == 1.0


def test_metrics_by_hand():
    """Turn of 10 tokens [0..9], draft always [0, 1, 2, 3], k 4:
    at 0: draft [0,1,2,3] accepted 4 -> commits 5 (i=5);
    at 5: draft [0,1,2,3] vs [5,6,7,8] accepted 0 -> commits 1 (i=6);
    at 6: ceiling 3, draft [0,1,2] accepted 0 (i=7); at 7: ceiling 2, [0,1] -> 0 (i=8);
    at 8: ceiling 1, [0] -> 0 (i=9); at 9: plain step.
    D = 4+4+3+2+1 = 14, C = 4, R = 5, P = 1, committed 10."""
    counts, _ = walk(list(range(10)), 0, 10, [0, 1, 2, 3], 4)
    m = metrics(counts, BRIEF)
    assert (m["draft_tokens"], m["accepted_tokens"], m["rounds"], m["plain_steps"]) == (14, 4, 5, 1)
    assert m["committed_tokens"] == 10
    assert m["acceptance_rate"] == pytest.approx(4 / 14)
    assert m["mean_acceptance_length"] == pytest.approx(1 + 4 / 5)
    assert m["coverage"] == pytest.approx(5 / 6)
    assert m["tokens_per_call"] == pytest.approx(10 / 6)
    assert m["reached_per_position"] == [5, 4, 3, 2]
    assert m["accepted_per_position"] == [1, 1, 1, 1]
    assert m["tried_per_position"] == [5, 1, 1, 1]
    assert m["conditional_acceptance"] == pytest.approx([1 / 5, 1, 1, 1])
    assert m["cumulative_acceptance"] == pytest.approx([1 / 5, 1 / 4, 1 / 3, 1 / 2])
    assert m["rounds_by_draft_len"] == [0, 1, 1, 1, 2]
    # Reference CPU t(n) (CostModel.brief()): 1 11, 2 19, 3 22.5, 4 26, 5 30.25 ms.
    literal = 10 * 11 / (2 * 26 + 22.5 + 19 + 11 + 1 * 11)  # rounds cost t(L)
    physical = 10 * 11 / (2 * 30.25 + 26 + 22.5 + 19 + 1 * 11)  # rounds cost t(L + 1)
    assert m["modeled_speedup"] == pytest.approx(literal)
    assert m["modeled_speedup_physical"] == pytest.approx(physical)
    assert m["propose_calls"] == 5 and m["propose_ms_p50"] <= m["propose_ms_p99"]


def test_pure_helpers():
    """Worked examples of the replay kernels: common_prefix_len, tokens_per_call and
    modeled_speedup with no data (None), modeled_speedup 44/26 for 4 tokens in one round,
    per_position."""
    assert common_prefix_len(np.array([1, 2, 3]), np.array([1, 2, 3])) == 3
    assert common_prefix_len(np.array([9]), np.array([1])) == 0
    assert tokens_per_call(0, 0, 0) is None
    assert modeled_speedup(0, [], 0, BRIEF.t_ms, 11.0) is None
    assert modeled_speedup(4, [0, 0, 0, 1], 0, BRIEF.round_ms, 11.0) == pytest.approx(44 / 26)
    assert per_position([], [], []) == ([], [])
    assert per_position([0], [2], [0]) == ([None], [0.0])


# ---------------------------------------------------------------- sessions and history


def tokenized(name, turns, seed=()):
    """A TokenizedSession from ``[(token list, is_model)]``."""
    parts, spans, pos = [], [], 0
    for ids, is_model in turns:
        parts.append(np.asarray(ids, dtype=np.int64))
        spans.append((pos, pos + len(ids), is_model, None))
        pos += len(ids)
    return TokenizedSession(name, np.concatenate(parts), spans,
                            [(n, np.asarray(t, dtype=np.int64)) for n, t in seed])


def test_non_model_turns_are_context_without_proposing():
    """A user turn [1, 2, 3] then a model turn [4, 5]: one call, at context length 3."""
    calls = []

    def make(history):
        p = FixedProposer([4, 5])
        calls.append(p)
        return p

    counts = replay_proposer(make, [tokenized("s", [([1, 2, 3], False), ([4, 5], True)])], 8)
    assert [c[:3] for c in calls[0].calls] == [(3, 1, SCOPE)]
    led = counts.ledger
    assert (led.rounds, led.draft_tokens, led.accepted_tokens, led.committed_tokens) == (1, 1, 1, 2)


def test_later_sessions_draft_from_earlier_ones_through_the_history():
    """The ngram proposer over 40 distinct tokens: the first session finds nothing (no
    repeats, empty history), the second drafts the same turn from the history: after
    the 3 tokens its shortest match needs, rounds of 16, 16 and 2 all accepted."""
    turn = list(range(100, 140))
    sessions = [tokenized("one", [(turn, True)]), tokenized("two", [(turn, True)])]
    counts = replay_proposer(lambda h: make_proposer("ngram", history=h, min_n=3), sessions, 16)
    led = counts.ledger
    assert led.plain_steps == 40 + 3
    assert (led.rounds, led.draft_tokens, led.accepted_tokens) == (3, 34, 34)
    assert counts.rounds_by_draft_len[16] == 2 and counts.rounds_by_draft_len[2] == 1


def test_seed_documents_are_in_the_history_before_the_session():
    """A session's seed documents are in the history before it is replayed: n-gram drafts from
    them are accepted."""
    turn = list(range(200, 230))
    counts = replay_proposer(lambda h: make_proposer("ngram", history=h, min_n=3),
                             [tokenized("s", [(turn, True)], seed=[("old", turn)])], 16)
    assert counts.ledger.accepted_tokens > 20


def test_build_proposer_errors_name_the_fix():
    """build_proposer names the known proposers for an unknown one; draft_model is not among the
    defaults, ngram and the PLD peers are."""
    with pytest.raises(InputError, match="unknown proposer 'nope'; known: .*ngram"):
        build_proposer("nope", None)
    assert "draft_model" not in default_proposers()
    assert {"ngram", "peer:llama-cpp-python-pld", "peer:transformers-pld"} <= set(default_proposers())


# ---------------------------------------------------------------- peers vs the real libraries


def random_contexts(seed=0, n=3000):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        length = int(rng.integers(0, 60))
        vocab = int(rng.integers(2, 12))
        yield rng.integers(0, vocab, size=length).astype(np.int64)


def test_llama_cpp_peer_matches_llama_cpp_python():
    """peer:llama-cpp-python-pld == LlamaPromptLookupDecoding(2, 10) on random contexts
    (small vocabularies, so matches of both n happen), and each draft is its cut to k."""
    llama_speculative = pytest.importorskip("llama_cpp.llama_speculative")
    real = llama_speculative.LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)
    peer = make_proposer("peer:llama-cpp-python-pld", history=None)
    for i, ctx in enumerate(random_contexts()):
        want = real(ctx.astype(np.intc))
        got, _ = earliest_lookup(ctx, 2, 10)
        assert got.tolist() == want.tolist(), ctx.tolist()
        k = 1 + i % 12
        d = peer.propose(ctx, k)
        assert (d.tokens.tolist() if d else []) == want[:k].tolist(), (ctx.tolist(), k)


def test_transformers_peer_matches_prompt_lookup_candidate_generator():
    """peer:transformers-pld == PromptLookupCandidateGenerator(num_output_tokens=10,
    max_matching_ngram_size=2, eos 2) on random contexts (EOS 2 occurs in them)."""
    torch = pytest.importorskip("torch", reason="transformers' generator needs torch")
    cg = pytest.importorskip("transformers.generation.candidate_generator")
    real = cg.PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor([2]), num_output_tokens=10, max_matching_ngram_size=2,
        max_length=10_000)
    peer = make_proposer("peer:transformers-pld", history=None)
    for ctx in random_contexts(seed=1, n=1500):
        if len(ctx) == 0:
            continue
        cand, _ = real.get_candidates(torch.tensor(ctx[None, :]))
        want = cand[0, len(ctx):].tolist()
        d = peer.propose(ctx, 10)
        assert (d.tokens.tolist() if d else []) == want, ctx.tolist()


def test_peer_kernels_worked_examples():
    """Worked examples of the PLD peers' kernels: earliest_lookup continues the earliest match
    (running into the tail), nothing without one; cut_at_eos; transformers-pld drafts only on a
    match."""
    assert earliest_lookup(np.array([1, 2, 3, 4, 2, 3]), 2, 10)[0].tolist() == [4, 2, 3]
    assert earliest_lookup(np.array([1, 2, 1, 2]), 2, 10)[0].tolist() == [1, 2]  # runs into the tail
    assert earliest_lookup(np.array([1, 2, 3]), 2, 10)[0].tolist() == []
    assert earliest_lookup(np.array([7]), 2, 10)[0].tolist() == []
    assert cut_at_eos(np.array([2, 5]), [2]).tolist() == []
    assert make_proposer("peer:transformers-pld").propose(np.array([1, 2, 9, 1, 2]), 8) is not None
    assert make_proposer("peer:transformers-pld").propose(np.array([1, 2, 2, 1, 2]), 8) is None


# ---------------------------------------------------------------- inputs


def test_transcript_turns_in_file_order_with_roles():
    """tests/data/replay/claude_session.jsonl: prompt, prose, Write, its result, a system
    notice, a prompt, prose; the tool result once (toolUseResult repeats it)."""
    s = transcript_session(DATA / "claude_session.jsonl")
    assert s.source == "claude_code"
    assert [(t.role, t.is_model) for t in s.turns] == [
        ("user", False), ("assistant", True), ("tool_input", True), ("tool_result", False),
        ("system", False), ("user", False), ("assistant", True)]
    assert s.turns[2].language == "python" and s.turns[1].language == "markdown"
    assert s.turns[3].text == "File created successfully at: /proj/calc.py"
    chat = transcript_session(DATA / "chat.jsonl")
    assert [t.role for t in chat.turns] == ["system", "user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_context_turns_leave_the_model_records_unchanged(fmt):
    """Every parser: with context_turns on, the model records (kinds assistant/tool_input)
    are exactly those it emits with it off, in the same order (own and shared data)."""
    files = sorted(DATA.parent.glob("transcripts/*")) + sorted(DATA.glob("*.jsonl"))
    if FIXTURES.is_dir():
        files += sorted(p for p in FIXTURES.rglob("*") if p.is_file())
    from storage.transcripts import HEAD_BYTES, detect_format, open_bytes

    for path in files:
        if detect_format(path, open_bytes(path, HEAD_BYTES)) != fmt:
            continue
        data = open_bytes(path)
        plain = apply_ops(parse_all(parser_for(fmt), data))
        with_ctx = apply_ops(parse_all(parser_for(fmt, context_turns=True), data))
        model = {k: r for k, r in with_ctx.items() if r.kind in MODEL_KINDS}
        assert list(model.items()) == list(plain.items()), path
        assert all(k.startswith("ctx:") for k, r in with_ctx.items() if r.kind not in MODEL_KINDS)


def test_each_format_emits_context_turns():
    """A literal transcript per format shows its user prompt (or tool result) as context."""
    cases = {
        "codex": b'{"timestamp":"t","type":"response_item","payload":{"type":"message","role":"user",'
                 b'"content":[{"type":"input_text","text":"hi"}]}}\n'
                 b'{"timestamp":"t","type":"response_item","payload":{"type":"function_call_output",'
                 b'"call_id":"c","output":"ok"}}\n',
        "aider": b"# aider chat started at 2024\n\n#### hi  \n\nreply\n> ok  \n",
        "gemini_json": b'{"sessionId":"s","messages":[{"id":"1","type":"user","content":"hi"},'
                       b'{"id":"2","type":"gemini","content":"","toolCalls":[{"id":"c","name":"ls",'
                       b'"args":{},"result":[{"functionResponse":{"response":{"output":"ok"}}}]}]}]}',
        "mini_swe_agent": b'{"messages":[{"role":"user","content":"hi"},{"role":"assistant",'
                          b'"content":"x"},{"role":"tool","content":"ok"}],"info":{}}',
        "openhands": b'[{"id":0,"source":"user","action":"message","args":{"content":"hi"}},'
                     b'{"id":1,"source":"agent","observation":"run","content":"ok"}]',
        "swe_agent": b'{"trajectory":[{"thought":"x","action":"ls","observation":"ok"}],'
                     b'"history":[{"role":"user","content":"hi"}]}',
        "generic_jsonl": b'{"role":"user","content":"hi"}\n{"role":"tool","content":"ok"}\n',
    }
    for fmt, data in cases.items():
        records = apply_ops(parse_all(parser_for(fmt, context_turns=True), data)).values()
        shown = [(r.kind, r.text) for r in records if r.kind not in MODEL_KINDS]
        assert (USER, "hi") in shown and (TOOL_RESULT, "ok") in shown, (fmt, shown)
        assert not [r for r in apply_ops(parse_all(parser_for(fmt), data)).values()
                    if r.kind not in MODEL_KINDS]


def git(repo, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


@pytest.fixture
def three_commits(tmp_path):
    """a.py added (with a binary file), a.py grown, b.py added and the binary deleted."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(12))
    (repo / "a.py").write_text(body)
    (repo / "logo.bin").write_bytes(b"\0\1\2")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    (repo / "a.py").write_text(body + "def g(x):\n    return f1(x) + f2(x)\n")
    git(repo, "commit", "-qam", "two")
    (repo / "b.py").write_text("from a import f1\n\nprint(f1(2))\n")
    (repo / "logo.bin").unlink()
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "three")
    return repo


def test_git_history_as_sessions(three_commits):
    """git_sessions turns the last commits into one session per changed file (path, then file
    turns), seeded with the file's previous version unless already replayed, skipping binaries,
    counted in the report."""
    report = InputReport()
    sessions = git_sessions(three_commits, 3, report)
    assert [s.name.split(":", 1)[1] for s in sessions] == ["a.py", "a.py", "b.py"]
    assert [t.role for t in sessions[0].turns] == ["path", "file"]
    assert sessions[0].turns[0].text == "a.py\n" and sessions[0].turns[1].language == "python"
    assert sessions[0].seed == [] and sessions[1].seed == []  # a.py's v1 is already replayed
    assert (report.git_commits, report.git_files, report.skipped_binary) == (3, 3, 1)
    last_two = git_sessions(three_commits, 2, InputReport())
    assert [n for n, _ in last_two[0].seed] and "def f11" in last_two[0].seed[0][1]


def test_git_replay_drafts_the_new_version_from_the_old(three_commits):
    """Commit two re-writes a.py: the ngram proposer copies most of it from version one."""
    from assistd.measure.replay import tokenize_sessions
    from assistd.targets.open import open_target

    target = open_target(None)
    try:
        sessions = tokenize_sessions(git_sessions(three_commits, 2, InputReport()), target.tokenize)
    finally:
        target.close()
    counts = replay_proposer(lambda h: build_proposer("ngram", h), sessions[:1], 16)
    # ngram as `complete` runs it (drafts capped at half the match): 152 of 191 here.
    assert counts.ledger.accepted_tokens > 0.75 * counts.ledger.committed_tokens


def test_git_errors(tmp_path):
    """A --git path that is not a directory, or not a repository, is an InputError saying
    which."""
    with pytest.raises(InputError, match="not a directory"):
        git_sessions(tmp_path / "nope", 3, InputReport())
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match="git rev-parse failed"):
        git_sessions(tmp_path / "plain", 3, InputReport())


# ---------------------------------------------------------------- the shared fixtures


REAL_FILES = [
    "claude-code/codemie__incremental-simple__turn-1.jsonl",
    "claude-code/codemie__incremental-simple__turn-2.jsonl",
    "claude-code/codemie__session-9eda1058.jsonl",
    "claude-code/daaain__representative_messages.synthetic.jsonl",
    "claude-code/simonw__sample_session.jsonl",
    "codex/codemie__incremental__turn-1.jsonl",
    "codex/codemie__incremental__turn-2.jsonl",
    "codex/codemie__rollout-2026-05-11T13-28-45-019e1695-0522-7c83-8b39-0dd379793f80.jsonl",
    "gemini-cli/codemie__session-2025-12-01T21-45-5b959dae.json",
    "mini-swe-agent/django__django-16139.traj.json",
    "openhands/openhands__basic.json",
    "swe-agent/sweagent__demo__function_calling__marshmallow-1867.traj",
]  # every transcript there but the 1.9 MB aider file (the reference set)


def _without_times(report):
    out = json.loads(json.dumps(report))
    for m in out["proposers"].values():
        for key in [k for k in m if k.startswith("propose_ms")]:
            del m[key]
    return out


@needs_fixtures
def test_replay_on_the_shared_fixtures_is_deterministic():
    """Twice over the issue's reference set, every proposer: identical numbers (times
    aside). The peers agree with each other (no EOS in text) and land near the issue's
    reference for llama-cpp-python's rule: 1.72 tokens per call, acceptance 0.09,
    modeled speedup 0.44 (the issue's t(draft length) formula)."""
    files = [FIXTURES / rel for rel in REAL_FILES]
    a = replay_report(files, cost_model="reference", k=16)
    with pytest.warns(FutureWarning, match="now called --cost-model reference"):
        b = replay_report(files, cost_model="brief", k=16)  # the old name still works
    assert _without_times(a) == _without_times(b)
    assert a["inputs"]["sessions"] == 12 and a["inputs"]["model_tokens"] > 20_000
    llama, hf = a["proposers"]["peer:llama-cpp-python-pld"], a["proposers"]["peer:transformers-pld"]
    assert _without_times({"proposers": {"x": llama}}) == _without_times({"proposers": {"x": hf}})
    assert llama["tokens_per_call"] == pytest.approx(1.72, abs=0.06)
    assert llama["acceptance_rate"] == pytest.approx(0.09, abs=0.01)
    assert llama["modeled_speedup"] == pytest.approx(0.44, abs=0.02)
    for m in a["proposers"].values():
        assert m["committed_tokens"] == a["inputs"]["model_tokens"]
        assert m["committed_tokens"] == m["accepted_tokens"] + m["rounds"] + m["plain_steps"]


# ---------------------------------------------------------------- the CLI


def test_cli_json_report(tmp_path):
    """`assistd replay --json` over two transcripts reports k, the cost model given, the inputs
    (formats, sessions, model turns) and for each proposer every metric, committing the
    recording's model tokens."""
    cost = tmp_path / "cost.json"
    BRIEF.save(cost)
    r = assistd("replay", DATA / "claude_session.jsonl", DATA / "chat.jsonl", "--proposer", "ngram",
                "--proposer", "peer:llama-cpp-python-pld", "--k", 8, "--cost-model", cost, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["k"] == 8 and out["cost_model"]["source"] == str(cost)
    assert out["cost_model"]["points"]["16"] == 75.0
    assert out["inputs"]["files"] == [str(DATA / "claude_session.jsonl"), str(DATA / "chat.jsonl")]
    assert out["inputs"]["formats"] == {"claude_code": 1, "generic_jsonl": 1}
    assert out["inputs"]["sessions"] == 2 and out["inputs"]["model_turns"] == 5
    assert list(out["proposers"]) == ["ngram", "peer:llama-cpp-python-pld"]
    for m in out["proposers"].values():
        for key in ("draft_tokens", "accepted_tokens", "rounds", "plain_steps", "acceptance_rate",
                    "mean_acceptance_length", "coverage", "tokens_per_call", "modeled_speedup",
                    "modeled_speedup_physical", "conditional_acceptance", "cumulative_acceptance",
                    "propose_ms_p50", "propose_ms_p99"):
            assert key in m
        assert m["committed_tokens"] == out["inputs"]["model_tokens"]


def test_cli_table_lists_every_default_proposer():
    """A folder gives its transcripts (others are passed over); a table per proposer."""
    r = assistd("replay", DATA, "--cost-model", "brief")  # the old name: works, and says so
    assert r.returncode == 0, r.stderr
    assert "now called --cost-model reference" in r.stderr
    for name in default_proposers():
        assert name in r.stdout
    assert "2 sessions" in r.stdout and "per-position" in r.stdout


def test_cli_default_cost_model_is_calibrated_on_the_target():
    """Without --cost-model, replay calibrates t(n) for 1..32 on the embedded SmolLM2 Target."""
    r = assistd("replay", DATA / "chat.jsonl", "--proposer", "ngram", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["cost_model"]["source"] == "calibrated:llama"
    assert set(out["cost_model"]["points"]) == {"1", "2", "4", "8", "16", "32"}
    assert out["target"]["model"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_cli_git(three_commits):
    """`assistd replay --git` replays the last commits' files and ngram drafts accepted
    tokens."""
    r = assistd("replay", "--git", three_commits, "--git-commits", 2, "--proposer", "ngram",
                "--cost-model", "reference", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["inputs"]["git_commits"] == 2 and out["inputs"]["git_files"] == 2
    assert out["proposers"]["ngram"]["accepted_tokens"] > 0


def test_a_fifo_given_by_name_is_said_to_be_no_regular_file(tmp_path):
    """Issue 21: `replay tx/fifo.jsonl` said "no transcript found in the folders given;
    pass the files by name" although it was passed by name. Never opened (a read would
    wait for a writer): the subprocess's timeout guards against a hang."""
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="fifo.jsonl: not a regular file"):
        transcript_sessions([fifo], InputReport())
    with pytest.raises(InputError, match="not a regular file"):
        transcript_session(fifo)
    one_line_error(assistd("replay", fifo, "--proposer", "ngram"), str(fifo),
                   "not a regular file", "FIFO")


def test_a_record_over_1_mb_is_left_out_and_counted_as_index_does(tmp_path):
    """A newcomer's transcript with one 5 MB message kept `replay` silent for over 300 s
    (a peer's step scans the whole context). A record over 1 MB (UTF-8) is not replayed,
    as `assistd index` does not store it; the others are; the count is in the JSON and
    the table says it."""
    big = "x = 1\n" * 200_000  # 1,200,000 bytes
    small = "def f(x):\n    return x + 1\n"
    tx = tmp_path / "big.jsonl"
    tx.write_text("".join(json.dumps({"role": role, "content": text}) + "\n" for role, text in
                          [("user", "write code"), ("assistant", big), ("assistant", small)]))
    report = InputReport()
    (session,) = transcript_sessions([tx], report)
    assert [t.text for t in session.turns] == ["write code", small]
    assert report.skipped_large == 1
    assert [t.text for t in transcript_session(tx, max_record_bytes=len(big)).turns] == [
        "write code", big, small]  # the limit is inclusive
    r = assistd("replay", tx, "--proposer", "ngram", "--cost-model", "reference", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["inputs"]["skipped_large"] == 1
    r = assistd("replay", tx, "--proposer", "ngram", "--cost-model", "reference")
    assert "not replayed: 1 too large (over 1 MB" in r.stdout


def test_cli_bad_inputs_are_one_line_exit_2(tmp_path):
    """replay with a missing file, an unknown format or proposer, a missing cost model, nothing
    to replay or a non-repository --git exits 2 with one line naming the fix."""
    missing = tmp_path / "missing.jsonl"
    one_line_error(assistd("replay", missing, "--cost-model", "reference"), "file not found", str(missing))
    one_line_error(assistd("replay", DATA / "notes.txt", "--cost-model", "reference"),
                   "not a known transcript format")
    one_line_error(assistd("replay", DATA / "chat.jsonl", "--proposer", "nope"),
                   "unknown proposer 'nope'", "ngram")
    one_line_error(assistd("replay", DATA / "chat.jsonl", "--cost-model", tmp_path / "c.json"),
                   "cost model file not found")
    one_line_error(assistd("replay"), "nothing to replay")
    one_line_error(assistd("replay", "--git", tmp_path, "--cost-model", "reference"), "git")


# ---------------------------------------------------------------- token trees


class FixedTree(Proposer):
    """Test double: always the same token tree (``parents`` as Draft has them)."""

    name = "test:fixed-tree"

    def __init__(self, tokens, parents):
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.parents = np.asarray(parents, dtype=np.int64)

    def propose(self, context, k, *, scope=None, language=None):
        return Draft(self.tokens, None, "context", 1, parents=self.parents)


def test_tree_oracle_by_hand():
    """Turn [2, 3, 4, 5, 6, 7], k 4, always the 8-node tree 2 -> {3 -> {4 -> 9, 8}, 5},
    4 -> 5 (tokens [2, 3, 4, 9, 8, 5, 4, 5], depth first), counted by hand:

    - at 0 (next 2 3 4 5): 2, 3, 4 followed, 4's only child 9 is not 5: 3 accepted of
      8 nodes verified, not at a leaf; commits 4;
    - at 4 (one token left before the turn's last): the tree cut to depth 1, the roots
      2 and 4, neither is 6: 0 accepted of 2 nodes;
    - at 5, the turn's last token: a plain step.

    D = 10 nodes, C = 3, R = 2, P = 1; modeled cost t(9) + t(3) + t(1) (nodes + 1)."""
    tokens = [2, 3, 4, 9, 8, 5, 4, 5]
    parents = [-1, 0, 1, 2, 1, 0, -1, 6]
    p = FixedTree(tokens, parents)
    counts = ReplayCounts()
    walk_turn(lambda ctx, kk, lang: p.propose(ctx, kk), np.array([2, 3, 4, 5, 6, 7]), 0, 6, 4,
              counts)
    led = counts.ledger
    assert (led.draft_tokens, led.accepted_tokens, led.rounds, led.plain_steps) == (10, 3, 2, 1)
    assert led.committed_tokens == 6 and led.tree_rounds == 2
    assert counts.rounds_by_draft_len == [0, 0, 1, 0, 0, 0, 0, 0, 1]
    assert led.reached_per_position == [2, 1, 1, 1]  # by depth along the accepted branch
    assert led.accepted_per_position == [1, 1, 1, 0]
    assert led.tried_per_position == [2, 1, 1, 1]  # depth 4 was verified (4 had a child)
    assert led.nodes_by_depth == [2, 0, 0, 8]
    m = metrics(counts, BRIEF)
    assert m["tree_rounds"] == 2 and m["nodes_per_round"] == 5.0
    assert m["tokens_per_call"] == pytest.approx(6 / 3)
    t = BRIEF.t_ms
    assert m["modeled_speedup_physical"] == pytest.approx(6 * t(1) / (t(9) + t(3) + t(1)))


def test_tree_arms_and_their_errors():
    """NAME+tree arms: --tree off/on/both expands the proposers that have a tree mode;
    a proposer without one, or an unknown --tree, is refused with the fix."""
    from assistd.measure.replay import check_arm, split_arm, tree_arms

    names = ["suffix", "ngram", "peer:suffixdecoding"]
    assert tree_arms(names, "off") == names
    assert tree_arms(names, "on") == ["suffix+tree", "ngram", "peer:suffixdecoding+tree"]
    assert tree_arms(names, "both") == ["suffix", "suffix+tree", "ngram", "peer:suffixdecoding",
                                        "peer:suffixdecoding+tree"]
    assert tree_arms(["suffix+tree", "suffix"], "both") == ["suffix+tree", "suffix"]
    assert split_arm("peer:suffixdecoding+tree") == ("peer:suffixdecoding", True)
    with pytest.raises(InputError, match="'ngram' has no tree mode.*suffix"):
        check_arm("ngram+tree")
    with pytest.raises(InputError, match="unknown proposer 'nope'"):
        tree_arms(["nope+tree"], "off")
    with pytest.raises(InputError, match="--tree must be one of off, on, both"):
        tree_arms(names, "sometimes")
    # A tree arm gets the tree options; a chain arm does not.
    assert build_proposer("suffix+tree", None, BRIEF, max_nodes=12).max_nodes == 12
    assert build_proposer("suffix+tree", None, BRIEF).tree
    assert not build_proposer("suffix", None, BRIEF).tree
    assert build_proposer("peer:suffixdecoding+tree", None).tree


def test_suffixdecoding_tree_mode_by_hand():
    """Arctic's use_tree_spec on the live context: after ``1 2`` came ``3 4`` twice and
    ``5 6`` once, and the context ends in ``1 2`` (Arctic's request tree holds it: a
    fourth occurrence, counted in the denominators). Path mode follows 3 4 (2/4, then
    1); tree mode grows best first by cumulative estimate within min(max_nodes, factor
    x match length) nodes: 3 (2/4), 3 4 (2/4), then 5 (1/4) once the budget allows."""
    from proposers.suffixdecoding import SuffixDecodingPeer

    ctx = np.array([1, 2, 3, 4, 9, 1, 2, 5, 6, 9, 1, 2, 3, 4, 9, 7, 1, 2], dtype=np.int64)
    path = SuffixDecodingPeer(None).propose(ctx, 8)
    assert path.parents is None and path.tokens.tolist()[:2] == [3, 4]
    tree = SuffixDecodingPeer(None, tree=True, max_spec_factor=2.0).propose(ctx, 8)
    assert tree.is_tree
    assert tree.tokens.tolist()[:2] == [3, 4] and 5 in tree.tokens.tolist()
    first = tree.tokens.tolist().index(5)
    assert tree.parents[first] == -1 and tree.probs[first] == pytest.approx(1 / 4)
    assert tree.probs[0] == pytest.approx(2 / 4) and tree.probs[1] == pytest.approx(1.0)
    # The node budget: never more than max_nodes, nor than factor x match length.
    small = SuffixDecodingPeer(None, tree=True, max_nodes=2, max_spec_factor=2.0).propose(ctx, 8)
    assert len(small.tokens) <= 2 and small.parents is None  # 3 and 3 4: a chain
    one = SuffixDecodingPeer(None, tree=True, max_leaves=1).propose(ctx, 8)
    assert one.parents is None  # one leaf: the path mode


def test_suffix_tree_whose_first_branch_outruns_its_source():
    """Found by the tree replay of the shared transcripts: a tree whose best first token
    comes from the history (a 2-token continuation) and whose first branch goes on with
    the live context's nodes crashed ``suffix``'s document lookup (numpy could not
    compare a 3-token branch with 2-token rows). One-line fix in proposers/suffix.py."""
    from proposers.index import HistoryIndex
    from proposers.suffix import SuffixProposer

    h = HistoryIndex()
    h.put("s", 1, np.array([99, 11, 12, 20, 21], dtype=np.int64), "doc")
    # The chain's floors (depth <= the match, 10% estimates), where it was found; the
    # tree defaults would grow the branch on past the live context's 22.
    p = SuffixProposer(h, tree=True, alpha=1.0, min_token_prob=0.1,
                       match_prior={"context": 1.5, "history": 0.0})
    ctx = np.array([10, 11, 12, 20, 21, 22, 23, 24, 25, 10, 11, 12], dtype=np.int64)
    d = p.propose(ctx, 8, scope="s")
    assert d.tokens.tolist() == [20, 21, 22] and d.source == "history" and d.document == "doc"


def test_cli_tree_both_compares_in_one_run():
    """--tree both --nodes 16, flat cost: suffix and SuffixDecoding each with and without
    trees on the same tokens; tree arms verify at most 16 nodes a round, every arm commits
    every model token; the table shows the tree columns."""
    args = ["replay", DATA / "claude_session.jsonl", DATA / "chat.jsonl", "--proposer", "suffix",
            "--proposer", "peer:suffixdecoding", "--tree", "both", "--nodes", 16,
            "--cost-model", "flat"]
    r = assistd(*args, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tree"] == "both" and out["max_nodes"] == 16
    assert out["cost_model"]["source"] == "flat"
    assert list(out["proposers"]) == ["suffix", "suffix+tree", "peer:suffixdecoding",
                                      "peer:suffixdecoding+tree"]
    for name, m in out["proposers"].items():
        assert m["committed_tokens"] == out["inputs"]["model_tokens"]
        # flat cost: the modeled speedup is tokens per call
        assert m["modeled_speedup_physical"] == pytest.approx(m["tokens_per_call"])
        assert len(m["rounds_by_draft_len"]) <= 17
        if not name.endswith("+tree"):
            assert m["tree_rounds"] == 0
    assert out["proposers"]["suffix+tree"]["tree_rounds"] > 0
    table = assistd(*args)
    assert table.returncode == 0, table.stderr
    assert "nodes/round" in table.stdout and "suffix+tree" in table.stdout


def test_cli_tree_errors_are_one_line():
    """replay with ngram+tree (no tree mode; suffix has) or --nodes 0 exits 2 with one line, no
    traceback."""
    one_line_error(assistd("replay", DATA / "chat.jsonl", "--proposer", "ngram+tree",
                           "--cost-model", "flat"), "'ngram' has no tree mode", "suffix")
    r = assistd("replay", DATA / "chat.jsonl", "--nodes", 0)
    assert r.returncode == 2 and "--nodes" in r.stderr and "Traceback" not in r.stderr
