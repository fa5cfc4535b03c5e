"""t(n, context): the torch Target's verify forward over n new tokens after a cached context.

The measured call is :meth:`assistd.targets.base.Target.evaluate` with logits for all n
rows, then ``truncate`` back to the context: what ``assistd/decoding/engine.py`` does in
every round (``[last] + draft``, then the rollback), copy of the logits to the host
included. Sizes are interleaved within each repeat and each point is
:func:`assistd.ground.costmodel.low_median` (docs/design.md, "Cost model and speedup").
"""

from __future__ import annotations

import inspect
import time

import numpy as np

from assistd.ground.costmodel import robust_points
from assistd.targets.base import Target
from assistd.targets.hf import TorchTarget

# Round shapes a sweep can time. A tree round of n nodes is the same forward over n
# tokens with a tree attention mask and per-node positions (docs/design.md, "Contracts
# the next pieces build on", "Token trees"): its timing goes in measure_round.
ROUND_KINDS = ("chain",)


class ModelTarget(TorchTarget):
    """:class:`TorchTarget`'s own ``evaluate``/``truncate`` over a model built in memory
    (random weights of a published shape): no file, no tokenizer. ``model``: a
    transformers causal LM already on ``device``; ``n_ctx``: tokens."""

    def __init__(self, model, *, device: str, n_ctx: int, n_batch: int = 512):
        Target.__init__(self)
        import torch
        from transformers import DynamicCache

        config = model.config.get_text_config()
        self._torch, self.model, self.tokenizer = torch, model, None
        self.device, self.dtype = device, str(model.dtype).removeprefix("torch.")
        self.model_path = f"<random weights: {config.model_type}>"
        self.n_ctx, self.n_vocab, self.n_batch = n_ctx, int(config.vocab_size), n_batch
        self._new_cache, self._caches = DynamicCache, [DynamicCache()]
        # As TorchTarget.__init__: transformers 5.2x renamed the cache argument.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"


def measure_round(target: Target, tokens: list[int], kind: str = "chain") -> float:
    """ms of one verify forward over ``tokens`` (all rows' logits) at the cache's end,
    which is then rolled back. Raises ValueError for a round kind not measured yet."""
    if kind != "chain":
        raise ValueError(f"round kind {kind!r} is not measured yet; known: {ROUND_KINDS}")
    n_past = target.n_past
    t0 = time.perf_counter()
    target.evaluate(tokens, range(len(tokens)))  # returns host numpy: the device is synced
    ms = (time.perf_counter() - t0) * 1000
    target.truncate(n_past)
    return ms


def sweep(target: Target, ns: list[int], contexts: list[int], repeats: int, deadline: float,
          seed: int = 0) -> dict:
    """Time rounds of every n in ``ns`` after every context length in ``contexts``
    (tokens, random ids), ``repeats`` times each, until ``time.monotonic()`` passes
    ``deadline``.

    Returns ``{"points": {ctx: {n: ms}}, "prefill_ms": {ctx: ms}, "partial": bool}``;
    a context whose repeats were cut keeps the sizes it measured at least once, and
    contexts that do not fit ``target.n_ctx`` are left out. The cache is left empty.
    """
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, target.n_vocab, size=max(contexts) + max(ns)).tolist()
    points, prefill, partial = {}, {}, False
    for ctx in contexts:
        if ctx + max(ns) > target.n_ctx:
            continue
        if time.monotonic() > deadline:
            partial = True
            break
        target.truncate(0)
        t0 = time.perf_counter()
        target.evaluate(ids[:ctx], [])
        prefill[ctx] = (time.perf_counter() - t0) * 1000
        batch = ids[ctx : ctx + max(ns)]
        for n in (max(ns), 1, max(ns)):  # warm-up: kernels picked, allocator grown
            measure_round(target, batch[:n])
        samples: dict[int, list[float]] = {n: [] for n in ns}
        for _ in range(repeats):
            if time.monotonic() > deadline:
                partial = True
                break
            for n in ns:
                if time.monotonic() > deadline:
                    partial = True
                    break
                samples[n].append(measure_round(target, batch[:n]))
        measured = {n: ms for n, ms in samples.items() if ms}
        if 1 in measured:
            points[ctx] = robust_points(measured)
    target.truncate(0)
    return {"points": points, "prefill_ms": prefill, "partial": partial}
