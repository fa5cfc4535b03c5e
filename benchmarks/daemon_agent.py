"""An agent's model calls replayed through `assistd serve`: suffix vs plain decoding.

    .venv/bin/python benchmarks/daemon_agent.py [--transcripts PATH ...] [--max-calls 16]
        [--max-tokens 128] [--n-ctx 4096] [--k auto] [--threads N] [--language ID]
        [--no-gap-check] [--json FILE]

The issue's goal: replaying an agent's model calls from a real transcript through
/v1/chat/completions with the agent's earlier sessions in the history: tokens/s vs
plain decoding of the same Target, same run.

Workload. ``--transcripts`` names transcript files (read in place, never copied into the
repository): the last file's session is replayed, the earlier ones are the history. One
aider history alone (the default: the shared fixture, 515 runs of aider's own
development) is split at its ``# aider chat started at`` lines instead: the last runs are
replayed, every run before them is the history. A session's model calls: each group of
consecutive model turns (assistant prose, tool-call inputs) is one call whose messages
are the turns before it (user and tool results as ``user``, model turns as
``assistant``, ``system``; consecutive turns of one role merged). The prompt must leave
``--max-tokens`` of the context: the oldest messages are dropped (the system message
kept) and a message alone over the window keeps its tail.

History. The daemon gives a transcript record the scope of its ``cwd`` (the repository
root), and a request can only name a scope that is a directory on this machine
(``Service.scope_job``): the fixtures' projects (``/Users/...``) are not. So the
earlier sessions are re-homed, in a temporary folder that is deleted at the end, into a
temporary project P: an aider history becomes ``P/.aider.chat.history.md`` (the
watcher's rule gives it P's scope), a Claude Code / Codex / JSONL record's ``cwd``
becomes P, a Gemini CLI session moves under ``<sha256(P)>/chats``. Formats that record
no project (SWE-agent, mini-swe-agent, OpenHands) cannot be re-homed: their scope is
reported, and the history does not serve the replay. The daemon runs with ``--repo P
--transcripts FILE ...``; measuring starts once its watcher is ``watching``; every
request carries ``assistd.scope = P``.

Measure. Every call's prompt is first prefilled by a request of one token (apart), so
that the measured requests all reuse it; then the call is sent once per arm, greedy
(temperature 0), the arms' order rotating from call to call (drift cancels out):
``suffix`` with the history scope P, ``suffix, no history`` with the scope of an empty
project (the live request alone: the history's share is the difference), and ``none``
(plain decoding through the same loop and Target). Per arm, from the ledgers: committed
tokens, decode ms (total_ms - prefill_ms), tokens/s = committed / decode s, speedup =
tokens/s(arm) / tokens/s(none); the wall clock (HTTP and queue included) beside it; draft
acceptance rate C / D, mean acceptance length 1 + C / R, coverage R / (R + plain steps);
prefix-cache reuse apart. Greedy speculation equals plain greedy only up to
floating-point near-ties (docs/design.md, 'Exactness'): differing texts are counted, never fatal, and
each is decoded again here plainly, one token at a time, for the Target's top-2 logit gap
at the first differing token (``--no-gap-check`` skips it).

Time: the daemon's model load and history scan (5 s for the aider history on idle cores), then per
call one prefill of up to ``--n-ctx`` tokens (~40 s for 4,000 tokens on 2 cores) and three
generations of ``--max-tokens`` (30-130 tokens/s), then the gap check's plain decodes:
``--max-calls 16`` takes ~6-9 minutes. The CPU must be idle; a busy one is warned about.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.measure.bench_workloads import aider_runs, fit, model_calls  # noqa: E402
from assistd.ground.numerics import first_difference  # noqa: E402
from assistd.runtime.chat import chat_prompt_ids  # noqa: E402
from assistd.measure.replay_inputs import transcript_session  # noqa: E402
from assistd.targets.open import default_model_path  # noqa: E402
from assistd.targets.llama import LlamaTarget  # noqa: E402
from storage.transcripts import HEAD_BYTES, detect_format, open_bytes  # noqa: E402
from benchmarks.lsp_typing import cpu_busy  # noqa: E402
from harness.daemon import start_daemon  # noqa: E402

FIXTURES = ROOT.parent / "shared" / "fixtures" / "transcripts"
DEFAULT = FIXTURES / "aider" / "aider__tests_fixtures_chat-history.TRUNCATED.md"
# Arms: (name, proposer, scope): P = the project with the earlier sessions, Q = an empty
# project (the same proposer drafting from the live request alone: the history's share).
ARMS = (("suffix", "suffix", "P"), ("suffix, no history", "suffix", "Q"), ("none", "none", "P"))
MARGIN_TOKENS = 8  # the prompt budget's slack below n_ctx - max_tokens - 1


# -- workload ----------------------------------------------------------------------------


def rehome(path: Path, project: Path, tmp: Path, i: int) -> tuple[Path | None, str]:
    """A history transcript as the daemon would see it had the agent run in ``project``:
    (file to pass with --transcripts or None when it went to P's aider history, how)."""
    fmt = detect_format(path, open_bytes(path, max_bytes=HEAD_BYTES))
    if fmt == "aider":
        with open(project / ".aider.chat.history.md", "a") as f:
            f.write(path.read_text(errors="replace"))
        return None, "aider history of P"

    def swap(x):
        if isinstance(x, dict):
            return {k: str(project) if k == "cwd" and isinstance(v, str) else swap(v)
                    for k, v in x.items()}
        return [swap(v) for v in x] if isinstance(x, list) else x

    raw = path.read_text(errors="replace")
    try:
        # Unchanged without a cwd: format detection reads the first bytes as written.
        out = json.dumps(swap(json.loads(raw))) if '"cwd"' in raw else raw
    except json.JSONDecodeError:  # JSON lines
        lines = []
        for line in raw.splitlines():
            try:
                lines.append(json.dumps(swap(json.loads(line))))
            except json.JSONDecodeError:
                lines.append(line)
        out = "\n".join(lines) + "\n"
    if fmt and fmt.startswith("gemini"):
        d = tmp / "gemini" / hashlib.sha256(str(project).encode()).hexdigest() / "chats"
        how = "moved under sha256(P)/chats"
    else:
        d = tmp / "history" / f"{i:02d}"
        how = "cwd -> P" if '"cwd"' in raw else "no cwd recorded: not re-homed (see its scope)"
    d.mkdir(parents=True, exist_ok=True)
    (d / path.name).write_text(out)
    return d / path.name, how


def build_workload(args, tmp: Path, project: Path) -> dict:
    """Calls to replay, history files for the daemon (re-homed), and the history text."""
    paths = [Path(p) for p in args.transcripts] if args.transcripts else [DEFAULT]
    for p in paths:
        if not p.is_file():
            sys.exit(f"transcript not found: {p}"
                     + ("" if args.transcripts else "; pass --transcripts FILE ..."))
    history_files, notes = [], []
    fmt = detect_format(paths[-1], open_bytes(paths[-1], max_bytes=HEAD_BYTES))
    if len(paths) == 1 and fmt == "aider":
        runs = aider_runs(paths[0].read_text(errors="replace"))
        replay_dir = tmp / "replay"
        replay_dir.mkdir()
        sessions, n_calls, first = [], 0, len(runs)
        while first > 1 and n_calls < args.max_calls:  # the last runs, enough calls
            first -= 1
            f = replay_dir / f"run-{first:04d}.md"
            f.write_text(runs[first])
            s = transcript_session(f, "aider")
            s.name = f"{paths[0].name} run {first + 1}/{len(runs)}"
            n = len(model_calls(s))
            if n:
                sessions.insert(0, s)
                n_calls += n
        history_text = "".join(runs[:first])
        (project / ".aider.chat.history.md").write_text(history_text)
        notes.append(f"{paths[0].name}: runs 1-{first} -> P/.aider.chat.history.md "
                     f"(history), runs {first + 1}-{len(runs)} replayed")
    else:
        sessions = [transcript_session(paths[-1])]
        history_text = ""
        for i, p in enumerate(paths[:-1]):
            f, how = rehome(p, project, tmp, i)
            if f is not None:
                history_files.append(f)
            notes.append(f"{p.name}: {how}")
            history_text += "\n".join(t.text for t in transcript_session(p).turns)
    calls = []
    for s in sessions:
        for c in model_calls(s):
            calls.append({**c, "session": s.name})
    return {"sessions": [s.name for s in sessions], "calls": calls[: args.max_calls],
            "calls_available": len(calls), "history_files": history_files,
            "history_text": history_text, "notes": notes, "paths": [str(p) for p in paths]}


def fit_all(calls: list[dict], n_ctx: int, max_tokens: int) -> None:
    """Fit every call's prompt to the window with the Target's own tokenizer and
    template (a small context: only tokenizing), closed before the daemon starts."""
    target = LlamaTarget(default_model_path(), n_ctx=256)
    try:
        budget = n_ctx - max_tokens - 1 - MARGIN_TOKENS
        for c in calls:
            c["messages"], c["prompt_tokens"], c["dropped"] = fit(target, c["messages"], budget)
    finally:
        target.close()


# -- measuring ------------------------------------------------------------------------


def wait_watching(daemon, timeout_s: float = 900) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = daemon.status()
        w = st.get("watcher") or {}
        if w.get("state") == "watching":
            return st
        if w.get("state") in ("failed", "stopped"):
            sys.exit(f"the daemon's watcher is {w.get('state')}: {(w.get('error') or w.get('off_reason'))}")
        time.sleep(0.5)
    sys.exit("the daemon's watcher did not finish its initial scan in time")


def history_sources(db: Path) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "assistd", "history", "sources", "--json",
                          "--db", str(db)], capture_output=True, text=True, cwd=ROOT)
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        return [{"error": out.stderr[-500:]}]


def chat(client, messages, proposer: str, args, scope: str, max_tokens=None) -> dict:
    body = {"model": "assistd", "messages": messages,
            "max_tokens": max_tokens or args.max_tokens,
            "temperature": 0, "assistd": {"proposer": proposer, "scope": scope,
                                          "k": args.k if args.k == "auto" else int(args.k)}}
    if args.language:
        body["assistd"]["language"] = args.language
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    wall_ms = (time.perf_counter() - t0) * 1000
    if r.status_code != 200:
        return {"error": f"HTTP {r.status_code}: {r.text[:300]}", "wall_ms": wall_ms}
    data = r.json()
    return {"text": data["choices"][0]["message"]["content"],
            "finish_reason": data["choices"][0]["finish_reason"],
            "ledger": data["usage"]["assistd"]["ledger"], "wall_ms": wall_ms}


def longest_common(out: str, hay: str) -> str:
    """The longest substring of ``out`` found in ``hay`` (one growing window: O(len(out))
    substring searches)."""
    best = ""
    for i in range(len(out)):
        while i + len(best) < len(out) and out[i:i + len(best) + 1] in hay:
            best = out[i:i + len(best) + 1]
    return best


def totals(runs: list[dict]) -> dict:
    """Sums of the ledgers' raw counters; rates computed here (docs/design.md, 'Vocabulary')."""
    keys = ("committed_tokens", "draft_tokens", "accepted_tokens", "rounds", "plain_steps",
            "prompt_tokens_reused", "prompt_tokens_evaluated")
    t = {k: sum(r["ledger"][k] for r in runs) for k in keys}
    t["total_ms"] = sum(r["ledger"]["total_ms"] for r in runs)
    t["prefill_ms"] = sum(r["ledger"]["prefill_ms"] for r in runs)
    t["decode_ms"] = t["total_ms"] - t["prefill_ms"]
    t["draft_ms"] = sum(r["ledger"]["draft_ms"] for r in runs)
    t["verify_ms"] = sum(r["ledger"]["verify_ms"] for r in runs)
    t["wall_ms"] = sum(r["wall_ms"] for r in runs)
    t["tokens_per_s"] = t["committed_tokens"] / (t["decode_ms"] / 1000) if t["decode_ms"] else None
    t["wall_tokens_per_s"] = t["committed_tokens"] / (t["wall_ms"] / 1000) if t["wall_ms"] else None
    t["acceptance_rate"] = t["accepted_tokens"] / t["draft_tokens"] if t["draft_tokens"] else None
    t["mean_acceptance_length"] = 1 + t["accepted_tokens"] / t["rounds"] if t["rounds"] else None
    steps = t["rounds"] + t["plain_steps"]
    t["coverage"] = t["rounds"] / steps if steps else None
    return t


def near_ties(calls: list[dict], results: list[dict], n_ctx: int, max_tokens: int) -> None:
    """For every call whose texts differ from plain decoding's: decode it again here,
    plainly, one token at a time, from a fresh prefill, and read the Target's top-2 logit
    gap at the first differing token (docs/design.md, 'Exactness': a divergence is a near-tie
    when that gap is small, e.g. < 0.1). The gap is only read where this local plain decode
    still agrees with the daemon's ``none`` text; where it does not (plain decoding
    itself differs: the daemon's prompt KV was computed in other batches, by earlier
    requests sharing the prefix), the gap at that earlier difference is noted instead.
    Adds ``first_diff_char`` and ``gap`` to each differing arm's result, and
    ``local_diff_char`` / ``local_gap`` to the ``none`` result."""
    from assistd.decoding.engine import generate

    todo = [(c, r) for c, r in zip(calls, results) if "error" not in r["none"] and any(
        "error" not in r[a] and r[a]["text"] != r["none"]["text"] for a, _, _ in ARMS)]
    if not todo:
        return
    target = LlamaTarget(default_model_path(), n_ctx=n_ctx)
    try:
        for c, r in todo:
            prompt = chat_prompt_ids(target, c["messages"])
            gen = generate(target, prompt, None, max_tokens=max_tokens, k=0, trace=True,
                           reuse_prefix=False)
            plain = r["none"]["text"]
            ends = [len(target.detokenize(gen.tokens[: j + 1], prev=prompt))
                    for j in range(len(gen.tokens))]  # text length after token j

            def gap_at(char):
                tok = next((j for j, e in enumerate(ends) if e > char), None)
                return None if tok is None else float(gen.top2_gaps[tok])

            local = first_difference(gen.text, plain)
            if local is not None:
                r["none"]["local_diff_char"], r["none"]["local_gap"] = local, gap_at(local)
            for name, _, _ in ARMS:
                other = r[name]
                at = first_difference(other.get("text", plain), plain)
                if name == "none" or "error" in other or at is None:
                    continue
                other["first_diff_char"] = at
                other["gap"] = gap_at(at) if local is None or local > at else None
    finally:
        target.close()


def fmt(v, spec=".2f"):
    return "n/a" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def ratio(a, b):
    return a / b if a is not None and b else None


ROWS = [  # (label, key, format, ratio to none shown)
    ("committed tokens", "committed_tokens", "d", False),
    ("decode ms (ledger total - prefill)", "decode_ms", ".0f", True),
    ("tokens/s (decode)", "tokens_per_s", ".1f", True),
    ("wall ms (HTTP, queue included)", "wall_ms", ".0f", True),
    ("tokens/s (wall clock)", "wall_tokens_per_s", ".1f", True),
    ("draft ms / verify ms", None, None, False),
    ("rounds / plain steps", None, None, False),
    ("draft tokens / accepted", None, None, False),
    ("draft acceptance rate C/D", "acceptance_rate", ".3f", False),
    ("mean acceptance length 1+C/R", "mean_acceptance_length", ".2f", False),
    ("coverage R/S", "coverage", ".3f", False),
    ("prompt tokens reused / evaluated", None, None, False),
]


def cell(t: dict, label: str, key, spec) -> str:
    if key is not None:
        return fmt(t[key], spec) if not isinstance(t[key], int) else f"{t[key]:,}"
    if label.startswith("draft ms"):
        return f"{t['draft_ms']:.0f} / {t['verify_ms']:.0f}"
    if label.startswith("rounds"):
        return f"{t['rounds']} / {t['plain_steps']}"
    if label.startswith("draft tokens"):
        return f"{t['draft_tokens']} / {t['accepted_tokens']}"
    return f"{t['prompt_tokens_reused']:,} / {t['prompt_tokens_evaluated']:,}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transcripts", nargs="+", metavar="PATH",
                    help="transcript files: the last is replayed, the earlier ones are the "
                         "history; one aider history is split into runs [default: the shared "
                         "aider fixture]")
    ap.add_argument("--max-calls", type=int, default=16, help="model calls replayed")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=4096, help="the daemon's context window")
    ap.add_argument("--k", default="auto", help="suffix's draft ceiling, or auto (the tuner)")
    ap.add_argument("--threads", type=int,
                    help="the Target's CPU threads (ASSISTD_THREADS) [default: the daemon's, "
                         "all cores]; 1 is steadier beside other work on the cores")
    ap.add_argument("--language", help="assistd.language of every request [default: none sent]")
    ap.add_argument("--no-gap-check", action="store_true",
                    help="skip re-decoding differing calls for their top-2 logit gap")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="daemon_agent_") as tmp_name:
        tmp = Path(tmp_name)
        project = (tmp / "project").resolve()
        (project / ".git").mkdir(parents=True)  # a repository root: a scope requests can name
        (project / ".gitignore").write_text(".aider*\n")  # as aider writes it
        empty = (tmp / "empty").resolve()
        (empty / ".git").mkdir(parents=True)
        scopes = {"P": str(project), "Q": str(empty)}
        work = build_workload(args, tmp, project)
        calls = work["calls"]
        if not calls:
            sys.exit("no model calls to replay in " + ", ".join(work["sessions"]))
        fit_all(calls, args.n_ctx, args.max_tokens)
        print(f"replaying {len(calls)} of {work['calls_available']} model calls of "
              f"{'; '.join(work['sessions'])}", flush=True)
        for n in work["notes"]:
            print(f"  history: {n}")
        print(f"  prompt tokens: {sum(c['prompt_tokens'] for c in calls):,} in all, max "
              f"{max(c['prompt_tokens'] for c in calls):,}; messages dropped to fit "
              f"n_ctx={args.n_ctx}: {sum(c['dropped'] for c in calls)}", flush=True)

        extra = ["--n-ctx", str(args.n_ctx), "--repo", str(project), "--repo", str(empty)]
        for f in work["history_files"]:
            extra += ["--transcripts", str(f)]
        if args.threads:
            os.environ["ASSISTD_THREADS"] = str(args.threads)  # start_daemon passes it on
        t0 = time.perf_counter()
        daemon = start_daemon(tmp / "daemon", *extra)
        try:
            status = wait_watching(daemon)
            ready_s = time.perf_counter() - t0
            sources = history_sources(daemon.db)
            scan = (status["watcher"] or {}).get("initial_scan") or {}
            print(f"daemon ready in {ready_s:.1f} s (model load + history scan); sources:",
                  flush=True)
            for s in sources:
                print(f"  {s}")
            if not any(s.get("source") == str(project) and s.get("kind") == "transcript"
                       and s.get("documents") for s in sources):
                print(f"warning: no transcript in scope {project}: suffix drafts from the "
                      "prompt alone", file=sys.stderr)
            busy = cpu_busy()
            if busy is not None and busy > 0.1:
                print(f"warning: the CPU is {busy:.0%} busy: tokens/s will be low and noisy "
                      "(llama.cpp's threads wait for busy cores)", file=sys.stderr)
            results, errors, prime_ms = [], [], 0.0
            with daemon.uds(timeout=900) as client:
                for _, p, sc in ARMS:  # warm-up: tuner, cost model, scopes loaded
                    chat(client, [{"role": "user", "content": "Say hello."}], p, args,
                         scopes[sc])
                t_run = time.perf_counter()
                for i, c in enumerate(calls):
                    # Prime: the prompt's prefill, apart, so every arm reuses all of it.
                    pr = chat(client, c["messages"], "none", args, scopes["P"], max_tokens=1)
                    prime_ms += pr.get("ledger", {}).get("prefill_ms", 0.0)
                    res = {}
                    for a in range(len(ARMS)):  # the order rotates with the call
                        name, p, sc = ARMS[(a + i) % len(ARMS)]
                        res[name] = chat(client, c["messages"], p, args, scopes[sc])
                        if "error" in res[name]:
                            errors.append(f"call {i + 1} {name}: {res[name]['error']}")
                    results.append(res)
                    if any("error" in x for x in res.values()):
                        print(f"call {i + 1:>3}: error", flush=True)
                        continue
                    s, h, n = (res[a]["ledger"] for a in
                               ("suffix", "suffix, no history", "none"))
                    same = "".join("=" if res[a]["text"] == res["none"]["text"] else "x"
                                   for a in ("suffix", "suffix, no history"))
                    print(f"call {i + 1:>3}/{len(calls)}: prompt {c['prompt_tokens']:>5}, "
                          f"{n['committed_tokens']:>3} tokens; tok/s suffix "
                          f"{fmt(s['tokens_per_s'], '.1f')}, no history "
                          f"{fmt(h['tokens_per_s'], '.1f')}, none "
                          f"{fmt(n['tokens_per_s'], '.1f')} "
                          f"({fmt(ratio(s['tokens_per_s'], n['tokens_per_s']))}x); accepted "
                          f"{s['accepted_tokens']}/{s['draft_tokens']}; same text as none: "
                          f"{same}", flush=True)
                run_s = time.perf_counter() - t_run
            final_status = daemon.status()
        finally:
            daemon.stop()
            log_tail = daemon.log.read_text()[-3000:] if daemon.log.exists() else ""

        ok = [(c, r) for c, r in zip(calls, results) if not any("error" in x for x in r.values())]
        if not args.no_gap_check:
            print("re-decoding the calls whose texts differ, for the top-2 logit gaps ...",
                  flush=True)
            near_ties([c for c, _ in ok], [r for _, r in ok], args.n_ctx, args.max_tokens)
        tot = {a: totals([r[a] for _, r in ok]) for a, _, _ in ARMS}
        per_call = []
        for i, (c, r) in enumerate(ok):
            per_call.append({
                "call": i + 1, "session": c["session"], "prompt_tokens": c["prompt_tokens"],
                "dropped_messages": c["dropped"],
                "speedup": ratio(r["suffix"]["ledger"]["tokens_per_s"],
                                 r["none"]["ledger"]["tokens_per_s"]),
                "speedup_no_history": ratio(r["suffix, no history"]["ledger"]["tokens_per_s"],
                                            r["none"]["ledger"]["tokens_per_s"]),
                "arms": r, "reference": c["reference"][:2000],
                "prompt_text": "\n".join(m["content"] for m in c["messages"]),
            })
        top = sorted((p for p in per_call if p["speedup"] is not None),
                     key=lambda p: -p["speedup"])[:3]
        for p in top:
            out = p["arms"]["suffix"]["text"]
            p["longest_in_prompt"] = longest_common(out, p["prompt_text"])
            p["longest_in_history"] = longest_common(out, work["history_text"])

    names = [a for a, _, _ in ARMS]
    table = Table(title=f"assistd serve: {len(ok)} model calls of {'; '.join(work['sessions'])}"
                        f" via /v1/chat/completions, greedy, max_tokens {args.max_tokens}, "
                        f"k={args.k}; prefill apart")
    table.add_column("")
    for a in names:
        table.add_column(a + (" (plain decoding)" if a == "none" else ""), justify="right")
    for a in names[:-1]:
        table.add_column(f"{a} / none", justify="right")
    for label, key, spec, show in ROWS:
        table.add_row(label, *(cell(tot[a], label, key, spec) for a in names),
                      *(fmt(ratio(tot[a][key], tot["none"][key])) if show else ""
                        for a in names[:-1]))
    speedup = {a: ratio(tot[a]["tokens_per_s"], tot["none"]["tokens_per_s"]) for a in names[:-1]}
    wall = {a: ratio(tot[a]["wall_tokens_per_s"], tot["none"]["wall_tokens_per_s"])
            for a in names[:-1]}
    table.add_row("speedup: tokens/s vs none (decode; wall)", *(
        f"{fmt(speedup[a])}; {fmt(wall[a])}" for a in names[:-1]), "", *([""] * 2))
    differ = {a: [p for p in per_call if p["arms"][a]["text"] != p["arms"]["none"]["text"]]
              for a in names[:-1]}
    table.add_row("texts differing from none", *(f"{len(differ[a])} of {len(ok)}"
                                                 for a in names[:-1]), "", "", "")
    gaps = {a: [p["arms"][a].get("gap") for p in differ[a]] for a in names[:-1]}
    table.add_row("  top-2 gap at the first difference: max (n)", *(
        f"{fmt(max((g for g in gaps[a] if g is not None), default=None), '.3f')} "
        f"({sum(g is not None for g in gaps[a])})" for a in names[:-1]), "", "", "")
    plain_diff = [p for p in per_call if "local_diff_char" in p["arms"]["none"]]
    table.add_row("  plain vs plain (fresh prefill) differing", *([f"{len(plain_diff)} of "
                  f"{len(set(p['call'] for a in differ for p in differ[a]))} checked"] * 2),
                  "", "", "")
    Console(width=160).print(table)
    print(f"prompt prefill (priming requests, max_tokens 1, apart): {prime_ms / 1000:.1f} s; "
          f"replay {run_s:.0f} s; daemon ready in {ready_s:.0f} s; history tokens loaded "
          f"{final_status.get('history_tokens_loaded')}")

    top_table = Table(title="top-3 calls by speedup (suffix vs none): what was being copied")
    for col in ("call", "speedup (no history)", "accepted/drafted", "output (suffix, start)",
                "longest copy in prompt / history (chars)"):
        top_table.add_column(col, overflow="fold")
    for p in top:
        s = p["arms"]["suffix"]
        top_table.add_row(str(p["call"]), f"{fmt(p['speedup'])} ({fmt(p['speedup_no_history'])})",
                          f"{s['ledger']['accepted_tokens']}/{s['ledger']['draft_tokens']}",
                          repr(s["text"][:90]),
                          f"{len(p['longest_in_prompt'])} / {len(p['longest_in_history'])}: "
                          f"{p['longest_in_prompt'][:60]!r}")
    Console(width=140).print(top_table)
    for a in names[:-1]:
        for p in differ[a]:
            x, n = p["arms"][a], p["arms"]["none"]
            at = x.get("first_diff_char", first_difference(x["text"], n["text"]))
            local = (f"top-2 gap {fmt(x['gap'], '.3f')}" if x.get("gap") is not None else
                     f"no gap: a local plain decode differs from none earlier, at char "
                     f"{n['local_diff_char']} (gap {fmt(n.get('local_gap'), '.3f')})"
                     if "local_diff_char" in n else "gap not checked")
            print(f"{a}: call {p['call']} differs at char {at} ({local}): "
                  f"{x['text'][max(0, at - 25):at + 25]!r} / none "
                  f"{n['text'][max(0, at - 25):at + 25]!r}")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)

    if args.json:
        for p in per_call:
            del p["prompt_text"]
        args.json.write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(args).items()},
            "workload": {k: v for k, v in work.items() if k not in ("calls", "history_text",
                                                                     "history_files")},
            "history_sources": sources, "initial_scan": scan, "ready_s": round(ready_s, 1),
            "replay_s": round(run_s, 1), "prime_prefill_ms": round(prime_ms), "cpu_busy": busy,
            "totals": tot, "speedup": speedup, "wall_speedup": wall,
            "differing_calls": {a: [p["call"] for p in differ[a]] for a in differ},
            "errors": errors, "per_call": per_call,
            "top3": [{k: p[k] for k in ("call", "speedup", "longest_in_prompt",
                                         "longest_in_history")} for p in top],
            "daemon_status": final_status, "daemon_log_tail": log_tail}, indent=1))


if __name__ == "__main__":
    main()
