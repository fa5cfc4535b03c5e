"""An agent and an editor on one `assistd serve`: one warm KV sequence vs several.

    .venv/bin/python benchmarks/mixed_load.py [--sequences-a 1] [--sequences-b 4]
        [--agent-tokens 2400] [--editor-tokens 1000] [--repeats 3] [--max-tokens 16]
        [--seconds 60] [--n-ctx 4096] [--numerics fast|exact|llama] [--transcript FILE]
        [--json FILE]

One daemon per configuration, in turn, on a temporary socket and history DB, started
with ``--n-ctx N --numerics M --sequences A`` then ``--sequences B``: the sequences flag
is the only difference. With one sequence an editor request evicts the agent's prompt from the KV
cache; with several each client keeps its own warm. An ``assistd lsp`` server (the
editor, driven by pytest-lsp's real client as in ``lsp_typing.py``) runs on the same
daemon. Requests are greedy; ``--max-tokens`` is small so that prefill dominates.

Workload. The agent's text is real: the model calls of the shared aider fixture (515 runs
of aider's own development, read in place; or ``--transcript``), as ``daemon_agent.py``
builds them. The editor's file is the stdlib module (by name, not starting with ``_``)
closest to ``--editor-tokens`` Target tokens, copied into a temporary repository.

1. Interleaved. The agent's conversation is the latest model call (not one of the
   concurrent part's) of at least ``--agent-tokens`` tokens, cut to that many. Per repeat,
   twice: the agent's request, then (the second time only) one editor completion at the
   end of a line of the file (a different line each repeat), then the agent's next request
   (its prompt, its reply, one new short user line). Measured: that next request's wall
   time and its ledger's ``prompt_tokens_reused`` / ``prompt_tokens_evaluated``, warm
   alone vs after the editor; medians over ``--repeats``.
2. Concurrent. For ``--seconds``, the agent replays the last 16 model calls of the
   transcript (each cut to ``--agent-tokens``; cycled), streamed, one after another,
   while the editor re-types the second half of the file (a copy, opened without it), a
   keystroke every 100 ms, each followed by an inline completion request; a burst ends
   at a line's end or (p = 0.3) a word's end, as ``lsp_typing.py`` defines it. Measured:
   the agent's time to first token (p50 / p95 over calls) and decode tokens/s (tokens
   after the first / time after the first, client side); the editor's burst-end latency
   (keystroke to answer; unanswered after 2 s counts as slower than any answer).

The daemon's ``status`` ``sequences.evictions`` is reported per scenario (n/a where the
daemon reports none). An older daemon without ``--sequences``: set
``MIXED_LOAD_NO_SEQUENCES_FLAG=1`` and the flag is not passed (both configurations are
then the same daemon: a baseline of the noise).

Time, on 2 idle cores: per configuration ~10 s of start-up and warm-up (a cold agent
prefill of 2,400 tokens), the interleaved repeats (~20 s each with one sequence, where
the agent's prompt is evaluated again after the editor; ~2 s with several), then
``--seconds``: ~2.5 minutes per configuration, ~5 minutes in all with the defaults. The
CPU must be idle; a busy one is warned about.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.measure.bench_workloads import fit, model_calls, transcript_source  # noqa: E402
from assistd.runtime.chat import chat_prompt_ids  # noqa: E402
from assistd.serving.client import DaemonClient  # noqa: E402
from assistd.ground.numerics import DEFAULT_NUMERICS, NUMERICS  # noqa: E402
from assistd.targets.llama import LlamaTarget  # noqa: E402
from assistd.targets.open import default_model_path  # noqa: E402
from benchmarks.lsp_typing import STDLIB, WAIT_S, cpu_busy, keystrokes, pct, utf16  # noqa: E402
from harness.daemon import start_daemon  # noqa: E402
from harness.lsp import inline_params, insert, lsp_session, open_doc, stats  # noqa: E402

FIXTURE = (ROOT.parent / "shared" / "fixtures" / "transcripts" / "aider"
           / "aider__tests_fixtures_chat-history.TRUNCATED.md")
NO_FLAG = "MIXED_LOAD_NO_SEQUENCES_FLAG"
CALLS = 16  # model calls the concurrent agent replays
INTERVAL_S = 0.1  # between keystrokes
PAUSE_PROB = 0.3  # a burst ends at a word's end
FOLLOW_UP = "Good. Now update the tests for that change (step {n})."  # distinct: no exact cache hit
MARGIN_TOKENS = 16


# -- workload ----------------------------------------------------------------------------


def build_workload(args) -> dict:
    """The agent's conversation and calls, and the editor's file. The Target that counts
    tokens (a small context: only tokenizing) is closed before any daemon starts."""
    if not args.transcript.is_file():
        sys.exit(f"transcript not found: {args.transcript}; pass --transcript FILE")
    budget = min(args.agent_tokens, args.n_ctx - args.max_tokens - MARGIN_TOKENS)
    target = LlamaTarget(default_model_path(), n_ctx=256)
    try:
        calls = [{**c, "session": s.name} for s in transcript_source(args.transcript)
                 for c in model_calls(s)]
        replay = calls[-CALLS:]
        for c in replay:
            c["messages"], c["prompt_tokens"], _ = fit(target, c["messages"], budget)
        # The conversation: from another session, so no replayed call shares its prefix.
        others = [c for c in calls if c["session"] not in {r["session"] for r in replay}]
        if not others:
            sys.exit(f"{args.transcript}: no model call outside the last {CALLS}")
        convo = next((c for c in reversed(others)
                      if len(chat_prompt_ids(target, c["messages"])) >= budget), None)
        if convo is None:
            sys.exit(f"{args.transcript}: no model call of {budget} tokens; lower --agent-tokens")
        convo_messages, convo_tokens, _ = fit(target, convo["messages"], budget)
        mods = sorted(p for p in STDLIB.glob("*.py") if not p.name.startswith("_"))
        near = sorted(mods, key=lambda p: abs(p.stat().st_size - 3.6 * args.editor_tokens))[:20]
        sizes = {p: len(target.tokenize(p.read_text())) for p in near}
        path = min(near, key=lambda p: abs(sizes[p] - args.editor_tokens))
    finally:
        target.close()
    lines = path.read_text().split("\n")
    typing_line = next(i for i in range(max(1, len(lines) // 2), len(lines)) if lines[i].strip())
    return {"transcript": str(args.transcript), "convo_session": convo["session"],
            "convo": convo_messages, "convo_tokens": convo_tokens, "calls": replay,
            "editor_file": path, "editor_tokens": sizes[path], "typing_line": typing_line}


# -- the agent ---------------------------------------------------------------------------


def body(messages, max_tokens: int, stream: bool = False) -> dict:
    return {"model": "assistd", "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}


def chat(api: DaemonClient, messages, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    data = api.post("/v1/chat/completions", body(messages, max_tokens))
    led = data["usage"]["assistd"]["ledger"]
    return {"text": data["choices"][0]["message"]["content"],
            "wall_ms": (time.perf_counter() - t0) * 1000, "prefill_ms": led["prefill_ms"],
            "reused": led["prompt_tokens_reused"], "evaluated": led["prompt_tokens_evaluated"]}


def stream_chat(api: DaemonClient, messages, max_tokens: int) -> dict:
    """One streamed call: time to the first content delta, then the rest."""
    t0 = time.perf_counter()
    first, usage = None, None
    with api.http.stream("POST", "/v1/chat/completions",
                         json=body(messages, max_tokens, stream=True)) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {r.read().decode()[:300]}"}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[len("data: "):])
            if "error" in ev:
                return {"error": ev["error"]["message"]}
            if first is None and ev["choices"] and ev["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
            usage = ev.get("usage") or usage
    end = time.perf_counter()
    led = usage["assistd"]["ledger"]
    return {"ttft_ms": None if first is None else (first - t0) * 1000,
            "tokens": usage["completion_tokens"], "decode_s": end - (first or end),
            "reused": led["prompt_tokens_reused"], "evaluated": led["prompt_tokens_evaluated"]}


def replay(socket: Path, calls: list[dict], max_tokens: int, stop: threading.Event,
           out: list[dict]) -> None:
    """The concurrent agent (a thread): the calls in turn, cycled, until ``stop``."""
    api = DaemonClient(socket, timeout=900)
    try:
        for c in itertools.cycle(calls):
            if stop.is_set():
                break
            try:
                out.append(stream_chat(api, c["messages"], max_tokens))
            except httpx.HTTPError as e:
                out.append({"error": repr(e)})
    finally:
        api.close()


# -- the two scenarios -------------------------------------------------------------------


async def inline_ms(client, uri: str, line: int, char: int) -> float:
    t0 = time.perf_counter()
    await client.text_document_inline_completion_async(inline_params(uri, line, char))
    return (time.perf_counter() - t0) * 1000


async def interleaved(api: DaemonClient, client, uri: str, work: dict, args) -> dict:
    lines = work["editor_file"].read_text().split("\n")
    cursors = [i for i in reversed(range(len(lines))) if lines[i].strip()]  # a line end each
    runs, editor_ms, n = {"alone": [], "after editor": []}, [], 0
    for r in range(args.repeats):
        for phase, out in runs.items():
            first = await asyncio.to_thread(chat, api, work["convo"], args.max_tokens)
            if phase == "after editor":
                ln = cursors[r % len(cursors)]
                editor_ms.append(await inline_ms(client, uri, ln, utf16(lines[ln])))
            n += 1
            messages = work["convo"] + [{"role": "assistant", "content": first["text"]},
                                        {"role": "user", "content": FOLLOW_UP.format(n=n)}]
            out.append(await asyncio.to_thread(chat, api, messages, args.max_tokens))
        a, e = runs["alone"][-1], runs["after editor"][-1]
        print(f"  repeat {r + 1}: agent's next request {a['wall_ms']:.0f} ms alone "
              f"(evaluated {a['evaluated']}), {e['wall_ms']:.0f} ms after the editor "
              f"(evaluated {e['evaluated']}); editor {editor_ms[-1]:.0f} ms", flush=True)
    med = {p: {k: statistics.median(x[k] for x in rs)
               for k in ("wall_ms", "prefill_ms", "reused", "evaluated")}
           for p, rs in runs.items()}
    return {"median": med, "editor_ms": statistics.median(editor_ms), "runs": runs,
            "editor_runs_ms": editor_ms,
            "ratio": ratio(med["after editor"]["wall_ms"], med["alone"]["wall_ms"])}


async def concurrent(socket: Path, client, repo: Path, work: dict, args) -> dict:
    text = work["editor_file"].read_text()
    lines, a = text.split("\n"), work["typing_line"]
    uri = open_doc(client, repo / f"typing_{work['editor_file'].name}", "\n".join(lines[:a]))
    line, char = a - 1, utf16(lines[a - 1])
    await inline_ms(client, uri, line, char)  # warm-up: this document's first prefill
    stop, agent = threading.Event(), []
    thread = threading.Thread(target=replay, args=(socket, work["calls"], args.max_tokens,
                                                   stop, agent))
    thread.start()
    keys = keystrokes(lines[a:], random.Random(0), PAUSE_PROB)
    futures, bursts, typed = [], [], 0
    t_end = time.perf_counter() + args.seconds
    t_next = time.perf_counter()
    for n, (key, burst_end) in enumerate(keys):
        await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
        if time.perf_counter() >= t_end:
            break
        t_key = time.perf_counter()
        insert(client, uri, n + 2, line, char, key)
        line, char = (line + 1, len(key) - 1) if key[0] == "\n" else (line, char + utf16(key))
        typed += 1
        futures.append(asyncio.ensure_future(
            client.text_document_inline_completion_async(inline_params(uri, line, char))))
        await asyncio.sleep(0)  # send it now, right after its didChange
        t_next = t_key + INTERVAL_S
        if not burst_end:
            continue
        try:
            res = await asyncio.wait_for(asyncio.shield(futures[-1]), WAIT_S)
        except asyncio.TimeoutError:
            bursts.append({"ms": math.inf, "timeout": True})
            continue
        s = res.items[0].insert_text if res and res.items else None
        bursts.append({"ms": (time.perf_counter() - t_key) * 1000,
                       "single": s is not None and "\n" not in s.removeprefix("\n")})
        t_next = max(t_next, time.perf_counter())  # type on once the answer is seen
    stop.set()
    await asyncio.gather(*futures, return_exceptions=True)
    await asyncio.to_thread(thread.join)
    ok = [c for c in agent if "error" not in c and c["ttft_ms"] is not None]
    ttft = [c["ttft_ms"] for c in ok]
    decode_s = sum(c["decode_s"] for c in ok)
    every = [b["ms"] for b in bursts]
    single = [b["ms"] for b in bursts if b.get("single") or b.get("timeout")]
    return {"agent_calls": len(ok), "agent_errors": [c["error"] for c in agent if "error" in c],
            "ttft_p50_ms": pct(ttft, 0.5), "ttft_p95_ms": pct(ttft, 0.95),
            "decode_tokens_per_s": ratio(sum(c["tokens"] - 1 for c in ok), decode_s),
            "agent_reused": sum(c["reused"] for c in ok),
            "agent_evaluated": sum(c["evaluated"] for c in ok),
            "keystrokes": typed, "bursts": len(bursts),
            "timeouts": sum(b["ms"] == math.inf for b in bursts),
            "burst_p50_ms": pct(every, 0.5), "burst_p95_ms": pct(every, 0.95),
            "single_p50_ms": pct(single, 0.5), "single_p95_ms": pct(single, 0.95),
            "agent_runs": agent}


def evictions(s0: dict, s1: dict) -> int | None:
    """KV evictions between two daemon statuses (None where the daemon reports none)."""
    e0, e1 = ((s.get("sequences") or {}).get("evictions") for s in (s0, s1))
    return None if e0 is None or e1 is None else e1 - e0


async def drive(daemon, work: dict, repo: Path, args) -> dict:
    api = DaemonClient(daemon.socket, timeout=900)
    settings = {"maxLatencyMs": 250, "maxPromptTokens": max(1024, args.editor_tokens + 128)}
    try:
        async with lsp_session(daemon.db, root=repo, settings=settings,
                               env={"ASSISTD_SOCKET": str(daemon.socket)}) as (client, _):
            path = repo / work["editor_file"].name
            text = path.read_text()
            uri = open_doc(client, path, text)
            lines = text.split("\n")
            await inline_ms(client, uri, len(lines) - 1, utf16(lines[-1]))  # warm-up
            if "daemon" not in await stats(client):
                sys.exit("the LSP server runs in-process, not on the daemon")
            before = daemon.status()
            inter = await interleaved(api, client, uri, work, args)
            middle = daemon.status()
            print(f"  concurrent: {args.seconds:g} s ...", flush=True)
            conc = await concurrent(daemon.socket, client, repo, work, args)
            after = daemon.status()
    finally:
        api.close()
    inter["evictions"], conc["evictions"] = evictions(before, middle), evictions(middle, after)
    return {"interleaved": inter, "concurrent": conc, "sequences_status": after.get("sequences"),
            "daemon_status": after}


def run_config(i: int, n_seq: int, work: dict, tmp: Path, args) -> dict:
    repo = tmp / f"repo-{i}"
    (repo / ".git").mkdir(parents=True)
    (repo / work["editor_file"].name).write_text(work["editor_file"].read_text())
    extra = ["--n-ctx", str(args.n_ctx), "--numerics", args.numerics]
    if not os.environ.get(NO_FLAG):
        extra += ["--sequences", str(n_seq)]
    busy = cpu_busy()
    if busy is not None and busy > 0.1:
        print(f"warning: the CPU is {busy:.0%} busy: times will be inflated", file=sys.stderr)
    print(f"assistd serve {' '.join(extra)}", flush=True)
    try:
        daemon = start_daemon(tmp / f"daemon-{i}", *extra)
    except AssertionError as e:
        hint = (f"\nthis assistd serve predates --sequences? set {NO_FLAG}=1 to benchmark it "
                "without the flag" if "--sequences" in str(e) else "")
        sys.exit(f"assistd serve {' '.join(extra)} did not start: {e}{hint}")
    try:
        out = asyncio.run(drive(daemon, work, repo, args))
    finally:
        daemon.stop()
    return {"sequences": n_seq, "flag_passed": not os.environ.get(NO_FLAG),
            "cpu_busy_before": busy, **out}


# -- report ------------------------------------------------------------------------------


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt(v, spec=".0f"):
    if v == math.inf:
        return f">{WAIT_S * 1000:.0f}"
    return "n/a" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def med(r, phase, key):
    return r["interleaved"]["median"][phase][key]


INTERLEAVED = [  # (label, value of one config, format; None: text, no ratio column)
    ("agent's next request, wall ms: warm alone", lambda r: med(r, "alone", "wall_ms"), ".0f"),
    ("  after the editor's request", lambda r: med(r, "after editor", "wall_ms"), ".0f"),
    ("  after editor / warm alone", lambda r: r["interleaved"]["ratio"], ".2f"),
    ("prefill ms: warm alone / after editor", lambda r: f"{med(r, 'alone', 'prefill_ms'):.0f} / "
     f"{med(r, 'after editor', 'prefill_ms'):.0f}", None),
    ("prompt tokens reused / evaluated: warm alone", lambda r: f"{med(r, 'alone', 'reused'):.0f}"
     f" / {med(r, 'alone', 'evaluated'):.0f}", None),
    ("  after the editor's request", lambda r: f"{med(r, 'after editor', 'reused'):.0f} / "
     f"{med(r, 'after editor', 'evaluated'):.0f}", None),
    ("editor request ms", lambda r: r["interleaved"]["editor_ms"], ".0f"),
    ("KV evictions (daemon status)", lambda r: fmt(r["interleaved"]["evictions"]), None),
]
CONCURRENT = [
    ("agent calls (errors)", lambda r: f"{r['concurrent']['agent_calls']} "
     f"({len(r['concurrent']['agent_errors'])})", None),
    ("agent time to first token ms p50", lambda r: r["concurrent"]["ttft_p50_ms"], ".0f"),
    ("agent time to first token ms p95", lambda r: r["concurrent"]["ttft_p95_ms"], ".0f"),
    ("agent decode tokens/s", lambda r: r["concurrent"]["decode_tokens_per_s"], ".1f"),
    ("agent prompt tokens reused / evaluated", lambda r: f"{r['concurrent']['agent_reused']} / "
     f"{r['concurrent']['agent_evaluated']}", None),
    ("editor keystrokes / bursts (unanswered)", lambda r: f"{r['concurrent']['keystrokes']} / "
     f"{r['concurrent']['bursts']} ({r['concurrent']['timeouts']})", None),
    ("editor burst-end ms p50", lambda r: r["concurrent"]["burst_p50_ms"], ".0f"),
    ("editor burst-end ms p95", lambda r: r["concurrent"]["burst_p95_ms"], ".0f"),
    ("editor single-line ms p50 / p95", lambda r: f"{fmt(r['concurrent']['single_p50_ms'])} / "
     f"{fmt(r['concurrent']['single_p95_ms'])}", None),
    ("KV evictions (daemon status)", lambda r: fmt(r["concurrent"]["evictions"]), None),
]


def label(r: dict) -> str:
    if r["flag_passed"]:
        return f"--sequences {r['sequences']}"
    return f"no flag (n_seq {fmt((r['sequences_status'] or {}).get('n_seq'))})"


def table(title: str, rows, results: list[dict]) -> Table:
    a, b = results
    t = Table(title=title)
    t.add_column("")
    for r in results:
        t.add_column(label(r), justify="right")
    t.add_column(f"{b['sequences']} / {a['sequences']}" if a["flag_passed"] else "2nd / 1st",
                 justify="right")
    for name, value, spec in rows:
        va, vb = value(a), value(b)
        if spec is None:
            t.add_row(name, va, vb, "")
        else:
            t.add_row(name, fmt(va, spec), fmt(vb, spec),
                      fmt(ratio(vb, va) if math.inf not in (va, vb) else None, ".2f"))
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences-a", type=int, default=1, help="the first daemon's --sequences")
    ap.add_argument("--sequences-b", type=int, default=4, help="the second daemon's --sequences")
    ap.add_argument("--agent-tokens", type=int, default=2400, help="the agent's prompt size")
    ap.add_argument("--editor-tokens", type=int, default=1000, help="the editor file's size")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats (median)")
    ap.add_argument("--max-tokens", type=int, default=16, help="per agent request")
    ap.add_argument("--seconds", type=float, default=60, help="the concurrent part's length")
    ap.add_argument("--n-ctx", type=int, default=4096, help="the daemons' context window")
    ap.add_argument("--numerics", choices=NUMERICS, default=DEFAULT_NUMERICS,
                    help="the daemons' numerics (assistd.ground.numerics)"
                         f" [default: {DEFAULT_NUMERICS}]")
    ap.add_argument("--transcript", type=Path, default=FIXTURE,
                    help="the agent's transcript [default: the shared aider fixture]")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args()
    work = build_workload(args)
    print(f"agent: {work['convo_tokens']} tokens of {work['convo_session']} (interleaved); "
          f"{len(work['calls'])} calls of up to {max(c['prompt_tokens'] for c in work['calls'])} "
          f"tokens (concurrent); editor: {work['editor_file'].name}, {work['editor_tokens']} "
          f"tokens", flush=True)
    if os.environ.get(NO_FLAG):
        print(f"{NO_FLAG} is set: --sequences is not passed; both daemons are the same",
              file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="mixed_load_") as tmp:
        results = [run_config(i, n, work, Path(tmp), args)
                   for i, n in enumerate((args.sequences_a, args.sequences_b))]
    console = Console(width=140)
    console.print(table(f"interleaved: agent ({work['convo_tokens']} tokens), editor "
                        f"({work['editor_tokens']} tokens), agent again; median of "
                        f"{args.repeats}, max_tokens {args.max_tokens}", INTERLEAVED, results))
    console.print(table(f"concurrent, {args.seconds:g} s: agent replaying {len(work['calls'])}"
                        f" calls (streamed) while the editor types every "
                        f"{INTERVAL_S * 1000:.0f} ms", CONCURRENT, results))
    for r in results:
        for e in r["concurrent"]["agent_errors"]:
            print(f"{label(r)}: agent error: {e}", file=sys.stderr)
    if args.json:  # a timed-out burst's latency is written as Infinity
        work = {**{k: v for k, v in work.items() if k != "convo"},
                "editor_file": str(work["editor_file"]),
                "calls": [{"session": c["session"], "prompt_tokens": c["prompt_tokens"]}
                          for c in work["calls"]]}
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "workload": work, "results": results}, indent=1))


if __name__ == "__main__":
    main()
