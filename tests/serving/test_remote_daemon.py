"""`assistd serve --backend openai`: the daemon's local API, `assistd status` and the
LSP path in front of a real llama-cpp-python server on loopback; a daemon that starts
while its server is down and serves once it is back."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import pytest

from assistd.targets.open import default_model_path
from harness.daemon import start_daemon
from tests.conftest import make_repo
from tests.daemon_helpers import wait_for
from tests.remote_helpers import PROMPT, reset_cache, server_completion
from tests.targets.test_remote import FaultServer


@pytest.fixture(scope="module")
def remote_daemon(llama_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("remote-daemon")
    repo = make_repo(tmp / "repo", {"a.py": PROMPT})
    d = start_daemon(tmp, "--backend", "openai", "--target-url", llama_server,
                     "--model", str(default_model_path()), "--repo", str(repo))
    d.repo, d.url = repo, llama_server
    yield d
    assert d.stop() == 0


def test_local_api_answers_what_the_server_answers(remote_daemon):
    """Through a daemon on a remote Target the local API completion, plain and streamed in
    several pieces, is the server's own completion, with a ledger naming the remote Target."""
    expected = server_completion(remote_daemon.url, PROMPT, 16)
    with remote_daemon.uds() as c:
        reset_cache(remote_daemon.url)
        r = c.post("/v1/completions", json={"model": "remote", "prompt": PROMPT, "max_tokens": 16,
                                            "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] == expected
        assert body["usage"]["assistd"]["ledger"]["target"] == "remote"
        reset_cache(remote_daemon.url)
        with c.stream("POST", "/v1/completions", json={"model": "remote", "prompt": PROMPT,
                                                        "max_tokens": 16, "temperature": 0,
                                                        "stream": True}) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        pieces = [e["choices"][0]["text"] for e in events if e.get("choices")]
        assert "".join(pieces) == expected and len([p for p in pieces if p]) > 1


def test_status_shows_the_remote_target(remote_daemon):
    """Status shows the remote Target reachable with model, latency and tokenizer, speculation
    off, and `assistd status` says how many seconds ago it was checked."""
    st = remote_daemon.status()
    remote = st["target"]["remote"]
    assert st["target"]["backend"] == "openai" and remote["reachable"] is True
    assert remote["model"] and remote["latency_ms"] is not None and remote["tokenizer"] == "model"
    assert "remote" in st["target"]["speculation_off"]
    p = subprocess.run([sys.executable, "-m", "assistd", "status"], env=remote_daemon.env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and f"remote Target {remote_daemon.url}: reachable" in p.stdout
    assert re.search(r"\(checked \d+ s ago\)", p.stdout)  # how old "reachable" is


async def test_lsp_completion_through_the_daemon(remote_daemon):
    """An editor through the daemon on a remote Target gets an inline completion and the daemon
    counts the LSP request."""
    from harness.lsp import inline, lsp_session, open_doc

    env = {"ASSISTD_SOCKET": str(remote_daemon.socket)}
    async with lsp_session(remote_daemon.db, env=env) as (client, _):
        uri = open_doc(client, remote_daemon.repo / "b.py", PROMPT)
        text = await inline(client, uri, 1, 4)
        assert text  # the editor got the server's suggestion
    assert remote_daemon.status()["requests"]["lsp"] >= 1


def test_the_daemon_starts_while_the_server_is_down_and_serves_once_back(tmp_path):
    """A daemon started while its remote server is down answers 503 ('does not answer'), lists
    the fallback model id, and serves once the server is up, with no traceback in the log."""
    fault = FaultServer()  # its port, nothing listening yet
    d = start_daemon(tmp_path, "--backend", "openai", "--target-url", fault.url)
    try:
        st = d.status()["target"]["remote"]
        assert st["reachable"] is False and "does not answer" in st["last_error"]
        with d.uds() as c:
            r = c.post("/v1/completions", json={"model": "remote", "prompt": "x", "max_tokens": 8})
            assert r.status_code == 503 and "does not answer" in r.json()["error"]["message"]
            fault.start()
            # no model id came at start: the clear fallback (kept until a restart)
            assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["remote"]
            r = c.post("/v1/completions", json={"model": "remote", "prompt": "x", "max_tokens": 8})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == "Hello, world!"
        assert wait_for(lambda: d.status()["target"]["remote"]["reachable"] is True)
        assert "Traceback" not in d.log.read_text()
    finally:
        assert d.stop() == 0
        if fault.server is not None:
            fault.stop()


def test_complete_through_the_daemon_as_the_mcp_tools_do(remote_daemon):
    """`assistd complete` and the MCP tools reach the daemon at /v1/assistd/complete."""
    expected = server_completion(remote_daemon.url, PROMPT, 12)
    reset_cache(remote_daemon.url)
    with remote_daemon.uds() as c:
        r = c.post("/v1/assistd/complete", json={"prompt_text": PROMPT, "max_tokens": 12,
                                                  "client": "mcp"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["completion"] == expected and out["ledger"]["target"] == "remote"


def test_config_keys_of_the_remote_target(tmp_path):
    """backend openai needs target_url; target_url, target_model, target_timeout_ms and
    ASSISTD_TARGET_KEY_FILE are read and written back by to_toml; a non-http URL is refused."""
    from assistd.ground.errors import InputError
    from assistd.serving.config import load_config

    f = tmp_path / "config.toml"
    f.write_text('backend = "openai"\n')
    with pytest.raises(InputError, match="needs target_url"):
        load_config(f, environ={})
    f.write_text('backend = "openai"\ntarget_url = "http://127.0.0.1:8080/v1"\n'
                 'target_model = "m"\ntarget_timeout_ms = 5000\n')
    config, _ = load_config(f, environ={"ASSISTD_TARGET_KEY_FILE": "/k"})
    assert (config.target_url, config.target_model, config.target_key_file,
            config.target_timeout_ms) == ("http://127.0.0.1:8080", "m", "/k", 5000)  # (/v1 dropped)
    assert 'target_url = "http://127.0.0.1:8080"' in config.to_toml()  # (the base URL)
    f.write_text('backend = "openai"\ntarget_url = "ftp://x"\n')
    with pytest.raises(InputError, match="must be http"):
        load_config(f, environ={})


def test_chat_goes_to_the_server_with_the_models_template(remote_daemon):
    """assistd renders the chat template (the GGUF's) and the server's own chat endpoint
    answers the same: the control tokens reach it spelled out, the first one kept."""
    chat = {"max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}]}
    reset_cache(remote_daemon.url)
    own = httpx.post(f"{remote_daemon.url}/v1/chat/completions", timeout=120, json={
        **chat, "top_k": 0, "min_p": 0, "repeat_penalty": 1.0}).json()
    reset_cache(remote_daemon.url)
    with remote_daemon.uds() as c:
        r = c.post("/v1/chat/completions", json={"model": "remote", **chat})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == own["choices"][0]["message"]["content"]


async def test_mcp_in_process_on_the_remote_target(keyed_llama_server, tmp_path):
    """`assistd mcp --no-daemon --backend openai --target-url ... --target-key-file ...`:
    the tools run on the server's model with its key; the key is in no log. Without
    --target-url the command refuses to start, naming what it needs."""
    from tests.serving.test_mcp import _env, _ok, mcp_session

    key = tmp_path / "key"
    key.write_text("sk-test-3f9d2c\n")
    key.chmod(0o600)
    repo = make_repo(tmp_path / "proj", {"a.py": PROMPT})
    env = _env(tmp_path, tmp_path / "no-daemon.sock", tmp_path / "history.db")
    env.pop("ASSISTD_BACKEND", None), env.pop("ASSISTD_TARGET_URL", None)  # the flags say it
    async with mcp_session(tmp_path, env, "--no-daemon", "-v", "--log-file", str(tmp_path / "mcp.log"),
                           "--backend", "openai",
                           "--target-url", keyed_llama_server, "--target-key-file", str(key)) as s:
        out = _ok(await s.call_tool("complete_code", {"path": str(repo / "a.py"), "line": 2,
                                                       "column": 5, "max_tokens": 12}), tmp_path)
    assert out["completion"] and out["daemon"] is False and out["tokens"] > 0
    log = (tmp_path / "mcp.log").read_text() + (tmp_path / "mcp.stderr").read_text()
    assert f"the remote Target {keyed_llama_server}" in log and "sk-test-3f9d2c" not in log
    p = subprocess.run([sys.executable, "-m", "assistd", "mcp", "--no-daemon", "--backend", "openai"],
                       env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and "--backend openai needs --target-url" in p.stderr
    assert "Traceback" not in p.stderr


def test_token_id_prompts_are_checked_or_refused_never_sent_unchecked(remote_daemon, llama_server,
                                                                      tmp_path, monkeypatch):
    """An id past the vocabulary crashed llama-cpp-python's server (its detokenize) when
    the daemon had no tokenizer to check it against: with the model's GGUF the ids are
    checked, without it a prompt of ids is refused; the server answers on after both."""
    monkeypatch.delenv("ASSISTD_MODEL", raising=False)  # (--target vllm sets one)
    body = {"model": "remote", "prompt": [999999], "max_tokens": 1}
    with remote_daemon.uds() as c:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 400 and "token ids must be in 0..49151" in r.text
    d = start_daemon(tmp_path, "--backend", "openai", "--target-url", llama_server)
    try:
        with d.uds() as c:
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 400 and "needs the server model's tokenizer" in r.text
            r = c.post("/v1/completions", json={**body, "prompt": "x"})
            assert r.status_code == 200, r.text
    finally:
        assert d.stop() == 0
    assert httpx.get(f"{llama_server}/v1/models", timeout=10).status_code == 200


def test_a_truncated_tokenizer_gguf_is_one_line_exit_2(llama_server, tmp_path):
    """llama.cpp's own error lines (printed by llama-cpp-python's log callback) stayed on
    stderr before assistd's: now the user reads one line naming the file."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(default_model_path().read_bytes()[: 2_000_000])
    src = tmp_path / "a.py"
    src.write_text(PROMPT)
    p = subprocess.run([sys.executable, "-m", "assistd", "complete", "--file", str(src),
                        "--backend", "openai", "--target-url", llama_server, "--model", str(cut),
                        "--no-daemon"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ASSISTD_DB": str(tmp_path / "h.db")})
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "failed to load model" in lines[0] and str(cut) in lines[0]


def test_an_unknown_proposer_is_refused_on_the_remote_target_too(remote_daemon):
    """The remote plan ignores the proposer asked for, but a name nothing knows is still
    the caller's error (it was answered 200 on /v1/assistd/complete)."""
    with remote_daemon.uds() as c:
        r = c.post("/v1/assistd/complete", json={"prompt_text": PROMPT, "max_tokens": 2,
                                                  "proposer": "magic"})
        assert r.status_code == 400 and "magic" in r.text
        r = c.post("/v1/assistd/complete", json={"prompt_text": PROMPT, "max_tokens": 2,
                                                  "proposer": "ngram"})
        assert r.status_code == 200, r.text


# -- a newcomer's rough edges (issue 25) -------------------------------------------------


def _log_messages(d) -> list[str]:
    return [json.loads(line)["msg"] for line in d.log.read_text().splitlines() if line.strip()]


def test_the_daemon_names_the_remote_target_and_lists_the_servers_model(remote_daemon):
    """The log said "loading the Target (embedded default)", /v1/models listed "remote"
    and the API's usage said k "auto" for a remote Target: now the log names the server
    and the tokenizer, /v1/models the server's own model id (a request may name it, or
    "remote" as before), and k is 0 as `complete --json` says (nothing drafts); usage
    counts what the ledger counts."""
    msgs = _log_messages(remote_daemon)
    assert (f"loading the Target (remote: {remote_daemon.url}, model the server's first,"
            f" tokenizer {default_model_path()})") in msgs
    assert not any("embedded default" in m for m in msgs)
    own = httpx.get(f"{remote_daemon.url}/v1/models", timeout=30).json()["data"][0]["id"]
    with remote_daemon.uds() as c:
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == [own]
        for name in (own, "remote"):
            r = c.post("/v1/completions", json={"model": name, "prompt": PROMPT,
                                                "max_tokens": 3, "temperature": 0})
            assert r.status_code == 200, r.text
            body = r.json()
            usage, led = body["usage"], body["usage"]["assistd"]["ledger"]
            assert body["model"] == own and usage["assistd"]["k"] == 0
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
                led["prompt_tokens"], led["committed_tokens"])
        r = c.post("/v1/completions", json={"model": "other", "prompt": "x"})
        assert r.status_code == 404 and own in r.json()["error"]["message"]
        out = c.post("/v1/assistd/complete", json={"prompt_text": PROMPT, "max_tokens": 2}).json()
    assert out["k"] == 0 and out["proposer"] == "remote"


def test_complete_prints_the_remote_stats_line_through_the_daemon_too(remote_daemon, tmp_path):
    """`assistd complete` through the daemon printed the local ledger's line (rounds,
    acceptance_rate=n/a...) for a remote Target; `--no-daemon` printed `target=remote`:
    now both print the same line, the daemon's with `daemon=yes`."""
    import re

    cmd = [sys.executable, "-m", "assistd", "complete", "--file", str(remote_daemon.repo / "a.py"),
           "--max-tokens", "4"]
    lines = []
    for extra, env in (([], remote_daemon.env()),
                       (["--no-daemon", "--backend", "openai", "--target-url", remote_daemon.url,
                         "--model", str(default_model_path())],
                        {**remote_daemon.env(), "ASSISTD_DB": str(tmp_path / "h.db")})):
        reset_cache(remote_daemon.url)
        p = subprocess.run(cmd + extra, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        lines.append(p.stderr.strip().splitlines()[-1])
    via, own = lines
    assert via.startswith("target=remote ") and via.endswith(" daemon=yes"), via
    assert own.startswith("target=remote ") and "daemon=yes" not in own, own
    assert "speculation=off (remote Target" in via and "speculation=off (remote Target" in own

    def counts(line):  # the server's figures, not the times
        return re.findall(r"\b(tokens|prompt|stop)=(\S+)", line)

    assert counts(via) == counts(own) and "rounds=" not in via


def test_character_mode_usage_and_the_watcher_off_reason(tmp_path, monkeypatch):
    """A server without a tokenize endpoint and no --model: prompt ids are characters
    here. The API's usage counted those characters and 0 completion tokens while the
    ledger said 5 and 4: now usage gives the ledger's counts (the server sent no usage
    of its own). The watcher is off by choice there: its reason is `off_reason`, and
    `error` stays for failures. The server is the stand-in FaultServer: llama-cpp-python's
    has a tokenize endpoint, so it cannot show character mode."""
    monkeypatch.delenv("ASSISTD_MODEL", raising=False)  # (--target vllm sets one)
    fault = FaultServer().start()
    fault.finish = "stop"  # not at the limit: then the count is the chunks'
    d = start_daemon(tmp_path, "--backend", "openai", "--target-url", fault.url)
    try:
        prompt = "def f(x):\n    return"  # 20 characters: 5 tokens at 4 a token
        with d.uds() as c:
            assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["fake-model"]
            r = c.post("/v1/completions", json={"model": "fake-model", "prompt": prompt,
                                                "max_tokens": 8})
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            led = usage["assistd"]["ledger"]
            assert led["server_usage"] is None and led["tokens_from"] == "streamed chunks"
            assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
                led["prompt_tokens"], led["committed_tokens"], 9) == (5, 4, 9)
            with c.stream("POST", "/v1/completions", json={
                    "model": "remote", "prompt": prompt, "max_tokens": 8, "stream": True,
                    "stream_options": {"include_usage": True}}) as s:
                events = [json.loads(line[6:]) for line in s.iter_lines()
                          if line.startswith("data: ") and line != "data: [DONE]"]
            last = events[-1]["usage"]
            assert (last["prompt_tokens"], last["completion_tokens"]) == (5, 4)
        w = d.status()["watcher"]
        assert w["state"] == "off" and w["error"] is None and "--model" in w["off_reason"]
        p = subprocess.run([sys.executable, "-m", "assistd", "status"], env=d.env(),
                           capture_output=True, text=True, timeout=60)
        line = next(x for x in p.stdout.splitlines() if x.startswith("watcher:"))
        assert "off" in line and "--model" in line and "error" not in line, line
    finally:
        assert d.stop() == 0
        fault.stop()


async def test_the_mcp_tools_describe_the_daemons_remote_target(remote_daemon, tmp_path):
    """The MCP instructions and tool descriptions said "small local model" while the
    daemon they used served a remote Target: an MCP server that finds the daemon at
    start describes the daemon's Target."""
    from tests.serving.test_mcp import _env, mcp_session

    env = _env(tmp_path, remote_daemon.socket, remote_daemon.db)
    env.pop("ASSISTD_BACKEND", None), env.pop("ASSISTD_TARGET_URL", None)  # the daemon's
    async with mcp_session(tmp_path, env) as s:
        tools = {t.name: t.description for t in (await s.list_tools()).tools}
        texts = [s.instructions, tools["complete_code"], tools["continue_text"]]
    for text in texts:
        assert f"remote server {remote_daemon.url}" in text and "local model" not in text
    assert "drafts from the history" not in tools["complete_code"]
