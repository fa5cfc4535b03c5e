"""`assistd serve --backend openai`: the daemon's local API, `assistd status` and the
LSP path in front of a real llama-cpp-python server on loopback; a daemon that starts
while its server is down and serves once it is back."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from assistd.targets.open import default_model_path
from tests.conftest import make_repo
from tests.daemon_helpers import start_daemon, wait_for
from tests.targets.test_remote import (PROMPT, FaultServer, llama_server, reset_cache,  # noqa: F401
                                       server_completion)


@pytest.fixture(scope="module")
def remote_daemon(llama_server, tmp_path_factory):  # noqa: F811 - the imported fixture
    tmp = tmp_path_factory.mktemp("remote-daemon")
    repo = make_repo(tmp / "repo", {"a.py": PROMPT})
    d = start_daemon(tmp, "--backend", "openai", "--target-url", llama_server,
                     "--model", str(default_model_path()), "--repo", str(repo))
    d.repo, d.url = repo, llama_server
    yield d
    assert d.stop() == 0


def test_local_api_answers_what_the_server_answers(remote_daemon):
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
    st = remote_daemon.status()
    remote = st["target"]["remote"]
    assert st["target"]["backend"] == "openai" and remote["reachable"] is True
    assert remote["model"] and remote["latency_ms"] is not None and remote["tokenizer"] == "model"
    assert "remote" in st["target"]["speculation_off"]
    p = subprocess.run([sys.executable, "-m", "assistd", "status"], env=remote_daemon.env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and f"remote Target {remote_daemon.url}: reachable" in p.stdout


async def test_lsp_completion_through_the_daemon(remote_daemon):
    from tests.lsp_helpers import inline, lsp_session, open_doc

    env = {"ASSISTD_SOCKET": str(remote_daemon.socket)}
    async with lsp_session(remote_daemon.db, env=env) as (client, _):
        uri = open_doc(client, remote_daemon.repo / "b.py", PROMPT)
        text = await inline(client, uri, 1, 4)
        assert text  # the editor got the server's suggestion
    assert remote_daemon.status()["requests"]["lsp"] >= 1


def test_the_daemon_starts_while_the_server_is_down_and_serves_once_back(tmp_path):
    fault = FaultServer()  # its port, nothing listening yet
    d = start_daemon(tmp_path, "--backend", "openai", "--target-url", fault.url)
    try:
        st = d.status()["target"]["remote"]
        assert st["reachable"] is False and "does not answer" in st["last_error"]
        with d.uds() as c:
            r = c.post("/v1/completions", json={"model": "remote", "prompt": "x", "max_tokens": 8})
            assert r.status_code == 503 and "does not answer" in r.json()["error"]["message"]
            fault.start()
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
            config.target_timeout_ms) == ("http://127.0.0.1:8080/v1", "m", "/k", 5000)
    assert 'target_url = "http://127.0.0.1:8080/v1"' in config.to_toml()
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
