"""Fuzzing the HTTP API's request handling: arbitrary JSON, raw bytes and mutated valid
bodies sent through a real Starlette TestClient (httpx) to the real app over a real
Service on the embedded model (loaded once for the module; ``max_tokens_limit`` 4 so a
request that does generate stays short).

Property: the answer is 2xx, or 4xx with OpenAI's JSON error body; never 5xx, never a
traceback, and a stream never carries a server error.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from assistd.serving.api import build_app
from assistd.serving.config import Config
from assistd.serving.service import Service
from assistd.targets.spec import TargetSpec
from tests.fuzz.conftest import examples
from tests.fuzz.strategies import JSON, TEXT, mutated

TOKEN = "fuzz-token"
COMPLETION = {"model": "assistd", "prompt": "def add(a, b):", "max_tokens": 2,
              "temperature": 0, "stop": ["\n"], "assistd": {"proposer": "suffix", "k": 2,
                                                            "language": "python",
                                                            "priority": "agent"}}
CHAT = {"model": "assistd", "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": [
                                             {"type": "text", "text": "Say hi"}]}],
        "max_tokens": 2, "stream": False, "stream_options": {"include_usage": True},
        "top_p": 0.9, "seed": 1}
COMPLETE = {"prompt_text": "def add(a, b):", "max_tokens": 2, "proposer": "suffix",
            "k": "auto", "max_prompt_tokens": 64, "stop": ["\n"], "language": "python",
            "sampling": {"temperature": 0}, "client": "mcp"}
# (path, body) of good requests: the templates the mutations start from.
VALID = [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT),
         ("/v1/assistd/complete", COMPLETE),
         ("/v1/completions", {**COMPLETION, "prompt": [1, 2, 3], "stream": True,
                              "stream_options": {"include_usage": True}}),
         ("/v1/chat/completions", {**CHAT, "stream": True, "max_completion_tokens": 1,
                                   "assistd": {"k": "auto", "scope": "no/such/dir"}})]
PATHS = sorted({path for path, _ in VALID})


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api")
    # A relative assistd.scope ("." and the like) must not index the checkout.
    cwd = os.getcwd()
    os.chdir(folder)
    service = Service(Config(target=TargetSpec(n_ctx=512), db=str(folder / "history.db"),
                             max_tokens_limit=4))
    service.start()
    try:
        # The API answers only a loopback Host, and TCP requests need the bearer token.
        with TestClient(build_app(service, TOKEN), raise_server_exceptions=False,
                        base_url="http://127.0.0.1",
                        headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            yield c
    finally:
        service.close()
        os.chdir(cwd)


def check(response) -> None:
    """2xx, or a 4xx whose body is OpenAI's error object; never a server error."""
    assert response.status_code < 500, response.text[:2000]
    if response.status_code >= 400:
        err = response.json()["error"]
        assert isinstance(err["message"], str) and err["type"] != "server_error"
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        assert "server_error" not in response.text and response.text.endswith(
            "data: [DONE]\n\n"), response.text[-2000:]
    else:
        response.json()


# TestClient takes no timeout: a hung request fails the test after this instead.
HANG_S = 120
_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fuzz-api")


def post(client, path: str, body: bytes):
    return _pool.submit(client.post, path, content=body,
                        headers={"Content-Type": "application/json"}).result(HANG_S)


ENDPOINT = st.sampled_from(PATHS)
TEMPLATE = st.sampled_from(VALID)


def test_valid_bodies_are_answered(client):
    """The templates themselves are good requests (else the mutations prove little)."""
    for path, body in VALID:
        r = post(client, path, json.dumps(body).encode())
        assert r.status_code == 200, r.text
        check(r)


@settings(max_examples=examples(0.5))
@given(path=ENDPOINT, body=st.one_of(
    st.binary(max_size=100), JSON.map(lambda v: json.dumps(v).encode()),
    st.text(st.characters(exclude_categories=()), max_size=50).map(
        lambda s: s.encode("utf-8", "surrogatepass"))))
@example(path="/v1/completions", body=b"\xff\xfe")
@example(path="/v1/completions", body=b"[" * 100_000)  # nested past the recursion limit
@example(path="/v1/chat/completions", body=b'{"model": "assistd", "messages": "\\ud800"}')
def test_any_body_is_a_2xx_or_a_4xx(client, path, body):
    """Any body (random bytes, any JSON, invalid UTF-8, 100,000 nested brackets) posted to each
    API route gets a 2xx or a 4xx in OpenAI's error shape, never a server error."""
    check(post(client, path, body))


@settings(max_examples=examples(1.0))
@given(data=st.data(), template=TEMPLATE)
def test_mutated_valid_body_is_a_2xx_or_a_4xx(client, data, template):
    """A valid request body with mutated fields gets a 2xx or a 4xx with OpenAI's error object,
    never a server error."""
    path, good = template
    body = data.draw(mutated(good))
    check(post(client, path, json.dumps(body).encode()))


@settings(max_examples=examples(0.2))
@given(template=TEMPLATE, name=TEXT, value=JSON)
def test_unknown_fields_are_ignored_or_refused(client, template, name, value):
    """A valid body with one unknown field of any name and value is served or refused with a
    4xx, never a server error."""
    path, good = template
    check(post(client, path, json.dumps({**good, name: value}).encode()))


@settings(max_examples=examples(0.2))
@given(model=st.text(st.characters(exclude_categories=("Cs",)), max_size=30))
def test_any_model_id_in_the_path_is_a_2xx_or_a_4xx(client, model):
    """GET /v1/models/ID with any model id answers 2xx or 4xx, never a server error, within the
    hang limit."""
    from urllib.parse import quote

    check(_pool.submit(client.get, "/v1/models/" + quote(model, safe="")).result(HANG_S))


# Paths the OS refuses outright (a name over NAME_MAX, a path over PATH_MAX, a NUL):
# os.stat raises OSError/ValueError for them rather than answering "no such file".
BAD_PATHS = [
    pytest.param("a" * 5000, id="long-name"), pytest.param("/" + "a/" * 3000, id="long-path"),
    pytest.param("x\x00y", id="nul"), pytest.param("\ud800", id="surrogate"),
    # finding 5 in fuzz_findings: '~nosuchuser/...' made Path.expanduser raise
    # RuntimeError in Runtime.resolve_scope: a 500.
    pytest.param("~nosuchuser/x", id="tilde"),
]


@pytest.mark.parametrize("bad", BAD_PATHS)
@pytest.mark.parametrize("path,body", [
    ("/v1/completions", lambda p: {**COMPLETION, "assistd": {"scope": p}}),
    ("/v1/chat/completions", lambda p: {**CHAT, "stream": True, "assistd": {"scope": p}}),
    ("/v1/assistd/complete", lambda p: {**COMPLETE, "repo": p}),
], ids=["completions", "chat-stream", "complete"])
def test_unusable_paths_are_a_4xx(client, path, body, bad):
    """An unusable scope or repository path in completions, a streamed chat or assistd/complete
    gets a 2xx or 4xx, never a server error."""
    check(post(client, path, json.dumps(body(bad)).encode()))
