"""Does verifying assistd's drafts on a remote server pay against the server's own speculation?

    nice .venv/bin/python benchmarks/remote_verify.py [--prompts 3] [--prompt-tokens 48]
        [--new-tokens 24] [--k 8] [--curve 16,32,64,128,256] [--cache-curve] [--json FILE]
    .venv/bin/python benchmarks/remote_verify.py --url http://H:8000 --spec-url http://H:8001 \
        --model-name M [--tokenizer GGUF]          # running servers instead (e.g. vLLM)

Issue 25, item 2. Against real llama-cpp-python servers on loopback (``python -m
llama_cpp.server``, the embedded SmolLM2 GGUF, 2 threads, started one after the other),
on prompts cut from real text (files of this repository and the shared transcripts in
../shared/fixtures/transcripts, read in place), each arm generates ``--new-tokens``
tokens greedily:

(a) plain: one streamed ``/v1/completions`` on a server without speculation;
(b) server speculation: the same on a server started with llama-cpp-python's prompt
    lookup decoding (``--draft_model prompt-lookup-decoding``, 10 tokens);
(c) remote verification: assistd's suffix proposer (proposers/suffix.py; its history is
    the prompt's whole document, as if that file had been indexed) drafts up to ``--k``
    tokens; one request scores the prompt + draft (``echo: true``, ``logprobs: 2``,
    ``max_tokens: 1``); the longest draft prefix whose every token is the top-1
    log-probability token is accepted, then the server's next token (the top-1 at the
    first rejected position, or the completion token after a fully accepted draft) is
    committed. With no draft, a plain ``max_tokens: 1`` request (no echo) commits one
    token. Greedy only: top-1 is the argmax of the logits the server computed; a sampled
    draft cannot be verified from top-k log-probabilities.

Then the per-request cost of a scoring request as a function of prompt length (cold: the
server's KV cache holds another prompt; warm: it holds the same text less its last 8
tokens, as in (c)), beside a plain ``max_tokens: 1`` request; ``--cache-curve`` repeats it
on a server started with ``--cache true`` (llama-cpp-python's RAM state cache).

Reports ms per committed token (total wall time / tokens, prefill included), each arm's
ratio to (a) (median over prompts), (c)'s acceptance (rounds, draft and accepted tokens,
tokens per request), the same proposer's oracle walk against (a)'s tokens, (c) modeled at
100 / 1,000 / 2,000 prompt tokens from the fitted cost line, whether (b) and (c) produce
(a)'s text (where (c) first differs, with its top-1/top-2 margin there: a batched forward
and a one-token forward can order a near-tie differently, so neither (b) nor (c) need
equal (a) token for token), and the load average of the machine before and after.

llama-cpp-python facts this relies on (0.3.x, llama_cpp/llama.py ``_create_completion``):
the server takes ``prompt`` as text only (it re-tokenizes; drafts are cut where text
round-tripping would change their tokens); with ``echo`` its log-probability row *i*
is the distribution of token *i + 1* (row 0's ``null`` hides the distribution of token
1), not of token *i* as in OpenAI's and vLLM's echo (:func:`rows_predict_next` checks
which on the server at hand; abetlen/llama-cpp-python#1983); and each echoed row is a
full-vocabulary Python sort, whatever the KV cache holds. Against vLLM (``--url``) the
same requests apply; untried here (no vLLM on a CPU machine).

Measured (2026-12-01, 2-core CPU at load 3-6, 3 prompts of 48 tokens, 24 new tokens, k 8):
median ms per token (a) 412.8, (b) 539.9 (1.31x), (c) 4292.8 (13.46x); (c) accepted 14 of
67 draft tokens (the oracle walk: 31 of 89); a scoring request ~165 ms + 112 ms per prompt
token, warm no cheaper than cold. Verdict: not kept in the product.

On a GPU with vLLM (not yet run; vLLM is not in benchmarks/gpu/payload): plain and scoring
``vllm serve MODEL --port 8000 --max-model-len 4096 --enable-prefix-caching --max-logprobs 2
--seed 0``; the server's own speculation on port 8001 with ``--speculative-config
'{"method":"ngram","num_speculative_tokens":8,"prompt_lookup_max":4,"prompt_lookup_min":2}'``
and with ``'{"method":"suffix","num_speculative_tokens":16}'``; again with
``VLLM_BATCH_INVARIANT=1`` for (c) = (a) token for token. Then ``--url
http://127.0.0.1:8000 --spec-url http://127.0.0.1:8001 --model-name MODEL --prompt-tokens
1000 --new-tokens 64 --curve 100,1000,2000`` (``--tokenizer`` the GGUF when serving
SmolLM2), watching ``/metrics``' prefix-cache hits (0 expected for scoring requests:
vLLM computes prompt log-probabilities without its prefix cache, PR #17251). (c) pays
only if one full prompt + draft pass costs less than ~1.7 of the server's speculative
steps (1.7: the best tokens per request measured here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.ground.numerics import first_difference  # noqa: E402
from assistd.targets.open import default_model_path  # noqa: E402
from harness.ports import free_port  # noqa: E402
from harness.openai_server import start_llama_server, stop_llama_server  # noqa: E402

GREEDY = {"temperature": 0.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}
TRANSCRIPTS = ROOT.parent / "shared" / "fixtures" / "transcripts"
SOURCES = [ROOT / "assistd" / "decoding" / "engine.py", ROOT / "proposers" / "suffix.py",
           TRANSCRIPTS / "aider" / "aider__tests_fixtures_chat-history.TRUNCATED.md",
           ROOT / "assistd" / "measure" / "replay.py",
           TRANSCRIPTS / "mini-swe-agent" / "django__django-16139.traj.json"]
SCOPE = "remote-verify"
NEAR_TIE = 0.1  # nats between top-1 and top-2: where batched and one-token forwards disagreed
EXTRA: dict = {}  # fields every request carries (``--model-name``: vLLM's "model")
RESET = "Zebras graze."  # a request on another text, so the next prompt starts cold


# -- servers -------------------------------------------------------------------------------

def start_server(*extra: str, log: Path | None = None) -> tuple[subprocess.Popen, str]:
    """llama-cpp-python's server with the embedded model on a free loopback port, n_ctx
    2048, plus ``extra`` arguments (harness/openai_server.py starts it); returns
    ``(process, base URL)`` once ``/v1/models`` answers."""
    port = free_port()
    log = log or Path(f"/tmp/remote_verify_server_{port}.log")
    return start_llama_server(port, log, *extra, n_ctx=2048), f"http://127.0.0.1:{port}"


stop_server = stop_llama_server


def complete(http: httpx.Client, prompt: str, **fields) -> dict:
    r = http.post("/v1/completions", json={"prompt": prompt, **GREEDY, **EXTRA, **fields})
    r.raise_for_status()
    return r.json()


# -- the tokenizer (the GGUF's vocabulary, no weights) ------------------------------------

class Vocab:
    """The model's tokenizer, as the server tokenizes text (same GGUF, same library)."""

    def __init__(self, model: Path | None = None):
        import llama_cpp

        self.llm = llama_cpp.Llama(str(model or default_model_path()), vocab_only=True,
                                   verbose=False)

    def ids(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def piece(self, token: int) -> str | None:
        """The token's text, or None where it is no whole UTF-8 text (a byte piece)."""
        try:
            return self.llm.detokenize([int(token)]).decode("utf-8")
        except UnicodeDecodeError:
            return None


# -- the accept rule -----------------------------------------------------------------------

def rows_predict_next(http: httpx.Client) -> bool:
    """Whether the server's echoed log-probability row *i* is the distribution of token
    *i + 1* (llama-cpp-python) rather than of token *i* (OpenAI, vLLM). Told by one
    greedy ``max_tokens: 1`` request: in the first case there is one row per prompt token
    and the last one's top-1 is the completion token; in the second the completion token
    has a row of its own, after the prompt's. Raises RuntimeError if neither fits."""
    body = complete(http, "def fibonacci(n):\n    if", max_tokens=1, echo=True, logprobs=1)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    n_prompt = body["usage"]["prompt_tokens"]
    completion = choice["text"][len("def fibonacci(n):\n    if"):]
    rows = lp["top_logprobs"]
    if len(rows) == n_prompt and next(iter(rows[-1])) == completion:
        return True
    if len(rows) == n_prompt + 1 and next(iter(rows[-1])) == completion:
        return False
    raise RuntimeError(f"cannot align echoed log-probabilities: {len(rows)} rows for "
                       f"{n_prompt} prompt tokens, completion {completion!r}")


@dataclass
class Verdict:
    """One scoring request read: ``accepted`` draft tokens, then ``next_piece`` (the
    server's token at the first rejected position, or after the whole draft), its
    ``margins`` (top-1 minus top-2 log-probability at each row read, nats; None where the
    row has no distinct second entry) and ``aligned`` (the server tokenized the draft as
    assistd did)."""

    accepted: int
    next_piece: str
    margins: list[float | None]
    aligned: bool
    finished: bool = False


def read_scoring(body: dict, prompt: str, n_context: int, draft_pieces: list[str],
                 next_row: bool) -> Verdict:
    """Apply the accept rule to a scoring response (``echo: true``, ``logprobs >= 1``,
    ``max_tokens: 1``) of ``prompt`` = context + draft, the context being ``n_context``
    tokens. ``next_row``: :func:`rows_predict_next`. Draft token j is accepted when it
    and every token before it is its row's top-1 (compared as text)."""
    choice = body["choices"][0]
    lp = choice["logprobs"]
    rows, tokens = lp["top_logprobs"], lp["tokens"]
    k = len(draft_pieces)
    aligned = tokens[n_context:n_context + k] == draft_pieces and \
        body["usage"]["prompt_tokens"] == n_context + k
    shift = 1 if next_row else 0
    margins: list[float | None] = []
    accepted = 0
    top = None
    for j in range(k + 1):
        at = n_context + j - shift  # the row whose distribution is of position n_context + j
        if j == k and not next_row:
            break  # the completion token below is the server's choice after the draft
        row = rows[at]
        if row is None:
            raise RuntimeError(f"no log-probabilities at row {at}")
        top = next(iter(row))
        margins.append(_margin_of(row))
        if j == k or not aligned or top != draft_pieces[j]:
            break
        accepted += 1
    completion = choice["text"][len(prompt):]
    finished = choice["finish_reason"] == "stop"
    if accepted == k:
        # Every draft token stood: the completion token is the server's next one.
        return Verdict(accepted, completion, margins, aligned, finished and not completion)
    return Verdict(accepted, top, margins, aligned)


def _margin_of(row: dict) -> float | None:
    # Top-1 first, top-2 second, then the row's own token (llama-cpp-python's order;
    # the own token only rewrites an entry of the same token with the same value).
    values = list(row.values())
    return values[0] - values[1] if len(values) > 1 else None


# -- the arms ------------------------------------------------------------------------------

@dataclass
class Run:
    text: str
    tokens: int
    ms: float
    first_ms: float | None = None
    pieces: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)

    @property
    def ms_per_token(self) -> float:
        return self.ms / max(self.tokens, 1)


def stream(http: httpx.Client, prompt: str, n: int) -> Run:
    """(a) and (b): one streamed greedy completion of ``n`` tokens."""
    complete(http, RESET, max_tokens=1)
    pieces, first, finish = [], None, None
    t0 = time.perf_counter()
    with http.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": n,
                                                       "stream": True, **GREEDY, **EXTRA}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            if choice["text"]:
                pieces.append(choice["text"])
                first = first or time.perf_counter()
            finish = choice.get("finish_reason") or finish
    ms = (time.perf_counter() - t0) * 1000
    text = "".join(pieces)
    tokens = n if finish == "length" else len(pieces)
    return Run(text, tokens, ms, (first - t0) * 1000 if first else None, pieces)


def verify(http: httpx.Client, vocab: Vocab, proposer, prompt: str, n: int, k: int,
           next_row: bool) -> Run:
    """(c): draft with ``proposer``, score on the server, commit; until ``n`` tokens."""
    complete(http, RESET, max_tokens=1)
    committed: list[str] = []  # one text piece per committed token
    margins: list[float | None] = []  # top-1 minus top-2 of each committed token's row
    st = {"scoring_requests": 0, "plain_requests": 0, "draft_tokens": 0, "accepted": 0,
          "misaligned": 0, "min_margin": None, "near_ties": 0, "request_ms": []}
    t0 = time.perf_counter()
    while len(committed) < n:
        text = prompt + "".join(committed)
        ctx = vocab.ids(text)
        draft = proposer.propose(np.asarray(ctx, dtype=np.int64), k, scope=SCOPE)
        pieces = _round_trip(vocab, ctx, text, [] if draft is None else draft.tokens.tolist())
        t1 = time.perf_counter()
        if not pieces:
            body = complete(http, text, max_tokens=1)
            st["plain_requests"] += 1
            piece = body["choices"][0]["text"]
            st["request_ms"].append((time.perf_counter() - t1) * 1000)
            if not piece:
                break  # end of generation
            committed.append(piece)
            margins.append(None)
            continue
        body = complete(http, text + "".join(pieces), max_tokens=1, echo=True, logprobs=2)
        st["request_ms"].append((time.perf_counter() - t1) * 1000)
        v = read_scoring(body, text + "".join(pieces), len(ctx), pieces, next_row)
        st["scoring_requests"] += 1
        st["draft_tokens"] += len(pieces)
        st["accepted"] += v.accepted
        st["misaligned"] += not v.aligned
        for m in v.margins:
            if m is not None:
                st["min_margin"] = m if st["min_margin"] is None else min(st["min_margin"], m)
                st["near_ties"] += m < NEAR_TIE
        committed += pieces[:v.accepted]
        read = v.margins + [None] * (v.accepted + 1 - len(v.margins))
        margins += read[:v.accepted]
        if v.finished or not v.next_piece:
            break
        committed.append(v.next_piece)
        margins.append(read[v.accepted])
    ms = (time.perf_counter() - t0) * 1000
    committed = committed[:n]
    rounds = st["scoring_requests"] + st["plain_requests"]
    st["tokens_per_request"] = round(len(committed) / max(rounds, 1), 2)
    st["acceptance"] = round(st["accepted"] / max(st["draft_tokens"], 1), 3)
    st["median_request_ms"] = round(statistics.median(st.pop("request_ms") or [0]), 1)
    st["margins"] = margins[:n]
    return Run("".join(committed), len(committed), ms, pieces=committed, stats=st)


def _round_trip(vocab: Vocab, ctx: list[int], text: str, draft: list[int]) -> list[str]:
    """The draft's pieces, cut before the first token that the server would not see as
    that token: a byte piece, or one that text re-tokenization merges or splits."""
    pieces = []
    for t in draft:
        p = vocab.piece(t)
        if not p:
            break
        pieces.append(p)
    while pieces and vocab.ids(text + "".join(pieces)) != ctx + draft[:len(pieces)]:
        pieces.pop()
    return pieces


# -- prompts -------------------------------------------------------------------------------

def load_prompts(vocab: Vocab, count: int, prompt_tokens: int) -> list[tuple[str, str, list[int]]]:
    """``(name, prompt text, whole document ids)``: from each source, the text of
    ``prompt_tokens`` tokens starting a third of the way in, cut at a line start."""
    out = []
    for path in SOURCES:
        if len(out) == count:
            break
        if not path.is_file():
            continue
        doc = path.read_text(encoding="utf-8", errors="replace")
        start = doc.find("\n", len(doc) // 3) + 1
        ids = vocab.ids(doc[start:])[:prompt_tokens]
        prompt = vocab.llm.detokenize(ids).decode("utf-8", errors="ignore")
        out.append((str(path.relative_to(ROOT.parent)), prompt, vocab.ids(doc)))
    if not out:
        raise SystemExit("no prompt sources found")
    return out


def suffix_proposer(doc_ids: list[int]):
    from proposers.index import HistoryIndex
    from proposers.suffix import SuffixProposer

    index = HistoryIndex()
    index.put(SCOPE, 1, np.asarray(doc_ids, dtype=np.int64), "document")
    return SuffixProposer(index)  # no cost model: a longer draft costs the server ~nothing


# -- the per-request cost ------------------------------------------------------------------

def cost_curve(http: httpx.Client, vocab: Vocab, lengths: list[int], next_row: bool) -> list[dict]:
    """ms of a scoring request (echo, logprobs 2, max_tokens 1) at each prompt length,
    cold and warm (KV holding all but the last 8 tokens), and of a plain max_tokens 1
    request, warm."""
    doc = SOURCES[0].read_text()
    ids = vocab.ids(doc)
    out = []
    for n in lengths:
        text = vocab.llm.detokenize(ids[:n]).decode("utf-8", errors="ignore")
        head = vocab.llm.detokenize(ids[:max(n - 8, 1)]).decode("utf-8", errors="ignore")
        row = {"prompt_tokens": n}
        complete(http, RESET, max_tokens=1)
        t = time.perf_counter()
        complete(http, text, max_tokens=1, echo=True, logprobs=2)
        row["scoring_cold_ms"] = round((time.perf_counter() - t) * 1000, 1)
        complete(http, head, max_tokens=1)
        t = time.perf_counter()
        complete(http, text, max_tokens=1, echo=True, logprobs=2)
        row["scoring_warm_ms"] = round((time.perf_counter() - t) * 1000, 1)
        complete(http, head, max_tokens=1)
        t = time.perf_counter()
        complete(http, text, max_tokens=1)
        row["plain_warm_ms"] = round((time.perf_counter() - t) * 1000, 1)
        out.append(row)
        print(f"  {n:5d} tokens: scoring cold {row['scoring_cold_ms']:9.1f} ms, warm "
              f"{row['scoring_warm_ms']:9.1f} ms; plain warm {row['plain_warm_ms']:7.1f} ms",
              flush=True)
    return out


# -- main ----------------------------------------------------------------------------------

def difference_at(a: Run, c: Run) -> dict | None:
    """Where (c)'s tokens first differ from (a)'s (stream chunks, one per token), with
    (c)'s top-1/top-2 margin there; None when the texts are equal."""
    if a.text == c.text:
        return None
    i = first_difference(a.pieces, c.pieces)
    if i is None or i == min(len(a.pieces), len(c.pieces)):  # same pieces, or one stops early
        return {"token": i if i is not None else len(a.pieces), "a": None, "c": None,
                "c_margin": None}
    margins = c.stats.get("margins", [])
    return {"token": i, "a": a.pieces[i], "c": c.pieces[i],
            "c_margin": margins[i] if i < len(margins) else None}


def oracle_walk(vocab: Vocab, proposer, prompt: str, truth_text: str, n: int, k: int) -> dict:
    """(c)'s rounds without a server: the same proposer against (a)'s tokens as the
    truth (replay's oracle walk). Counts scoring requests, plain requests, tokens."""
    from assistd.measure.replay import common_prefix_len

    base = vocab.ids(prompt)
    truth = vocab.ids(prompt + truth_text)[len(base):][:n]
    pos = scoring = plain = drafted = accepted = 0
    while pos < len(truth):
        ctx = np.asarray(base + truth[:pos], dtype=np.int64)
        draft = proposer.propose(ctx, k, scope=SCOPE)
        if draft is None:
            plain += 1
            pos += 1
            continue
        m = common_prefix_len(draft.tokens, np.asarray(truth[pos:], dtype=np.int64))
        scoring += 1
        drafted += len(draft.tokens)
        accepted += m
        pos += m + 1
    return {"scoring_requests": scoring, "plain_requests": plain, "draft_tokens": drafted,
            "accepted": accepted, "tokens": len(truth)}


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)``."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(intercept), float(slope)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--k", type=int, default=8, help="draft tokens at most per request")
    ap.add_argument("--curve", default="16,32,64,128,256",
                    help="prompt lengths (tokens) of the per-request cost curve")
    ap.add_argument("--cache-curve", action="store_true",
                    help="repeat the curve on a server with --cache true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--url", default=None,
                    help="a running server for (a), (c) and the curve (e.g. vLLM) instead of "
                         "starting llama_cpp.server")
    ap.add_argument("--spec-url", default=None,
                    help="a running server with its own speculation for (b)")
    ap.add_argument("--model-name", default=None, help='"model" of every request')
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="the served model's GGUF (its vocabulary) [default: the embedded one]")
    args = ap.parse_args()
    if args.model_name:
        EXTRA["model"] = args.model_name
    lengths = [int(x) for x in args.curve.split(",") if x]
    load = {"cores": os.cpu_count(), "loadavg_start": os.getloadavg()}
    vocab = Vocab(args.tokenizer)
    prompts = load_prompts(vocab, args.prompts, args.prompt_tokens)
    results: dict = {"args": {k: str(v) if isinstance(v, Path) else v
                              for k, v in vars(args).items()}, "prompts": []}

    proc, url = (None, args.url) if args.url else start_server()
    try:
        with httpx.Client(base_url=url, timeout=900) as http:
            complete(http, "warm up", max_tokens=2)
            next_row = rows_predict_next(http)
            results["rows_predict_next"] = next_row
            print(f"echoed row i is the distribution of token {'i + 1' if next_row else 'i'}")
            for name, prompt, doc_ids in prompts:
                a = stream(http, prompt, args.new_tokens)
                c = verify(http, vocab, suffix_proposer(doc_ids), prompt, args.new_tokens,
                           args.k, next_row)
                diff = difference_at(a, c)
                oracle = oracle_walk(vocab, suffix_proposer(doc_ids), prompt, a.text,
                                     args.new_tokens, args.k)
                results["prompts"].append({
                    "name": name, "prompt_tokens": len(vocab.ids(prompt)),
                    "a_ms_per_token": round(a.ms_per_token, 1), "a_first_ms": a.first_ms,
                    "c_ms_per_token": round(c.ms_per_token, 1), "c": c.stats,
                    "c_oracle": oracle, "c_equals_a": diff is None, "first_difference": diff,
                    "a_text": a.text, "c_text": c.text})
                shown = {key: v for key, v in c.stats.items() if key != "margins"}
                print(f"{name}: (a) {a.ms_per_token:.1f} ms/token, (c) {c.ms_per_token:.1f} "
                      f"ms/token {shown}; oracle {oracle}; (c) == (a): {diff is None}"
                      + (f" (first difference {diff})" if diff else ""), flush=True)
            print("per-request cost (plain server):")
            results["curve"] = cost_curve(http, vocab, lengths, next_row)
    finally:
        if proc is not None:
            stop_server(proc)

    proc, url = (None, args.spec_url) if args.spec_url else start_server(
        "--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "10")
    try:
        with httpx.Client(base_url=url, timeout=900) as http:
            complete(http, "warm up", max_tokens=2)
            for row, (name, prompt, _) in zip(results["prompts"], prompts):
                b = stream(http, prompt, args.new_tokens)
                row["b_ms_per_token"] = round(b.ms_per_token, 1)
                row["b_equals_a"] = b.text == row["a_text"]
                print(f"{name}: (b) {b.ms_per_token:.1f} ms/token; equal: {row['b_equals_a']}",
                      flush=True)
    finally:
        if proc is not None:
            stop_server(proc)

    if args.cache_curve and not args.url:
        proc, url = start_server("--cache", "true")
        try:
            with httpx.Client(base_url=url, timeout=900) as http:
                complete(http, "warm up", max_tokens=2)
                print("per-request cost (server with --cache true):")
                results["curve_cache"] = cost_curve(http, vocab, lengths, next_row)
        finally:
            stop_server(proc)

    load["loadavg_end"] = os.getloadavg()
    results["load"] = load
    rows = results["prompts"]
    med = {arm: statistics.median(r[f"{arm}_ms_per_token"] for r in rows) for arm in "abc"}
    ratio = {arm: statistics.median(r[f"{arm}_ms_per_token"] / r["a_ms_per_token"]
                                    for r in rows) for arm in "bc"}
    # (c) at the prompt sizes: the oracle's request counts at the fitted costs.
    curve = results["curve"]
    score = fit_line([r["prompt_tokens"] for r in curve], [r["scoring_warm_ms"] for r in curve])
    plain_ms = statistics.median(r["plain_warm_ms"] for r in curve)
    tot = {key: sum(r["c_oracle"][key] for r in rows) for key in rows[0]["c_oracle"]}
    modeled = {p: round((tot["scoring_requests"] * (score[0] + score[1] * (p + args.k))
                         + tot["plain_requests"] * plain_ms) / max(tot["tokens"], 1), 1)
               for p in (100, 1000, 2000)}
    results["summary"] = {"median_ms_per_token": med, "median_ratio_to_a": ratio,
                          "oracle_totals": tot, "scoring_fit_ms": {"intercept": score[0],
                                                                   "per_token": score[1]},
                          "c_modeled_ms_per_token": modeled}
    print(f"(c) oracle totals {tot}; scoring request ~ {score[0]:.0f} ms + {score[1]:.1f} ms "
          f"per prompt token; (c) modeled ms/token at 100/1000/2000 prompt tokens: {modeled}")
    print(f"\nmedian ms per committed token: (a) {med['a']:.1f}, (b) {med['b']:.1f} "
          f"({ratio['b']:.2f}x a), (c) {med['c']:.1f} ({ratio['c']:.2f}x a)")
    print(f"load average {load['loadavg_start']} -> {load['loadavg_end']} on {load['cores']} cores")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
