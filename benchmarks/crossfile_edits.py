"""Cross-file context on real edits: shown -> accepted with and without it, and its latency.

    nice .venv/bin/python benchmarks/crossfile_edits.py [--repo .] [--cases 30] [--keys 3]
        [--per-commit 1] [--cross-file-tokens 256] [--max-prompt-tokens 1024]
        [--max-latency-ms 0] [--model GGUF] [--json FILE]

Workload: the ``edit`` workload's commits (assistd/measure/bench_workloads.py) of a git
repository's last ``--commits`` first-parent commits, newest ``--cases`` kept. In a commit
that changed two or more text files, the first changed file with a cursor
(``edit_cursor``: after its first changed block, >200 characters in) is the document, cut at
the cursor (the text before it, as the workload's prompt); the commit's other changed files
are the open buffers, in their new versions: a change made across files is made with them
open, and what the editor holds is their new text. Commits that changed one file are left
out: there both arms are the same prompt. Each case runs in a temporary repository that
holds the parent commit's versions of the changed files (the history the scope indexes).

One real Completer on the embedded model serves both arms of each case, in turn:
``crossFileTokens`` 0, then ``--cross-file-tokens`` (the per-document state is dropped
between them). Per arm: the first suggestion at the cursor (cold: the whole prompt is
evaluated), then ``--keys`` keystrokes of the file's real continuation, each a request:
Target calls and type-through (the rest of an earlier suggestion, no Target call) are
reported apart. "Accepted": the file's real continuation starts with the suggestion
(benchmarks/lsp_typing.py's proxy for a user accepting it); accepted characters are its
length. For partial accepts: whether its first line of text is right (accept next line),
and how many characters are right before the first wrong one. No time budget by default
(``--max-latency-ms 0``), so that a suggestion's text does not depend on how busy the
machine is; latency is then the whole generation.

Time: ~10 s per case on 2 cores (2 arms x (1 cold + 3 keystroke) requests); ~5 minutes
for the default 30 cases. Run it alone: latencies beside a test suite mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.measure.bench_workloads import edit_cursor  # noqa: E402
from assistd.measure.replay_inputs import InputReport, git_sessions  # noqa: E402
from editors.completer import Completer, Request  # noqa: E402
from editors.settings import Settings  # noqa: E402


def pct(xs, q):
    return sorted(xs)[max(0, math.ceil(q * len(xs)) - 1)] if xs else None  # nearest rank


def edit_cases(repo: Path, commits: int, n_cases: int, per_commit: int) -> list[dict]:
    """[{commit, path, language, new, cursor, changed: {path: (old | None, new)}}], oldest
    first: up to ``per_commit`` per commit that changed >= 2 files, the newest ``n_cases``."""
    sessions = git_sessions(repo, commits, InputReport())
    groups: dict[str, list] = {}
    for s in sessions:
        groups.setdefault(s.name.split(":", 1)[0], []).append(s)
    state: dict[str, str] = {}  # path -> its latest version before the commit
    cases = []
    for commit, group in groups.items():
        changed = {}
        for s in group:
            path = s.turns[0].text.rstrip("\n")
            for _, text in s.seed:
                state[path] = text
            changed[path] = (state.get(path), s.turns[1].text, s.turns[1].language)
        taken = 0
        for path, (old, new, language) in changed.items():
            cursor = edit_cursor(old, new) if old is not None else None
            if len(changed) >= 2 and taken < per_commit and cursor is not None and cursor > 200:
                taken += 1
                cases.append({"commit": commit, "path": path, "language": language,
                              "new": new, "cursor": cursor,
                              "changed": {p: (o, n) for p, (o, n, _) in changed.items()}})
        for path, (_, new, _) in changed.items():
            state[path] = new
    return cases[-n_cases:]


def run_case(c: Completer, base: Settings, case: dict, root: Path, args) -> dict:
    (root / ".git").mkdir(parents=True)
    for path, (old, _) in case["changed"].items():  # the parent commit's versions
        if old is not None:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(old)
    uri = (root / case["path"]).as_uri()
    buffers = {(root / p).as_uri(): new for p, (_, new) in case["changed"].items()
               if p != case["path"]}
    new, cursor = case["new"], case["cursor"]
    t0 = time.perf_counter()
    c.scope_of(uri)  # the repository is indexed on first use: not part of either arm
    out = {"case": f"{case['commit']}:{case['path']}", "buffers": len(buffers),
           "index_ms": (time.perf_counter() - t0) * 1000}
    for arm, tokens in (("off", 0), ("on", args.cross_file_tokens)):
        c.configure(replace(base, cross_file_tokens=tokens))
        for u in [uri, *buffers]:
            c.drop_buffer(u)  # a fresh window and choice: the arms do not share state
        for seq in range(c.target.n_seq_max):  # nor the KV cache: each arm starts cold
            c.target.drop_sequence(seq)
        rows = []
        for j in range(args.keys + 1):
            at = cursor + j
            sug = c.complete(Request(uri=uri, text=new[:at], offset=at,
                                     language=case["language"] or "plaintext", buffers=buffers))
            accepted = bool(sug.text) and new.startswith(sug.text, at - sug.replace)
            common = len(os.path.commonprefix([sug.text, new[at - sug.replace:]]))
            body = sug.text.lstrip("\n")  # its first line of text (what accept-next-line takes)
            line = sug.text[:len(sug.text) - len(body) + len(body.split("\n")[0])]
            pick = c.crossfile.pick(uri)
            rows.append({"source": sug.source, "ms": sug.ms, "shown": bool(sug.text),
                         "accepted": accepted, "chars": len(sug.text) if accepted else 0,
                         "common": common if sug.text else 0,
                         "line": bool(line.strip()) and common >= len(line),
                         "cross_tokens": len(pick.ids) if pick else 0,
                         "prompt_tokens": sug.ledger.prompt_tokens if sug.ledger else 0,
                         "reused": sug.ledger.prompt_tokens_reused if sug.ledger else 0,
                         "prefill_ms": sug.ledger.prefill_ms if sug.ledger else 0.0,
                         "total_ms": sug.ledger.total_ms if sug.ledger else 0.0})
        out[arm] = rows
    return out


def summary(results: list[dict], arm: str) -> dict:
    first = [r[arm][0] for r in results]
    keys = [x for r in results for x in r[arm][1:]]
    target = first + [x for x in keys if x["source"] == "target"]
    shown = [x for x in first if x["shown"]]
    t_shown = [x for x in target if x["shown"]]
    return {
        "cases": len(first), "shown": len(shown), "accepted": sum(x["accepted"] for x in first),
        "rate": sum(x["accepted"] for x in shown) / len(shown) if shown else None,
        "chars": sum(x["chars"] for x in first) / len(first) if first else None,
        "target_line": (sum(x["line"] for x in t_shown) / len(t_shown) if t_shown else None),
        "target_common": (sum(x["common"] for x in t_shown) / len(t_shown)
                          if t_shown else None),
        "target_shown": len(t_shown), "target_accepted": sum(x["accepted"] for x in t_shown),
        "target_rate": sum(x["accepted"] for x in t_shown) / len(t_shown) if t_shown else None,
        "first_p50": pct([x["ms"] for x in first], 0.5),
        "first_p95": pct([x["ms"] for x in first], 0.95),
        "key_target": sum(x["source"] == "target" for x in keys),
        "key_type_through": sum(x["source"] == "type-through" for x in keys),
        "key_p50": pct([x["ms"] for x in keys if x["source"] == "target"], 0.5),
        "key_p95": pct([x["ms"] for x in keys if x["source"] == "target"], 0.95),
        "prompt_tokens": sum(x["prompt_tokens"] for x in first) / len(first) if first else 0,
        "cross_tokens": sum(x["cross_tokens"] for x in first) / len(first) if first else 0,
        "with_snippets": sum(x["cross_tokens"] > 0 for x in first),
        "key_reuse": (sum(x["reused"] for x in keys if x["source"] == "target")
                      / max(1, sum(x["prompt_tokens"] - 1 for x in keys
                                   if x["source"] == "target"))),
    }


def fmt(v, spec=".0f"):
    return "n/a" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def ratio(on, off, spec=".2f"):
    return "n/a" if not on or not off else format(on / off, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=ROOT, help="a git repository [default: this one]")
    ap.add_argument("--commits", type=int, default=200, help="first-parent commits read")
    ap.add_argument("--cases", type=int, default=30)
    ap.add_argument("--per-commit", type=int, default=1, help="changed files completed per commit")
    ap.add_argument("--keys", type=int, default=3, help="keystrokes after the first suggestion")
    ap.add_argument("--cross-file-tokens", type=int, default=256, help="the arm with it")
    ap.add_argument("--model", type=Path, help="a GGUF Target [default: the embedded model]")
    ap.add_argument("--max-prompt-tokens", type=int, default=Settings.max_prompt_tokens)
    ap.add_argument("--max-latency-ms", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cases = edit_cases(args.repo, args.commits, args.cases, args.per_commit)
    if not cases:
        sys.exit(f"{args.repo}: no commit changed two files with a cursor after a change")
    print(f"{len(cases)} cases from {args.repo}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="crossfile_edits_") as tmp:
        base = Settings(db=str(Path(tmp) / "history.db"), max_latency_ms=args.max_latency_ms,
                        model=str(args.model) if args.model else None,
                        max_prompt_tokens=args.max_prompt_tokens)
        c = Completer(base)
        t0 = time.perf_counter()
        c.open()
        print(f"opened in {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            for i, case in enumerate(cases):
                r = run_case(c, base, case, Path(tmp) / f"case{i}", args)
                results.append(r)
                on, off = r["on"][0], r["off"][0]
                print(f"{i + 1:3}/{len(cases)} {r['case'][:60]:60} buffers {r['buffers']:2} "
                      f"cross {on['cross_tokens']:3} tok | off {off['ms']:5.0f} ms "
                      f"{'A' if off['accepted'] else '-'} | on {on['ms']:5.0f} ms "
                      f"{'A' if on['accepted'] else '-'}", flush=True)
                if args.json:  # after every case: a run cut short still leaves its cases
                    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in
                                                              vars(args).items()},
                                                     "results": results}, indent=1))
        finally:
            c.close()
    s = {arm: summary(results, arm) for arm in ("off", "on")}
    table = Table(title=f"cross-file context on {len(results)} real edits of {args.repo.name} "
                        f"(crossFileTokens {args.cross_file_tokens}, maxPromptTokens "
                        f"{args.max_prompt_tokens})")
    table.add_column("")
    table.add_column("off", justify="right")
    table.add_column("on", justify="right")
    table.add_column("on / off", justify="right")
    rows = [
        ("first suggestion: shown / accepted", lambda a: f"{a['shown']} / {a['accepted']}", None),
        ("shown -> accepted", lambda a: fmt(a["rate"], ".3f"), "rate"),
        ("accepted chars per case (mean)", lambda a: fmt(a["chars"], ".1f"), "chars"),
        ("all Target suggestions: shown -> accepted",
         lambda a: f"{fmt(a['target_rate'], '.3f')} ({a['target_accepted']}/{a['target_shown']})",
         "target_rate"),
        ("all Target suggestions: first line right", lambda a: fmt(a["target_line"], ".3f"),
         "target_line"),
        ("all Target suggestions: chars right before the first wrong one (mean)",
         lambda a: fmt(a["target_common"], ".2f"), "target_common"),
        ("first suggestion ms p50 / p95 (cold prompt)",
         lambda a: f"{fmt(a['first_p50'])} / {fmt(a['first_p95'])}", "first_p50"),
        ("keystroke ms p50 / p95 (Target calls)",
         lambda a: f"{fmt(a['key_p50'])} / {fmt(a['key_p95'])}", "key_p50"),
        ("keystrokes: Target / type-through",
         lambda a: f"{a['key_target']} / {a['key_type_through']}", None),
        ("keystroke prompt reuse (reused / prompt-1)", lambda a: fmt(a["key_reuse"], ".3f"), None),
        ("prompt tokens (mean, first)", lambda a: fmt(a["prompt_tokens"], ".0f"), "prompt_tokens"),
        ("cross-file tokens (mean) / cases with snippets",
         lambda a: f"{fmt(a['cross_tokens'], '.0f')} / {a['with_snippets']}", None),
    ]
    for name, cell, key in rows:
        table.add_row(name, cell(s["off"]), cell(s["on"]),
                      ratio(s["on"][key], s["off"][key]) if key else "")
    gained = sum(r["on"][0]["accepted"] and not r["off"][0]["accepted"] for r in results)
    lost = sum(r["off"][0]["accepted"] and not r["on"][0]["accepted"] for r in results)
    Console(width=140).print(table)
    print(f"first suggestion accepted only with cross-file context: {gained}; only without: {lost}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "summary": s, "results": results}, indent=1))


if __name__ == "__main__":
    main()
