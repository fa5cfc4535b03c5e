"""Numerics: which kernels a llama.cpp Target runs, and what speculative output promises.

The one place the modes, the default and their promises are written (docs/design.md,
"Exactness"). Every front end (``--numerics``, the config file's ``numerics``, the LSP
setting ``numerics``, ``mcp --no-daemon``, the benchmarks) validates through
:func:`parse_numerics` and defaults to :data:`DEFAULT_NUMERICS`.

- ``fast`` (the default): llama.cpp's default kernels on every thread (flash attention
  off, as llama-cpp-python's ``Llama()`` has it: at 1,000-1,500 tokens of context its
  batches cost least; SmolLM2 on 2 cores, t(1) 13.2 ms, t(4) 31.3), without the tiled
  K-quant matmul (batches of 8+ rows of a K-quant model). Promise: greedy output is
  the Target's argmax for the batch it verified (vLLM's and llama.cpp's own); batched
  and one-token logits differ by up to ~1 logit (SmolLM2 Q4_1), 1.7 (Gemma 3 Q4_K_M),
  so output may differ from one-token decoding where plain's top-2 gap is below that.
- ``exact``: batch-invariant kernels only (flash attention, ubatches of at most 48, no
  repacking, no tiled matmul, one thread on one-token steps), so batched and one-token
  evaluation agree to the bit and speculative greedy output is plain decoding's, token
  for token. Its plain steps cost 1.9x (t(1) 24.6 ms) and its rounds ~1.3x.
- ``llama``: llama.cpp exactly as it ships (the tiled K-quant matmul on): the baseline
  every speedup assistd reports is against. Same promise as ``fast``.

``GGML_CPU_TILED_MM`` is read once per process by ggml, so ``llama`` cannot share a
process with ``fast`` or ``exact`` (:func:`tiled_mm` says which value a mode needs);
``fast`` turns it off so that one process can host ``fast`` and ``exact`` Targets.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    "0" for ``fast`` and ``exact`` (exact's batch invariance needs it off; fast shares
    exact's processes).

    >>> tiled_mm("llama"), tiled_mm("fast")
    ('1', '0')
    """
    return "1" if numerics == "llama" else "0"


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """Where two outputs part: the first index at which ``a`` and ``b`` (token ids ``[n]``,
    stream pieces, or texts, compared element by element) differ; the shorter's length
    when one is a prefix of the other; None when they are equal. The index to read
    plain decoding's top-2 gap at when judging a difference a near-tie ("Exactness").

    >>> first_difference([1, 2, 3], [1, 2, 4]), first_difference([1, 2], [1, 2, 5])
    (2, 2)
    >>> first_difference([7], [7]) is None, first_difference("abc", "abd")
    (True, 2)
    """
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
