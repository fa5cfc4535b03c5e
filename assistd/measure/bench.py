"""``assistd bench``: plain decoding, every proposer and the in-stack peers on one ledger.

One process, one Target, the same prompts. Each case is prefilled once (the Target and
the peer library keep its KV, so no arm pays for the prompt), then run ``repeats``
times; in every repeat each arm runs once, in an order rotated from case to case and
repeat to repeat, so that drift in the machine's speed hits every arm alike.

Arms:

- ``plain``: the engine with no proposer (k = 0), the baseline of every ratio;
- our proposers (``ngram``, ``suffix``; ``draft_model`` given ``--draft-model``) with
  the workload's history and ``--k`` (``auto``: a fresh tuner per workload, learning as
  the run goes, on the startup calibration of t(n));
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
- speedup = tokens/s / plain's tokens/s over the whole run; its spread is the min and
  max of the same ratio within each repeat;
- draft and verify ms per committed token; extra memory = bytes held beside the Target
  (the history index, a draft model, the library peer's ``logits_all`` score buffer);
- output match (greedy): the first repeat's tokens against plain's. Where they differ,
  plain decoding is run again with its top-2 logit gap traced: a difference where the
  gap is under :data:`assistd.decoding.verify.NEAR_TIE_GAP` is a rounding near-tie, any other
  one ``differs`` (a decoding bug). For a difference, the common prefix is also
  evaluated afresh in one batch and ``batch_argmax`` says whether the Target's argmax
  there is the arm's token: a diagnosis (did batch shape decide it?), never a pass.
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
    (the arm is then named ``proposer+tree``)."""

    name: str
    kind: str
    proposer: str | None
    k: int | str
    tree: bool = False


def arms_for(proposers: Sequence[str], k: int | str, *, library_peer: str | None,
             draft_model: bool = False, tree: str = "off") -> list[Arm]:
    """Plain first, then the proposers named (a ``peer:`` name runs at its peer's k;
    ``NAME+tree`` and ``tree`` as :func:`assistd.measure.replay.tree_arms`),
    ``draft_model`` when a draft is given, and the library peer named ``library_peer``.
    Raises :class:`InputError` for an unknown arm."""
    from assistd.measure.replay import split_arm, tree_arms

    arms = [Arm("plain", "plain", None, 0)]
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


def arm_row(arm: Arm, t: ArmTotals, plain: ArmTotals) -> dict:
    """One ledger row: the raw sums and every rate computed from them."""
    led = t.ledger
    tps = tokens_per_s(led.committed_tokens, t.decode_ms)
    base = tokens_per_s(plain.ledger.committed_tokens, plain.decode_ms)
    per_repeat = []
    for r in sorted(t.decode_ms_by_repeat):
        a = tokens_per_s(t.committed_by_repeat[r], t.decode_ms_by_repeat[r])
        b = tokens_per_s(plain.committed_by_repeat.get(r, 0), plain.decode_ms_by_repeat.get(r, 0))
        per_repeat.append(None if a is None or not b else a / b)
    spread = [x for x in per_repeat if x is not None]
    library = arm.kind == "peer-library"
    statuses = [m["status"] for m in t.matches]
    gaps = [m["gap"] for m in t.matches if m.get("gap") is not None]
    committed = led.committed_tokens
    return {
        "arm": arm.name, "kind": arm.kind, "proposer": arm.proposer, "k": arm.k,
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
        "speedup_min": min(spread) if spread else None,
        "speedup_max": max(spread) if spread else None,
        "speedup_per_repeat": per_repeat,
        "extra_memory_bytes": int(t.extra_memory_bytes),
        "output_match": {
            "exact": statuses.count("exact"), "near_tie": statuses.count("near-tie"),
            "differs": statuses.count("differs"), "max_gap": max(gaps) if gaps else None,
            "cases": t.matches,
        },
    }


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
    :class:`LlamaCppPromptLookup` (or None); ``draft``: an open draft-model Target."""

    def __init__(self, target, arms: Sequence[Arm], *, max_tokens: int, repeats: int,
                 cost, library_peer=None, draft=None, seed: int = 0, progress: Callable[[str, int], None] | None = None,
                 max_nodes: int = 64):
        if repeats < 1 or max_tokens < 1:
            raise InputError("--repeats and --max-tokens must be at least 1")
        self.max_nodes = max_nodes
        self.target, self.arms, self.max_tokens, self.repeats = target, list(arms), max_tokens, repeats
        self.cost, self.peer, self.draft = cost, library_peer, draft
        self.seed = seed
        self.progress = progress or (lambda desc, n: None)

    def steps(self, workloads: Sequence[Workload]) -> int:
        """Generations the run will make (for a progress bar)."""
        return sum(len(w.cases) for w in workloads) * self.repeats * len(self.arms)

    def _proposers(self, scope_index) -> dict[str, object]:
        from assistd.runtime.runtime import proposer_options
        from proposers import make_proposer

        out = {}
        for arm in self.arms:
            if arm.proposer is None:
                continue
            options = proposer_options(arm.proposer, scope_index, self.cost, self.target,
                                       tree=arm.tree, max_nodes=self.max_nodes)
            if arm.proposer == "draft_model":
                options["draft"] = self.draft
            out[arm.name] = make_proposer(arm.proposer, **options)
        return out

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
        return {
            "name": w.name, "source": w.source, "description": w.description,
            "cases": len(w.cases), "prompt_tokens": sum(len(c.prompt) for c in w.cases),
            "history_tokens": w.history_tokens, "history_documents": w.history_documents,
            "k_max": K_MAX,
            "arms": [arm_row(a, totals[a.name], plain) for a in self.arms],
        }

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
        """Evaluate the prompt once on the Target and the library peer (untimed)."""
        generate(self.target, case.prompt, None, max_tokens=1, k=0)
        if self.peer is not None:
            self.peer.prefill(case.prompt)

    def _run(self, arm: Arm, case: Case, proposer, rt: Runtime, scope: str):
        """``(tokens, committed, decode ms, ledger or None)`` of one generation."""
        if arm.kind == "peer-library":
            tokens, ms = self.peer.generate(case.prompt, self.max_tokens)
            return tokens, len(tokens), ms, None
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
        return g.tokens, g.ledger.committed_tokens, g.ledger.decode_ms, g.ledger

    def _match(self, case: Case, first: dict[str, list[int]], totals: dict) -> None:
        """Output match of every arm's first repeat against plain's (see the module)."""
        plain = first["plain"]
        traced = None
        batch_argmax: dict[int, int] = {}
        for arm in self.arms:
            tokens = first[arm.name]
            i = first_difference(tokens, plain)
            if i is None:
                totals[arm.name].matches.append({"case": case.name, "status": "exact",
                                                 "first_diff": None, "gap": None,
                                                 "batch_argmax": None})
                continue
            if traced is None:
                traced = generate(self.target, case.prompt, None, max_tokens=self.max_tokens,
                                  k=0, trace=True)
            j = first_difference(tokens, traced.tokens)
            gap, batch = None, None
            if j is None:  # plain itself did not reproduce; the arm matches the traced run
                status = "near-tie"
            else:
                gap = traced.top2_gaps[j] if j < len(traced.top2_gaps) else None
                status = "near-tie" if gap is not None and gap < NEAR_TIE_GAP else "differs"
                if j < len(tokens) and j < len(traced.tokens):
                    if j not in batch_argmax:
                        batch_argmax[j] = self._batch_argmax(case.prompt + traced.tokens[:j])
                    batch = batch_argmax[j] == tokens[j]
            totals[arm.name].matches.append({
                "case": case.name, "status": status, "first_diff": i if j is None else j,
                "gap": None if gap is None else round(float(gap), 4), "batch_argmax": batch})

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
        numerics: str = "exact", seed: int = 0, command: str = "",
        progress=None, on_workload: Callable[[str], None] | None = None,
        optional: Sequence[str] = (), on_skip: Callable[[str, str], None] | None = None,
        tree: str = "off", max_nodes: int = 64) -> dict:
    """Build the workloads, run every arm, return the report (``assistd bench --json``).

    ``progress(total)`` is called once with the number of generations, and returns a
    ``step(description, n)`` callback. A spec in ``optional`` that cannot be built
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
    arms = arms_for(proposers, k, library_peer=LIBRARY_PEERS.get(backend) if library_peer else None,
                    draft_model=draft_model is not None, tree=tree)
    # llama.cpp verifies a tree in one batch only with branch ids to spare (one sequence).
    branches = TREE_BRANCHES if backend == "llama" and any(a.tree for a in arms) else 0
    started = time.time()
    target = open_target(model, backend=backend, n_ctx=n_ctx, n_threads=n_threads,
                         numerics=numerics, **({"tree_branches": branches} if branches else {}))
    peer = draft = None
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
            from proposers.draft_model import open_draft

            try:
                draft = open_draft(draft_model, backend=backend, n_ctx=n_ctx, n_threads=n_threads)
            except ModelError as e:
                raise ModelError(f"--draft-model {draft_model}: {str(e).split(';')[0]}; pass a"
                                 " GGUF of a small model with the Target's tokenizer") from None
        if any(a.kind == "peer-library" for a in arms):
            peer = library_peer_for(target)
        cost = CostModel.calibrate(target)
        bench = Bench(target, arms, max_tokens=max_tokens, repeats=repeats, cost=cost,
                      library_peer=peer, draft=draft, seed=seed, max_nodes=max_nodes)
        if progress is not None:
            bench.progress = progress(bench.steps(workloads))
        results = [bench.run_workload(w) for w in workloads]
        target_desc = {"backend": target.backend, "model": str(getattr(target, "model_path", "")),
                       "n_ctx": target.n_ctx, "threads": getattr(target, "n_threads", None)}
    finally:
        for m in (peer, draft, target):
            if m is not None:
                m.close()
    report = {
        "version": 1,
        "command": command,
        "started": datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": round(time.time() - started, 1),
        "machine": {**machine(), "threads": target_desc["threads"]},
        "target": target_desc,
        "settings": {"k": k, "max_tokens": max_tokens, "repeats": repeats, "cases": cases,
                     "max_prompt_tokens": budget, "near_tie_gap": NEAR_TIE_GAP,
                     "numerics": target.numerics, "seed": seed, "tree": tree,
                     "max_nodes": max_nodes, "tree_branches": branches,
                     "arms": [a.name for a in arms]},
        "cost_model": cost.as_dict(),
        "workloads": results,
    }
    report["warnings"] = drift_warnings(report)
    return report


DRIFT = 1.25  # an arm that did plain's work (no round) must run within this factor of it
SLOW_T1_MS = 100.0  # a one-token forward of a model this tool embeds takes ~11 ms here


def drift_warnings(report: dict) -> list[str]:
    """Signs that the machine's speed changed under the run, so its ratios are not to be
    trusted: an arm that drafted nothing (the same work as plain) running more than
    ``DRIFT`` times faster or slower than plain, a calibration that found the machine
    busy, or a calibrated t(1) over ``SLOW_T1_MS`` (another process holding the cores)."""
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
        for a in w["arms"]:
            if a["kind"] == "plain" or a["rounds"] != 0 or a["speedup"] is None:
                continue
            if not 1 / DRIFT <= a["speedup"] <= DRIFT:
                out.append(f"{w['name']}: {a['arm']} drafted nothing (plain decoding's work) "
                           f"but ran at {a['speedup']:.2f}x plain: the machine's speed "
                           "drifted during the run; rerun on idle cores, or with more --repeats")
    return out


def check_ledger(report: dict) -> list[str]:
    """The ledger arithmetic every row must obey; returns the violations (empty = ok).

    committed = C + R + P; acceptance rate = C / D; mean acceptance length = 1 + C / R;
    coverage = R / (R + P); Σ accepted per position = C, Σ reached per position = D
    (a row with tree rounds: <= D, since positions are depths and D counts nodes);
    tokens/s = committed / decode s; speedup = tokens/s / plain's; the spread brackets
    nothing outside [min, max] of the per-repeat ratios; plain's speedup is 1.
    """
    bad = []

    def close(a, b, what, row):
        if a is None or b is None:
            if a is not b:
                bad.append(f"{row}: {what}: {a} vs {b}")
        elif abs(a - b) > 1e-6 * max(1.0, abs(b)):
            bad.append(f"{row}: {what}: {a} != {b}")

    for w in report["workloads"]:
        plain = next(a for a in w["arms"] if a["kind"] == "plain")
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
        close(plain["speedup"], 1.0 if base else None, "plain speedup", f"{w['name']}/plain")
    return bad


