"""llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``) with the
embedded model on loopback: the remote Target's peer in its tests, in the remote mode of
the front-end tests (``pytest --target remote``) and in the remote benchmarks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from assistd.targets.open import default_model_path
from harness.ports import wait_ready

# The server's context window, tokens: the daemon's default n_ctx (the LSP's is 2048),
# so that no front end's prompt budget outgrows what the server holds.
SERVER_N_CTX = 4096


def start_llama_server(port: int, log: Path, *args: str, n_ctx: int = SERVER_N_CTX) -> subprocess.Popen:
    """llama-cpp-python's OpenAI-compatible server with the embedded model on loopback
    (``args``: more server flags, e.g. ``--api_key K``); returns once ``/v1/models``
    answers (AssertionError with its log if it exits or is silent for 120 s)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(default_model_path()),
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "2",
         # a request queues behind the one in hand: by default a new request cuts the
         # stream in hand short (a daemon's editor request would end an agent's)
         "--interrupt_requests", "False", *args],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    headers = {}
    if "--api_key" in args:
        headers["Authorization"] = f"Bearer {args[args.index('--api_key') + 1]}"
    return wait_ready(proc, f"http://127.0.0.1:{port}/v1/models", log, "llama_cpp.server",
                      headers)


def stop_llama_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s; returns once the server has exited."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
