"""The daemon end to end: a real `assistd serve` process, the real embedded model, real
HTTP clients (httpx on the Unix socket, the openai package on loopback TCP)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from harness.daemon import start_daemon
from tests.conftest import make_repo, on_remote_target, server_tokenizes

PATTERN = "def f1():\n    return 1\n\ndef f2():\n    return 2\n\ndef f3():\n    return 3\n\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("daemon")
    repo = make_repo(tmp / "repo", {"pattern.py": PATTERN * 4})
    # Exact numerics: the tests compare outputs bit for bit (streamed and not, other
    # drafts, in-process, after a preemption), which is exact numerics' promise.
    d = start_daemon(tmp, "--repo", str(repo), "--numerics", "exact", tcp=True)
    d.repo = repo
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def uds(daemon):
    with daemon.uds() as c:
        yield c


def model_id(uds) -> str:
    return uds.get("/v1/models").json()["data"][0]["id"]


def sse(lines) -> list[dict]:
    """Parse an SSE body: the JSON events, then assert it ended with [DONE]."""
    events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


# -- completions and chat over the Unix socket -------------------------------------------


@pytest.mark.local_target("the model file's name, the ledger's rounds and accepted tokens,"
                          " the proposer and k: local draft verification")
def test_models_health_and_completion_with_ledger(uds, daemon):
    """The daemon's /healthz is ok, /v1/models lists the model file's name, and a completion
    returns OpenAI's shape with usage and an assistd ledger whose counts add up; ngram with k 8
    drafts and gives the same text."""
    assert uds.get("/healthz").json()["status"] == "ok"
    mid = model_id(uds)
    assert mid == "SmolLM2-135M-Instruct.Q4_1"
    r = uds.post("/v1/completions", json={
        "model": mid, "prompt": PATTERN * 4 + "def f4():\n    return", "max_tokens": 12, "temperature": 0,
        "assistd": {"scope": str(daemon.repo), "language": "python"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"].startswith(" 4\n\ndef f5():")
    u = body["usage"]
    assert u["completion_tokens"] == 12 and u["total_tokens"] == u["prompt_tokens"] + 12
    ledger = u["assistd"]["ledger"]
    assert ledger["committed_tokens"] == 12 == ledger["accepted_tokens"] + ledger["rounds"] \
        + ledger["plain_steps"]
    assert u["assistd"]["proposer"] == "suffix" and u["assistd"]["k"] == "auto"
    # Whether suffix drafts depends on the Target's measured forward times (a busy
    # machine makes drafts not pay); ngram with a forced k drafts whenever the context
    # repeats, as this pattern does.
    r = uds.post("/v1/completions", json={
        "model": mid, "prompt": PATTERN * 4 + "def f4():\n    return", "max_tokens": 12,
        "temperature": 0, "assistd": {"proposer": "ngram", "k": 8}})
    ledger = r.json()["usage"]["assistd"]["ledger"]
    assert r.json()["choices"][0]["text"] == body["choices"][0]["text"]
    assert ledger["rounds"] >= 1 and ledger["accepted_tokens"] >= 1


@pytest.mark.exact_numerics
def test_streamed_completion_is_the_same_text(uds):
    """A streamed completion's pieces join to the non-streamed text, which stops before the stop
    string with finish_reason stop. The daemon pins ``--numerics exact``: the two runs batch
    differently."""
    mid = model_id(uds)
    # A continuation the model is sure of (no near-ties: the two runs draft differently).
    req = {"model": mid, "prompt": PATTERN * 4 + "def f4():\n    return", "max_tokens": 40,
           "temperature": 0, "stop": ["def f6"]}
    plain = uds.post("/v1/completions", json=req).json()
    with uds.stream("POST", "/v1/completions", json={**req, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse(list(r.iter_lines()))
    text = "".join(e["choices"][0]["text"] for e in events)
    assert text == plain["choices"][0]["text"] == " 4\n\ndef f5():\n    return 5\n\n"
    assert plain["choices"][0]["finish_reason"] == "stop"  # the stop string is never streamed
    assert events[-1]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert events[-1]["usage"]["assistd"]["ledger"]["committed_tokens"] > 0


def test_chat_uses_the_models_template_and_streams(uds):
    """Chat completions apply the model's chat template (25+ prompt tokens for SmolLM2) and the
    streamed deltas join to the non-streamed message, with usage in a final choice-less
    event."""
    mid = model_id(uds)
    msgs = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    r = uds.post("/v1/chat/completions", json={"model": mid, "messages": msgs,
                                               "max_tokens": 20, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    msg = body["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"].strip()
    # SmolLM2's ChatML template with its default system prompt: 30+ prompt tokens (a
    # remote Target without the model's GGUF has no template: bare ChatML).
    assert body["usage"]["prompt_tokens"] > (10 if on_remote_target() else 25)
    with uds.stream("POST", "/v1/chat/completions",
                    json={"model": mid, "messages": msgs, "max_tokens": 20, "temperature": 0,
                          "stream": True, "stream_options": {"include_usage": True}}) as s:
        events = sse(list(s.iter_lines()))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = "".join(e["choices"][0]["delta"].get("content", "")
                       for e in events if e["choices"])
    assert streamed == msg["content"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 20


# -- loopback TCP: the openai package, and the token ---------------------------------------


def test_openai_client_over_tcp_with_the_token(daemon):
    """The openai client over TCP with the daemon's token lists models, chats with usage and the
    assistd ledger, and streams completions with the proposer it asked for."""
    token = daemon.token_file.read_text().strip()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{daemon.port}/v1", api_key=token)
    mid = client.models.list().data[0].id
    chat = client.chat.completions.create(
        model=mid, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
        temperature=0)
    assert chat.choices[0].message.content
    assert chat.usage.completion_tokens == 8
    assert chat.usage.model_extra["assistd"]["ledger"]["committed_tokens"] == 8
    stream = client.completions.create(model=mid, prompt="import os\n", max_tokens=8,
                                       temperature=0, stream=True,
                                       extra_body={"assistd": {"proposer": "none"}})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage.model_extra["assistd"]["proposer"] == "none"


def test_tcp_refuses_without_the_right_token_and_files_are_private(daemon):
    """Over TCP a missing or wrong token gets 401 (invalid_api_key), and the socket, token and
    log files are mode 600 in a 700 folder."""
    url = f"http://127.0.0.1:{daemon.port}"
    assert httpx.get(f"{url}/v1/models").status_code == 401
    bad = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(f"{url}/v1/completions", json={"model": "assistd", "prompt": "x"})
    assert r.status_code == 401
    assert stat.S_IMODE(daemon.socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(daemon.socket.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(daemon.token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(daemon.log.stat().st_mode) == 0o600
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong").models.list()


# -- bad requests: 4xx with a message, and the daemon keeps serving ---------------------------


@pytest.mark.parametrize("body,status,needle", [
    (b"{not json", 400, "not valid JSON"),
    (b'["a list"]', 400, "JSON object"),
    (json.dumps({"model": "gpt-4", "prompt": "x"}).encode(), 404, "does not exist"),
    (json.dumps({"model": "assistd", "prompt": "x", "max_tokens": -5}).encode(), 400,
     "max_tokens"),
    (json.dumps({"model": "assistd", "prompt": "x", "max_tokens": 10**6}).encode(), 400,
     "max_tokens_limit"),
    (json.dumps({"model": "assistd", "prompt": "word " * 5000}).encode(), 400,
     "context window"),
    (json.dumps({"model": "assistd", "prompt": "x", "n": 3}).encode(), 400, "n > 1"),
    (json.dumps({"model": "assistd", "prompt": "x", "temperature": "hot"}).encode(), 400,
     "temperature"),
    (json.dumps({"model": "assistd", "prompt": [999999]}).encode(), 400, "token ids"),
    (json.dumps({"model": "assistd", "prompt": "x", "assistd": {"proposer": "magic"}}).encode(),
     400, "magic"),
    (json.dumps({"model": "assistd"}).encode(), 400, "prompt"),
    (json.dumps({"model": "assistd", "prompt": "x", "max_tokens": "5"}).encode(), 400,
     "max_tokens"),
    (json.dumps({"model": "assistd", "prompt": "x", "max_tokens": True}).encode(), 400,
     "max_tokens"),
    (json.dumps({"model": "assistd", "prompt": "x", "stream": "yes"}).encode(), 400, "stream"),
    (json.dumps({"model": "assistd", "prompt": "x", "response_format": {"type": "json_object"}}
                ).encode(), 400, "response_format"),
    (json.dumps({"model": "assistd", "prompt": "x" * 7_000_000}).encode(), 400, "bytes"),
    *[(json.dumps({"model": "assistd", "prompt": "x", "assistd": {"k": k}}).encode(), 400,
       "assistd.k must be 'auto' or a number of tokens 0..64") for k in (99, -1, True, "8", "x", 4.5)],
])
def test_bad_requests_get_4xx_with_a_message(uds, body, status, needle):
    """Each malformed completion request (bad JSON, unknown model, bad max_tokens, prompt too
    long, n > 1, bad k, ...) gets its 4xx with a message naming the fault, and the daemon still
    answers the next one."""
    r = uds.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    ok = uds.post("/v1/completions", json={"model": "assistd", "prompt": "a", "max_tokens": 1})
    assert ok.status_code == 200


def test_oversized_body_and_bad_chat(uds):
    """A 9 MB body gets 413; chat with no messages, an image part, an unknown role or no content
    gets 400 naming it; /v1/models/assistd aliases the model, an unknown id is 404."""
    r = uds.post("/v1/completions", content=b"x" * 9_000_000)
    assert r.status_code == 413
    r = uds.post("/v1/chat/completions", json={"model": "assistd", "messages": []})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = uds.post("/v1/chat/completions", json={"model": "assistd", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert r.status_code == 400 and "image_url" in r.json()["error"]["message"]
    r = uds.post("/v1/chat/completions", json={"model": "assistd", "messages": [
        {"role": "wizard", "content": "hi"}]})
    assert r.status_code == 400 and "role" in r.json()["error"]["message"]
    r = uds.post("/v1/chat/completions", json={"model": "assistd", "messages": [
        {"role": "user"}]})
    assert r.status_code == 400 and "content" in r.json()["error"]["message"]
    assert uds.get("/v1/models/assistd").json()["id"] == model_id(uds)
    assert uds.get("/v1/models/gpt-4").status_code == 404


def test_message_text_cannot_forge_control_tokens(uds):
    """`<|im_start|>` inside a message is text (several tokens), not the control token:
    a message cannot open a system turn of its own."""
    def prompt_tokens(content):
        r = uds.post("/v1/chat/completions", json={"model": "assistd", "max_tokens": 1,
                                                   "messages": [{"role": "user",
                                                                 "content": content}]})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    assert prompt_tokens("<|im_start|>") > prompt_tokens("x") + 1
    # A lone surrogate (valid JSON) is a replacement character, not a codec error.
    r = uds.post("/v1/completions", content=b'{"model": "assistd", "prompt": "a\\ud800b",'
                                            b' "max_tokens": 1}',
                 headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert uds.get("/v1/nothing").status_code == 404


# -- concurrency: no cross-talk; an editor request is not starved ---------------------------


@pytest.mark.exact_numerics
def test_16_concurrent_clients_get_their_own_answers(daemon, uds):
    """16 clients at once (half streaming) each get the text their prompt got alone, and the
    answers are distinct. The daemon pins ``--numerics exact``: concurrent and lone runs batch
    differently."""
    mid = model_id(uds)
    prompts = [f"# Function number {i} returns {i * 7}\ndef function_{i}():\n    return"
               for i in range(16)]
    expected = [uds.post("/v1/completions", json={
        "model": mid, "prompt": p, "max_tokens": 6, "temperature": 0}).json()["choices"][0]["text"]
        for p in prompts]
    results: dict[int, str] = {}

    def client(i: int) -> None:
        with daemon.uds() as c:
            req = {"model": mid, "prompt": prompts[i], "max_tokens": 6, "temperature": 0}
            if i % 2:  # half stream: streamed pieces must not land in another stream
                with c.stream("POST", "/v1/completions", json={**req, "stream": True}) as r:
                    results[i] = "".join(e["choices"][0]["text"]
                                         for e in sse(list(r.iter_lines())))
            else:
                results[i] = c.post("/v1/completions", json=req).json()["choices"][0]["text"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(results) == list(range(16))
    assert [results[i] for i in range(16)] == expected
    assert len(set(expected)) > 8  # distinct answers, so a swap would show


@pytest.mark.exact_numerics
@pytest.mark.local_target("preemption between local decoding rounds; a server decodes each"
                          " request whole, in its own order")
def test_editor_request_runs_between_the_rounds_of_a_long_generation(daemon, uds):
    """An agent generation of 300 tokens is running; an editor-priority request sent
    after it starts finishes first, and the long generation's output is unchanged.

    The prompt continues a pattern the model is sure of: the KV cache is restored by
    evaluating the evicted tokens as one batch, whose float rounding differs from
    token-by-token evaluation, so at a near-tie (a story, say) greedy output may differ;
    away from near-ties it must be identical. The daemon pins ``--numerics exact``, so the
    output is asserted equal."""
    mid = model_id(uds)
    long_req = {"model": mid, "prompt": PATTERN * 4 + "def f4():\n    return",
                "max_tokens": 300, "temperature": 0, "assistd": {"proposer": "none"}}
    reference = uds.post("/v1/completions", json=long_req).json()["choices"][0]["text"]
    before = daemon.status()["scheduler"]["preemptions"]
    done: dict[str, float] = {}
    out: dict[str, str] = {}

    def run_long():
        with daemon.uds() as c:
            out["long"] = c.post("/v1/completions", json=long_req).json()["choices"][0]["text"]
        done["long"] = time.monotonic()

    t = threading.Thread(target=run_long)
    t.start()
    while not daemon.status()["jobs_running"]:  # the long generation has started
        time.sleep(0.01)
    time.sleep(0.3)
    r = uds.post("/v1/completions", json={"model": mid, "prompt": "def main():", "max_tokens": 4,
                                          "temperature": 0, "assistd": {"priority": "editor"}})
    done["editor"] = time.monotonic()
    t.join(300)
    assert r.status_code == 200
    assert done["editor"] < done["long"]
    assert daemon.status()["scheduler"]["preemptions"] > before
    # Exactness: the KV cache was restored after the interruption.
    assert out["long"] == reference


# -- the CLI as a client --------------------------------------------------------------------


@pytest.mark.exact_numerics
def test_complete_and_status_use_the_daemon(daemon, tmp_path):
    """`complete` goes through the daemon (its request count rises) and `complete --no-daemon`
    in another process gives the same text; `status` names the exact numerics and their promise;
    `--daemon --n-ctx` is refused with exit 2. Both processes pin ``--numerics exact``:
    cross-process equality is their promise."""
    f = daemon.repo / "pattern.py"
    before = daemon.status()["requests"]["complete"]
    cmd = [sys.executable, "-m", "assistd", "complete", "--file", str(f), "--line", "14",
           "--column", "1", "--max-tokens", "8", "--json"]
    r = subprocess.run(cmd, env=daemon.env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["daemon"] is True and out["tokens"] == 8
    assert out["completion"].strip()
    assert out["history"]["scope"] == str(daemon.repo)
    assert daemon.status()["requests"]["complete"] == before + 1
    # The same completion in-process (its own Target, the daemon's numerics): the same text.
    r = subprocess.run(cmd + ["--no-daemon", "--numerics", "exact"], env=daemon.env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    local = json.loads(r.stdout)
    assert "daemon" not in local and local["completion"] == out["completion"]
    r = subprocess.run([sys.executable, "-m", "assistd", "status", "--json"], env=daemon.env(),
                       capture_output=True, text=True, timeout=60)
    st = json.loads(r.stdout)
    assert r.returncode == 0 and st["running"] is True and st["model"]
    # the numerics it runs and what its speculative output promises (a remote one: none)
    assert (st["target"]["numerics"], st["target"]["promise"]) == (
        ("remote", None) if on_remote_target() else ("exact", "exact"))
    r = subprocess.run([sys.executable, "-m", "assistd", "status"], env=daemon.env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and ("exact numerics (promise: exact)" in r.stdout) is (
        not on_remote_target()), r.stdout
    # where the history is (a newcomer had to find it with `history stats`)
    assert f"history: {daemon.db}" in r.stdout and st["db"] == str(daemon.db), r.stdout
    # the request counts as words, not a Python dict (a newcomer saw "{'api': 0, ...}")
    assert re.search(r"^requests: (\w+ \d+, )+\w+ \d+; tokens generated", r.stdout, re.M), r.stdout
    # a remote Target with the server's tokenizer: no history to watch (nothing drafts);
    # with the served model's (--target vllm) it keeps the history in that token space
    assert st["watcher"]["state"] == ("off" if server_tokenizes() else "watching")
    # --daemon with a Target option is a contradiction, said plainly.
    r = subprocess.run([sys.executable, "-m", "assistd", "complete", "--file", str(f), "--daemon",
                        "--n-ctx", "512"], env=daemon.env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--n-ctx" in r.stderr


def test_a_file_over_the_request_limit_completes_through_the_daemon(daemon, tmp_path):
    """A newcomer's `complete --file big.py` (55 MB) failed with the daemon up ("request
    body of 55582001 bytes is over the limit of 8000000 (max_request_bytes)") and worked
    without it. The CLI sends only the tail of the prompt the daemon reads: the 9.8 MB
    file completes through the daemon, with the in-process text (exact numerics)."""
    big = tmp_path / "big.py"
    big.write_text("# filler line\n" * 700_000 + PATTERN)
    assert big.stat().st_size > 8_000_000
    cmd = [sys.executable, "-m", "assistd", "complete", "--file", str(big), "--max-tokens", "8",
           "--json"]
    r = subprocess.run(cmd, env=daemon.env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["daemon"] is True and out["tokens"] == 8
    r = subprocess.run(cmd + ["--no-daemon", "--numerics", "exact"], env=daemon.env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["completion"] == out["completion"]


def test_status_without_a_daemon(tmp_path):
    """`assistd status` with no daemon on the socket exits 1 saying no daemon answers."""
    env = {**os.environ, "ASSISTD_SOCKET": str(tmp_path / "none.sock")}
    r = subprocess.run([sys.executable, "-m", "assistd", "status"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no daemon answers" in r.stdout


def test_a_second_daemon_on_the_same_socket_is_refused(daemon, tmp_path):
    """A second `serve` on a socket a daemon answers exits 2 ('already answers') and the first
    daemon is untouched."""
    r = subprocess.run([sys.executable, "-m", "assistd", "serve", "--socket", str(daemon.socket),
                        "--db", str(tmp_path / "other.db"), "--no-agent-transcripts",
                        "--log-file", str(tmp_path / "log")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "already answers" in r.stderr
    # and only that: httpx's INFO line of the probe came first (a newcomer's read)
    assert "httpx" not in r.stderr, r.stderr
    assert daemon.status()["model"]  # the first one is untouched


# -- assistd lsp as a client of the daemon -----------------------------------------------------


async def test_lsp_runs_on_the_daemon(daemon, tmp_path, target):
    """`assistd lsp` with a daemon running pipes the editor to the language server the
    daemon hosts: two editors at once, one Target and history, each its own session and
    buffers; a session (and its buffers in the shared index) ends with its connection."""
    from harness.lsp import inline, lsp_session, open_doc, stats

    before = daemon.status()["requests"]["lsp"]
    env = {"ASSISTD_SOCKET": str(daemon.socket)}
    text = PATTERN * 4 + "def f4():\n    return"
    async with lsp_session(daemon.db, env=env) as (a, _), lsp_session(daemon.db, env=env) as (b, _):
        uri_a = open_doc(a, daemon.repo / "new.py", text)
        uri_b = open_doc(b, daemon.repo / "other.py", text)
        assert await inline(a, uri_a, 37, 10) == " 4"  # line mode: up to the end of the line
        assert await inline(b, uri_b, 37, 10) == " 4"
        st = daemon.status()
        assert st["lsp_sessions"] == 2 and st["editors"]["socket"].endswith(".lsp.sock")
        report_a, report_b = await stats(a), await stats(b)
        assert report_a["daemon"] != report_b["daemon"]  # two sessions on one daemon
        assert report_a["daemon"].startswith(st["editors"]["socket"] + "#")
        assert report_a["server"]["generations"] >= 1
        assert report_a["server"]["buffers_indexed"] == report_b["server"]["buffers_indexed"] == 1
        # Both buffers are in the one history index the daemon's requests draft from.
        during = daemon.status()["history_tokens_loaded"]
        owners = {s["owner"] for s in st["sequences"]["slots"]} - {None}
        assert any(o.startswith("lsp:") for o in owners)
    assert daemon.status()["requests"]["lsp"] >= before + 2
    deadline = time.monotonic() + 30
    while daemon.status()["lsp_sessions"] and time.monotonic() < deadline:
        time.sleep(0.1)  # the editors exited: their sessions closed on the daemon
    assert daemon.status()["lsp_sessions"] == 0
    # Their buffers left the shared index (the daemon's tokenizer is the fixture's).
    assert daemon.status()["history_tokens_loaded"] == during - 2 * len(target.tokenize(text))


# -- crash safety: kill -9 while the daemon ingests, then restart --------------------------------


def _documents(db) -> list[tuple[str, str]]:
    import sqlite3

    with sqlite3.connect(db) as c:
        assert c.execute("pragma integrity_check").fetchone()[0] == "ok"
        return c.execute("select scope, path from documents order by scope, path").fetchall()


@pytest.mark.local_target("a remote Target with the server's tokenizer ingests no history"
                          " (nothing drafts against it; its watcher is off)")
def test_kill_9_while_ingesting_then_restart_loses_and_duplicates_nothing(tmp_path):
    """A daemon killed with SIGKILL mid-scan of a 400-file repository, restarted on the same
    database, ends with every file stored once with its tokens; SIGTERM then exits cleanly and
    removes the socket."""
    files = {f"pkg/m{i:03d}.py": f"def f{i}(x):\n    return x * {i}\n" * 40 for i in range(400)}
    repo = make_repo(tmp_path / "repo", files)
    d = start_daemon(tmp_path / "d1", "--repo", str(repo))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill it mid-scan: some files stored, not all
        n = len(_documents(d.db)) if d.db.exists() else 0
        if n >= 20 or d.status()["watcher"]["state"] == "watching":
            break
        time.sleep(0.05)
    d.proc.kill()
    d.proc.wait(30)
    stored = _documents(d.db)
    assert len(stored) < len(files), "the scan finished before the kill: make the repo bigger"
    # Restart on the same database (the dead daemon left its socket file behind).
    d2 = start_daemon(tmp_path / "d1", "--repo", str(repo), db=d.db)
    deadline = time.monotonic() + 300
    while d2.status()["watcher"]["state"] != "watching" and time.monotonic() < deadline:
        time.sleep(0.2)
    rows = _documents(d2.db)
    assert [p for _, p in rows] == sorted(files)  # every file once, nothing duplicated
    assert {s for s, _ in rows} == {str(repo.resolve())}
    import sqlite3

    with sqlite3.connect(d2.db) as c:  # and each has its tokens
        assert c.execute("select count(*) from documents d where not exists (select 1 from"
                         " tokenizations t where t.document_id = d.id)").fetchone()[0] == 0
    assert d2.stop() == 0  # SIGTERM: a clean exit, and the socket is removed
    assert not d2.socket.exists()


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_stops_its_generation(daemon, stream):
    """The generation of a client gone (its timeout, a closed stream) is cancelled
    within a round instead of holding the Target for all its tokens."""
    before = daemon.status()["generations_cancelled"]
    req = {"model": "assistd", "prompt": "Once upon a time", "max_tokens": 2000,
           "temperature": 0, "assistd": {"proposer": "none"}, "stream": stream}
    with daemon.uds(timeout=30.0 if stream else 1.0) as c:
        if stream:
            with c.stream("POST", "/v1/completions", json=req) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        break  # one event, then hang up
        else:
            with pytest.raises(httpx.ReadTimeout):
                c.post("/v1/completions", json=req)
    deadline = time.monotonic() + 120
    while daemon.status()["jobs_running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    st = daemon.status()
    assert st["generations_cancelled"] == before + 1
    assert not st["jobs_running"]


def test_sigterm_during_a_stream_ends_it_cleanly(tmp_path):
    """SIGTERM stops the generation in hand at its next round: the stream gets its final
    chunk and [DONE], the daemon exits 0 and removes its socket."""
    d = start_daemon(tmp_path / "d")
    req = {"model": "assistd", "prompt": "Once upon a time", "max_tokens": 3000,
           "temperature": 0, "stream": True, "assistd": {"proposer": "none"}}
    lines = []
    with d.uds() as c, c.stream("POST", "/v1/completions", json=req) as r:
        for line in r.iter_lines():
            lines.append(line)
            if len(lines) == 3:
                d.proc.send_signal(signal.SIGTERM)
    events = sse(lines)
    assert events[-1]["choices"][0]["finish_reason"] == "cancelled"
    assert 0 < events[-1]["usage"]["completion_tokens"] < 3000
    assert d.proc.wait(60) == 0
    assert not d.socket.exists()
    assert "Traceback" not in (tmp_path / "d" / "daemon.stderr").read_text()


async def test_sigterm_with_an_editor_session_open_ends_it_cleanly(tmp_path):
    """The daemon stops while `assistd lsp` is connected: exit 0 within seconds, the
    session closed on the scheduler before it stopped (no failed session in the log),
    and the editor's server process ends (its connection closed)."""
    from harness.lsp import inline, lsp_session, open_doc

    repo = make_repo(tmp_path / "repo", {"pattern.py": PATTERN * 4})
    d = start_daemon(tmp_path, "--repo", str(repo))
    # The server is gone when the block ends: the helper's own shutdown request then
    # finds the client stopped, which is what this test expects.
    with pytest.raises(RuntimeError, match="Client has been stopped"):
        async with lsp_session(d.db, env={"ASSISTD_SOCKET": str(d.socket)}) as (client, _):
            uri = open_doc(client, repo / "new.py", PATTERN * 4 + "def f4():\n    return")
            assert await inline(client, uri, 37, 10) == " 4"
            t0 = time.monotonic()
            assert d.stop() == 0
            assert time.monotonic() - t0 < 20
            deadline = time.monotonic() + 20
            while client._server.returncode is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert client._server.returncode is not None  # the pipe saw the daemon go
    log = d.log.read_text()
    assert "editor session 1 closed" in log and "failed" not in log
