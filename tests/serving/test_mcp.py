"""`assistd mcp`: an MCP client (the official SDK) drives the real server over stdio.

Real processes and the real embedded Target, no mocks: one MCP server process per
test (in-process Target), and one real daemon in the daemon test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from assistd.serving.client import find_daemon
from tests.conftest import make_repo, on_remote_target

TOOLS = {"complete_code", "continue_text", "acceptance_stats", "apply_edit"}
CALL_TIMEOUT_S = 180  # a first completion loads the Target and calibrates its cost model
TEST_TIMEOUT_S = 420

# A file whose last function repeats an earlier one: the history drafts the copy.
APP_PY = '''\
def load_users(path):
    """Read users from a CSV file."""
    with open(path) as f:
        rows = [line.strip().split(",") for line in f]
    return [{"name": r[0], "email": r[1]} for r in rows if r]


def load_groups(path):
    """Read groups from a CSV file."""
    with open(path) as f:
'''


def _env(tmp_path: Path, socket: Path, db: Path) -> dict[str, str]:
    """The test's own history, socket and config: never the user's."""
    env = {k: v for k, v in os.environ.items() if k != "ASSISTD_CONFIG"}
    env.update(ASSISTD_DB=str(db), ASSISTD_SOCKET=str(socket),
               XDG_CONFIG_HOME=str(tmp_path / "config-home"))
    return env


@asynccontextmanager
async def mcp_session(tmp_path: Path, env: dict[str, str], *args: str):
    """``assistd mcp ARGS`` as a subprocess, and an initialized client session on it."""
    errlog = open(tmp_path / "mcp.stderr", "a")  # noqa: SIM115 - closed below
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "assistd", "mcp", *args], env=env,
                                   cwd=str(tmp_path))
    try:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write,
                                     read_timeout_seconds=CALL_TIMEOUT_S) as session:
                await session.initialize()
                yield session
    finally:
        errlog.close()


def _text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def _ok(result, tmp_path: Path) -> dict:
    """The structured result of a successful call (fails with the server's stderr)."""
    assert not result.is_error, (_text(result), (tmp_path / "mcp.stderr").read_text()[-3000:])
    assert json.loads(_text(result)) == result.structured_content  # the text is the same JSON
    return result.structured_content


@pytest.mark.local_target("the proposer, the history's tokens and the tuner's statistics of"
                          " local drafting (tests/serving/test_remote_daemon.py runs the tools"
                          " in-process on the remote Target)")
async def test_mcp_tools_in_process(tmp_path):
    """Without a daemon: list the four tools, continue a text, complete at a cursor of a
    file in a git repository (drafting from its history), read the tuner's statistics of
    both, and get tool errors (not a dead server) for a missing file, a line past the end
    and a bad argument."""
    repo = make_repo(tmp_path / "proj", {"app.py": APP_PY})
    db = tmp_path / "history.db"
    env = _env(tmp_path, tmp_path / "no-daemon.sock", db)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with mcp_session(tmp_path, env) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == TOOLS
            for t in tools.values():
                assert t.description and len(t.description) > 80, t.name
            assert {"path", "line", "column", "max_tokens"} <= set(
                tools["complete_code"].input_schema["properties"])
            assert tools["complete_code"].input_schema["required"] == ["path", "line"]
            assert "acceptance_rate" in tools["continue_text"].output_schema["properties"]

            out = _ok(await s.call_tool("continue_text", {
                "text": "def add(a, b):\n    return", "max_tokens": 16}), tmp_path)
            assert out["completion"].strip() and out["tokens"] > 0
            assert out["daemon"] is False
            assert out["language"] == "plaintext" and out["proposer"] == "suffix"
            assert out["tokens_per_s"] > 0 and out["total_ms"] > 0
            assert out["history_scope"] is None  # no repo given: drafts from the text only

            n_lines = APP_PY.count("\n") + 1  # the empty line after the final newline
            out = _ok(await s.call_tool("complete_code", {
                "path": str(repo / "app.py"), "line": n_lines, "column": 1,
                "max_tokens": 24, "stop": ["\n\n\n"]}), tmp_path)
            assert out["completion"] and out["tokens"] > 0 and out["daemon"] is False
            assert out["language"] == "python"
            assert out["history_scope"] == str(repo) and out["history_tokens"] > 0
            assert out["rounds"] + out["tokens"] > 0
            if out["rounds"]:  # a draft existed: the rates are defined and in range
                assert 0 <= out["acceptance_rate"] <= 1 and out["mean_acceptance_length"] >= 1

            # Errors come back as tool errors naming what is wrong; the server stays up.
            missing = tmp_path / "nope.py"
            r = await s.call_tool("complete_code", {"path": str(missing), "line": 1})
            assert r.is_error and str(missing) in _text(r) and "not found" in _text(r)
            r = await s.call_tool("complete_code", {"path": str(repo / "app.py"), "line": 99})
            assert r.is_error and "past the end" in _text(r) and "app.py" in _text(r)
            r = await s.call_tool("complete_code", {"path": str(repo), "line": 1})
            assert r.is_error and "not a file" in _text(r)
            r = await s.call_tool("continue_text", {"text": "x", "max_tokens": 0})
            assert r.is_error and "max_tokens" in _text(r)

            stats = _ok(await s.call_tool("acceptance_stats", {}), tmp_path)
            assert stats["daemon"] is False and stats["db"] == str(db)
            by_lang = {e["language"]: e for e in stats["entries"]}
            assert {"python", "plaintext"} <= set(by_lang)
            for e in by_lang.values():
                assert e["steps"] > 0 and "speedup_by_k" not in e  # compact by default
            assert stats["scope_count"] >= 1 and str(repo) not in json.dumps(stats)
            assert isinstance(stats["user_acceptance"], dict)

            scoped = _ok(await s.call_tool("acceptance_stats", {
                "scope": str(repo), "full": True}), tmp_path)
            assert {e["language"] for e in scoped["entries"]} == {"python"}
            assert "speedup_by_k" in scoped["entries"][0]
            r = await s.call_tool("acceptance_stats", {"scope": str(tmp_path / "elsewhere")})
            assert r.is_error and "no ledger rows for scope" in _text(r)


def _start_daemon(tmp_path: Path, socket: Path, db: Path) -> subprocess.Popen:
    log = tmp_path / "daemon.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "assistd", "serve", "--socket", str(socket), "--db", str(db),
         "--no-agent-transcripts", "--log-file", str(log)],
        env=_env(tmp_path, socket, db), stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "daemon.stderr", "w"))  # noqa: SIM115 - the child owns it
    return proc


def _wait_for_daemon(proc: subprocess.Popen, socket: Path, tmp_path: Path,
                     timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited {proc.returncode}: "
                                 + (tmp_path / "daemon.stderr").read_text()[-3000:])
        client = find_daemon(socket)
        if client is not None:
            return client
        time.sleep(0.25)
    raise AssertionError(f"no daemon answered on {socket} within {timeout_s} s")


async def test_mcp_uses_a_daemon_started_after_it(tmp_path):
    """The MCP server runs in-process until a daemon answers, then from its next call
    on the daemon serves: continue_text says so, the daemon counts the completion, and
    acceptance_stats reads the daemon's ledger; `assistd mcp --no-daemon` ignores it."""
    socket = tmp_path / "run" / "assistd.sock"
    socket.parent.mkdir()
    daemon_db, mcp_db = tmp_path / "daemon-history.db", tmp_path / "mcp-history.db"
    proc = None
    try:
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with mcp_session(tmp_path, _env(tmp_path, socket, mcp_db)) as s:
                before = _ok(await s.call_tool("acceptance_stats", {}), tmp_path)
                assert before["daemon"] is False and before["entries"] == []  # no model load

                proc = _start_daemon(tmp_path, socket, daemon_db)
                client = await anyio.to_thread.run_sync(_wait_for_daemon, proc, socket,
                                                        tmp_path)
                try:
                    out = _ok(await s.call_tool("continue_text", {
                        "text": "def add(a, b):\n    return", "max_tokens": 16}), tmp_path)
                    assert out["daemon"] is True
                    assert out["completion"].strip() and out["tokens"] > 0
                    status = client.get("/v1/assistd/status")
                    assert status["requests"]["mcp"] >= 1  # counted as an MCP call
                    assert status["tokens_generated"] >= out["tokens"]
                    # apply_edit goes to the daemon too (its endpoint takes absolute paths).
                    calc = tmp_path / "calc.py"
                    calc.write_text("def add(a, b):\n    return a + b\n")
                    edit = ("<<<<<<< SEARCH\n    return a + b\n=======\n    return b + a\n"
                            ">>>>>>> REPLACE\n")
                    applied = _ok(await s.call_tool("apply_edit", {
                        "path": str(calc), "edit": edit, "repo": str(tmp_path)}), tmp_path)
                    assert applied["daemon"] is True and applied["method"] == "search_replace"
                    assert "+    return b + a" in applied["diff"]
                    assert calc.read_text() == "def add(a, b):\n    return a + b\n"  # not written
                finally:
                    client.close()

                stats = _ok(await s.call_tool("acceptance_stats", {}), tmp_path)
                assert stats["daemon"] is True and stats["db"] == str(daemon_db)
                if on_remote_target():  # the server decoded: no acceptance data here
                    assert stats["entries"] == []
                else:
                    assert [e["language"] for e in stats["entries"]] == ["plaintext"]
                    assert stats["entries"][0]["steps"] > 0

            # --no-daemon never asks it: the statistics are this process's own (empty).
            async with mcp_session(tmp_path, _env(tmp_path, socket, mcp_db),
                                   "--no-daemon") as s:
                own = _ok(await s.call_tool("acceptance_stats", {}), tmp_path)
                assert own["daemon"] is False and own["db"] == str(mcp_db)
                assert own["entries"] == []
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
    assert rc == 0, (tmp_path / "daemon.stderr").read_text()[-3000:]


@pytest.mark.parametrize("args, message", [
    (["--target-url", "htp:/nope"], "must be http(s)://HOST"),
    (["--target-url", "http://127.0.0.1:9", "--target-fim", "nope"], "--target-fim"),
    (["--target-url", "http://127.0.0.1:9", "--target-key-file", "KEY"], "readable by others"),
])
def test_mcp_refuses_bad_remote_options_at_start(tmp_path, args, message):
    """A newcomer's `assistd mcp --no-daemon` with a malformed URL, a 0644 key file or a
    bad --target-fim started, and exited 0 when stdin closed: the mistake showed only at
    the first tool call, which an agent set up with `claude mcp add` never shows."""
    key = tmp_path / "key"
    key.write_text("sk-test")
    key.chmod(0o644)
    args = [str(key) if a == "KEY" else a for a in args]
    r = subprocess.run([sys.executable, "-m", "assistd", "mcp", "--no-daemon", "--backend",
                        "openai", *args], input="", capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert message in r.stderr and "sk-test" not in r.stderr


async def test_the_instructions_and_tools_describe_the_configured_target(tmp_path):
    """They said "small local model" / "assistd's local model" whatever the Target: with
    `--backend openai` they name the remote server and promise no drafting, else a local
    model. No tool is called: nothing loads and no server need answer."""
    env = _env(tmp_path, tmp_path / "no-daemon.sock", tmp_path / "history.db")
    for name in ("ASSISTD_BACKEND", "ASSISTD_TARGET_URL", "ASSISTD_MODEL"):
        env.pop(name, None)  # the flags say it
    url = "http://127.0.0.1:9"
    for args, remote in (((), False), (("--backend", "openai", "--target-url", url), True)):
        async with mcp_session(tmp_path, env, "--no-daemon", *args) as s:
            tools = {t.name: t.description for t in (await s.list_tools()).tools}
            texts = [s.instructions, tools["complete_code"], tools["continue_text"]]
        for text in texts:
            assert (f"remote server {url}" in text) is remote, text
            assert ("small local model" in text) is not remote, text
        assert ("drafts from the history" in tools["complete_code"]) is not remote
        assert ("acceptance_rate" in tools["continue_text"]) is not remote
        assert all(len(t) > 80 for t in tools.values())
