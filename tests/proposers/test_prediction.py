"""The prediction proposer (OpenAI's Predicted Outputs): place keeping, re-finding after a
divergence, the cost cut against the inner proposer, OpenAI's usage counts, and on the
real model: output equal to plain decoding, drafts from the prediction accepted."""

import numpy as np
import pytest

from assistd.decoding.engine import generate
from assistd.ground.costmodel import CostModel
from proposers.prediction import START_RUN, PredictionProposer, prediction_usage
from proposers.suffix import SuffixProposer

PROMPT = [900, 901, 902]  # token ids before the output (the proposer never reads them)


def step(p: PredictionProposer, output: list[int], k: int = 8):
    """The proposer's draft after ``output`` (the prompt before it), as a list (or None)."""
    d = p.propose(np.array(PROMPT + output), k)
    return None if d is None else d.tokens.tolist()


def test_drafts_the_prediction_from_its_start_and_follows_agreeing_output():
    """Before any output the draft is the prediction's first k tokens; each agreeing
    output token moves the place on by one."""
    p = PredictionProposer(list(range(10, 40)), start=len(PROMPT))
    assert step(p, [], k=4) == [10, 11, 12, 13]
    assert step(p, [10, 11, 12], k=4) == [13, 14, 15, 16]
    assert p.pos == 3 and p.run == START_RUN + 3 and p.losses == 0


def test_an_insertion_loses_the_place_and_matching_the_output_tail_finds_it_again():
    """Output inserts tokens the prediction lacks (new code): the place is lost (no draft
    while the tail matches nothing), then the output returns to the prediction's text and
    three matching tokens find the place again, after the match."""
    pred = list(range(10, 40))
    p = PredictionProposer(pred, start=len(PROMPT))
    out = [10, 11, 12, 500, 501]  # 13.. replaced by new tokens
    assert step(p, out) is None and p.pos is None and p.losses == 1
    out += [13, 14]  # two tokens of the prediction again: under MIN_MATCH (3)
    assert step(p, out) is None
    out += [15]
    assert step(p, out, k=3) == [16, 17, 18]
    assert p.refinds == 1 and p.run == 3


def test_a_deletion_resumes_further_on_and_the_nearest_forward_occurrence_wins():
    """Output skips a stretch (deleted code) and resumes on a line that occurs twice in
    the prediction, once before where the place was lost and once after: the occurrence
    after it is taken, though both match as well."""
    line = [7, 8, 9]
    pred = [1, 2] + line + [3, 4, 5, 6, 20, 21, 22, 23] + line + [30, 31]
    p = PredictionProposer(pred, start=len(PROMPT))
    out = [1, 2] + line + [3]  # place at index 6 (token 4)
    assert step(p, out, k=1) == [4]
    out += line  # 4 5 6 20..23 deleted; the line again
    assert step(p, out, k=2) == [30, 31]
    assert p.pos == len(pred) - 2


def test_a_sure_match_far_behind_beats_a_short_one_ahead():
    """A long match (SURE_MATCH tokens or more) wins over a 3-token one that is nearer
    and forward: a short match in code is often a coincidence ("):\\n    ")."""
    block = list(range(50, 60))  # 10 tokens
    pred = block + [70, 71] + [100, 101] + block[-3:] + [80, 81]
    p = PredictionProposer(pred, start=len(PROMPT))
    p.pos, p.lost_at = None, 14  # lost near the end, after the short occurrence's start
    out = [5] + block  # the whole block again
    assert step(p, out, k=2) == [70, 71]


def test_without_a_cost_model_the_prediction_wins_and_the_inner_proposer_fills_gaps():
    """Without a cost model the prediction's draft is taken whenever there is one; when
    its place is lost the inner proposer (suffix over the live context) drafts."""
    inner = SuffixProposer(None)
    p = PredictionProposer([10, 11, 12, 13], start=len(PROMPT), inner=inner)
    d = p.propose(np.array(PROMPT + [10]), 4)
    assert d.source == "prediction" and d.tokens.tolist() == [11, 12, 13]
    # Lost (the output went elsewhere), and the context repeats itself: suffix drafts.
    ctx = np.array(PROMPT + [10, 40, 41, 42, 43, 40, 41])
    d = p.propose(ctx, 4)
    assert d.source == "context" and d.tokens.tolist()[:2] == [42, 43]


def test_the_cost_model_cuts_the_draft_and_refuses_one_that_does_not_pay():
    """Under a steep cost (each drafted token as dear as a plain step) a draft never
    pays; under the reference CPU costs a draft after a long agreeing run is long, and
    the first tokens of a request (START_RUN credited) make a shorter one."""
    steep = CostModel({1: 10.0, 2: 20.0, 64: 640.0})
    p = PredictionProposer(list(range(100)), start=len(PROMPT), cost=steep)
    assert step(p, [], k=8) is None
    cpu = CostModel.brief()
    p = PredictionProposer(list(range(10, 200)), start=len(PROMPT), cost=cpu)
    first = step(p, [], k=64)
    later = step(p, list(range(10, 90)), k=64)
    assert first and later and len(later) > len(first)
    assert later[0] == 90


def test_the_prediction_exhausted_drafts_nothing_and_past_its_end_re_finds_nothing_new():
    """At the end of the prediction there is nothing to draft; output past it loses the
    place without an error."""
    p = PredictionProposer([10, 11, 12], start=len(PROMPT))
    assert step(p, [10, 11, 12]) is None
    assert step(p, [10, 11, 12, 99]) is None and p.pos is None


def test_invalid_settings_are_refused():
    """Out-of-range settings are a ValueError, not a silent default."""
    with pytest.raises(ValueError):
        PredictionProposer([1], start=-1)
    with pytest.raises(ValueError):
        PredictionProposer([1], start=0, min_match=5, sure_match=4)
    with pytest.raises(ValueError):
        PredictionProposer([1], start=0, fail_floor=1.0)


def test_usage_counts_follow_openais_definition():
    """accepted = prediction tokens found (in order) in the completion, rejected = the
    rest of the prediction: they always sum to the prediction's length."""
    assert prediction_usage([1, 2, 3], [1, 2, 3]) == (3, 0)
    assert prediction_usage([1, 2, 3, 4], [9, 9]) == (0, 4)
    assert prediction_usage([1, 2, 3, 4, 5, 6], [1, 2, 7, 7, 7, 5, 6]) == (4, 2)
    assert prediction_usage([], [1]) == (0, 0)


@pytest.mark.exact_numerics
def test_on_the_real_model_output_equals_plain_and_an_edited_prediction_is_followed(target):
    """SmolLM2-135M, greedy: the plain output of a code prompt; a prediction that is that
    output with words inserted in the middle (the output will not have them).
    Speculative output equals plain decoding (exact numerics: batched and one-token
    logits are equal), most output tokens come from accepted prediction drafts, the
    place is lost at the insertion and found again after it."""
    prompt = target.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    plain = generate(target, prompt, None, max_tokens=48, k=0)
    half = len(plain.tokens) // 2
    pred = (plain.tokens[:half] + target.tokenize(" zebra quantum marmalade")
            + plain.tokens[half:])
    prop = PredictionProposer(pred, start=len(prompt))
    spec = generate(target, prompt, prop, max_tokens=48, k=16)
    assert spec.tokens == plain.tokens
    by = spec.ledger.by_source["prediction"]
    assert by[1] >= len(plain.tokens) // 2, (by, len(plain.tokens))
    assert prop.losses >= 1 and prop.refinds >= 1


def test_trust_grows_with_the_agreeing_run_and_falls_with_misses():
    """A draft's estimates: higher after a long agreeing run than after a place just
    re-found, non-increasing along the draft's cumulative product, and lower once the
    place has been lost more often (misses since the last sure run)."""
    pred = list(range(10, 200))
    p = PredictionProposer(pred, start=len(PROMPT))
    long_run = p.propose(np.array(PROMPT + pred[:60]), 4).probs
    q = PredictionProposer(pred, start=len(PROMPT))
    q.propose(np.array(PROMPT + pred[:5] + [999] + pred[6:9]), 4)  # lost, re-found on 3
    fresh = q._from_prediction(4).probs
    assert q.refinds == 1 and q.misses == 1
    assert (long_run > fresh).all()
    r = PredictionProposer(pred, start=len(PROMPT), start_run=3)
    r.propose(np.array(PROMPT), 4)
    assert (r._from_prediction(4).probs > fresh).all()  # same run, no miss: trusted more
