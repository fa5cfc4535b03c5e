"""One config file, one Target: `complete --no-daemon`, `serve`, an in-process `lsp` and
`mcp --no-daemon` open the same Target from it (n_ctx, numerics, threads and device
included), read through the one TargetSpec (assistd/targets/spec.py).

`complete --no-daemon` used to take the file's model and backend but not its n_ctx,
numerics, threads or device. Real processes and the embedded model; the config file is
the test's own (tmp), named by ``$ASSISTD_CONFIG`` as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest

pytestmark = pytest.mark.local_target(
    "the file names a local llama.cpp Target's n_ctx, numerics and threads; the remote"
    " run's ASSISTD_BACKEND and ASSISTD_TARGET_URL go over it")

# Not the defaults (4096, fast, all cores): each must come from the file.
CONFIG = 'n_ctx = 1024\nnumerics = "exact"\nthreads = 1\nn_gpu_layers = 0\nproposer = "ngram"\n'
EXPECTED = {"backend": "llama", "n_ctx": 1024, "numerics": "exact", "threads": 1,
            "device": "cpu"}


@pytest.fixture
def config_env(tmp_path, monkeypatch):
    f = tmp_path / "config.toml"
    f.write_text(CONFIG)
    monkeypatch.setenv("ASSISTD_CONFIG", str(f))
    return {**os.environ, "ASSISTD_CONFIG": str(f)}


def _seen(target: dict) -> dict:
    return {k: target[k] for k in EXPECTED}


def test_complete_without_the_daemon_opens_the_files_target(tmp_path, config_env):
    """`assistd complete --no-daemon --json` reports the file's Target: EXPECTED (backend llama,
    n_ctx 1024, numerics exact, threads 1, device cpu)."""
    r = subprocess.run([sys.executable, "-m", "assistd", "complete", "--file", "-",
                        "--no-daemon", "--json", "--max-tokens", "4"],
                       input="def add(a, b):\n    return", env=config_env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _seen(json.loads(r.stdout)["target"]) == EXPECTED


def test_the_daemon_opens_the_files_target(tmp_path, config_env):
    """A daemon started with $ASSISTD_CONFIG reports the file's Target in its status: EXPECTED
    (n_ctx 1024, numerics exact, threads 1, device cpu)."""
    from harness.daemon import start_daemon

    d = start_daemon(tmp_path, env={"ASSISTD_CONFIG": config_env["ASSISTD_CONFIG"]})
    try:
        assert _seen(d.status()["target"]) == EXPECTED
    finally:
        d.stop()


def test_an_in_process_language_server_opens_the_files_target(config_env):
    """What `assistd lsp` without a daemon starts from: the environment and the file."""
    from editors.completer import Completer
    from editors.settings import environment_settings

    settings, warnings = environment_settings()
    assert warnings == []
    c = Completer(settings)
    c.open()
    try:
        t = c.runtime.target
        assert {"backend": t.backend, "n_ctx": t.n_ctx, "numerics": t.numerics,
                "threads": t.n_threads, "device": t.device} == EXPECTED
    finally:
        c.close()


async def test_mcp_without_the_daemon_opens_the_files_target(tmp_path, config_env):
    """`assistd mcp --no-daemon` logs "the Target in this process: backend llama, n_ctx 1024,
    numerics exact, threads 1, device cpu" after a continue_text call."""
    from tests.serving.test_mcp import _ok, mcp_session

    log = tmp_path / "mcp.log"
    with anyio.fail_after(600):
        async with mcp_session(tmp_path, config_env, "--no-daemon", "--log-file", str(log)) as s:
            _ok(await s.call_tool("continue_text", {"text": "def add(a, b):\n    return",
                                                    "max_tokens": 4}), tmp_path)
    assert ("the Target in this process: backend llama, n_ctx 1024, numerics exact,"
            " threads 1, device cpu") in log.read_text()


@pytest.mark.parametrize("command", [["complete", "--file", "-", "--no-daemon"],
                                     ["mcp", "--no-daemon"], ["serve", "--print-config"]])
def test_a_key_of_the_file_that_is_no_setting_is_refused_by_every_reader(tmp_path, command):
    """A typo (`n_cxt`) in the one config file is one `error:` line naming it, exit 2, from
    `complete --no-daemon` and `mcp --no-daemon` as from `serve` (the one-shot commands
    read only the Target's keys and went on with the default n_ctx, silently)."""
    f = tmp_path / "config.toml"
    f.write_text(CONFIG + "n_cxt = 2048\n")
    r = subprocess.run([sys.executable, "-m", "assistd", *command], input="x = 1\n",
                       env={**os.environ, "ASSISTD_CONFIG": str(f)}, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"error: config file {f}: unknown key(s) n_cxt;"), r.stderr[-2000:]
