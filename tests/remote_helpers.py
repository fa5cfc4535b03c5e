"""What the remote Target's tests send llama-cpp-python's server (harness.openai_server
starts it; tests/conftest.py holds the fixtures) and read back from it."""

from __future__ import annotations

import httpx

PROMPT = "def fibonacci(n):\n    "
# The server's defaults are not greedy decoding (top_k 40, min_p 0.05, repeat 1.1).
GREEDY = {"temperature": 0.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}


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
