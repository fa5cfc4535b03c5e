"""Memory of `assistd serve` over many small requests: RSS after warm-up vs the end.

    .venv/bin/python benchmarks/daemon_memory.py [--requests 10000] [--clients 2]
        [--warmup 500] [--sample-every 500] [--n-ctx 4096] [--threads N] [--seed 0]
        [--json FILE]

The issue's goal: memory of the daemon flat (within 10%) over 10,000 requests.

Workload: one daemon (the embedded Target, ``--repo`` a small temporary repository of
stdlib modules, so that some requests draft from a history scope), ``--clients``
threads each with its own Unix-socket connection, ``--requests`` requests in all, a
seeded mix: ``/v1/completions`` and ``/v1/chat/completions`` (one in 5, in blocks of 25 so
that consecutive prompts share their KV prefix; a chat request costs ~300 ms here: ~25
tokens of template, and ~200 ms rendering it in ``assistd.runtime.chat``), streamed or not (some
streams with ``include_usage``, some hung up after the first event), string and token-id
prompts that differ per request, ``max_tokens`` 1-4, greedy or seeded sampling, proposer
suffix / none / the default, with or without ``assistd.scope``, stop strings; a few GETs
(models, status, stats) and ~3% bad requests (invalid JSON, unknown model, ``n=2``,
``max_tokens`` 0, no messages, an unknown proposer, ``k`` out of range, an unknown
``assistd`` key, ``echo``, a prompt over the context window), each of which must get its
4xx.

Memory: the daemon's resident set (psutil, the process and any children: VmRSS) after
every ``--sample-every`` requests. The baseline is the sample after ``--warmup``
requests (model, history index, tuner and caches in place); the goal holds when every
later sample is within 10% of it. Any 5xx, a bad request answered 200, or a good one
answered otherwise is counted and shown (the daemon's log tail goes to the JSON).

Time: ~60-90 ms a request on 2 idle cores (most of it Target forwards: the prompt's new
tokens, then one forward per token): ~15-20 minutes for 10,000. Beside other work on the
cores it is many times slower (a 2-thread forward waits for a busy core): ``--threads 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import sysconfig
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.daemon import start_daemon  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
REPO_FILES = ("bisect.py", "colorsys.py", "keyword.py", "heapq.py", "fnmatch.py")
# Short beginnings (prefill is most of a request's cost: ~4 ms a token here), so
# that 10,000 requests take minutes; each request's own tail makes its prompt differ.
BASES = ["def f_", "import os\nx_", "# TODO: ", "SELECT * FROM t_", "The quick brown ",
         "class Stack_", "- apples\n- "]
BLOCK = 25  # requests in a row of one endpoint: their prompts share the KV prefix
CHAT_EVERY = 5  # one block in 5 is chat: a chat request costs ~300 ms here, 5x a completion
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi "
         "omicron pi rho sigma tau upsilon phi chi psi omega").split()


def make_request(i: int, rng: random.Random, scope: str) -> dict:
    """Request ``i`` of the mix: {kind, method, path, json or content, stream, hangup,
    bad (a 4xx is expected)}."""
    r = rng.random()
    tail = f"{rng.choice(WORDS)}{i}"
    a = {"proposer": rng.choice(["suffix", "none", None]), "scope": scope
         if rng.random() < 0.3 else None, "k": rng.choice(["auto", "auto", 2, 4])}
    a = {k: v for k, v in a.items() if v is not None}
    common = {"model": "assistd", "max_tokens": rng.randint(1, 4), "assistd": a}
    if rng.random() < 0.25:
        common.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 30))
    else:
        common["temperature"] = 0
    if rng.random() < 0.1:
        common["stop"] = ["\n"]
    req = {"method": "POST", "stream": False, "hangup": False, "bad": False}
    if r < 0.03:  # bad requests
        return {**req, "bad": True, **bad_request(i, rng, common)}
    if r < 0.04:  # reads
        path = rng.choice(["/v1/models", "/v1/assistd/status", "/v1/assistd/stats"])
        return {**req, "kind": "get " + path.rsplit("/", 1)[1], "method": "GET", "path": path}
    stream = rng.random() < 0.3
    if stream and rng.random() < 0.05:
        req["hangup"] = True
    if (i // BLOCK) % CHAT_EVERY:
        prompt = rng.choice(BASES) + tail
        if rng.random() < 0.06:  # token ids
            prompt = [1] + [rng.randrange(100, 49_000) for _ in range(rng.randint(2, 8))]
        body = {**common, "prompt": prompt}
        kind, path = "completion", "/v1/completions"
    else:
        messages = [{"role": "system", "content": "Be terse."},
                    {"role": "user", "content": f"{rng.choice(BASES)}{tail}"}]
        if rng.random() < 0.1:  # the model's own default system prompt (~20 tokens)
            del messages[0]
        if rng.random() < 0.1:
            messages[-1:-1] = [{"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "Hello!"}]
        body = {**common, "messages": messages}
        kind, path = "chat", "/v1/chat/completions"
    if stream:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        kind += " stream" + (" hangup" if req["hangup"] else "")
    return {**req, "kind": kind, "path": path, "json": body, "stream": stream}


def bad_request(i: int, rng: random.Random, common: dict) -> dict:
    chat = {**common, "messages": [{"role": "user", "content": f"hi {i}"}]}
    comp = {**common, "prompt": f"x = {i}\n"}
    which = rng.choice(["json", "model", "n", "max_tokens", "messages", "proposer", "k",
                        "assistd_key", "too_long", "echo"])
    p_chat, p_comp = "/v1/chat/completions", "/v1/completions"
    cases = {
        "json": (p_comp, None, b'{"model": "assistd", "prompt": '),
        "model": (p_chat, {**chat, "model": "gpt-17"}, None),
        "n": (p_comp, {**comp, "n": 2}, None),
        "max_tokens": (p_comp, {**comp, "max_tokens": 0}, None),
        "messages": (p_chat, {**common, "messages": []}, None),
        "proposer": (p_comp, {**comp, "assistd": {"proposer": "bogus"}}, None),
        "k": (p_chat, {**chat, "assistd": {"k": 99}}, None),
        "assistd_key": (p_chat, {**chat, "assistd": {"colour": "blue"}}, None),
        "too_long": (p_comp, {**comp, "prompt": [1] + [300] * 5000}, None),
        "echo": (p_comp, {**comp, "echo": True}, None),
    }
    path, body, raw = cases[which]
    out = {"kind": f"bad {which}", "path": path}
    if raw is not None:
        out["content"] = raw
    else:
        out["json"] = body
    return out


def send(client: httpx.Client, q: dict) -> tuple[int, str | None]:
    """(HTTP status, a problem found in the answer or None)."""
    kw = {"json": q["json"]} if "json" in q else (
        {"content": q["content"], "headers": {"content-type": "application/json"}}
        if "content" in q else {})
    if not q["stream"]:
        r = client.request(q["method"], q["path"], **kw)
        if r.status_code == 200 and q["method"] == "POST":
            data = r.json()
            if "choices" not in data or "usage" not in data:
                return r.status_code, f"no choices/usage: {r.text[:200]}"
        return r.status_code, None
    with client.stream("POST", q["path"], **kw) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, None
        events = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if q["hangup"]:
                    return r.status_code, None  # leaving the block closes the connection
        if not events or events[-1] != "[DONE]":
            return r.status_code, f"stream did not end with [DONE]: {events[-1:]}"
        if any('"error"' in e and e.startswith('{"error"') for e in events):
            return r.status_code, f"error event: {[e for e in events if 'error' in e][:1]}"
    return r.status_code, None


def rss_bytes(proc: psutil.Process) -> int:
    total = proc.memory_info().rss
    for c in proc.children(recursive=True):
        try:
            total += c.memory_info().rss
        except psutil.Error:
            pass
    return total


def vm_hwm_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=2, help="client threads")
    ap.add_argument("--warmup", type=int, default=500, help="requests before the baseline sample")
    ap.add_argument("--sample-every", type=int, default=500)
    ap.add_argument("--n-ctx", type=int, default=4096, help="the daemon's context window")
    ap.add_argument("--threads", type=int,
                    help="the Target's CPU threads (ASSISTD_THREADS) [default: the daemon's, "
                         "all cores]; 1 keeps a run going beside other work: llama.cpp's "
                         "threads wait for each other, and a busy core stalls them all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="daemon_memory_") as tmp_name:
        tmp = Path(tmp_name)
        repo = tmp / "repo"
        (repo / ".git").mkdir(parents=True)
        for name in REPO_FILES:
            if (STDLIB / name).is_file():
                (repo / name).write_text((STDLIB / name).read_text())
        if args.threads:
            os.environ["ASSISTD_THREADS"] = str(args.threads)  # start_daemon passes it on
        t0 = time.perf_counter()
        daemon = start_daemon(tmp / "daemon", "--n-ctx", str(args.n_ctx), "--repo", str(repo))
        print(f"daemon pid {daemon.proc.pid} answering in {time.perf_counter() - t0:.1f} s",
              flush=True)
        proc = psutil.Process(daemon.proc.pid)
        rng = random.Random(args.seed)
        queue = [make_request(i, rng, str(repo)) for i in range(args.requests)]
        lock = threading.Lock()
        state = {"next": 0, "done": 0}
        samples = []  # [requests done, rss bytes, elapsed s]
        statuses: Counter = Counter()  # (kind, status)
        latency_ms: dict[str, list[float]] = {}  # kind -> ms per request
        problems: list[str] = []
        t_start = time.perf_counter()
        samples.append([0, rss_bytes(proc), 0.0])
        print(f"{0:>6} requests: RSS {samples[0][1] / 2**20:7.1f} MiB", flush=True)

        def worker():
            with daemon.uds(timeout=300) as client:
                while True:
                    with lock:
                        i = state["next"]
                        if i >= len(queue):
                            return
                        state["next"] += 1
                    q = queue[i]
                    t_req = time.perf_counter()
                    try:
                        status, problem = send(client, q)
                    except httpx.HTTPError as e:
                        status, problem = -1, f"{type(e).__name__}: {e}"
                    ok = (400 <= status < 500) if q["bad"] else status == 200
                    ms = (time.perf_counter() - t_req) * 1000
                    with lock:
                        statuses[(q["kind"], status)] += 1
                        latency_ms.setdefault(q["kind"], []).append(ms)
                        if problem or not ok:
                            problems.append(f"#{i} {q['kind']}: HTTP {status}"
                                            + (f": {problem}" if problem else ""))
                        state["done"] += 1
                        done = state["done"]
                        if done % args.sample_every == 0 or done == len(queue):
                            s = [done, rss_bytes(proc), time.perf_counter() - t_start]
                            samples.append(s)
                            print(f"{done:>6} requests: RSS {s[1] / 2**20:7.1f} MiB "
                                  f"({s[2]:.0f} s, {len(problems)} problems)", flush=True)

        threads = [threading.Thread(target=worker) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t_start
        try:
            status = daemon.status()
        except httpx.HTTPError as e:
            status = {"error": str(e)}
        hwm = vm_hwm_kb(daemon.proc.pid)
        alive = daemon.proc.poll() is None
        rc = daemon.stop()
        log_tail = daemon.log.read_text()[-4000:] if daemon.log.exists() else ""

    samples.sort()
    base = next((s for s in samples if s[0] >= args.warmup), samples[-1])
    after = [s for s in samples if s[0] >= base[0]]
    end = samples[-1]
    peak = max(after, key=lambda s: s[1])
    low = min(after, key=lambda s: s[1])
    mib = 2**20
    flat = all(abs(s[1] / base[1] - 1) <= 0.10 for s in after)

    series = Table(title="daemon RSS, sampled every "
                         f"{args.sample_every} requests ({args.clients} clients)")
    for col in ("requests", "RSS MiB", "vs baseline", "elapsed s"):
        series.add_column(col, justify="right")
    for s in samples:
        series.add_row(f"{s[0]:,}", f"{s[1] / mib:.1f}",
                       f"{s[1] / base[1]:.3f}" if s[0] >= base[0] else "", f"{s[2]:.0f}")
    Console(width=120).print(series)

    table = Table(title=f"assistd serve memory over {len(queue):,} requests "
                        f"({elapsed:.0f} s, {len(queue) / elapsed:.1f} requests/s)")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row(f"RSS after warm-up ({base[0]:,} requests) MiB", f"{base[1] / mib:.1f}")
    table.add_row(f"RSS at the end ({end[0]:,}) MiB", f"{end[1] / mib:.1f}")
    table.add_row(f"max RSS after warm-up (at {peak[0]:,}) MiB", f"{peak[1] / mib:.1f}")
    table.add_row(f"min RSS after warm-up (at {low[0]:,}) MiB", f"{low[1] / mib:.1f}")
    table.add_row("end / warm-up", f"{end[1] / base[1]:.3f}")
    table.add_row("max / warm-up", f"{peak[1] / base[1]:.3f}")
    table.add_row("RSS before the first request MiB", f"{samples[0][1] / mib:.1f}")
    table.add_row("peak RSS of the process (VmHWM, load included) MiB",
                  "n/a" if hwm is None else f"{hwm / 1024:.1f}")
    table.add_row("HTTP 200 / 4xx / 5xx / failed",
                  " / ".join(str(sum(n for (_, st), n in statuses.items() if pred(st)))
                             for pred in (lambda s: s == 200, lambda s: 400 <= s < 500,
                                          lambda s: s >= 500, lambda s: s < 0)))
    table.add_row("problems (unexpected status, bad stream)", str(len(problems)))
    table.add_row("daemon alive at the end / exit code on SIGTERM", f"{alive} / {rc}")
    table.add_row("goal: every sample after warm-up within ±10%", "met" if flat else "NOT met")
    Console(width=120).print(table)

    kinds = Table(title="requests by kind and status")
    kinds.add_column("kind")
    kinds.add_column("status", justify="right")
    kinds.add_column("count", justify="right")
    kinds.add_column("ms mean / p95 (kind)", justify="right")
    for (kind, st), n in sorted(statuses.items()):
        ms = sorted(latency_ms[kind])
        kinds.add_row(kind, str(st), str(n), f"{sum(ms) / len(ms):.0f} / "
                      f"{ms[max(0, -(-len(ms) * 95 // 100) - 1)]:.0f}")
    Console(width=120).print(kinds)
    for p in problems[:20]:
        print(f"problem: {p}", file=sys.stderr)

    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(args).items()},
            "elapsed_s": round(elapsed, 1), "samples": samples,
            "baseline": base, "end": end, "max_after_warmup": peak, "min_after_warmup": low,
            "end_ratio": end[1] / base[1], "max_ratio": peak[1] / base[1], "flat": flat,
            "vm_hwm_kb": hwm, "statuses": [[k, s, n] for (k, s), n in sorted(statuses.items())],
            "latency_ms_mean": {k: sum(v) / len(v) for k, v in latency_ms.items()},
            "problems": problems, "daemon_status": status, "daemon_exit_code": rc,
            "daemon_log_tail": log_tail}, indent=1))


if __name__ == "__main__":
    main()
