"""Exactness of the torch Target's verification path on real weights (any device).

Greedy: speculative decoding (``suffix`` and ``ngram`` drafts from this repository's
sources) against plain decoding, token by token, on real prompts; at a first difference
the plain run's top-2 logit gap says whether it is a near-tie (float rounding choosing
between two almost equal logits: docs/design.md, "Exactness", "Numerics") or a fault.
Sampling: a χ² test of the first committed token over many speculative-sampling rounds
against the Target's own p, on logits the device computed, with a deliberately biased
sampler as the control that the test can fail.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from assistd.decoding.engine import generate
from assistd.decoding.verify import NEAR_TIE_GAP, sample_accept
from assistd.ground.numerics import first_difference
from assistd.ground.sampling import SamplingParams, target_distribution
from proposers.index import HistoryIndex
from proposers.ngram import NgramProposer
from proposers.suffix import SuffixProposer

REPO = Path(__file__).resolve().parents[2]
# (file, prompt tokens): code to continue and prose, from this repository.
PROMPTS = [("assistd/decoding/engine.py", 700), ("proposers/suffix.py", 500),
           ("assistd/ground/costmodel.py", 400), ("README.md", 300)]
ALPHA = 1e-4  # as tests/ground/test_sampling.py: reject "matches p" below this p-value


def with_bos(target, ids: list[int]) -> list[int]:
    return ([target.bos_token_id] if target.add_bos else []) + ids


def history_for(target) -> HistoryIndex:
    """This repository's Python sources (``assistd/``, ``proposers/``) as scope ``repo``."""
    index = HistoryIndex()
    files = sorted((REPO / "assistd").rglob("*.py")) + sorted((REPO / "proposers").glob("*.py"))
    for i, path in enumerate(files):
        index.put("repo", i + 1, target.tokenize(path.read_text(encoding="utf-8")), path.name)
    return index


def greedy(target, n_prompts: int, prompt_tokens: int, max_tokens: int, k: int,
           deadline: float) -> dict:
    """Plain vs ``suffix`` and ``ngram`` greedy decoding on the first ``n_prompts`` of
    :data:`PROMPTS` (at most ``prompt_tokens`` each), ``max_tokens`` new tokens each,
    draft ceiling ``k``, until ``deadline`` (``time.monotonic()``). Returns ``{"rows":
    [...], "verdict": "identical" | "near-ties only" | "DIFFERENT", "partial": bool}``; each row has the arm, the first
    difference (token index or None), plain's top-2 gap there, the counters D, C, R and
    decode ms (total − prefill) of plain and of the arm."""
    history = history_for(target)
    rows, partial = [], False
    for path, n in PROMPTS[:n_prompts]:
        if time.monotonic() > deadline:
            partial = True
            break
        text = (REPO / path).read_text(encoding="utf-8")
        ids = with_bos(target, target.tokenize(text)[: min(n, prompt_tokens)])
        plain = generate(target, ids, None, max_tokens=max_tokens, trace=True, reuse_prefix=False)
        plain_ms = plain.ledger.total_ms - plain.ledger.prefill_ms
        for arm in (SuffixProposer(history), NgramProposer(history)):
            g = generate(target, ids, arm, max_tokens=max_tokens, k=k, scope="repo")
            i = first_difference(plain.tokens, g.tokens)
            gap = plain.top2_gaps[i] if i is not None and i < len(plain.top2_gaps) else None
            verdict = ("identical" if i is None else
                       "near-tie" if gap is not None and gap < NEAR_TIE_GAP else "DIFFERENT")
            led = g.ledger
            rows.append({"prompt": path, "prompt_tokens": len(ids), "arm": arm.name,
                         "tokens": len(plain.tokens), "first_difference": i, "top2_gap": gap,
                         "verdict": verdict, "draft_tokens": led.draft_tokens,
                         "accepted_tokens": led.accepted_tokens, "rounds": led.rounds,
                         "plain_decode_ms": plain_ms,
                         "arm_decode_ms": led.total_ms - led.prefill_ms})
    verdicts = {r["verdict"] for r in rows}
    overall = ("DIFFERENT" if "DIFFERENT" in verdicts else
               "near-ties only" if "near-tie" in verdicts else "identical")
    return {"near_tie_gap": NEAR_TIE_GAP, "rows": rows, "verdict": overall, "partial": partial}


def chisquare_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson χ² p-value, ``len - 1`` degrees of freedom (scipy's ``chisquare``; written
    with torch's regularised incomplete gamma, since the GPU machine has no scipy)."""
    import torch

    stat = float(((observed - expected) ** 2 / expected).sum())
    df = torch.tensor((len(observed) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))


def poisson_tail(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean): a rare token's one-sided test (binomial, small p)."""
    import torch

    if k <= 0:
        return 1.0
    return float(torch.special.gammainc(torch.tensor(float(k), dtype=torch.float64),
                                        torch.tensor(mean, dtype=torch.float64)))


def lumped_pvalue(samples: np.ndarray, p, watch=()) -> float:
    """p-value that ``samples`` come from p, as tests/ground/test_sampling.py's
    ``lumped_chisquare``: χ² over the tokens expected >= 20 times and the ``watch``
    (drafted) tokens expected >= 5 times, the rest lumped into one bin; a watched token
    expected < 5 times gets a one-sided tail test; Bonferroni-combined."""
    n = len(samples)
    watch = {int(t) for t in watch}
    keep = {int(t) for t in p.ids[p.probs * n >= 20]} | {t for t in watch if p.prob(t) * n >= 5}
    rare = sorted(watch - keep)
    keep = sorted(keep)
    obs = np.array([(samples == t).sum() for t in keep], dtype=np.float64)
    exp = np.array([p.prob(t) * n for t in keep])
    rest_obs, rest_exp = n - obs.sum(), n - exp.sum()
    if rest_exp >= 20:
        obs, exp = np.append(obs, rest_obs), np.append(exp, rest_exp)
    elif rest_obs > max(5, 3 * rest_exp):
        return 0.0  # samples where p has (almost) no mass: certainly not p
    else:
        exp = exp * obs.sum() / exp.sum()
    pvalues = [chisquare_pvalue(obs, exp)]
    pvalues += [poisson_tail(int((samples == t).sum()), p.prob(t) * n) for t in rare]
    return min(1.0, min(pvalues) * len(pvalues))


def sampling(target, draws: int, seed: int = 5) -> dict:
    """χ² of the first committed token over ``draws`` rounds of ``sample_accept`` at
    temperature 1 with a likely, a less likely and the least likely draft, on one round's
    logits ``[last, d1, d1]`` after a code prompt; the same for a sampler biased by 2% in
    total variation, which must be rejected. Returns both p-values and the verdict."""
    code = "import os\n\n\ndef read_config(path):\n    with open(path) as f:\n       "
    ids = with_bos(target, target.tokenize(code))
    target.truncate(0)
    target.evaluate(ids[:-1], [])
    d1 = int(target.evaluate([ids[-1]], [0])[0].argmax())
    target.truncate(len(ids) - 1)
    logits = target.evaluate([ids[-1], d1, d1], range(3))
    target.truncate(0)
    params = SamplingParams(temperature=1.0)
    dists = [target_distribution(row, params) for row in logits]
    p = dists[0]
    order = p.ids[np.argsort(-p.probs)]
    drafts = [[int(order[0]), int(order[0])], [int(order[min(1, len(order) - 1)]), 7],
              [int(order[-1]), 3]]
    rng = np.random.default_rng(seed)

    def first_tokens(bias: float) -> np.ndarray:
        out = np.empty(draws, dtype=np.int64)
        for n, pick in enumerate(rng.integers(len(drafts), size=draws)):
            draft = drafts[pick]
            j, tok = sample_accept(draft, lambda i: dists[i], rng)
            if j == 0 and bias and rng.random() < bias / (1 - p.prob(draft[0])):
                j = 1  # the biased control: keep a rejected draft token anyway
            out[n] = draft[0] if j >= 1 else tok
        return out

    t0 = time.perf_counter()
    watch = [d[0] for d in drafts]
    pvalue = lumped_pvalue(first_tokens(0.0), p, watch)
    control = lumped_pvalue(first_tokens(0.02), p, watch)
    return {"draws": draws, "support": int(len(p.ids)), "pvalue": pvalue,
            "biased_control_pvalue": control, "alpha": ALPHA,
            "verdict": ("DIFFERS from p" if pvalue <= ALPHA else "matches p" if control <= ALPHA
                        else "control not rejected (test too weak)"),
            "seconds": time.perf_counter() - t0}
