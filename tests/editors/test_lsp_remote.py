"""`assistd lsp` in its own process (no daemon) on the remote Target: the settings
(``backend``, ``targetUrl``, ``targetKeyFile``, ...) or the ``ASSISTD_*`` environment
name a real llama-cpp-python server on loopback, here one that wants an API key."""

from __future__ import annotations


import pytest
from lsprotocol import types

from editors.settings import Settings, environment_settings, parse_settings
from harness.lsp import inline, lsp_session, open_doc, stats
from tests.conftest import make_repo
from tests.lsp_helpers import until
from tests.remote_helpers import PROMPT

KEY = "sk-test-3f9d2c"  # the keyed server's: it must reach the server, never a log


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo", {"a.py": PROMPT})


def key_file(tmp_path, key=KEY, mode=0o600):
    f = tmp_path / f"key-{key}-{mode:o}"
    f.write_text(key + "\n")
    f.chmod(mode)
    return f


def test_remote_settings_are_checked_and_need_a_url():
    """Remote settings (backend openai, targetUrl without a trailing slash, targetModel,
    targetTimeoutMs) are read and change the engine key; openai without a URL, a non-http URL or
    a bad timeout fall back to llama or the default with a warning each, in settings and in the
    environment alike."""
    s, w = parse_settings({"assistd": {"backend": "openai", "targetUrl": "http://127.0.0.1:8080/v1/",
                                       "targetModel": "m", "targetTimeoutMs": 5000}})
    t = s.target
    assert w == [] and (t.backend, t.target_url, t.target_model) == ("openai", "http://127.0.0.1:8080", "m")
    assert t.target_timeout_ms == 5000
    assert s.engine_key() != Settings().engine_key()  # a new server reopens the Target
    s, w = parse_settings({"backend": "openai"})  # a local model would answer in its place
    assert s.target.backend == "llama" and len(w) == 1 and "needs targetUrl" in w[0]
    s, w = parse_settings({"backend": "openai", "targetUrl": "ftp://x", "targetTimeoutMs": 0})
    assert s.target.backend == "llama" and s.target.target_url is None and len(w) == 3
    assert "http(s)://" in w[0] and "targetTimeoutMs" in w[1]
    s, w = environment_settings({"ASSISTD_BACKEND": "openai", "ASSISTD_TARGET_URL": "http://h:1",
                                 "ASSISTD_TARGET_TIMEOUT_MS": "x", "ASSISTD_MODEL": "/m.gguf"})
    t = s.target  # the model too: the in-process server opens the daemon's Target
    assert (t.backend, t.target_url, t.target_timeout_ms, t.model) == (
        "openai", "http://h:1", 30_000, "/m.gguf")
    assert w == ["$ASSISTD_TARGET_TIMEOUT_MS: target_timeout_ms must be an integer, not 'x';"
                 " using 30000"]
    assert environment_settings({"ASSISTD_BACKEND": "openai"})[1] == [
        "$ASSISTD_BACKEND: backend openai needs target_url (the server's base URL,"
        " e.g. http://127.0.0.1:8080); using 'llama'"]
    assert environment_settings({})[0] == Settings()


async def test_lsp_in_process_on_the_remote_target_from_its_settings(keyed_llama_server, repo,
                                                                      tmp_path):
    """The settings name the server and the key file; a wrong key is the editor's error,
    answered, and the right one (didChangeConfiguration) reopens the Target and serves;
    the key is in no log, even at debug."""
    log = tmp_path / "lsp.log"
    wrong = {"backend": "openai", "targetUrl": keyed_llama_server + "/v1",
             "targetKeyFile": str(key_file(tmp_path, "sk-wrong"))}
    from harness import lsp as lsp_harness

    lsp_harness.LSP_ARGS[:] = ["--log-file", str(log), "-v"]
    try:
        async with lsp_session(tmp_path / "h.db", root=repo, settings=wrong) as (client, _):
            uri = open_doc(client, repo / "b.py", PROMPT)
            assert await inline(client, uri, 1, 4) is None  # answered, empty
            await until(lambda: any(m.type == types.MessageType.Error for m in client.messages))
            errors = [m.message for m in client.messages if m.type == types.MessageType.Error]
            assert any("401" in e or "key" in e.lower() for e in errors), errors
            client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
                settings={"assistd": {**wrong, "targetKeyFile": str(key_file(tmp_path))}}))
            text = None
            for _ in range(3):  # the reopening is queued before this request on one thread
                text = await inline(client, uri, 1, 4)
                if text:
                    break
            assert text, client.messages
            report = await stats(client)  # no acceptance rows: the server decoded
            assert report["ledger"]["entries"] == []
    finally:
        lsp_harness.LSP_ARGS[:] = []
    assert "loading the model of the remote Target http://127.0.0.1:" in log.read_text()
    assert KEY not in log.read_text() and KEY not in (tmp_path / "h.db").read_bytes().decode("latin-1")


async def test_lsp_in_process_on_the_remote_target_from_the_environment(llama_server, repo, tmp_path):
    """ASSISTD_BACKEND and ASSISTD_TARGET_URL, as `assistd serve` reads them, serve an
    `assistd lsp` with no Target settings."""
    from harness import lsp as lsp_harness

    log = tmp_path / "lsp.log"
    env = {"ASSISTD_BACKEND": "openai", "ASSISTD_TARGET_URL": llama_server}
    lsp_harness.LSP_ARGS[:] = ["--log-file", str(log)]
    try:
        async with lsp_session(tmp_path / "h.db", root=repo, env=env) as (client, _):
            uri = open_doc(client, repo / "b.py", PROMPT)
            assert await inline(client, uri, 1, 4)
    finally:
        lsp_harness.LSP_ARGS[:] = []
    assert f"loading the model of the remote Target {llama_server}" in log.read_text()


def test_target_context_is_read_from_the_environment_like_the_other_target_keys():
    """`ASSISTD_TARGET_CONTEXT` was the one remote Target key an in-process `assistd lsp`
    did not read from the environment `assistd serve` reads."""
    base = {"ASSISTD_BACKEND": "openai", "ASSISTD_TARGET_URL": "http://127.0.0.1:8080"}
    s, w = environment_settings({**base, "ASSISTD_TARGET_CONTEXT": "file"})
    assert w == [] and s.target.target_context == "file"
    s, w = environment_settings({**base, "ASSISTD_TARGET_CONTEXT": "nothing"})
    assert s.target.target_context == "all" and len(w) == 1 and "$ASSISTD_TARGET_CONTEXT" in w[0]
    s, w = parse_settings({"targetContext": "all"}, environment_settings(
        {**base, "ASSISTD_TARGET_CONTEXT": "file"})[0])
    assert s.target.target_context == "all"  # an editor's own setting still goes over it
