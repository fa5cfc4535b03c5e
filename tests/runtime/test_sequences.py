"""Several warm KV sequences: an editor request no longer evicts an agent's prompt.

On the real models: a Target with several sequences gives, in each, the very logits of
a Target with one (exact numerics: llama.cpp keeps each sequence in its own KV
stream); the daemon's engine serves an agent, an editor and the agent again, and the
agent's second request evaluates only its new tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from assistd.runtime.sequences import SequencePool
from assistd.serving.config import Config
from assistd.runtime.scheduler import AGENT, EDITOR
from assistd.serving.service import GenerationRequest, Service
from assistd.targets.base import choose_sequences
from assistd.targets.llama import LlamaTarget, kv_bytes_per_token
from assistd.targets.open import default_model_path
from assistd.targets.spec import TargetSpec
from tests.conftest import REPO

AGENT_TEXT = (REPO / "assistd/decoding/engine.py").read_text(encoding="utf-8")[:2400]
EDITOR_TEXT = (REPO / "assistd/runtime/runtime.py").read_text(encoding="utf-8")[:1500]


def _interleave_and_compare(path, n_ctx=1024):
    """Two prompts, their tokens interleaved over sequences 2 and 0 of a 3-sequence
    Target, against one-sequence Targets: max |logit difference| over every row. Exact
    numerics: bit-identity is their promise (fast's holds only under 512 cells)."""
    multi = LlamaTarget(path, n_ctx=n_ctx, sequences=3, numerics="exact")
    single = LlamaTarget(path, n_ctx=n_ctx, numerics="exact")
    try:
        assert multi.n_seq_max == 3 and multi.n_ctx == single.n_ctx
        a, b = multi.tokenize(AGENT_TEXT)[:300], multi.tokenize(EDITOR_TEXT)[:200]
        worst = 0.0
        multi.use_sequence(2)
        multi.evaluate(a[:200], [])
        multi.use_sequence(0)
        multi.evaluate(b[:150], [])
        rows = []
        for i in range(200, 300):  # one-token decoding in seq 2, seq 0 growing between
            multi.use_sequence(2)
            rows.append(multi.evaluate([a[i]], [0])[0])
            if i % 10 == 0:
                multi.use_sequence(0)
                multi.evaluate([b[150 + (i - 200) // 10]], [])
        multi.use_sequence(0)
        multi.truncate(100)  # a rollback in one sequence leaves the others alone
        multi.use_sequence(2)
        multi.truncate(280)
        batch = multi.evaluate(a[280:296], range(16))  # a verification batch in seq 2
        single.evaluate(a[:200], [])
        ref = [single.evaluate([a[i]], [0])[0] for i in range(200, 300)]
        single.truncate(280)
        ref_batch = single.evaluate(a[280:296], range(16))
        for x, y in zip(rows + list(batch), ref + list(ref_batch)):
            worst = max(worst, float(np.abs(x - y).max()))
        assert multi.sequence_tokens(0) == b[:100] and multi.sequence_tokens(1) == []
        return worst
    finally:
        multi.close()
        single.close()


@pytest.mark.exact_numerics
def test_each_sequence_gives_the_logits_of_a_one_sequence_target():
    """SmolLM2: rows decoded in sequence 2 of a 3-sequence Target, with sequence 0 growing and
    rolled back in between, equal a one-sequence Target's to the bit (both pin
    ``numerics="exact"``)."""
    assert _interleave_and_compare(default_model_path()) == 0.0


@pytest.mark.exact_numerics
def test_each_sequence_is_exact_on_gemma_too(gemma_path):
    """Gemma 3 (sliding-window layers, iSWA cache): the same holds. Both Targets pin
    ``numerics="exact"``."""
    assert _interleave_and_compare(gemma_path) == 0.0


def test_auto_chooses_from_the_kv_size_and_the_context():
    """SmolLM2: 23,040 bytes of K/V per token (30 layers x 3 KV heads x 64 x 2 x f16)."""
    per = kv_bytes_per_token(default_model_path())
    assert per == 30 * 3 * 64 * 2 * 2
    assert choose_sequences("auto", per, 2048) == 4  # 45 MiB each: the cap
    assert choose_sequences("auto", per, 131_072) == 1  # 2.8 GiB each: over the budget
    assert choose_sequences(2, per, 2048) == 2
    with pytest.raises(ValueError):
        choose_sequences(0, per, 2048)


class _FakeTarget:
    """Only the KV bookkeeping SequencePool reads (no model: the pool's rule alone)."""

    kv_bytes_per_token, n_ctx = 10, 100

    def __init__(self, n):
        self.n_seq_max, self.kv = n, [[] for _ in range(n)]

    def sequence_tokens(self, seq):
        return self.kv[seq]


def test_the_pool_keeps_each_prompt_in_its_own_sequence():
    """SequencePool (over a fake two-sequence Target: the choice needs no model) puts a new
    prompt in an empty sequence first, a follow-up where its prefix is, evicts the least
    recently used one (counted), never a pinned one, and reports owners and reserved KV
    bytes."""
    t = _FakeTarget(2)
    pool = SequencePool(t)
    agent, editor = list(range(100)), [7] + list(range(500, 550))
    s_agent = pool.choose(agent, "api")
    t.kv[s_agent] = agent
    s_editor = pool.choose(editor, "lsp:1")
    assert s_editor != s_agent and pool.evictions == 0  # an empty sequence first
    t.kv[s_editor] = editor
    assert pool.choose(agent + [1, 2, 3], "api") == s_agent  # the next turn: its prefix
    third = list(range(900, 950))
    assert pool.choose(third, "complete") == s_editor  # least recently used goes
    assert pool.evictions == 1
    with pool.pinned(s_agent):  # a running generation is never taken over...
        assert pool.choose(agent, "api") == s_editor
    st = pool.status()
    assert st["n_seq"] == 2 and st["kv_bytes_reserved"] == 2 * 10 * 100
    assert {s["owner"] for s in st["slots"]} == {"api"}


def test_one_sequence_takes_over_even_a_pinned_one():
    """With a single sequence a preempting request must run: it takes it over, and the
    preempted generation re-evaluates when it resumes."""
    t = _FakeTarget(1)
    pool = SequencePool(t)
    t.kv[0] = [1, 2, 3]
    with pool.pinned(0):
        assert pool.choose([9, 9], "lsp") == 0
    assert pool.evictions == 1


def fresh_greedy(target, prompt, n):
    """Plain greedy decoding, one token at a time, on a Target of its own."""
    target.truncate(0)
    logits = target.evaluate(prompt, [len(prompt) - 1])[0]
    out = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        if out[-1] in target.eos_token_ids:
            break
        logits = target.evaluate(out[-1:], [0])[0]
    return out


@pytest.mark.exact_numerics
@pytest.mark.parametrize("sequences", ["4", "1"])
def test_agent_editor_agent_keeps_the_agents_prefix_warm(tmp_path, sequences):
    """The issue's interleaving on one daemon engine: with 4 sequences the agent's second
    request evaluates only its new tokens, and its output is a fresh Target's; with 1
    (today's daemon) the editor request evicted the agent's prompt. Service and fresh Target pin
    ``numerics="exact"``: tokens and logits are compared bit for bit."""
    # Exact numerics: the output and logits are compared with a fresh Target's bit for
    # bit, which is exact numerics' promise.
    service = Service(Config(target=TargetSpec(n_ctx=1024, numerics="exact"),
                             db=str(tmp_path / "h.db"), sequences=sequences))
    service.start()
    try:
        t = service.target
        agent1 = [t.bos_token_id] + t.tokenize(AGENT_TEXT)[:400]
        editor = [t.bos_token_id] + t.tokenize(EDITOR_TEXT)[:300]

        def gen(prompt, priority):
            req = GenerationRequest(prompt=prompt, max_tokens=8, proposer="none")
            return service.generate(req, priority).result(120)

        first = gen(agent1, AGENT)
        gen(editor, EDITOR)
        agent2 = agent1 + first.tokens + t.tokenize("\n# next\n")
        second = gen(agent2, AGENT)
        reused = second.ledger["prompt_tokens_reused"]
        if sequences == "1":
            assert reused < 10  # only what the editor prompt shares (BOS, maybe more)
            return
        # The KV held agent1 + the first reply but its last token: only the new line
        # (and that last token) are evaluated.
        assert reused == len(agent1) + len(first.tokens) - 1
        assert second.ledger["prompt_tokens_evaluated"] == len(agent2) - 1 - reused
        st = service.status()["sequences"]
        assert st["n_seq"] == 4 and st["evictions"] == 0
        assert sorted(s["owner"] or "" for s in st["slots"]) == ["", "", "api", "api"]
        fresh = LlamaTarget(t.model_path, n_ctx=1024, numerics="exact")  # (as the service's)
        try:  # the same tokens and next-token logits as a Target that saw nothing else
            assert fresh_greedy(fresh, agent2, 8) == second.tokens
            seq = next(s["seq"] for s in st["slots"] if s["tokens"] > len(agent2))
            context = agent2 + second.tokens

            def next_logits():  # on the engine thread, in the agent's sequence
                t.use_sequence(seq)
                assert t.reuse_prefix(context[:-1]) == len(context) - 1  # still all there
                return t.evaluate(context[-1:], [0])

            fresh.truncate(0)
            fresh.evaluate(context[:-1], [])
            ref = fresh.evaluate(context[-1:], [0])
            assert np.array_equal(service.submit(next_logits, EDITOR, "check").result(60), ref)
        finally:
            fresh.close()
    finally:
        service.close()
