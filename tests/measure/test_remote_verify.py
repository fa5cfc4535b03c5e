"""benchmarks/remote_verify.py's accept rule on real responses of a llama-cpp-python
server on loopback (the embedded model): how its echoed rows align, what a scoring
request accepts, and one remotely verified generation. The draft tokens asserted on are
the model's confident choices (top-1/top-2 margins of several nats), so batched scoring
and one-at-a-time decoding agree on them."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import remote_verify as rv  # noqa: E402

PROMPT = "one, two, three, four, five, six, seven,"


@pytest.fixture(scope="module")
def vocab():
    return rv.Vocab()


@pytest.fixture
def http(llama_server):  # tests/conftest.py: a real server on loopback
    with httpx.Client(base_url=llama_server, timeout=300) as c:
        yield c


def score(http, vocab, pieces):
    text = PROMPT + "".join(pieces)
    body = rv.complete(http, text, max_tokens=1, echo=True, logprobs=2)
    return rv.read_scoring(body, text, len(vocab.ids(PROMPT)), pieces,
                           rv.rows_predict_next(http))


def test_echoed_rows_are_the_next_tokens_distribution(http):
    """llama-cpp-python's echoed logprob row i is the distribution of token i + 1 (not of token
    i, as OpenAI's and vLLM's)."""
    # llama-cpp-python's row i is the distribution of token i + 1 (OpenAI's and vLLM's:
    # of token i); reading it the OpenAI way would verify every draft one token late.
    assert rv.rows_predict_next(http) is True


def test_the_longest_top1_prefix_is_accepted_then_the_servers_token(http, vocab):
    """Scoring a draft against the server accepts its longest prefix of top-1 tokens, then takes
    the server's token as bonus (' eight', ',' all accepted; ' nine' none, bonus ' eight')."""
    rv.complete(http, rv.RESET, max_tokens=1)
    truth = rv.complete(http, PROMPT, max_tokens=2)["choices"][0]["text"]
    assert truth == " eight,"  # the model's greedy continuation, sequentially decoded

    v = score(http, vocab, [" eight", ","])
    assert (v.accepted, v.aligned) == (2, True) and v.next_piece  # and the bonus token
    v = score(http, vocab, [" eight", " nine", ","])
    assert (v.accepted, v.next_piece) == (1, ",")
    v = score(http, vocab, [" nine"])
    assert (v.accepted, v.next_piece) == (0, " eight")
    assert all(m is None or m >= 0 for m in v.margins)


def test_a_remotely_verified_generation_commits_the_greedy_tokens(http, vocab):
    """A generation verified through the server with a suffix proposer commits the server's
    greedy tokens, with drafts accepted and none misaligned."""
    doc = vocab.ids("zero, one, two, three, four, five, six, seven, eight, nine, ten")
    c = rv.verify(http, vocab, rv.suffix_proposer(doc), PROMPT, 4, 4, True)
    a = rv.stream(http, PROMPT, 4)
    assert c.tokens == 4 and c.pieces[:2] == a.pieces[:2] == [" eight", ","]
    st = c.stats
    assert st["scoring_requests"] >= 1 and st["accepted"] >= 2 and st["misaligned"] == 0
    assert len(st["margins"]) == 4
