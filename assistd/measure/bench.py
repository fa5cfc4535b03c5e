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

This module builds the run and its report (:func:`run`); the arms and the library peers
are in :mod:`~assistd.measure.bench_arms`, the run over a workload in
:mod:`~assistd.measure.bench_runner`, the ledger's rows, t(n) and ceiling in
:mod:`~assistd.measure.bench_ledger`, the warnings in :mod:`~assistd.measure.bench_warnings`,
the workloads in :mod:`~assistd.measure.bench_workloads` and the output in
:mod:`~assistd.measure.bench_report`.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from assistd.decoding.verify import NEAR_TIE_GAP
from assistd.ground.errors import InputError
from assistd.ground.numerics import BASELINE_NUMERICS, DEFAULT_NUMERICS, parse_numerics
from assistd.ground.options import DEFAULT_N_CTX
from assistd.measure.bench_arms import (
    DEFAULT_PROPOSERS,
    LIBRARY_PEERS,
    TREE_BRANCHES,
    Arm,
    arms_for,
    library_peer_for,
)
from assistd.measure.bench_ledger import ArmTotals, chain_ceiling, check_ledger, measured_t
from assistd.measure.bench_runner import Bench, first_difference
from assistd.measure.bench_warnings import drift_warnings
from assistd.runtime.runtime import index_width

# The bench's names, wherever they live (the CLI, the tests and benchmarks/ import them here).
__all__ = ["Arm", "ArmTotals", "Bench", "DEFAULT_PROPOSERS", "arms_for", "chain_ceiling",
           "check_ledger", "drift_warnings", "first_difference", "index_width", "machine",
           "measured_t", "run"]


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
        n_ctx: int = DEFAULT_N_CTX, n_threads: int | None = None, library_peer: bool = True,
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
