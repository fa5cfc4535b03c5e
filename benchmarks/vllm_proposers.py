"""vLLM's speculative decoding with assistd's history against vLLM's own proposers, in
one run on this machine (vLLM's CPU build, harness/vllm_server.py, the embedded model
converted to float32).

    .venv/bin/python benchmarks/vllm_proposers.py [--arms none ngram suffix assistd]
        [--workloads agent edit] [--k 8] [--max-tokens 96] [--json OUT]

Arms, each a vLLM server of its own, every one at the same ``num_speculative_tokens``:

- ``none``: no speculation (the baseline, vLLM's defaults otherwise);
- ``ngram``: vLLM's prompt lookup, ``prompt_lookup_min`` 2, ``prompt_lookup_max`` 4;
- ``suffix``: vLLM's SuffixDecoding (Arctic Inference 0.3.0; ``pip install
  arctic-inference`` fails to build here, so vLLM is given the module ``assistd peers
  build arctic`` builds from the same sdist);
- ``assistd``: :class:`assistd.fleet.vllm_proposer.HistoryProposer` over a history that
  holds only text written before each request (never the continuation measured): the
  benchmark writes it, as a daemon would, between requests.

Workloads:

- ``agent``: six 3,500-character chunks of the aider fixture transcript (read in place),
  spread over one half of it; the history before chunk i is the transcript up to it.
- ``edit``: six real edits of this repository before a fixed commit
  (:func:`assistd.measure.rewrite_cases.git_cases`),
  the chat prompt of ``assistd bench --workload rewrite`` (the file, the change, "rewrite
  the whole file"); the history before each holds the files before the edits so far.

Per workload and arm: output tokens/s over the requests (sequential, greedy, float32,
streamed) and after each request's first token (decoding alone: the prefill of a
1,000-token prompt takes this CPU 2-3 s of a request's 4-8), their ratios to ``none``, accepted draft tokens per output token, acceptance rate and mean
acceptance length (vLLM's own ``/metrics`` counters, read before and after each request),
outputs equal to ``none``'s, and for assistd the proposer's time per engine step.
``--set``: ``fit``, the cases the proposer's default cost model was chosen on (the
transcript's second half, the newest edits at 0b3d95c765), or ``held-out`` (the default: the first
half, the newest edits at 3f33af2de5, 60 commits earlier). Needs a quiet machine: the timings are wall-clock.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import vllm_server  # noqa: E402
from harness.openai_server import stop_llama_server  # noqa: E402
from harness.ports import free_port  # noqa: E402

AIDER = ROOT.parent / "shared" / "fixtures" / "transcripts" / "aider" / \
    "aider__tests_fixtures_chat-history.TRUNCATED.md"
CHUNK_CHARS = 3500
CASES = 6
NGRAM = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")


# The cases the proposer's settings were chosen on ("fit": the cost model) and others
# ("held-out"): the transcript's other half, this repository's commits before them.
SETS = {"fit": {"half": 1, "rev": "0b3d95c765"}, "held-out": {"half": 0, "rev": "3f33af2de5"}}


def agent_cases(half: int) -> list[dict]:
    """``{"name", "prompt", "history"}``: chunks ending at line starts, spread evenly
    over the transcript's ``half`` (0: first, 1: second); the history is everything
    before the chunk's end."""
    text = AIDER.read_text(encoding="utf-8", errors="replace")
    out = []
    for i in range(CASES):
        end = half * len(text) // 2 + (i + 1) * (len(text) // 2) // (CASES + 1)
        end = max(end, CHUNK_CHARS + 1)
        end = text.rfind("\n", 0, end) + 1
        out.append({"name": f"aider@{end}", "prompt": text[end - CHUNK_CHARS:end],
                    "history": {"aider-transcript.md": text[:end]}})
    return out


def edit_cases(tokenizer_folder: Path, rev: str) -> list[dict]:
    """The rewrite workload's file prompts as text (the served model's chat template),
    each case's history the files before every edit so far."""
    from jinja2 import Template

    from assistd.measure.bench_rewrite import (MAX_CASE_CHARS, OPEN_ANSWER, WINDOW_LINES,
                                               file_messages)
    from assistd.measure.rewrite_cases import git_cases

    template = Template((tokenizer_folder / "chat_template.jinja").read_text())
    edits = git_cases(ROOT, limit=CASES, window=WINDOW_LINES, max_chars=MAX_CASE_CHARS, rev=rev)
    out, files = [], {}
    for e in edits:
        files[f"{len(files)}-{Path(e.path).name}"] = e.before
        chat = template.render(messages=file_messages(e.path, e.instruction, e.before),
                               add_generation_prompt=True)
        out.append({"name": e.name, "prompt": chat + OPEN_ANSWER, "history": dict(files)})
    return out


def spec_counters(url: str) -> dict[str, float]:
    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            name = s.name.removeprefix("vllm:spec_decode_num_").removesuffix("_total")
            if s.name.startswith("vllm:spec_decode_num_") and name in out \
                    and "position" not in s.labels:
                out[name] = s.value
    return out


class History:
    """The assistd arm's history: a folder indexed into a SQLite file by the real
    indexer with the local Target's tokenizer (the served folder's fingerprint)."""

    def __init__(self, tmp: Path):
        from assistd.targets.open import default_model_path
        from assistd.targets.remote.gguf_vocab import LlamaVocab

        self.root = tmp / "history"
        (self.root / ".git").mkdir(parents=True)
        self.db = tmp / "history.db"
        self.vocab = LlamaVocab(default_model_path())
        self.write({"README.md": "history of the benchmark\n"})

    def write(self, files: dict[str, str]) -> None:
        from storage.indexer import index_repository
        from storage.store import HistoryStore

        for name, text in files.items():
            (self.root / name).write_text(text)
        store = HistoryStore(self.db)
        try:
            index_repository(store, self.root, self.vocab.tokenize, self.vocab.fingerprint,
                             max_bytes=8 << 20)
        finally:
            store.close()


def run_arm(arm: str, workloads: dict[str, list[dict]], k: int, max_tokens: int,
            tmp: Path) -> dict:
    args, env = [], vllm_server.environment()
    history = stats = None
    if arm == "ngram":
        args = ["--speculative-config", json.dumps({"method": "ngram",
                                                    "num_speculative_tokens": k, **NGRAM})]
    elif arm == "suffix":
        # vLLM imports arctic_inference.suffix_decoding; its sdist does not build under
        # pip here (CMake finds no Python headers in pip's build environment), so vLLM
        # gets the module `assistd peers build arctic` builds from the same sdist.
        from assistd.measure.arctic import build

        env["PYTHONPATH"] = str(build().parents[2])
        args = ["--speculative-config", json.dumps({"method": "suffix",
                                                    "num_speculative_tokens": k})]
    elif arm.partition(":")[0] == "assistd":
        # "assistd:alpha=8,cost=reference": settings of this arm (ASSISTD_VLLM_*)
        folder = tmp / arm.replace(":", "_").replace(",", "_").replace("=", "-")
        history = History(folder)
        stats = folder / "stats.json"
        env.update(ASSISTD_DB=str(history.db), ASSISTD_VLLM_SCOPE=str(history.root),
                   ASSISTD_VLLM_STATS_FILE=str(stats), ASSISTD_VLLM_REFRESH_S="0.1")
        for pair in filter(None, arm.partition(":")[2].split(",")):
            key, _, value = pair.partition("=")
            env[f"ASSISTD_VLLM_{key.upper()}"] = value
        args = ["--speculative-config", json.dumps({
            "method": "custom_class", "num_speculative_tokens": k,
            "model": "assistd.fleet.vllm_proposer.HistoryProposer"})]
    log = tmp / f"{arm.replace(':', '_')}.log"
    try:
        proc = vllm_server.start(port := free_port(), log, *args, env=env)
    except AssertionError as e:
        return {"error": str(e).splitlines()[0], "log": log.read_text()[-1500:]}
    url = f"http://127.0.0.1:{port}"
    out: dict = {}
    try:
        complete(url, "def warm_up():\n", 8)  # (the first request compiles)
        for name, cases in workloads.items():
            rows = []
            for case in cases:
                if history is not None:
                    history.write(case["history"])
                    time.sleep(0.3)  # the proposer re-reads every 0.1 s
                before = spec_counters(url)
                t0 = time.perf_counter()
                text, tokens, decode_s = complete(url, case["prompt"], max_tokens)
                seconds = time.perf_counter() - t0
                after = spec_counters(url)
                rows.append({"case": case["name"], "tokens": tokens, "seconds": seconds,
                             "decode_s": decode_s,
                             "text": text, **{c: after[c] - before[c] for c in COUNTERS}})
            out[name] = rows
        if stats is not None and stats.exists():
            out["propose"] = json.loads(stats.read_text())
    finally:
        stop_llama_server(proc)
    return out


def complete(url: str, prompt: str, max_tokens: int) -> tuple[str, int, float]:
    """Streamed: ``(text, output tokens, seconds from the first token to the last)``."""
    body = {"model": vllm_server.SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    text, tokens, first = [], 0, None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                if first is None:
                    first = time.perf_counter()
                text.append(chunk["choices"][0].get("text") or "")
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return "".join(text), tokens, time.perf_counter() - (first or time.perf_counter())


def summary(results: dict, workload: str) -> dict:
    base = results.get("none", {}).get(workload)
    table = {}
    for arm, res in results.items():
        rows = res.get(workload)
        if not rows:
            table[arm] = {"error": res.get("error", "no rows")}
            continue
        tokens = sum(r["tokens"] for r in rows)
        seconds = sum(r["seconds"] for r in rows)
        drafts, draft_tokens, accepted = (sum(r[c] for r in rows) for c in COUNTERS)
        decode = sum(r["decode_s"] for r in rows)
        row = {"tokens": tokens, "tokens_per_s": round(tokens / seconds, 2),
               # after the first token: decoding alone, the prompt's prefill left out
               "decode_tokens_per_s": round(sum(r["tokens"] - 1 for r in rows) / decode, 2),
               "accepted_per_output": round(accepted / tokens, 3) if tokens else None,
               "acceptance_rate": round(accepted / draft_tokens, 3) if draft_tokens else None,
               "mean_acceptance_length": round(1 + accepted / drafts, 2) if drafts else None}
        if base:
            row["speedup"] = round(row["tokens_per_s"] / (sum(r["tokens"] for r in base)
                                                         / sum(r["seconds"] for r in base)), 3)
            row["decode_speedup"] = round(row["decode_tokens_per_s"] / (
                sum(r["tokens"] - 1 for r in base) / sum(r["decode_s"] for r in base)), 3)
            row["equal_to_none"] = sum(a["text"] == b["text"] for a, b in zip(rows, base))
            row["cases"] = len(rows)
        if "propose" in res:
            row["propose_ms_per_step"] = res["propose"]["propose_ms"]
        table[arm] = row
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=["none", "ngram", "suffix", "assistd"])
    parser.add_argument("--workloads", nargs="+", default=["agent", "edit"])
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--set", choices=SETS, default="held-out",
                        help="the cases: those the proposer's cost model was chosen on (fit),"
                             " or others (held-out, the default)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if vllm_server.python() is None:
        sys.exit(f"vLLM is not installed: {vllm_server.INSTALL_HINT}")
    folder = vllm_server.model_dir()
    workloads = {}
    if "agent" in args.workloads:
        workloads["agent"] = agent_cases(SETS[args.set]["half"])
    if "edit" in args.workloads:
        workloads["edit"] = edit_cases(folder, SETS[args.set]["rev"])
    tmp = Path(tempfile.mkdtemp(prefix="vllm-proposers-"))
    results = {}
    try:
        for arm in args.arms:
            Console(stderr=True).print(f"[dim]arm {arm}: starting vLLM ...[/dim]")
            results[arm] = run_arm(arm, workloads, args.k, args.max_tokens, tmp)
    finally:
        logs = {arm: (tmp / f"{arm.replace(':', '_')}.log") for arm in args.arms}
        kept = {a: p.read_text()[-3000:] for a, p in logs.items() if p.exists()}
        shutil.rmtree(tmp, ignore_errors=True)
    report = {"k": args.k, "max_tokens": args.max_tokens, "ngram": NGRAM, "set": args.set,
              "summary": {w: summary(results, w) for w in workloads}, "results": results}
    if args.json:
        args.json.write_text(json.dumps({**report, "logs": kept}, indent=1))
    console = Console()
    for w, table in report["summary"].items():
        t = Table(title=f"{w} ({args.set}): vLLM {vllm_server.VLLM_VERSION}, k {args.k}, "
                        f"{args.max_tokens} tokens per request")
        for col in ("arm", "tok/s", "× none", "decode tok/s", "× none", "accepted/output",
                    "acceptance", "mean acc. len", "equal", "propose ms/step (p50)"):
            t.add_column(col)
        for arm, r in table.items():
            if "error" in r:
                t.add_row(arm, r["error"][:60], *[""] * 9)
                continue
            t.add_row(arm, str(r["tokens_per_s"]), str(r.get("speedup", "")),
                      str(r["decode_tokens_per_s"]), str(r.get("decode_speedup", "")),
                      str(r["accepted_per_output"]), str(r["acceptance_rate"]),
                      str(r["mean_acceptance_length"]),
                      f"{r.get('equal_to_none', '')}/{r.get('cases', '')}",
                      str(r.get("propose_ms_per_step", {}).get("p50", "")))
        console.print(t)


if __name__ == "__main__":
    main()
