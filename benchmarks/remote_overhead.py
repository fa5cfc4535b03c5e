"""Time to first token through assistd's remote Target vs the server's own, on loopback.

    .venv/bin/python benchmarks/remote_overhead.py [--runs 5] [--url URL] [--sizes 100,1000,2000]

Starts llama-cpp-python's OpenAI-compatible server with the embedded model (unless
--url names a running one), then for prompts of about 100, 1,000 and 2,000 tokens measures,
interleaved, ``--runs`` times each:

- server: a streamed ``POST /v1/completions`` with httpx, from the request to the first
  chunk with text;
- assistd (gguf): ``Runtime.prompt`` + ``Runtime.run`` with the model's own tokenizer
  (``--model`` the GGUF), from before tokenizing to the first ``stop_at`` call;
- assistd (server tok): the same with the server's ``/extras/tokenize`` and
  ``/extras/detokenize`` (two more requests).

Each run's prompt starts with its own line, so no request reuses the previous one's
KV cache on the server. Prints the medians, assistd's overhead in ms and whether it
meets the goal (issue 25): time to first token through assistd <= the server's own
+ :data:`GOAL_MS`.

On a busy machine the server's prefill (hundreds of ms to seconds on 2 CPU cores)
varies by far more than assistd adds; ``--instant`` replaces the server by a stand-in
that answers at once (a starlette app on loopback in this process, with a tokenize
endpoint of one id per character), which leaves only what assistd adds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.runtime.runtime import Runtime  # noqa: E402
from assistd.targets.open import default_model_path  # noqa: E402
from harness.ports import free_port  # noqa: E402
from harness.openai_server import start_llama_server  # noqa: E402

BODY = (ROOT / "assistd" / "decoding" / "engine.py").read_text()  # > 2,000 tokens
GOAL_MS = 20.0
N_CTX = 4096  # room for the 2,000-token prompt, on both sides


def start_server() -> tuple[subprocess.Popen, str]:
    """The real llama-cpp-python server with the embedded model (harness/openai_server.py)."""
    port = free_port()
    log = Path(tempfile.mkdtemp()) / "llama_server.log"
    return start_llama_server(port, log, n_ctx=N_CTX), f"http://127.0.0.1:{port}"


def start_instant() -> str:
    """A stand-in server that streams one chunk at once (isolates assistd's overhead)."""
    import json
    import threading

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def completions(request):
        await request.body()

        async def events():
            body = {"choices": [{"text": "x", "index": 0, "finish_reason": None}]}
            yield f"data: {json.dumps(body)}\n\n"
            body["choices"][0].update(text="", finish_reason="length")
            yield f"data: {json.dumps(body)}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    async def tokenize(request):
        return JSONResponse({"tokens": [ord(c) for c in (await request.json())["input"]]})

    async def detokenize(request):
        return JSONResponse({"text": "".join(map(chr, (await request.json())["tokens"]))})

    async def models(request):
        return JSONResponse({"data": [{"id": "instant"}]})

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/extras/tokenize", tokenize, methods=["POST"]),
                            Route("/extras/detokenize", detokenize, methods=["POST"]),
                            Route("/v1/models", models)])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="critical", lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}"


def server_ttft(http: httpx.Client, prompt: str) -> float:
    t0 = time.perf_counter()
    with http.stream("POST", "/v1/completions", json={
            "prompt": prompt, "max_tokens": 4, "stream": True, "temperature": 0,
            "top_k": 0, "min_p": 0, "repeat_penalty": 1.0}) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and '"text": ""' not in line and "[DONE]" not in line:
                return (time.perf_counter() - t0) * 1000
    raise RuntimeError("no text streamed")


def assistd_ttft(rt: Runtime, prompt: str, budget: int) -> float:
    first = []
    t0 = time.perf_counter()
    ids = rt.prompt(prompt, budget)
    rt.run(ids, rt.plan("none", 0), max_tokens=4,
           stop_at=lambda text: first.append(time.perf_counter()) or None)
    return (first[0] - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--url", default=None)
    ap.add_argument("--sizes", default="100,1000,2000",
                    help="prompt sizes, tokens (comma-separated)")
    ap.add_argument("--instant", action="store_true",
                    help="against a stand-in that answers at once (assistd's overhead only)")
    args = ap.parse_args()
    if args.instant:
        proc, url = None, start_instant()
    else:
        proc, url = (None, args.url) if args.url else start_server()
    tmp = Path(tempfile.mkdtemp())
    arms = {"assistd (gguf)": default_model_path(), "assistd (server tok)": None}
    sizes = [int(x) for x in args.sizes.split(",")]
    rts = {name: Runtime.open(model, db=tmp / f"{i}.db", n_ctx=N_CTX,
                              target_options={"backend": "openai", "target_url": url})
           for i, (name, model) in enumerate(arms.items())}
    sizer = rts["assistd (gguf)"].target
    try:
        with httpx.Client(base_url=url, timeout=300) as http:
            server_ttft(http, "warm up")
            print(f"{'prompt':>8} {'arm':>22} {'median ms':>10} {'overhead ms':>12}")
            for tokens in sizes:
                ids = sizer.tokenize(BODY)
                assert len(ids) >= tokens, f"the prompt source has only {len(ids)} tokens"
                base = sizer.detokenize(ids[:tokens])
                times: dict[str, list[float]] = {"server": [], **{a: [] for a in arms}}
                for run in range(args.runs):
                    for arm in times:
                        # A distinct first line per request: no KV reuse on the server.
                        prompt = f"# {arm} {run} {time.time_ns()}\n" + base
                        if arm == "server":
                            times[arm].append(server_ttft(http, prompt))
                        else:
                            times[arm].append(assistd_ttft(rts[arm], prompt, tokens + 32))
                server = statistics.median(times["server"])
                for arm, xs in times.items():
                    m = statistics.median(xs)
                    over = "" if arm == "server" else f"{m - server:+.1f}"
                    goal = "" if arm == "server" else (
                        " goal met" if m - server <= GOAL_MS else f" over the {GOAL_MS:g} ms goal")
                    print(f"{tokens:>8} {arm:>22} {m:>10.1f} {over:>12}{goal}   runs:"
                          f" {' '.join(f'{x:.0f}' for x in xs)}")
    finally:
        for rt in rts.values():
            rt.close()
        if proc is not None:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
