"""``assistd bench``: plain decoding, every proposer and the in-stack peers on one ledger.

One Target per numerics mode, the same prompts. The main process runs every arm under
``--numerics``; on the llama.cpp backend plain decoding also runs under each other mode
(:mod:`assistd.ground.numerics`) in a companion process of its own
(:mod:`assistd.measure.bench_companion`: ggml fixes its kernels once per process), driven
in turn with the others, so the processes never share the cores. Each case is prefilled
once (every Target and the peer library keep its KV, so no arm pays for the prompt),
then run ``repeats`` times; in every repeat each arm runs once, in an order rotated from
case to case and repeat to repeat, so that drift in the machine's speed hits every arm
alike.

The **baseline** of every speedup is plain decoding with llama.cpp's own default kernels
on every thread (``plain:llama``, numerics ``llama``; on torch, ``plain``): what a user
runs without assistd. Each arm's ``ceiling`` is the best chain speedup over it that this
run's own figures allow (:func:`chain_ceiling`).

Arms:

- ``plain``: the engine with no proposer (k = 0) under the main numerics;
  ``plain:llama`` and ``plain:exact``: the same in the companions;
- our proposers (``ngram``, ``suffix``; ``draft_model`` given ``--draft-model``) with
  the workload's history and ``--k`` (``auto``: a fresh tuner per workload, learning as
  the run goes, seeded with the startup calibration of t(n)); as for a completion
  (:meth:`assistd.runtime.runtime.Runtime.plan`), each generation gets a proposer priced
  by the tuner's cost model, which learns t(n) from the forwards of the tuned arms;
- the peers' rules in our loop, with the peers' own defaults (``peer:llama-cpp-python-pld``
  and ``peer:transformers-pld`` at k = 10, ``peer:suffixdecoding`` at k = 16): the same
  verification, so their ledger is comparable position by position;
- with ``--tree on|both``, the token-tree mode of the proposers that have one
  (``suffix+tree``, ``peer:suffixdecoding+tree``; :func:`assistd.measure.replay.tree_arms`),
  at most ``--nodes`` nodes a round, on a llama.cpp Target opened with
  ``tree_branches`` = :data:`TREE_BRANCHES` (one batch per tree; torch takes any tree);
- on the llama.cpp backend, the library itself: llama-cpp-python's ``Llama`` with
  ``draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)`` and ``logits_all=True``
  (what its docs prescribe), a second instance on the same GGUF and threads, greedy
  (``temp=0``). Its decode loop is its own, so it reports speed and output only.

Per arm and workload the ledger sums the raw counters over cases and repeats (the
formulas of docs/design.md, "Vocabulary", on read), and:

- tokens/s = committed tokens / decode seconds, decode = prefill excluded (the library
  peer: the wall time of ``generate`` over a cached prompt, which evaluates the last
  prompt token, as our first step does);
- speedup = tokens/s / the baseline's tokens/s over the whole run; its spread is the
  min and max of the same ratio within each repeat; ``speedup_vs_plain``: over the main
  process's plain arm;
- ceiling: :func:`chain_ceiling` from the arm's per-position acceptance and this
  workload's measured t(n), at coverage 1 and at the arm's measured coverage;
- draft and verify ms per committed token; extra memory = bytes held beside the Target
  (the history index, a draft model, the library peer's ``logits_all`` score buffer);
- output match (greedy): the first repeat's tokens against plain's (a companion's
  plain: ``numerics`` where other kernels chose other tokens). Where they differ,
  plain decoding is run again with its top-2 logit gap traced: a difference where the
  gap is under :data:`assistd.decoding.verify.NEAR_TIE_GAP` is a rounding near-tie, any other
  one ``differs`` (a decoding bug). For a difference, the common prefix is also
  evaluated afresh in one batch and ``batch_argmax`` says whether the Target's argmax
  there is the arm's token: a diagnosis (did batch shape decide it?), never a pass;
  ``replay_argmax`` the same with the arm's own forwards replayed, shape for shape
  (:meth:`Bench._replay_argmax`), which checks the promise "the Target's argmax for
  the batch it verified" itself. A difference neither reproduces is ``unexplained``.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from assistd.decoding.engine import generate
from assistd.decoding.tuner import K_MAX
from assistd.decoding.verify import NEAR_TIE_GAP
from assistd.ground.errors import InputError
from assistd.ground.ledger import Ledger, ratio
from assistd.ground.numerics import BASELINE_NUMERICS, DEFAULT_NUMERICS, parse_numerics
from assistd.measure.bench_workloads import Case, Workload
from assistd.runtime.runtime import Plan, Runtime, index_width

PEER_RULE_K = {"peer:llama-cpp-python-pld": 10, "peer:transformers-pld": 10,
               "peer:suffixdecoding": 16,
               # Arctic's vLLM default num_speculative_tokens for suffix decoding
               "peer:arctic": 16, "peer:arctic-tree": 16}
TREE_BRANCHES = 16  # leaves of a tree round on llama.cpp (KV sequence ids in one batch)
LIBRARY_PEERS = {"llama": "llama-cpp-python PLD (library)",
                 "torch": "transformers prompt lookup (library)"}


@dataclass(frozen=True)
class Arm:
    """One way of decoding: ``kind`` is plain | proposer | peer-rule | peer-library;
    ``k`` the ceiling (tokens) or ``"auto"``; ``tree``: the proposer's token-tree mode
    (the arm is then named ``proposer+tree``); ``numerics``: a plain arm's mode when it
    runs in a companion process (None: the main process)."""

    name: str
    kind: str
    proposer: str | None
    k: int | str
    tree: bool = False
    numerics: str | None = None


def arms_for(proposers: Sequence[str], k: int | str, *, library_peer: str | None,
             draft_model: bool = False, tree: str = "off",
             companions: Sequence[str] = ()) -> list[Arm]:
    """Plain first, ``plain:MODE`` for each companion numerics mode, then the proposers
    named (a ``peer:`` name runs at its peer's k; ``NAME+tree`` and ``tree`` as
    :func:`assistd.measure.replay.tree_arms`), ``draft_model`` when a draft is given,
    and the library peer named ``library_peer``. Raises :class:`InputError` for an
    unknown arm."""
    from assistd.measure.replay import split_arm, tree_arms

    arms = [Arm("plain", "plain", None, 0)]
    arms += [Arm(f"plain:{m}", "plain", None, 0, numerics=m) for m in companions]
    for name in tree_arms(proposers, tree):
        proposer, is_tree = split_arm(name)
        if proposer == "draft_model" and not draft_model:
            raise InputError("--proposer draft_model needs --draft-model PATH")
        if proposer.startswith("peer:"):
            arms.append(Arm(name, "peer-rule", proposer, PEER_RULE_K.get(proposer, 10), is_tree))
        else:
            arms.append(Arm(name, "proposer", proposer, k, is_tree))
    if draft_model and "draft_model" not in proposers:
        arms.append(Arm("draft_model", "proposer", "draft_model", k))
    if library_peer:
        arms.append(Arm(library_peer, "peer-library", None, 10))
    return arms


DEFAULT_PROPOSERS = ("ngram", "suffix", "peer:suffixdecoding", "peer:llama-cpp-python-pld",
                     "peer:transformers-pld")


# ---------------------------------------------------------------- the library peer


class LlamaCppPromptLookup:
    """llama-cpp-python's own prompt-lookup decoding, on a second ``Llama`` of the
    Target's GGUF (``logits_all=True``, as ``LlamaPromptLookupDecoding`` requires)."""

    name = "llama-cpp-python PLD (library)"

    def __init__(self, target, *, num_pred_tokens: int = 10):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from assistd.targets.llama import open_llama

        threads = getattr(target, "n_threads", None) or 2
        # The Target's numerics, so that the peer's verification rounds like ours.
        self.llm = open_llama(
            target.model_path, numerics=target.numerics, threads=threads, n_ctx=target.n_ctx,
            logits_all=True, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens))
        self.eos = self.llm.token_eos()

    @property
    def memory_bytes(self) -> int:
        """The score buffer ``logits_all`` adds: n_ctx × n_vocab float32 (bytes)."""
        return int(self.llm.scores.nbytes)

    def prefill(self, prompt: list[int]) -> None:
        """Evaluate all but the last prompt token, as the engine's prefill does; the
        calls that follow reuse it (llama-cpp-python keeps the longest common prefix).

        Not ``generate(prompt, 1)``: measured with llama-cpp-python 0.3.36, a
        prompt-lookup call that follows a call stopped after one token returns other
        tokens than greedy decoding (the first difference at a top-2 logit gap of 0.33,
        then two tokens skipped); after an ``eval`` prefill it matches."""
        self.llm.reset()
        self.llm.eval(prompt[:-1])

    def generate(self, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
        """Greedy tokens (a final EOS included, as the engine returns them) and wall ms."""
        out: list[int] = []
        t0 = time.perf_counter()
        for tok in self.llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                     repeat_penalty=1.0):
            out.append(int(tok))
            if tok == self.eos or len(out) >= max_tokens:
                break
        return out, (time.perf_counter() - t0) * 1000

    def close(self) -> None:
        self.llm.close()


class TransformersPromptLookup:
    """transformers' own prompt lookup, ``model.generate(prompt_lookup_num_tokens=10,
    max_matching_ngram_size=2)``, greedy, on the torch Target's model object (no second
    copy). The prompt's KV cache is computed once per case and a copy is handed to every
    call (untimed), so it decodes from a cached prompt as the other arms do."""

    name = "transformers prompt lookup (library)"
    memory_bytes = 0  # the Target's own weights; its KV cache as the Target's

    def __init__(self, target, *, num_pred_tokens: int = 10, max_ngram_size: int = 2):
        self.target, self.lookup = target, {"prompt_lookup_num_tokens": num_pred_tokens,
                                            "max_matching_ngram_size": max_ngram_size}
        self._prompt, self._cache = None, None

    def prefill(self, prompt: list[int]) -> None:
        import torch
        from transformers import DynamicCache

        cache = DynamicCache()
        with torch.inference_mode():
            self.target.model(input_ids=torch.tensor([prompt[:-1]], device=self.target.device),
                              past_key_values=cache, use_cache=True)
        self._prompt, self._cache = list(prompt), cache

    def generate(self, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
        import copy

        import torch

        if self._prompt != list(prompt):
            self.prefill(prompt)
        cache = copy.deepcopy(self._cache)
        ids = torch.tensor([prompt], device=self.target.device)
        eos = sorted(self.target.eos_token_ids)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.target.model.generate(
                ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                do_sample=False, max_new_tokens=max_tokens, eos_token_id=eos,
                pad_token_id=eos[0], **self.lookup)
        ms = (time.perf_counter() - t0) * 1000
        return [int(t) for t in out[0, len(prompt):].tolist()], ms

    def close(self) -> None:
        self._cache = None


def library_peer_for(target):
    """The in-stack peer library of the Target's backend."""
    return LlamaCppPromptLookup(target) if target.backend == "llama" \
        else TransformersPromptLookup(target)


# ---------------------------------------------------------------- accumulation


@dataclass
class ArmTotals:
    """Raw sums of one arm over a workload: the ledger's counters, and per repeat the
    committed tokens and decode ms (for the speedup's spread)."""

    ledger: Ledger = field(default_factory=Ledger)
    decode_ms: float = 0.0
    committed_by_repeat: dict[int, int] = field(default_factory=dict)
    decode_ms_by_repeat: dict[int, float] = field(default_factory=dict)
    extra_memory_bytes: int = 0
    matches: list[dict] = field(default_factory=list)

    def add(self, repeat: int, committed: int, decode_ms: float, ledger: Ledger | None) -> None:
        if ledger is not None:
            self.ledger.add(ledger)
        else:
            self.ledger.committed_tokens += committed
        self.decode_ms += decode_ms
        self.committed_by_repeat[repeat] = self.committed_by_repeat.get(repeat, 0) + committed
        self.decode_ms_by_repeat[repeat] = self.decode_ms_by_repeat.get(repeat, 0.0) + decode_ms


def tokens_per_s(committed: float, decode_ms: float) -> float | None:
    """Committed tokens per second of decoding.

    >>> tokens_per_s(100, 2000.0)
    50.0
    """
    return ratio(committed, decode_ms / 1000.0)


def arm_row(arm: Arm, t: ArmTotals, baseline: ArmTotals, plain: ArmTotals | None = None,
            t_ms: Callable[[int], float] | None = None) -> dict:
    """One ledger row: the raw sums and every rate computed from them. ``baseline``:
    the arm every speedup is against; ``plain``: the main process's plain arm
    (``speedup_vs_plain``); ``t_ms``: the workload's measured t(n) (the ceiling)."""
    led = t.ledger
    plain = plain or baseline
    tps = tokens_per_s(led.committed_tokens, t.decode_ms)
    base = tokens_per_s(baseline.ledger.committed_tokens, baseline.decode_ms)
    own = tokens_per_s(plain.ledger.committed_tokens, plain.decode_ms)
    per_repeat, tps_per_repeat = [], []
    for r in sorted(t.decode_ms_by_repeat):
        a = tokens_per_s(t.committed_by_repeat[r], t.decode_ms_by_repeat[r])
        b = tokens_per_s(baseline.committed_by_repeat.get(r, 0),
                         baseline.decode_ms_by_repeat.get(r, 0))
        per_repeat.append(None if a is None or not b else a / b)
        tps_per_repeat.append(a)
    spread = [x for x in per_repeat if x is not None]
    library = arm.kind == "peer-library"
    statuses = [m["status"] for m in t.matches]
    gaps = [m["gap"] for m in t.matches if m.get("gap") is not None]
    committed = led.committed_tokens
    ceiling = None
    if t_ms is not None and not library and led.rounds and not led.tree_rounds:
        base_ms = ratio(baseline.ledger.verify_ms, baseline.ledger.committed_tokens)
        if base_ms:
            ceiling = chain_ceiling(led.cumulative_acceptance(), t_ms, base_ms, led.coverage)
    return {
        "arm": arm.name, "kind": arm.kind, "proposer": arm.proposer, "k": arm.k,
        "numerics": arm.numerics,
        "committed_tokens": int(committed),
        "draft_tokens": None if library else int(led.draft_tokens),
        "accepted_tokens": None if library else int(led.accepted_tokens),
        "rounds": None if library else int(led.rounds),
        "plain_steps": None if library else int(led.plain_steps),
        "acceptance_rate": None if library else led.acceptance_rate,
        "mean_acceptance_length": None if library else led.mean_acceptance_length,
        "coverage": None if library else led.coverage,
        # Trees: rounds that branched; draft nodes verified per round (D / R).
        "tree_rounds": None if library else int(led.tree_rounds),
        "nodes_per_round": None if library else ratio(led.draft_tokens, led.rounds),
        "accepted_per_position": [int(x) for x in led.accepted_per_position],
        "reached_per_position": [int(x) for x in led.reached_per_position],
        "tried_per_position": [int(x) for x in led.tried_per_position],
        "conditional_acceptance": led.conditional_acceptance(),
        "draft_ms": None if library else led.draft_ms,
        "verify_ms": None if library else led.verify_ms,
        "decode_ms": t.decode_ms,
        "draft_ms_per_token": None if library else ratio(led.draft_ms, committed),
        "verify_ms_per_token": None if library else ratio(led.verify_ms, committed),
        "tokens_per_s": tps,
        "speedup": None if tps is None or not base else tps / base,
        "speedup_vs_plain": None if tps is None or not own else tps / own,
        "ceiling": ceiling,
        "speedup_min": min(spread) if spread else None,
        "speedup_max": max(spread) if spread else None,
        "speedup_per_repeat": per_repeat,
        "tokens_per_s_per_repeat": tps_per_repeat,
        "extra_memory_bytes": int(t.extra_memory_bytes),
        "output_match": {
            "exact": statuses.count("exact"), "near_tie": statuses.count("near-tie"),
            "differs": statuses.count("differs"), "max_gap": max(gaps) if gaps else None,
            # other kernels (a companion's plain) chose other tokens: not a decoding fault
            "numerics": statuses.count("numerics"),
            # a difference past the near-tie bound that neither the batched re-evaluation
            # nor the replay of the arm's own forwards reproduced
            "unexplained": sum(1 for m in t.matches if m["status"] == "differs"
                               and m.get("batch_argmax") is not True
                               and m.get("replay_argmax") is not True),
            "cases": t.matches,
        },
    }


def measured_t(ledgers: Sequence[Ledger], fallback: Callable[[int], float],
               min_steps: int = 3) -> Callable[[int], float]:
    """This run's t(n) in ms, from the chain forwards of ``ledgers`` (``verify_ms_by_len``
    over ``steps_by_len``; a length needs ``min_steps`` forwards): linear between the
    measured lengths; elsewhere ``fallback`` (the calibrated cost model), shifted to
    meet the nearest measured point.

    >>> t = measured_t([Ledger(steps_by_len=[4, 0, 3], verify_ms_by_len=[40.0, 0, 60.0])],
    ...                lambda n: 10.0 * n)
    >>> [round(t(n), 1) for n in (1, 2, 3, 4)]
    [10.0, 15.0, 20.0, 30.0]
    """
    steps: dict[int, float] = {}
    ms: dict[int, float] = {}
    for led in ledgers:
        for L, (s, m) in enumerate(zip(led.steps_by_len, led.verify_ms_by_len)):
            steps[L + 1] = steps.get(L + 1, 0.0) + s
            ms[L + 1] = ms.get(L + 1, 0.0) + m
    known = sorted(n for n in steps if steps[n] >= min_steps)
    points = {n: ms[n] / steps[n] for n in known}
    if not points:
        return fallback

    def t(n: int) -> float:
        if n in points:
            return points[n]
        lo = max((m for m in known if m < n), default=None)
        hi = min((m for m in known if m > n), default=None)
        if lo is not None and hi is not None:
            w = (n - lo) / (hi - lo)
            return (1 - w) * points[lo] + w * points[hi]
        near = lo if lo is not None else hi
        return points[near] + fallback(n) - fallback(near)

    return t


def chain_ceiling(cumulative: Sequence[float | None], t_ms: Callable[[int], float],
                  base_ms: float, coverage: float | None) -> dict | None:
    """The best speedup over the baseline that a chain of k draft tokens could give with
    this run's cumulative acceptance A_1..A_K and forward times t(n) (ms): a round
    commits E_k = 1 + Σ_{i<=k} A_i tokens in t(k + 1); at coverage c a step is a round
    with probability c, else a plain step of t(1), so

        speedup_k(c) = base_ms · (c·E_k + 1 - c) / (c·t(k + 1) + (1 - c)·t(1))

    with ``base_ms`` the baseline's Target ms per committed token. Returns ``{"full":
    max over k at c = 1, "k_full", "measured": max at the measured coverage, "k"}``
    (None without a measured A_1). Target time only: propose() and the loop's own time
    are what separates an arm from its ceiling. It is the best *fixed* k: an arm that
    drafts long where it is sure and short elsewhere may pass it.

    >>> c = chain_ceiling([0.9, 0.8], lambda n: 10.0 + 4.0 * (n - 1), 10.0, 0.5)
    >>> c["full"], c["k_full"], round(c["measured"], 4), c["k"]
    (1.5, 2, 1.3214, 2)
    """
    best_full = best = (None, 0)
    total = 1.0
    t1 = t_ms(1)
    c = coverage or 0.0
    for k, a in enumerate(cumulative, start=1):
        if a is None:
            break
        total += a
        tk = t_ms(k + 1)
        full = base_ms * total / tk
        at = base_ms * (c * total + 1 - c) / (c * tk + (1 - c) * t1)
        if best_full[0] is None or full > best_full[0]:
            best_full = (full, k)
        if best[0] is None or at > best[0]:
            best = (at, k)
    if best_full[0] is None:
        return None
    return {"full": best_full[0], "k_full": best_full[1], "measured": best[0], "k": best[1]}


def _short(name: str, width: int = 48) -> str:
    """A case name for a progress line: its end (the file and position), not its start."""
    return name if len(name) <= width else "…" + name[-(width - 1):]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token lists differ (the shorter length when one is a
    prefix of the other), None when equal.

    >>> first_difference([1, 2, 3], [1, 2, 4]), first_difference([1, 2], [1, 2, 5])
    (2, 2)
    >>> first_difference([7], [7]) is None
    True
    """
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---------------------------------------------------------------- the run


class Bench:
    """Runs arms over workloads on one Target. ``library_peer``: a
    :class:`LlamaCppPromptLookup` (or None); ``draft``: an open draft-model Target;
    ``companions``: numerics mode -> :class:`~assistd.measure.bench_companion.Companion`
    for the ``plain:MODE`` arms."""

    def __init__(self, target, arms: Sequence[Arm], *, max_tokens: int, repeats: int,
                 cost, library_peer=None, draft=None, seed: int = 0, progress: Callable[[str, int], None] | None = None,
                 max_nodes: int = 64, companions: dict | None = None):
        if repeats < 1 or max_tokens < 1:
            raise InputError("--repeats and --max-tokens must be at least 1")
        self.max_nodes = max_nodes
        self.companions = companions or {}
        self._shapes: dict[str, list[tuple[int, int]]] = {}  # per arm, this case's first run
        self.target, self.arms, self.max_tokens, self.repeats = target, list(arms), max_tokens, repeats
        self.cost, self.peer, self.draft = cost, library_peer, draft
        self.seed = seed
        self.progress = progress or (lambda desc, n: None)

    def steps(self, workloads: Sequence[Workload]) -> int:
        """Generations the run will make (for a progress bar)."""
        return sum(len(w.cases) for w in workloads) * self.repeats * len(self.arms)

    def _proposers(self, scope_index) -> dict[str, object]:
        """Every proposer arm's proposer over ``scope_index``, priced by the startup
        calibration (a tuned arm's generations get fresh ones, :meth:`_run`)."""
        return {arm.name: self._proposer(arm, scope_index, self.cost)
                for arm in self.arms if arm.proposer is not None}

    def _proposer(self, arm: Arm, scope_index, cost):
        from assistd.runtime.runtime import proposer_options
        from proposers import make_proposer

        options = proposer_options(arm.proposer, scope_index, cost, self.target,
                                   tree=arm.tree, max_nodes=self.max_nodes)
        if arm.proposer == "draft_model":
            options["draft"] = self.draft
        return make_proposer(arm.proposer, **options)

    def run_workload(self, w: Workload) -> dict:
        from assistd.decoding.tuner import Tuner, target_key
        from proposers.index import HistoryIndex

        scope = f"bench:{w.name}"
        index = HistoryIndex(width=index_width(self.target))
        doc_id = 0

        def put(docs):
            nonlocal doc_id
            for name, ids in docs:
                if len(ids):
                    doc_id += 1
                    index.put(scope, doc_id, ids, name)

        put(w.history)
        tuner = Tuner(None, target_key(self.target), self.cost, seed=self.seed)
        tuner.seed_costs(self.cost)
        # The workload's own runtime: its history and tuner live in memory only.
        rt = Runtime(self.target, None, tuner=tuner, index=index)
        proposers = self._proposers(index)
        totals = {a.name: ArmTotals() for a in self.arms}
        n_arms = len(self.arms)
        for ci, case in enumerate(w.cases):
            put(case.seed)
            self._prefill(case)
            self._warm(proposers, case, scope)
            first: dict[str, list[int]] = {}
            self._shapes = {}
            for r in range(self.repeats):
                shift = (ci * self.repeats + r) % n_arms
                for arm in self.arms[shift:] + self.arms[:shift]:
                    tokens, committed, decode_ms, ledger = self._run(
                        arm, case, proposers.get(arm.name), rt, scope)
                    totals[arm.name].add(r, committed, decode_ms, ledger)
                    first.setdefault(arm.name, tokens)
                    self.progress(f"{w.name}: {_short(case.name)}", 1)
            self._match(case, first, totals)
        for arm in self.arms:
            if arm.kind == "peer-library":
                totals[arm.name].extra_memory_bytes = self.peer.memory_bytes
            elif arm.name in proposers:
                totals[arm.name].extra_memory_bytes = int(proposers[arm.name].memory_bytes)
        plain = totals["plain"]
        baseline = totals[self.baseline]
        # This workload's t(n): every chain forward of the main process's arms.
        mean_ctx = sum(len(c.prompt) for c in w.cases) / max(1, len(w.cases))
        t_ms = measured_t([totals[a.name].ledger for a in self.arms
                           if a.kind != "peer-library" and a.numerics is None
                           and not totals[a.name].ledger.tree_rounds],
                          lambda n: self.cost.t_ms(n, int(mean_ctx)))
        return {
            "name": w.name, "source": w.source, "description": w.description,
            "cases": len(w.cases), "prompt_tokens": sum(len(c.prompt) for c in w.cases),
            "history_tokens": w.history_tokens, "history_documents": w.history_documents,
            "k_max": K_MAX, "baseline": self.baseline,
            "t_ms": {str(n): round(t_ms(n), 3) for n in (1, 2, 3, 4, 6, 8, 12, 16)},
            "arms": [arm_row(a, totals[a.name], baseline, plain, t_ms) for a in self.arms],
        }

    @property
    def baseline(self) -> str:
        """The arm every speedup is against: plain under :data:`BASELINE_NUMERICS` (a
        companion's, or the main process's when it runs that mode), else ``plain``."""
        name = f"plain:{BASELINE_NUMERICS}"
        return name if any(a.name == name for a in self.arms) else "plain"

    @staticmethod
    def _warm(proposers: dict, case: Case, scope: str) -> None:
        """One untimed propose() per proposer, like the prefill: the history index builds
        its search structures on the first lookup after documents arrive (~1 s for the
        3.4M-token standard library), which would otherwise land on whichever arm ran
        first (measured: an arm that drafted nothing at 0.48x plain on a short run)."""
        for prop in proposers.values():
            prop.propose(np.asarray(case.prompt, dtype=np.int64), 4, scope=scope,
                         language=case.language)

    def _prefill(self, case: Case) -> None:
        """Evaluate the prompt once on the Target, the companions and the library peer
        (untimed)."""
        generate(self.target, case.prompt, None, max_tokens=1, k=0)
        for companion in self.companions.values():
            companion.prefill(case.prompt)
        if self.peer is not None:
            self.peer.prefill(case.prompt)

    def _run(self, arm: Arm, case: Case, proposer, rt: Runtime, scope: str):
        """``(tokens, committed, decode ms, ledger or None)`` of one generation."""
        if arm.kind == "peer-library":
            tokens, ms = self.peer.generate(case.prompt, self.max_tokens)
            return tokens, len(tokens), ms, None
        if arm.numerics is not None:
            out = self.companions[arm.numerics].run(case.prompt, self.max_tokens)
            return (out["tokens"], out["committed"], out["decode_ms"],
                    Ledger.from_counters(out["counters"]))
        if proposer is not None and arm.proposer != "draft_model":
            # As Runtime.plan does for a completion: a proposer per generation, priced
            # by the tuner's cost model, learned from this loop's forwards (measured on 2
            # cores: 8-10% dearer than the startup calibration's back-to-back forwards).
            proposer = self._proposer(arm, rt.index, rt.tuner.cost_model())
        if proposer is None:
            plan = Plan("none", None, 0, 0, None, case.language)
        elif arm.k == "auto":
            plan = Plan(arm.proposer, proposer, "auto", K_MAX,
                        rt.tuner.policy(arm.proposer, case.language), case.language)
        else:
            plan = Plan(arm.proposer, proposer, arm.k, arm.k, None, case.language)
        # Only the tuned arms teach the tuner; the fixed ones and the peers' rules do not.
        g = rt.run(case.prompt, plan, scope=scope, max_tokens=self.max_tokens,
                   record=arm.kind == "proposer" and arm.k == "auto")
        self._shapes.setdefault(arm.name, g.shapes)
        return g.tokens, g.ledger.committed_tokens, g.ledger.decode_ms, g.ledger

    def _match(self, case: Case, first: dict[str, list[int]], totals: dict) -> None:
        """Output match of every arm's first repeat against plain's (see the module)."""
        plain = first["plain"]
        traced = None
        batch_argmax: dict[int, int] = {}
        for arm in self.arms:
            tokens = first[arm.name]
            i = first_difference(tokens, plain)
            if i is None or arm.numerics is not None:
                totals[arm.name].matches.append({"case": case.name,
                                                 "status": "exact" if i is None else "numerics",
                                                 "first_diff": i, "gap": None,
                                                 "batch_argmax": None})
                continue
            if traced is None:
                traced = generate(self.target, case.prompt, None, max_tokens=self.max_tokens,
                                  k=0, trace=True)
            j = first_difference(tokens, traced.tokens)
            gap, batch, replay = None, None, None
            if j is None:  # plain itself did not reproduce; the arm matches the traced run
                status = "near-tie"
            else:
                gap = traced.top2_gaps[j] if j < len(traced.top2_gaps) else None
                status = "near-tie" if gap is not None and gap < NEAR_TIE_GAP else "differs"
                if j < len(tokens) and j < len(traced.tokens):
                    if j not in batch_argmax:
                        batch_argmax[j] = self._batch_argmax(case.prompt + traced.tokens[:j])
                    batch = batch_argmax[j] == tokens[j]
                    shapes = self._shapes.get(arm.name)
                    if shapes:
                        r = self._replay_argmax(case.prompt, tokens, shapes, j)
                        replay = None if r is None else r == tokens[j]
            totals[arm.name].matches.append({
                "case": case.name, "status": status, "first_diff": i if j is None else j,
                "gap": None if gap is None else round(float(gap), 4), "batch_argmax": batch,
                "replay_argmax": replay})

    def _replay_argmax(self, prompt: list[int], tokens: list[int],
                       shapes: list[tuple[int, int]], j: int) -> int | None:
        """The Target's argmax for output position ``j`` with the arm's own forwards
        replayed: the prompt prefilled, then each step's kept rows evaluated in a batch of
        the step's size (the rejected rows padded with a repeat: ggml picks its kernels
        by a batch's size, and a row's result never depends on the other rows' values).
        That reproduces the arm's logits (the test past 512 cells checks it on the
        default numerics), so a token that is not this argmax would be a verification
        fault. None for a tree round."""
        t = self.target
        t.truncate(0)
        t.evaluate(prompt[:-1], [])
        ctx = list(prompt) + list(tokens)
        n = len(prompt)  # committed tokens; the KV cache holds n - 1
        for rows, kept in shapes:
            if rows == 0:
                return None
            batch = ctx[n - 1 : n - 1 + kept]
            batch += [batch[-1]] * (rows - len(batch))
            first = n - len(prompt)  # the output index this step's row 0 predicts
            if first <= j < first + kept:
                return int(np.argmax(t.evaluate(batch, [j - first])[0]))
            t.evaluate(batch, [])
            t.truncate(n - 1 + kept)
            n += kept
        return None

    def _batch_argmax(self, tokens: list[int]) -> int:
        """The Target's argmax after ``tokens``, all evaluated afresh in one batch (as a
        prefill): with ``_match``'s verdict, whether batch shape would have picked the
        arm's token (with llama.cpp's fast numerics it does, up to 1.7 logits away)."""
        self.target.truncate(0)
        row = self.target.evaluate(tokens, [len(tokens) - 1])[0]
        return int(np.argmax(row))


def machine() -> dict:
    """What the numbers were measured on."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        import llama_cpp
        llama_version = llama_cpp.__version__
    except Exception:  # the torch backend does not need it
        llama_version = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "platform": platform.platform(),
            "python": platform.python_version(), "llama_cpp_python": llama_version,
            "memory_bytes": mem}


def run(workload_specs: Sequence[str], *, proposers: Sequence[str] = DEFAULT_PROPOSERS,
        backend: str = "llama", model=None, draft_model=None, k: int | str = "auto",
        cases: int = 6, max_tokens: int = 96, repeats: int = 3, max_prompt_tokens: int = 1536,
        n_ctx: int = 2048, n_threads: int | None = None, library_peer: bool = True,
        numerics: str = DEFAULT_NUMERICS, seed: int = 0, command: str = "",
        progress=None, on_workload: Callable[[str], None] | None = None,
        optional: Sequence[str] = (), on_skip: Callable[[str, str], None] | None = None,
        tree: str = "off", max_nodes: int = 64) -> dict:
    """Build the workloads, run every arm, return the report (``assistd bench --json``).

    ``progress(total)`` is called once with the number of generations, and returns a
    ``step(description, n)`` callback. On the llama.cpp backend plain decoding also runs
    under the baseline's numerics and ``exact`` (those ``numerics`` is not), each in a
    companion process (:mod:`assistd.measure.bench_companion`). A spec in ``optional`` that cannot be built
    (no transcripts found, say) is left out, with ``on_skip(spec, reason)``. ``tree``
    (off | on | both) and ``max_nodes``: token-tree arms and their node budget a round.
    Raises :class:`InputError` (a bad workload,
    proposer or setting) and :class:`~assistd.ground.errors.ModelError` (a model fails to load).
    """
    from assistd.measure.bench_workloads import build_workload, parse_spec
    from assistd.ground.costmodel import CostModel
    from assistd.targets.open import open_target
    from assistd.decoding.tuner import K_MAX

    if not (k == "auto" or (isinstance(k, int) and k >= 1)):
        raise InputError(f"--k must be 'auto' or a number of tokens >= 1, not {k!r}")
    if cases < 1:
        raise InputError("--cases must be at least 1")
    budget = min(max_prompt_tokens, n_ctx - max_tokens - K_MAX - 2)
    if budget < 16:
        raise InputError(f"--n-ctx {n_ctx} leaves no room for a prompt with --max-tokens "
                         f"{max_tokens}")
    for spec in workload_specs:  # fail before loading anything
        parse_spec(spec)
    if not workload_specs:
        raise InputError("no workload to run")
    if max_nodes < 1:
        raise InputError(f"--nodes must be at least 1, got {max_nodes}")
    numerics = parse_numerics(numerics, what="--numerics")
    modes = [m for m in (BASELINE_NUMERICS, "exact") if m != numerics] if backend == "llama" else []
    arms = arms_for(proposers, k, library_peer=LIBRARY_PEERS.get(backend) if library_peer else None,
                    draft_model=draft_model is not None, tree=tree, companions=modes)
    # llama.cpp verifies a tree in one batch only with branch ids to spare (one sequence).
    branches = TREE_BRANCHES if backend == "llama" and any(a.tree for a in arms) else 0
    started = time.time()
    target = open_target(model, backend=backend, n_ctx=n_ctx, n_threads=n_threads,
                         numerics=numerics, **({"tree_branches": branches} if branches else {}))
    peer = draft = None
    companions: dict = {}
    try:
        workloads = []
        for spec in workload_specs:
            if on_workload:
                on_workload(spec)
            try:
                workloads.append(build_workload(target, spec, cases=cases, budget=budget,
                                                seed=seed))
            except InputError as e:
                if spec not in optional:
                    raise
                if on_skip is not None:
                    on_skip(spec, str(e))
        if not workloads:
            raise InputError("no workload could be built; pass --workload NAME=PATH")
        if draft_model is not None:
            from assistd.ground.errors import ModelError
            from proposers.draft_model import draft_numerics, open_draft

            try:
                draft = open_draft(draft_model, backend=backend, n_ctx=n_ctx, n_threads=n_threads,
                                   numerics=draft_numerics(target))
            except ModelError as e:
                raise ModelError(f"--draft-model {draft_model}: {str(e).split(';')[0]}; pass a"
                                 " GGUF of a small model with the Target's tokenizer") from None
        if any(a.kind == "peer-library" for a in arms):
            peer = library_peer_for(target)
        from assistd.measure.bench_companion import Companion

        for m in modes:  # each loads before the calibration, which wants quiet cores
            companions[m] = Companion(model, n_ctx=n_ctx, threads=n_threads, numerics=m)
        cost = CostModel.calibrate(target)
        bench = Bench(target, arms, max_tokens=max_tokens, repeats=repeats, cost=cost,
                      library_peer=peer, draft=draft, seed=seed, max_nodes=max_nodes,
                      companions=companions)
        if progress is not None:
            bench.progress = progress(bench.steps(workloads))
        results = [bench.run_workload(w) for w in workloads]
        target_desc = {"backend": target.backend, "model": str(getattr(target, "model_path", "")),
                       "n_ctx": target.n_ctx, "threads": getattr(target, "n_threads", None),
                       "numerics": target.numerics, "promise": target.promise}
        baseline = bench.baseline
    finally:
        for m in (peer, draft, target, *companions.values()):
            if m is not None:
                m.close()
    report = {
        "version": 1,
        "command": command,
        "started": datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": round(time.time() - started, 1),
        "machine": {**machine(), "threads": target_desc["threads"]},
        "target": target_desc,
        "baseline": baseline,
        "settings": {"k": k, "max_tokens": max_tokens, "repeats": repeats, "cases": cases,
                     "max_prompt_tokens": budget, "near_tie_gap": NEAR_TIE_GAP,
                     "numerics": target.numerics, "promise": target.promise,
                     "companions": modes, "seed": seed, "tree": tree,
                     "max_nodes": max_nodes, "tree_branches": branches,
                     "arms": [a.name for a in arms]},
        "cost_model": cost.as_dict(),
        "workloads": results,
    }
    report["warnings"] = drift_warnings(report)
    return report


DRIFT = 1.25  # an arm that did plain's work (no round) must run within this factor of it
FALLING_T = 1.1  # t(n) measured over this factor below a smaller n's: not noise
SLOW_T1_MS = 100.0  # a one-token forward of a model this tool embeds takes ~11 ms here


def drift_warnings(report: dict) -> list[str]:
    """Signs that the machine's speed changed under the run, so its ratios are not to be
    trusted: an arm that drafted nothing (the same work as plain) running more than
    ``DRIFT`` times faster or slower than plain, the baseline's speed moving by more than
    ``DRIFT`` between repeats (the same prompts each time) or plain's moving that far from
    the baseline's, a workload's measured t(n) falling by more than ``FALLING_T`` from one
    size to the next (its ceiling rests on it), a calibration that found the
    machine busy, or a calibrated t(1) over ``SLOW_T1_MS`` (another process holding the
    cores)."""
    out = []
    t1 = (report.get("cost_model") or {}).get("points", {}).get("1")
    note = (report.get("cost_model") or {}).get("note", "")
    if note.startswith("busy machine"):  # the calibration itself saw the cores taken
        out.append(f"calibration: {note}; rounds of several tokens may cost many plain "
                   "steps, so the speedups are not this Target's: rerun on idle cores, or "
                   "with --threads 1")
    if t1 is not None and t1 > SLOW_T1_MS:
        out.append(f"calibration measured t(1) = {t1:.0f} ms for one token: the machine was "
                   "busy; rerun on idle cores")
    for w in report["workloads"]:
        base = next((a for a in w["arms"] if a["arm"] == w.get("baseline")), None)
        speeds = [x for x in (base or {}).get("tokens_per_s_per_repeat", []) if x]
        if speeds and max(speeds) > DRIFT * min(speeds):
            # every repeat runs the same cases: the baseline's own speed should not move
            out.append(f"{w['name']}: the baseline ran at {min(speeds):.0f} to "
                       f"{max(speeds):.0f} tokens/s across repeats of the same prompts: the "
                       "machine's speed drifted during the run, so this workload's speedups "
                       "and ceilings are not to be trusted; rerun on idle cores")
        plain = next((a for a in w["arms"] if a["arm"] == "plain"), None)
        if (plain is not None and base is not None and plain is not base
                and plain.get("speedup") and not 1 / DRIFT <= plain["speedup"] <= DRIFT):
            # one-token steps run the same kernels in the main process and the baseline's
            out.append(f"{w['name']}: plain ran at {plain['speedup']:.2f}x the baseline, which "
                       "runs the same one-token kernels: the machine's speed drifted during "
                       "the run; rerun on idle cores")
        t = sorted((int(n), ms) for n, ms in (w.get("t_ms") or {}).items())
        for (a, x), (b, y) in zip(t, t[1:]):
            if y < x / FALLING_T:
                out.append(f"{w['name']}: t({b}) = {y:.1f} ms < t({a}) = {x:.1f} ms: a forward "
                           "over more tokens measured faster, so the machine's speed moved; "
                           "the ceiling built on this t(n) is not to be trusted")
                break
        for a in w["arms"]:
            vs = a.get("speedup_vs_plain", a["speedup"])
            if a["kind"] == "plain" or a["rounds"] != 0 or vs is None:
                continue
            if not 1 / DRIFT <= vs <= DRIFT:
                out.append(f"{w['name']}: {a['arm']} drafted nothing (plain decoding's work) "
                           f"but ran at {vs:.2f}x plain: the machine's speed "
                           "drifted during the run; rerun on idle cores, or with more --repeats")
    return out


def check_ledger(report: dict) -> list[str]:
    """The ledger arithmetic every row must obey; returns the violations (empty = ok).

    committed = C + R + P; acceptance rate = C / D; mean acceptance length = 1 + C / R;
    coverage = R / (R + P); Σ accepted per position = C, Σ reached per position = D
    (a row with tree rounds: <= D, since positions are depths and D counts nodes);
    tokens/s = committed / decode s; speedup = tokens/s / the baseline's; the spread
    brackets nothing outside [min, max] of the per-repeat ratios; the baseline's
    speedup is 1.
    """
    bad = []

    def close(a, b, what, row):
        if a is None or b is None:
            if a is not b:
                bad.append(f"{row}: {what}: {a} vs {b}")
        elif abs(a - b) > 1e-6 * max(1.0, abs(b)):
            bad.append(f"{row}: {what}: {a} != {b}")

    for w in report["workloads"]:
        name = w.get("baseline", "plain")
        plain = next(a for a in w["arms"] if a["arm"] == name)
        base = plain["tokens_per_s"]
        for a in w["arms"]:
            row = f"{w['name']}/{a['arm']}"
            close(a["tokens_per_s"], tokens_per_s(a["committed_tokens"], a["decode_ms"]),
                  "tokens/s", row)
            close(a["speedup"], None if a["tokens_per_s"] is None or not base
                  else a["tokens_per_s"] / base, "speedup", row)
            reps = [x for x in a["speedup_per_repeat"] if x is not None]
            if reps and not (min(reps) == a["speedup_min"] and max(reps) == a["speedup_max"]):
                bad.append(f"{row}: spread is not min/max of the repeats")
            if a["kind"] == "peer-library":
                continue
            C, D, R, P = (a["accepted_tokens"], a["draft_tokens"], a["rounds"], a["plain_steps"])
            if a["committed_tokens"] != C + R + P:
                bad.append(f"{row}: committed {a['committed_tokens']} != C + R + P {C + R + P}")
            close(a["acceptance_rate"], ratio(C, D), "acceptance rate", row)
            close(a["mean_acceptance_length"], 1 + C / R if R else None, "mean acc. len", row)
            close(a["coverage"], ratio(R, R + P), "coverage", row)
            # Per position is by depth: a tree round reaches its depth, verifies its nodes.
            reached, trees = sum(a["reached_per_position"]), a.get("tree_rounds") or 0
            if sum(a["accepted_per_position"]) != C or (reached > D if trees else reached != D):
                bad.append(f"{row}: per-position sums != C, D"
                           + (" (or reached > D)" if trees else ""))
            if R and a["reached_per_position"][0] != R:
                bad.append(f"{row}: every round reaches position 1")
            close(a["draft_ms_per_token"], ratio(a["draft_ms"], a["committed_tokens"]),
                  "draft ms/token", row)
        close(plain["speedup"], 1.0 if base else None, "baseline speedup", f"{w['name']}/{name}")
    return bad


