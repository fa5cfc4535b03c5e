"""A real llama-cpp-python OpenAI-compatible server (``python -m llama_cpp.server``) with
the embedded model on loopback, for the remote Target's tests and for the remote mode of
the front-end tests (``pytest --target remote``, see tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from assistd.targets.open import default_model_path

PROMPT = "def fibonacci(n):\n    "
# The server's defaults are not greedy decoding (top_k 40, min_p 0.05, repeat 1.1).
GREEDY = {"temperature": 0.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}
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


def wait_ready(proc: subprocess.Popen, url: str, log: Path, name: str,
               headers: dict | None = None) -> subprocess.Popen:
    """``proc`` once ``GET url`` answers 200; AssertionError with the tail of its
    ``log`` if it exits first, or after 120 s (then it is killed)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url, headers=headers or {}, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"{name} did not answer within 120 s")


def stop_llama_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def server_completion(url: str, prompt: str, max_tokens: int) -> str:
    """What the server itself answers (not streamed), after a request on another prompt,
    so that both sides start from the same server cache state."""
    reset_cache(url)
    r = httpx.post(f"{url}/v1/completions", timeout=120,
                   json={"prompt": prompt, "max_tokens": max_tokens, **GREEDY})
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def reset_cache(url: str) -> None:
    httpx.post(f"{url}/v1/completions", json={"prompt": "Zebras graze.", "max_tokens": 1},
               timeout=120).raise_for_status()
