"""Typing latency of `assistd lsp`: a user re-types code in a ~2,000-token Python file.

    .venv/bin/python benchmarks/lsp_typing.py [--proposer suffix --proposer none] [--k auto]
        [--lines 30] [--interval-ms 100] [--pause-prob 0.3] [--seed 0] [--json FILE]
        [--max-latency-ms 250] [--max-prompt-tokens 1024] [--edit]
        [--open-buffers N --cross-file-tokens T] [--numerics fast|exact|llama]

The goal (issue 22): on this CPU with the embedded model, a 2,000-token Python file,
keystrokes every 100 ms, the time from the last keystroke to a single-line suggestion is
p50 <= 100 ms and p95 <= 250 ms, with the suggestions that grow after the budget cut
them; with ``--edit`` (the history holds an earlier version of the file) ``suffix``
reaches <= 0.8x plain decoding's p50; a suggestion the file goes on with is >= 20
characters on average.

Workload: the first public stdlib module (by name, 5.5-9.5 KB) of 1,800-2,200 Target
tokens (or ``--file``), opened with ``--lines`` consecutive lines deleted (seeded, after
the first 1,000 tokens: the prompt window is full) in a temporary repository whose
history is ``--history-files`` other stdlib modules, never the file itself. Each
``--proposer`` (``none``: plain decoding) gets a fresh server and history DB, in turn.
With the cursor at the end of the line before the gap, the user re-types the lines by
incremental ``didChange``, one keystroke every ``--interval-ms`` (Enter plus the line's
indentation is one keystroke: auto-indent), each followed by an ``inlineCompletion``
request as an editor sends (the server answers superseded ones empty). A burst ends at
each line's end and, with ``--pause-prob``, at a word's end: the user waits for that
answer (2 s at most), then types on. Per burst end: keystroke-to-answer latency; whether
the answer is a suggestion, single-line (no line break but a leading one: the end-of-line
"\\n<next line>"), type-through (the rest of an earlier suggestion: its id again), and
whether the file goes on with it (a proxy for the user accepting it). A burst unanswered
after 2 s counts as slower than any answer, in the single-line percentiles too. The server's
``assistd.stats`` counters (typing only) give prefix-cache reuse, reused / (reused +
evaluated) prompt tokens (the prompt's last token, evaluated by the first decode step, is
in neither), and cancelled work: tokens of cancelled generations / tokens generated,
requests cancelled before / during generation. One request before typing warms the
server up (model load, t(n) calibration, indexing, first prefill); its time is apart.

Time: keystrokes x interval + pauses + ~10 s start and warm-up: ~2.5 minutes per config
for the default 30 lines (901 keystrokes, 46 bursts). The CPU must be idle: beside a
test suite the server's llama.cpp forwards averaged ~380 ms (11-75 ms idle, docs/design.md,
'Reference measurements') and nearly every burst timed out; a CPU over 10% busy is warned about.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sys
import sysconfig
import tempfile
import time
from dataclasses import fields
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.ground.numerics import DEFAULT_NUMERICS, NUMERICS  # noqa: E402
from assistd.targets.open import default_model_path  # noqa: E402
from assistd.targets.llama import LlamaTarget  # noqa: E402
from editors.completer import Counters  # noqa: E402
from harness.ports import free_port  # noqa: E402
from harness.lsp import inline_params, insert, lsp_session, open_doc, stats  # noqa: E402
from harness.openai_server import start_llama_server, stop_llama_server  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
COUNTERS = [f.name for f in fields(Counters)]
WAIT_S = 2.0  # the longest a user waits for a suggestion after a burst


def utf16(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2  # LSP's default position unit


def pick_workload(args):
    """(file, text, its tokens, region start line, history files). The Target that counts
    tokens is closed before any server starts: 2 cores never run two models."""
    target = LlamaTarget(default_model_path(), n_ctx=512)
    try:
        mods = sorted(p for p in STDLIB.glob("*.py") if not p.name.startswith("_"))
        path = args.file or next(p for p in mods if 5_500 <= p.stat().st_size <= 9_500
                                 and 1_800 <= len(target.tokenize(p.read_text())) <= 2_200)
        text = path.read_text()
        lines = text.split("\n")
        starts = [0]
        for ln in lines:
            starts.append(starts[-1] + len(ln) + 1)
        # Region start a: the lines before it hold >= 1,000 tokens, line a has code.
        cands = [a for a in range(1, len(lines) - args.lines - 1) if lines[a].strip()
                 and len(target.tokenize(text[:starts[a]])) >= 1_000]
        n_tokens = len(target.tokenize(text))
    finally:
        target.close()
    if not cands:
        sys.exit(f"{path}: no {args.lines}-line region after the first 1,000 tokens")
    rng = random.Random(args.seed)
    others = [p for p in mods if p != path and 2_000 <= p.stat().st_size <= 50_000]
    return path, text, n_tokens, rng.choice(cands), rng.sample(others, args.history_files)


def keystrokes(region: list[str], rng: random.Random, p: float) -> list[tuple[str, bool]]:
    """[(text typed, burst ends after it)]: Enter + indentation, then each character."""
    keys = []
    for line in region:
        body = line.lstrip()
        keys.append(("\n" + line[: len(line) - len(body)], not body))
        for i, c in enumerate(body):
            word_end = i + 1 < len(body) and body[i + 1] == " " and c != " "
            keys.append((c, i == len(body) - 1 or (word_end and rng.random() < p)))
    return keys


def cpu_busy(seconds: float = 1.0) -> float | None:
    """The share of CPU time not idle over ``seconds`` (/proc/stat; None elsewhere). Not the
    load average: it decays over minutes and would blame the previous config's server."""
    def sample():
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
    except OSError:
        return None
    return 1 - (i1 - i0) / max(1, t1 - t0)


def pct(xs, q):
    return sorted(xs)[max(0, math.ceil(q * len(xs)) - 1)] if xs else None  # nearest rank


@contextlib.contextmanager
def remote_target(proposer: str, tmp: Path):
    """The arm ``remote``: the same model behind llama-cpp-python's OpenAI-compatible
    server on loopback (harness/openai_server.py), the LSP server's Target a
    :class:`RemoteTarget` (``backend`` openai; the GGUF given for its tokenizer, read
    here). Yields the settings that select it ({} for the local arms)."""
    if proposer != "remote":
        yield {}
        return
    port = free_port()
    server = start_llama_server(port, tmp / "llama_server.log")
    try:
        yield {"proposer": "none", "backend": "openai", "targetUrl": f"http://127.0.0.1:{port}",
               "model": str(default_model_path())}
    finally:
        stop_llama_server(server)


async def run_config(work, proposer: str, args) -> dict:
    path, text, _, a, history = work
    lines = text.split("\n")
    doc = "\n".join(lines[:a] + lines[a + args.lines:])
    with tempfile.TemporaryDirectory(prefix="lsp_typing_") as tmp:
        repo = Path(tmp) / "repo"
        (repo / ".git").mkdir(parents=True)
        for h in history:
            (repo / h.name).write_text(h.read_text())
        if args.edit:
            # The edit situation: the history holds an earlier version of the buffer
            # (the re-typed lines as they were, one in five missing: lines this edit
            # adds), as a copy beside it: the open buffer takes the place of its own
            # path's document in the live history, so an old version at that path
            # would be gone from it.
            region = lines[a:a + args.lines]
            old = lines[:a] + [x for i, x in enumerate(region) if i % 5 != 4] + lines[a + args.lines:]
            (repo / f"old_{path.name}").write_text("\n".join(old))
        k = args.k if args.k == "auto" else int(args.k)
        settings = {"proposer": proposer, "k": k, "maxLatencyMs": args.max_latency_ms,
                    "maxPromptTokens": args.max_prompt_tokens,
                    "crossFileTokens": args.cross_file_tokens, "numerics": args.numerics}
        with remote_target(proposer, Path(tmp)) as remote:
            async with lsp_session(Path(tmp) / "history.db", root=repo,
                                   settings={**settings, **remote}) as (client, _):
                for h in history[:args.open_buffers]:  # open beside it: cross-file context
                    open_doc(client, repo / h.name, h.read_text())
                uri = open_doc(client, repo / path.name, doc)
                line, char = a - 1, utf16(lines[a - 1])
                t0 = time.perf_counter()
                await client.text_document_inline_completion_async(inline_params(uri, line, char))
                warmup_ms = (time.perf_counter() - t0) * 1000
                before = (await stats(client))["server"]
                seen: set[str] = set()  # suggestion ids answered so far
                trace = []  # every request: [keystroke #, ms to its answer, suggestion, type-through]

                errors = []  # JSON-RPC errors answered (a server bug: there should be none)

                async def timed(coro, n, t_key):
                    try:
                        res = await coro
                    except Exception as e:  # noqa: BLE001 - recorded and reported, not fatal
                        errors.append(f"keystroke {n}: {e!r}")
                        return None, False, time.perf_counter()
                    done = time.perf_counter()
                    item = res.items[0] if res and res.items else None
                    sid = item.command.arguments[0]["id"] if item else None
                    again = sid is not None and sid in seen  # type-through: an earlier suggestion's id
                    seen.add(sid)
                    s = item.insert_text if item else None
                    trace.append([n, round((done - t_key) * 1000, 1), s, again])
                    return s, again, done

                keys = keystrokes(lines[a:a + args.lines], random.Random(args.seed), args.pause_prob)
                orig = sum(len(x) + 1 for x in lines[:a]) - 1  # the cursor's offset in `text`
                futures, bursts = [], []
                t_start = t_next = time.perf_counter()
                for n, (key, burst_end) in enumerate(keys):
                    await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
                    t_key = time.perf_counter()
                    insert(client, uri, n + 2, line, char, key)
                    if key[0] == "\n":
                        line, char = line + 1, len(key) - 1
                    else:
                        char += utf16(key)
                    orig += len(key)
                    futures.append(asyncio.ensure_future(timed(
                        client.text_document_inline_completion_async(inline_params(uri, line, char)),
                        n, t_key)))
                    await asyncio.sleep(0)  # send it now, right after its didChange
                    t_next = t_key + args.interval_ms / 1000
                    if not burst_end:
                        continue
                    try:
                        s, again, done = await asyncio.wait_for(asyncio.shield(futures[-1]), WAIT_S)
                    except asyncio.TimeoutError:
                        bursts.append({"ms": math.inf, "text": None, "timeout": True})
                        continue
                    bursts.append({"ms": (done - t_key) * 1000, "text": s, "type_through": again,
                                   "single": s is not None and "\n" not in s.removeprefix("\n"),
                                   "matched": s is not None and text.startswith(s, orig)})
                    t_next = max(t_next, time.perf_counter())  # type on once the answer is seen
                typing_s = time.perf_counter() - t_start
                await asyncio.gather(*futures)
                report = await stats(client)
                after = report["server"]
                tuner = [{k: e.get(k) for k in ("language", "proposer", "steps", "rounds", "coverage",
                                                "acceptance_rate", "chosen_k", "expected_speedup")}
                         for e in report["ledger"]["entries"]]
                messages = [m.message for m in client.messages]
    d = {k: after[k] - before[k] for k in COUNTERS}  # typing only: the warm-up excluded
    shown = [b for b in bursts if b["text"]]
    single = [b["ms"] for b in bursts if b.get("single") or b.get("timeout")]
    every = [b["ms"] for b in bursts]
    reuse_den = d["prompt_tokens_reused"] + d["prompt_tokens_evaluated"]
    p50, p95 = pct(single, 0.5), pct(single, 0.95)
    return {
        "proposer": proposer, "k": args.k, "max_latency_ms": args.max_latency_ms,
        "max_prompt_tokens": args.max_prompt_tokens, "keystrokes": len(keys), "bursts": len(bursts),
        "typing_s": round(typing_s, 1), "warmup_ms": round(warmup_ms),
        "timeouts": sum(b["ms"] == math.inf for b in bursts),
        "errors": errors, "server_messages": messages,
        "with_suggestion": len(shown), "single_line": sum(bool(b.get("single")) for b in bursts),
        "single_p50_ms": p50, "single_p95_ms": p95, "single_max_ms": max(single, default=None),
        "all_p50_ms": pct(every, 0.5), "all_p95_ms": pct(every, 0.95),
        "all_max_ms": max(every, default=None),
        "type_through_bursts": sum(b["type_through"] for b in shown),
        "matched": sum(b["matched"] for b in shown),
        "matched_chars": sum(len(b["text"]) for b in shown if b["matched"]),
        "prefix_reuse": d["prompt_tokens_reused"] / reuse_den if reuse_den else None,
        "cancelled_token_share": d["tokens_cancelled"] / d["tokens_generated"]
        if d["tokens_generated"] else None,
        "mean_matched_chars": sum(len(b["text"]) for b in shown if b["matched"])
        / max(1, sum(b["matched"] for b in shown)),
        "edit": args.edit, "tuner": tuner,
        "server": d, "goal_met": p50 is not None and p50 <= 100 and p95 <= 250,
        "trace": sorted(trace),
    }


def fmt(v, spec=".0f"):
    if v == math.inf:
        return f">{WAIT_S * 1000:.0f}"
    return "n/a" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def label(r):
    if r["proposer"] in ("none", "remote"):
        return {"none": "none (plain decoding)", "remote": "remote (llama_cpp.server)"}[r["proposer"]]
    return f"{r['proposer']} k={r['k']}"


def ms3(r, kind):
    return " / ".join(fmt(r[f"{kind}_{q}_ms"]) for q in ("p50", "p95", "max"))


ROWS = [  # (label, the cell of one result)
    ("keystrokes / bursts", lambda r: f"{r['keystrokes']} / {r['bursts']}"),
    ("bursts unanswered after 2 s / errors", lambda r: f"{r['timeouts']} / {len(r['errors'])}"),
    ("with suggestion / single-line", lambda r: f"{r['with_suggestion']} / {r['single_line']}"),
    ("single-line ms p50 / p95 / max", lambda r: ms3(r, "single")),
    ("all bursts ms p50 / p95 / max", lambda r: ms3(r, "all")),
    ("type-through: bursts; requests", lambda r: f"{r['type_through_bursts']}; "
     f"{r['server']['type_through']} of {r['server']['requests']}"),
    ("suggestion the file goes on with", lambda r: f"{r['matched']} ({r['matched_chars']} chars)"),
    ("chars per suggestion the file goes on with (goal >= 20)",
     lambda r: fmt(r["mean_matched_chars"], ".1f")),
    ("prefix-cache reuse (tokens reused / evaluated)", lambda r: f"{fmt(r['prefix_reuse'], '.3f')}"
     f" ({r['server']['prompt_tokens_reused']} / {r['server']['prompt_tokens_evaluated']})"),
    ("generations (cancelled before start / during)", lambda r: f"{r['server']['generations']} "
     f"({r['server']['cancelled_before_start']} / {r['server']['cancelled_during']})"),
    ("tokens cancelled / generated", lambda r: f"{r['server']['tokens_cancelled']} / "
     f"{r['server']['tokens_generated']} ({fmt(r['cancelled_token_share'], '.2f')})"),
    ("warm-up ms / typing s", lambda r: f"{r['warmup_ms']} / {r['typing_s']}"),
    ("goal p50 <= 100, p95 <= 250", lambda r: "met" if r["goal_met"] else "NOT met"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proposer", action="append", choices=["suffix", "ngram", "none", "remote"],
                    help="repeatable: one fresh server each, in order; remote: plain decoding"
                         " by llama-cpp-python's server on loopback [default: suffix]")
    ap.add_argument("--k", default="auto", help="draft ceiling, or auto (the tuner)")
    ap.add_argument("--lines", type=int, default=30, help="lines re-typed")
    ap.add_argument("--max-latency-ms", type=int, default=250,
                    help="the server's time budget per suggestion (setting maxLatencyMs; 0 = none)")
    ap.add_argument("--max-prompt-tokens", type=int, default=1024,
                    help="the server's prompt window (setting maxPromptTokens)")
    ap.add_argument("--interval-ms", type=float, default=100)
    ap.add_argument("--pause-prob", type=float, default=0.3, help="a burst ends at a word's end")
    ap.add_argument("--history-files", type=int, default=6)
    ap.add_argument("--edit", action="store_true",
                    help="the history holds an earlier version of the file (1 in 5 of the"
                         " re-typed lines missing): the edit situation")
    ap.add_argument("--open-buffers", type=int, default=0,
                    help="history files also open in the editor (cross-file context)")
    ap.add_argument("--cross-file-tokens", type=int, default=0,
                    help="the server's setting crossFileTokens (0 = off, its default)")
    ap.add_argument("--file", type=Path, help="the document [default: chosen from the stdlib]")
    ap.add_argument("--numerics", choices=NUMERICS, default=DEFAULT_NUMERICS,
                    help="the server's Target's numerics (its setting numerics;"
                         " assistd.ground.numerics)"
                         f" [default: {DEFAULT_NUMERICS}]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args()
    work = pick_workload(args)
    path, _, n_tokens, a, history = work
    print(f"{path.name}: {n_tokens} tokens; re-typing lines {a + 1}-{a + args.lines}; history: "
          f"{', '.join(h.name for h in history)}", flush=True)
    results = []
    for proposer in args.proposer or ["suffix"]:
        busy = cpu_busy()
        if busy is not None and busy > 0.1:
            print(f"warning: the CPU is {busy:.0%} busy before {proposer}: latencies will be "
                  "inflated (llama.cpp threads wait for busy cores)", file=sys.stderr)
        r = asyncio.run(run_config(work, proposer, args))
        r["cpu_busy_before"] = busy
        results.append(r)
        print(f"{label(r)}: single-line p50 {fmt(r['single_p50_ms'])} ms, p95 "
              f"{fmt(r['single_p95_ms'])} ms (n={r['single_line']}, {r['timeouts']} timeouts); "
              f"reuse {fmt(r['prefix_reuse'], '.3f')}; cancelled tokens "
              f"{fmt(r['cancelled_token_share'], '.2f')}; goal "
              f"{'met' if r['goal_met'] else 'NOT met'}", flush=True)
        for m in r["errors"] + r["server_messages"]:
            print(f"  {m}", file=sys.stderr)
    table = Table(title=f"assistd lsp: re-typing {args.lines} lines of {path.name} "
                        f"({n_tokens} tokens), a keystroke every {args.interval_ms:g} ms")
    table.add_column("")
    for r in results:
        table.add_column(label(r), justify="right")
    for name, cell in ROWS:
        table.add_row(name, *(cell(r) for r in results))
    Console(width=140).print(table)
    plain = next((r for r in results if r["proposer"] == "none"), None)
    for r in results:
        if plain is not None and r is not plain and r["single_p50_ms"] and plain["single_p50_ms"]:
            ratio = r["single_p50_ms"] / plain["single_p50_ms"]
            goal = " (goal with --edit: <= 0.80)" if args.edit else ""
            print(f"{label(r)} / plain, single-line p50: {ratio:.2f}x{goal}")
    if args.json:  # a timed-out burst's latency is written as Infinity
        args.json.write_text(json.dumps({
            "file": path.name, "tokens": n_tokens, "region_line": a + 1,
            "args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1))


if __name__ == "__main__":
    main()
