"""Numerics: which kernels a llama.cpp Target runs, and what speculative output promises.

The one place the modes, the default and their promises are written (docs/design.md,
"Exactness"). Every front end (``--numerics``, the config file's ``numerics``, the LSP
setting ``numerics``, ``mcp --no-daemon``, the benchmarks) validates through
:func:`parse_numerics` and defaults to :data:`DEFAULT_NUMERICS`.

- ``fast`` (the default): batch-invariant matmuls (no weight repacking, no tiled K-quant
  matmul), flash attention, ubatches of at most 48 tokens, every thread on every step.
  Measured on 2 cores (SmolLM2-135M Q4_1): t(1) 9.3 ms, t(8) 36.5 ms against llama.cpp's
  own defaults' 9.9 and 38.2. Batched and one-token logits are bit-identical while the
  cache view is under 512 cells; past it ggml splits a single query's attention over the
  threads, which rounds otherwise (up to 1.2 logits on SmolLM2, 3.3 on Gemma 3 270M).
  Promise: greedy output is the Target's argmax for the batch it verified (vLLM's).
- ``exact``: as ``fast`` but one thread on one-token steps, so batched and one-token
  evaluation agree to the bit at every context: speculative greedy output is plain
  decoding's, token for token. Plain steps cost 1.7x (SmolLM2) to 1.8x (Gemma 3).
- ``llama``: llama.cpp's own defaults (weight repacking, tiled K-quant matmul, ubatches
  of 512, flash attention as ``auto`` resolves it on a CPU): what llama-server runs, the
  baseline of every speedup assistd reports. Same promise as ``fast``, wider drift.

``GGML_CPU_TILED_MM`` is read once per process by ggml, so ``llama`` cannot share a
process with ``fast`` or ``exact`` (:func:`tiled_mm` says which value a mode needs).
"""

from __future__ import annotations

from assistd.ground.errors import InputError

NUMERICS = ("fast", "exact", "llama")
DEFAULT_NUMERICS = "fast"
# The mode of the baseline every speedup is against (assistd bench, the benchmarks).
BASELINE_NUMERICS = "llama"

EXACT_PROMISE = "exact"
BATCH_PROMISE = "batch-argmax"
PROMISES = {
    EXACT_PROMISE: "greedy output is one-token decoding's, bit for bit",
    BATCH_PROMISE: ("greedy output is the Target's argmax for the batch it verified; it may "
                    "differ from one-token decoding where batch rounding exceeds the top-2 gap"),
}


def parse_numerics(value, *, what: str = "numerics") -> str:
    """One of :data:`NUMERICS`; None means :data:`DEFAULT_NUMERICS`.

    Raises :class:`InputError` naming ``what`` (the flag, setting or key as spelt).

    >>> parse_numerics(None), parse_numerics("exact")
    ('fast', 'exact')
    >>> parse_numerics("slow", what="--numerics")
    Traceback (most recent call last):
    ...
    assistd.ground.errors.InputError: --numerics must be fast, exact or llama, not 'slow'
    """
    if value is None:
        return DEFAULT_NUMERICS
    if isinstance(value, str) and value in NUMERICS:
        return value
    raise InputError(f"{what} must be {', '.join(NUMERICS[:-1])} or {NUMERICS[-1]}, "
                     f"not {value!r}")


def promise(numerics: str, *, gpu: bool = False) -> str:
    """The promise a llama.cpp Target keeps: :data:`EXACT_PROMISE` only for ``exact`` on
    the CPU (a GPU offload's kernels are not batch-invariant), else :data:`BATCH_PROMISE`.

    >>> promise("exact"), promise("exact", gpu=True), promise("fast")
    ('exact', 'batch-argmax', 'batch-argmax')
    """
    return EXACT_PROMISE if numerics == "exact" and not gpu else BATCH_PROMISE


def tiled_mm(numerics: str) -> str:
    """The ``GGML_CPU_TILED_MM`` value a mode needs: "1" (ggml's default) for ``llama``,
    "0" for the batch-invariant modes.

    >>> tiled_mm("llama"), tiled_mm("fast")
    ('1', '0')
    """
    return "1" if numerics == "llama" else "0"
