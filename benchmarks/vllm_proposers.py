"""vLLM's speculative decoding with assistd's history against vLLM's own proposers, in
one run on this machine (vLLM's CPU build, harness/vllm_server.py, the embedded model
converted to float32).

    .venv/bin/python benchmarks/vllm_proposers.py [--arms none ngram suffix assistd]
        [--workloads agent edit] [--k 8] [--max-tokens 96] [--json OUT]

Arms, each a vLLM server of its own, every one at the same ``num_speculative_tokens``.
All servers are started first, then the arms take turns case by case (the order rotated
from case to case), so every arm meets the same moments of a shared machine: a paired
comparison (``--rounds N`` sends every case N times).

- ``none``: no speculation (the baseline, vLLM's defaults otherwise);
- ``ngram``: vLLM's prompt lookup, ``prompt_lookup_min`` 2, ``prompt_lookup_max`` 4;
- ``suffix``: vLLM's SuffixDecoding (Arctic Inference 0.3.0; ``pip install
  arctic-inference`` fails to build here, so vLLM is given the module ``assistd peers
  build arctic`` builds from the same sdist);
- ``assistd``: :class:`assistd.fleet.vllm_proposer.HistoryProposer` over a history that
  holds only text written before each request (never the continuation measured): the
  benchmark writes it, as a daemon would, between requests. ``assistd:cost=measured``
  cuts its drafts by the t(n) the ``oracle`` arm measured earlier in the same run;
- ``oracle``: the ceiling at this k (``benchmarks/vllm_oracle.py``): every case is sent
  twice and the second is measured, every draft the Target's own next k tokens. Then,
  on the edit case with the longest output (else the first agent one), a sweep of draft
  lengths n = 0..k, all accepted, gives vLLM's time per step over n + 1 tokens: the cost
  model ``assistd:cost=measured`` uses (written to ``--cost-out`` too);
- ``empty``: the oracle's class cut to no drafts: vLLM's custom-proposer path with
  nothing to verify, to tell what that path costs or saves apart from the drafts.

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
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
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


ARMS = ("none", "ngram", "suffix", "assistd", "oracle", "empty")
SWEEP_TOKENS = 256  # per request of the t(n) sweep: ~28 steps at n = 8
QUIET_S = 1.0  # idle seconds before every measured request (Arm.request)


class Arm:
    """One arm's vLLM server (started by :meth:`start`), and what it needs around each
    request: the assistd arm's history written first, the oracle's first pass."""

    def __init__(self, arm: str, k: int, tmp: Path):
        self.name, self.k, self.tmp = arm, k, tmp
        self.args, self.env = [], vllm_server.environment()
        self.history = self.stats = self.oracle = self.proc = self.url = None
        self.error: dict | None = None
        folder = tmp / re.sub(r"[^\w.-]", "_", arm)  # (a cost file's path as a name)
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / "vllm.log"
        if arm == "ngram":
            self.args = ["--speculative-config", json.dumps(
                {"method": "ngram", "num_speculative_tokens": k, **NGRAM})]
        elif arm == "suffix":
            # vLLM imports arctic_inference.suffix_decoding; its sdist does not build under
            # pip here (CMake finds no Python headers in pip's build environment), so vLLM
            # gets the module `assistd peers build arctic` builds from the same sdist.
            from assistd.measure.arctic import build

            self.env["PYTHONPATH"] = str(build().parents[2])
            self.args = ["--speculative-config", json.dumps(
                {"method": "suffix", "num_speculative_tokens": k})]
        elif arm.partition(":")[0] == "assistd":
            # "assistd:alpha=8,cost=reference": settings of this arm (ASSISTD_VLLM_*)
            self.history = History(folder)
            self.stats = folder / "stats.json"
            self.env.update(ASSISTD_DB=str(self.history.db),
                            ASSISTD_VLLM_SCOPE=str(self.history.root),
                            ASSISTD_VLLM_STATS_FILE=str(self.stats), ASSISTD_VLLM_REFRESH_S="0.1")
            for pair in filter(None, arm.partition(":")[2].split(",")):
                key, _, value = pair.partition("=")
                if key == "cost" and value == "measured":
                    value = str(tmp / "vllm_cost.json")  # the oracle arm's sweep, this run
                self.env[f"ASSISTD_VLLM_{key.upper()}"] = value
            self.args = ["--speculative-config", json.dumps({
                "method": "custom_class", "num_speculative_tokens": k,
                "model": "assistd.fleet.vllm_proposer.HistoryProposer"})]
        elif arm in ("oracle", "empty"):
            oracle = {"cap": folder / "cap", "stats": folder / "oracle-stats.json"}
            oracle["cap"].write_text(str(k if arm == "oracle" else 0))
            self.oracle = oracle if arm == "oracle" else None  # "empty": never drafts
            self.env.update(PYTHONPATH=str(ROOT / "benchmarks"), VLLM_SERVER_DEV_MODE="1",
                            ASSISTD_ORACLE_CAP_FILE=str(oracle["cap"]),
                            ASSISTD_ORACLE_STATS=str(oracle["stats"]))
            self.args = ["--speculative-config", json.dumps({
                "method": "custom_class", "num_speculative_tokens": k,
                "model": "vllm_oracle.ReplayOracle"})]
        elif arm != "none":
            raise SystemExit(f"unknown arm {arm!r}")

    def start(self) -> bool:
        """Start the server and warm it up; False (and :attr:`error`) if it fails."""
        Console(stderr=True).print(f"[dim]arm {self.name}: starting vLLM ...[/dim]")
        try:
            self.proc = vllm_server.start(port := free_port(), self.log, *self.args,
                                          env=self.env)
        except AssertionError as e:
            self.error = {"error": str(e).splitlines()[0], "log": self.log.read_text()[-1500:]}
            return False
        self.url = f"http://127.0.0.1:{port}"
        complete(self.url, "def warm_up():\n", 8)  # (the first request compiles)
        return True

    def request(self, case: dict, max_tokens: int) -> dict:
        """One measured request: ``{"case", "tokens", "seconds", "decode_s", "text",
        drafts, draft_tokens, accepted_tokens}`` (vLLM's counters for it)."""
        if self.history is not None:
            self.history.write(case["history"])
            time.sleep(0.3)  # the proposer re-reads every 0.1 s
        if self.oracle is not None:  # decoded once, remembered; its prompt uncached
            complete(self.url, case["prompt"], max_tokens)
            httpx.post(f"{self.url}/reset_prefix_cache").raise_for_status()
        # Every arm's request starts on a machine at rest: right after another server's
        # request, that server's threads still spin for a while and slowed this one's
        # prefill by up to 0.6 s (measured: arms with a history write before their
        # request, or the oracle's first pass, looked 0.5 s faster to the first token).
        time.sleep(QUIET_S)
        before = spec_counters(self.url)
        t0 = time.perf_counter()
        text, tokens, decode_s = complete(self.url, case["prompt"], max_tokens)
        seconds = time.perf_counter() - t0
        after = spec_counters(self.url)
        return {"case": case["name"], "tokens": tokens, "seconds": seconds,
                "decode_s": decode_s, "text": text,
                **{c: after[c] - before[c] for c in COUNTERS}}

    def propose_stats(self) -> dict | None:
        return json.loads(self.stats.read_text()) if self.stats and self.stats.exists() else None

    def stop(self) -> None:
        if self.proc is not None:
            stop_llama_server(self.proc)
            self.proc = None


def run_interleaved(arms: list[Arm], workloads: dict[str, list[dict]], max_tokens: int,
                    rounds: int = 1) -> dict:
    """Every case on every started arm, the arms taking turns case by case (their order
    rotated from case to case) so that they meet the same moments of a shared machine;
    ``rounds`` times over. Returns ``{arm: {workload: [row, ...], "propose": stats}}``
    (or the arm's error)."""
    live = [a for a in arms if a.url]
    out: dict = {a.name: a.error or {} for a in arms}
    turn = 0
    for _ in range(rounds):
        for name, cases in workloads.items():
            for case in cases:
                order = live[turn % len(live):] + live[:turn % len(live)] if live else []
                turn += 1
                for a in order:
                    out[a.name].setdefault(name, []).append(a.request(case, max_tokens))
    for a in live:
        if (stats := a.propose_stats()) is not None:
            out[a.name]["propose"] = stats
    return out


def sweep(arm: Arm, workloads: dict[str, list[dict]], path: Path) -> dict:
    """vLLM's ms per decode step with n = 0..k drafts, all accepted (the oracle cut to n),
    on one case; written to ``path`` as a cost model (``{"points": {n + 1: ms}}``, made
    non-decreasing in n; one level: the case's context, ~1,000 tokens, stands for all).
    Returns ``{"points", "raw"}``."""
    url, k, oracle = arm.url, arm.k, arm.oracle
    case = max(workloads.get("edit") or [], key=lambda c: len(c["prompt"]), default=None) \
        or workloads["agent"][0]
    oracle["cap"].write_text(str(k))
    complete(url, case["prompt"], SWEEP_TOKENS)  # (remembered, up to SWEEP_TOKENS)
    raw = {}
    for n in range(k + 1):
        oracle["cap"].write_text(str(n))
        httpx.post(f"{url}/reset_prefix_cache").raise_for_status()
        before = json.loads(oracle["stats"].read_text())["decode_steps"]
        _, tokens, decode_s = complete(url, case["prompt"], SWEEP_TOKENS)
        steps = json.loads(oracle["stats"].read_text())["decode_steps"] - before
        # the first step that decodes ends the prefill (the first token): not timed
        raw[n + 1] = {"ms": 1000 * decode_s / max(1, steps - 1), "steps": steps,
                      "tokens": tokens}
    oracle["cap"].write_text(str(k))
    ms = np.maximum.accumulate([raw[n]["ms"] for n in sorted(raw)])
    points = {n: round(float(m), 2) for n, m in zip(sorted(raw), ms)}
    path.write_text(json.dumps({"source": f"vLLM {vllm_server.VLLM_VERSION} CPU, oracle sweep",
                                "points": {str(n): m for n, m in points.items()}}, indent=1))
    return {"points": points, "raw": raw}


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
    parser.add_argument("--arms", nargs="+", default=["none", "ngram", "suffix", "assistd"],
                        help=f"of {', '.join(ARMS)}; assistd:KEY=VALUE,... sets the"
                             " proposer's settings (ASSISTD_VLLM_KEY), cost=measured the"
                             " oracle's t(n)")
    parser.add_argument("--workloads", nargs="+", default=["agent", "edit"],
                        choices=["agent", "edit"])
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens of every arm")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per request")
    parser.add_argument("--set", choices=SETS, default="held-out",
                        help="the cases: those the proposer's cost model was chosen on (fit),"
                             " or others (held-out, the default)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times every case is sent to every arm")
    parser.add_argument("--json", type=Path, help="write the rows, the summary and the logs here")
    parser.add_argument("--cost-out", type=Path,
                        help="where to copy the t(n) the oracle arm measured (cost model JSON)")
    args = parser.parse_args()
    bad = [a for a in args.arms if a.partition(":")[0] not in ARMS]
    if bad:
        parser.error(f"unknown arm {bad[0]!r}: the arms are {', '.join(ARMS)}")
    if args.k < 1 or args.max_tokens < 1 or args.rounds < 1:
        parser.error("--k, --max-tokens and --rounds must be at least 1")
    if vllm_server.python() is None:
        sys.exit(f"vLLM is not installed: {vllm_server.INSTALL_HINT}")
    folder = vllm_server.model_dir()
    workloads = {}
    if "agent" in args.workloads:
        workloads["agent"] = agent_cases(SETS[args.set]["half"])
    if "edit" in args.workloads:
        workloads["edit"] = edit_cases(folder, SETS[args.set]["rev"])
    tmp = Path(tempfile.mkdtemp(prefix="vllm-proposers-"))
    arms = [Arm(a, args.k, tmp) for a in args.arms]
    try:
        # The oracle first: its sweep measures the t(n) that "assistd:cost=measured" needs.
        extra = {}
        for arm in sorted(arms, key=lambda a: a.name != "oracle"):
            if arm.start() and arm.oracle is not None:
                extra[arm.name] = {"cost": sweep(arm, workloads, tmp / "vllm_cost.json")}
                if args.cost_out:
                    shutil.copy(tmp / "vllm_cost.json", args.cost_out)
        results = run_interleaved(arms, workloads, args.max_tokens, args.rounds)
        for name, more in extra.items():
            results[name].update(more)
    finally:
        for arm in arms:
            arm.stop()
        kept = {a.name: a.log.read_text()[-3000:] for a in arms if a.log.exists()}
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
    for arm, res in results.items():
        if "cost" in res:
            console.print(f"{arm}: vLLM ms per step over n tokens (n - 1 drafts, all accepted):"
                          f" {res['cost']['points']}")


if __name__ == "__main__":
    main()
