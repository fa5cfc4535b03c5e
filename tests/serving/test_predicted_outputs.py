"""OpenAI's Predicted Outputs end to end: a real ``assistd serve`` process with the real
embedded model, driven by the real ``openai`` package over loopback TCP (and by httpx for
Continue's apply request): the ``prediction`` field on /v1/chat/completions and
/v1/completions, streamed and not, its usage counts against the ledger, its 400s, and that
it is neither stored nor logged.

The daemon runs ``--numerics exact``: equality of a speculative answer with plain decoding
is exact numerics' promise on llama.cpp's CPU backend; the default ``fast`` promises only the
argmax of the batch each token was verified in (docs/exactness.md, ``LlamaTarget.promise``),
and a prediction changes the batches.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import httpx
import openai
import pytest

from harness.daemon import start_daemon
from tests.conftest import on_remote_target

# Only ever in predictions (never in a prompt or an answer): the leak test looks for it.
MARKER = "QZX-PREDICTION-ONLY-7731"

MESSAGES = [{"role": "user",
             "content": "Write a Python function that returns the square of a number."}]
PROMPT = 'def is_even(n):\n    """Return True when n is even."""\n'
MAX_TOKENS = 48
PLAIN = {"assistd": {"proposer": "none"}}  # plain decoding: the reference answer


# Prompts that repeat themselves: ngram drafts from them whenever asked (it has no cost
# model), after under 128 tokens of context and after more (the cost model's two buckets
# where this module's requests run).
REPEATED = ["def f1():\n    return 1\n\ndef f2():\n    return 2\n\n" * n + "def f3():\n    return"
            for n in (2, 6)]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """One daemon for the module: exact numerics (see the module's docstring), loopback
    TCP with a token file, a debug-level log (the leak test reads all of it), one thread.

    Whether a prediction drafts is the cost model's call: t(n) of the Target, calibrated at
    start and then learned from the forwards it runs. On 2 shared cores a calibration under
    another process's load can price batches at 2-3x what plain steps then measure, and
    nothing that drafts under that model re-measures them. So before the tests the daemon
    runs real draft rounds (ngram with a fixed k on REPEATED), as a daemon in use does:
    the small t(n) are then measured under the load the tests meet."""
    d = start_daemon(tmp_path_factory.mktemp("predicted"), "--numerics", "exact",
                     "--log-level", "debug", tcp=True, env={"ASSISTD_THREADS": "1"})
    with d.uds() as c:
        for prompt in REPEATED:
            for k in (1, 3, 7):
                r = c.post("/v1/completions", json={
                    "model": "assistd", "prompt": prompt, "max_tokens": 40, "temperature": 0,
                    "assistd": {"proposer": "ngram", "k": k}})
                assert r.status_code == 200, r.text
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def client(daemon):
    """The openai package on the daemon's TCP listener, with its bearer token."""
    return openai.OpenAI(base_url=f"http://127.0.0.1:{daemon.port}/v1",
                         api_key=daemon.token_file.read_text().strip(), timeout=300,
                         max_retries=0)


@pytest.fixture(scope="module")
def plain(client):
    """The plain (proposer "none") answers to MESSAGES and PROMPT: ``{"chat": (text,
    finish_reason, completion_tokens), "completion": (...)}``."""
    chat = client.chat.completions.create(model="assistd", messages=MESSAGES,
                                          max_tokens=MAX_TOKENS, temperature=0,
                                          extra_body=PLAIN)
    comp = client.completions.create(model="assistd", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                     temperature=0, extra_body=PLAIN)
    out = {"chat": (chat.choices[0].message.content, chat.choices[0].finish_reason,
                    chat.usage.completion_tokens),
           "completion": (comp.choices[0].text, comp.choices[0].finish_reason,
                          comp.usage.completion_tokens)}
    for text, _, _ in out.values():
        assert text.strip() and MARKER not in text
    return out


def insertion_point(text: str) -> int:
    """Where the ``insert`` case's sentence goes: the first line break past the middle."""
    at = text.find("\n", len(text) // 2)
    return len(text) // 2 if at < 0 else at


def predicted(text: str, case: str) -> str:
    """The prediction of a case: ``same`` (the plain answer), ``insert`` (it with a
    sentence inserted at :func:`insertion_point`), ``unrelated`` (other text)."""
    if case == "same":
        return text
    if case == "insert":
        at = insertion_point(text)
        return text[:at] + f"\nThis sentence was inserted ({MARKER}) and is not in the answer." \
            + text[at:]
    return f"Lorem ipsum dolor sit amet {MARKER}, consectetur adipiscing elit. " * 3


def details(usage) -> tuple[int, int]:
    """``(accepted, rejected)`` prediction tokens of an SDK usage object."""
    d = usage.completion_tokens_details
    return d.accepted_prediction_tokens, d.rejected_prediction_tokens


def check_usage(usage, case: str, n_prediction: int, plain_entry) -> None:
    """What the usage says of a prediction, per case (``usage``: the SDK's object)."""
    _, finish, n_plain = plain_entry
    accepted, rejected = details(usage)
    extra = usage.model_dump()["assistd"]
    ledger = extra["ledger"]
    by_prediction = ledger["by_source"].get("prediction", {"draft_tokens": 0,
                                                             "accepted_tokens": 0})
    # OpenAI's definition, counted from the prediction's side.
    assert accepted + rejected == n_prediction
    assert extra["proposer"] == "prediction"
    assert by_prediction["accepted_tokens"] <= by_prediction["draft_tokens"]
    assert sum(s["accepted_tokens"] for s in ledger["by_source"].values()) \
        == ledger["accepted_tokens"]
    if case == "same":
        # The answer's own text re-tokenized is its tokens (EOS, counted in
        # completion_tokens when it stopped, has no text): the prediction is the
        # completion's prefix, so every one of its tokens appears in it.
        assert n_prediction == n_plain - (finish == "stop")
        assert (accepted, rejected) == (n_prediction, 0)
        assert by_prediction["accepted_tokens"] > 0
    elif case == "insert":
        # The inserted sentence is rejected and the rest of the prediction appears (a token
        # or two at the seams may be cut differently). (Whether its drafts paid is the
        # cost model's call, made on a run of agreeing tokens cut short by the insertion.)
        assert rejected > 0 and accepted >= n_plain - 4
    else:
        # Unrelated text: its drafts fail (a common "." or " the" may match by chance).
        assert by_prediction["accepted_tokens"] <= 3
        assert accepted <= n_prediction // 4


# -- output equality and usage ---------------------------------------------------------


@pytest.mark.exact_numerics
@pytest.mark.parametrize("case", ["same", "insert", "unrelated"])
def test_chat_prediction_leaves_the_answer_plain(client, plain, target, case):
    """A chat completion with ``prediction`` (string content) answers exactly the plain
    answer whatever the prediction: itself, itself with a sentence inserted, or unrelated
    text; its usage has accepted + rejected == the prediction's tokens (counted by the
    model's own tokenizer in this process), all accepted for the answer itself, the
    inserted sentence rejected, few drafts accepted for unrelated text."""
    text = plain["chat"][0]
    prediction = predicted(text, case)
    r = client.chat.completions.create(model="assistd", messages=MESSAGES,
                                       max_tokens=MAX_TOKENS, temperature=0,
                                       prediction={"type": "content", "content": prediction})
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == plain["chat"][1]
    check_usage(r.usage, case, len(target.tokenize(prediction)), plain["chat"])


@pytest.mark.exact_numerics
@pytest.mark.parametrize("case", ["same", "insert", "unrelated"])
def test_completion_prediction_leaves_the_answer_plain(client, plain, target, case):
    """/v1/completions takes ``prediction`` too (``extra_body`` in the openai package):
    the text is the plain completion's in every case, with the same usage accounting as
    chat."""
    text = plain["completion"][0]
    prediction = predicted(text, case)
    r = client.completions.create(model="assistd", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                  temperature=0,
                                  extra_body={"prediction": {"type": "content",
                                                             "content": prediction}})
    assert r.choices[0].text == text
    assert r.choices[0].finish_reason == plain["completion"][1]
    check_usage(r.usage, case, len(target.tokenize(prediction)), plain["completion"])


@pytest.mark.exact_numerics
def test_streamed_chat_with_parts_reports_prediction_usage(client, plain, target):
    """A streamed chat completion whose prediction is a list of text parts (the plain
    answer cut in three, with a marker part the answer lacks): the deltas join to the plain
    answer, and the last chunk (``stream_options.include_usage``: no choices) carries
    ``completion_tokens_details`` whose counts sum to the joined parts' tokens."""
    text = plain["chat"][0]
    a, b = len(text) // 3, 2 * len(text) // 3
    parts = [text[:a], text[a:b], f"\n# {MARKER}\n", text[b:]]
    stream = client.chat.completions.create(
        model="assistd", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
        stream=True, stream_options={"include_usage": True},
        prediction={"type": "content",
                    "content": [{"type": "text", "text": p} for p in parts]})
    chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == text
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    accepted, rejected = details(last.usage)
    assert accepted + rejected == len(target.tokenize("".join(parts)))
    assert rejected > 0 and accepted >= plain["chat"][2] - 4
    assert last.usage.model_dump()["assistd"]["proposer"] == "prediction"


@pytest.mark.exact_numerics
def test_streamed_completion_reports_prediction_usage(client, plain, target):
    """A streamed /v1/completions with the plain answer as prediction: the pieces join to
    the plain text and the final usage chunk accepts every prediction token, its ledger
    showing the accepted drafts came from the prediction."""
    text = plain["completion"][0]
    stream = client.completions.create(
        model="assistd", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True},
        extra_body={"prediction": {"type": "content", "content": text}})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    n = len(target.tokenize(text))
    assert details(last.usage) == (n, 0)
    extra = last.usage.model_dump()["assistd"]
    assert extra["proposer"] == "prediction"
    assert extra["ledger"]["by_source"]["prediction"]["accepted_tokens"] > 0


@pytest.mark.local_target("the proposer that drafted and the ledger row it was recorded under")
@pytest.mark.parametrize("content", ["", []], ids=["empty string", "no parts"])
def test_empty_prediction_names_the_proposer_that_drafted(daemon, client, content):
    """An empty prediction (no text, no parts) has nothing to draft: accepted and rejected
    are 0, no draft comes from it, and ``usage.assistd.proposer`` names the daemon's own
    proposer (suffix, the default), the name its ledger row is recorded under."""
    r = client.chat.completions.create(model="assistd", messages=MESSAGES, max_tokens=8,
                                       temperature=0,
                                       prediction={"type": "content", "content": content})
    assert details(r.usage) == (0, 0)
    extra = r.usage.model_dump()["assistd"]
    assert "prediction" not in extra["ledger"]["by_source"]
    assert extra["proposer"] == "suffix"


# -- refusals ----------------------------------------------------------------------------


BAD_PREDICTIONS = {
    "type text": {"type": "text", "content": f"x {MARKER}"},
    "type other": {"type": "file", "content": f"x {MARKER}"},
    "no type": {"content": f"x {MARKER}"},
    "unknown part type": {"type": "content",
                          "content": [{"type": "image_url",
                                       "image_url": {"url": f"http://x/{MARKER}"}}]},
    "part without text": {"type": "content", "content": [{"type": "text"}]},
    "part text not a string": {"type": "content", "content": [{"type": "text", "text": 7}]},
    "content a number": {"type": "content", "content": 42},
    "content an object": {"type": "content", "content": {"text": MARKER}},
    "not an object": f"{MARKER}",
}


@pytest.mark.parametrize("name", list(BAD_PREDICTIONS))
@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_bad_prediction_is_an_openai_400(client, name, endpoint):
    """A malformed prediction (a type other than "content", a part that is not
    ``{"type": "text", "text": str}``, content neither a string nor a list of parts) is
    refused with a 400 in OpenAI's error shape naming the prediction, on both endpoints."""
    body = {"prediction": BAD_PREDICTIONS[name]}
    with pytest.raises(openai.BadRequestError) as e:
        if endpoint == "chat":
            client.chat.completions.create(model="assistd", messages=MESSAGES, max_tokens=4,
                                           temperature=0, extra_body=body)
        else:
            client.completions.create(model="assistd", prompt=PROMPT, max_tokens=4,
                                      temperature=0, extra_body=body)
    err = e.value
    assert err.status_code == 400
    assert set(err.body) >= {"message", "type", "param", "code"}
    assert err.body["type"] == "invalid_request_error"
    assert err.param is not None and err.param.startswith("prediction"), err.body
    assert MARKER not in err.body["message"]  # the refusal does not echo it back


def test_prediction_longer_than_the_context_window_is_a_400(client):
    """A prediction of more tokens than the context window (4,096 by default) is refused
    with a 400 ``context_length_exceeded`` on ``prediction``: by its token count when it is
    small enough to tokenize, and by its bytes, before tokenizing, when even the longest
    token pieces could not fit it (both bodies under max_request_bytes, 8 MB)."""
    n_ctx = client.models.list().data[0].model_extra["n_ctx"]
    assert n_ctx == 4096 or on_remote_target()
    by_tokens = f" word {MARKER}" * (n_ctx // 3)  # 17 tokens a repeat, 41 KB: tokenized
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="assistd", messages=MESSAGES, max_tokens=4,
                                       temperature=0,
                                       prediction={"type": "content", "content": by_tokens})
    assert e.value.param == "prediction" and e.value.code == "context_length_exceeded"
    assert f"window is {n_ctx} tokens" in e.value.body["message"]
    by_bytes = (MARKER + " ") * 40_000  # 1 MB: over n_ctx times the longest piece
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="assistd", prompt=PROMPT, max_tokens=4, temperature=0,
                                  extra_body={"prediction": {"type": "content",
                                                             "content": by_bytes}})
    assert e.value.param == "prediction" and e.value.code == "context_length_exceeded"
    assert " bytes" in e.value.body["message"]


# -- Continue's apply request -------------------------------------------------------------

# A file and a chat's suggested edit to it (a method to add): the apply rewrites the file.
ORIGINAL = ("class Counter:\n    def __init__(self):\n        self.count = 0\n\n"
            "    def increment(self):\n        self.count += 1\n\n"
            "    def reset(self):\n        self.count = 0\n")
SUGGESTED = "    def decrement(self):\n        self.count -= 1\n"


@pytest.mark.local_target("the prediction drafts only where verification is local")
def test_continue_apply_request_drafts_from_its_prediction(daemon):
    """Continue's apply, as its source builds the request (continuedev/continue,
    PR #3159 "support predicted outputs for other models"):
    ``core/edit/streamDiffLines.ts`` sets ``prediction = {type: "content", content:
    highlighted}`` (the code being rewritten); ``core/llm/templates/edit/gpt.ts``
    (``defaultApplyPrompt``) renders the prompt "<original>\\n\\nThe following code was
    suggested as an edit:\\n```\\n<new>\\n```\\nPlease apply it to the previous code.",
    which ``core/llm/llms/OpenAI.ts`` sends as one user message; its ``_convertArgs``
    builds ``{messages, model, max_tokens, temperature, stream (default true), prediction}``
    (frequency/presence penalties and ``max_completion_tokens`` dropped beside a
    prediction; undefined fields vanish in JSON.stringify). Sent here with httpx, greedy
    and with a small max_tokens: a 200 stream of the rewritten file whose finish chunk has
    usage (Continue sends no stream_options), the prediction drafted and mostly copied."""
    prompt = (f"{ORIGINAL}\n\nThe following code was suggested as an edit:\n```\n"
              f"{SUGGESTED}\n```\nPlease apply it to the previous code.")
    body = {"messages": [{"role": "user", "content": prompt}], "model": "assistd",
            "max_tokens": 64, "temperature": 0, "stream": True,
            "prediction": {"type": "content", "content": ORIGINAL}}
    headers = {"Authorization": f"Bearer {daemon.token_file.read_text().strip()}",
               "Content-Type": "application/json"}
    with httpx.Client(base_url=f"http://127.0.0.1:{daemon.port}", timeout=300) as c:
        with c.stream("POST", "/v1/chat/completions", content=json.dumps(body),
                      headers=headers) as r:
            assert r.status_code == 200
            lines = [x[len("data: "):] for x in r.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(x) for x in lines[:-1]]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert "class Counter:" in text and "def decrement(self):" in text  # the file, edited
    usage = events[-1]["usage"]
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert usage["assistd"]["proposer"] == "prediction"
    drafts = usage["assistd"]["ledger"]["by_source"]["prediction"]
    assert drafts["draft_tokens"] > 0 and drafts["accepted_tokens"] > 0
    d = usage["completion_tokens_details"]
    assert d["accepted_prediction_tokens"] > d["rejected_prediction_tokens"]  # mostly copied


# -- privacy (last: after every other test's predictions) ----------------------------------


def test_prediction_is_never_stored_or_logged(daemon, client):
    """The prediction belongs to its request: after this module's requests (every
    prediction but the plain answers themselves carries MARKER: accepted, streamed,
    refused) and one more of each endpoint here, neither the daemon's log (at debug level)
    nor its history database (the text of every row, and the raw bytes of the file, its
    WAL and its stderr) holds the marker."""
    pred = {"type": "content", "content": f"def square(x):\n    # {MARKER}\n    return x * x\n"}
    client.chat.completions.create(model="assistd", messages=MESSAGES, max_tokens=16,
                                   temperature=0, prediction=pred)
    client.completions.create(model="assistd", prompt=PROMPT, max_tokens=16, temperature=0,
                              extra_body={"prediction": pred})
    status = daemon.status()  # nothing in hand: every generation ran and was recorded
    assert not status["jobs_running"] and not status["jobs_queued"]
    log = daemon.log.read_text(encoding="utf-8", errors="replace")
    assert '"level": "debug"' in log  # the log was written, debug lines and all
    assert MARKER not in log
    with closing(sqlite3.connect(f"file:{daemon.db}?mode=ro", uri=True)) as db:
        tables = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
        for table in tables:
            for row in db.execute(f'select * from "{table}"'):
                for value in row:
                    blob = value if isinstance(value, bytes) else str(value).encode()
                    assert MARKER.encode() not in blob, table
        # the generations were recorded here: their ledger rows, not their predictions (a
        # remote Target's server decodes: nothing is recorded)
        rows = db.execute("select count(*) from ledger where proposer = 'prediction'")
        assert on_remote_target() or rows.fetchone()[0] == 1
    folder = daemon.db.parent
    for path in [daemon.db, *folder.glob(daemon.db.name + "-*"), folder / "daemon.stderr"]:
        if path.exists():
            assert MARKER.encode() not in path.read_bytes(), path
