"""torch Target through transformers: a GGUF file or a Hugging Face model directory.

A GGUF file is dequantized by transformers on its first load (~27 s for the embedded
135M model on 2 CPU cores); the dense float32 weights (540 MB for it) and the
tokenizer are then cached under ``<cache>/torch-weights/<sha256 of the file>/``
(``<cache>``: ``$ASSISTD_CACHE_DIR``, else the user cache dir), so later loads of the
same bytes skip the conversion (~4 s, mostly transformers' own imports). Evaluation feeds explicit positions into a ``DynamicCache`` and
projects only the requested rows onto the vocabulary (``logits_to_keep``); rollback
crops the cache. A token tree goes in one forward with a 4-D additive attention mask
(cached tokens visible, within the tree ancestors only; one per layer type where the
model has sliding-window layers) and explicit position ids ``n_past + depth``, as
Medusa's and SpecInfer's tree attention do; the cache is then cut to the cached tokens
plus the accepted path, its rows gathered into place. For a GGUF file the tokenizer
agrees with llama.cpp's: same vocab text (so the same fingerprint and history),
end-of-generation ids, pre-tokenizer split and piece bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import re
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import platformdirs

from assistd.ground.errors import ModelError
from assistd.ground.options import DEFAULT_N_CTX
from assistd.ground.process import process_alive
from assistd.targets.base import Target, choose_sequences, encodable, tokenizer_fingerprint
from assistd.targets.gguf_header import gguf_metadata
from assistd.targets.llama import check_model_file
from assistd.targets.vocab import eog_ids, piece_bytes

INSTALL_HINT = (
    "pip install 'assistd[torch]' (on a CPU-only machine install the CPU build of torch "
    "first: pip install torch==2.13.0; an unpinned torch pulls a multi-GB CUDA build)"
)

# GGUF pre-tokenizers (``tokenizer.ggml.pre``) that split every digit off before
# GPT-2's regex in llama.cpp; transformers' GGUF converter leaves this split out.
DIGIT_SPLIT_PRE = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell",
                             "exaone", "minerva-7b"})
DTYPES = ("float32", "bfloat16", "float16")


def cache_root() -> Path:
    """``$ASSISTD_CACHE_DIR`` if set, else the user cache dir (platformdirs)."""
    env = os.environ.get("ASSISTD_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("assistd", appauthor=False))


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class TorchTarget(Target):
    """A GGUF file (dequantized) or a Hugging Face model directory on torch.

    n_ctx: context window (tokens), capped by the model's ``max_position_embeddings``;
    device: ``"auto"`` (cuda, else mps, else cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"``,
    ``"mps"``; dtype: ``"auto"`` (float32 on cpu, bfloat16 on cuda where supported else
    float16, float16 on mps), ``"float32"``, ``"bfloat16"``, ``"float16"``; n_threads:
    torch CPU threads [default: all usable cores]; n_batch: tokens per forward pass.
    ``model`` and ``tokenizer`` are the transformers objects (for benchmarks and tools).
    Raises :class:`ModelError` when torch/transformers are missing, the file or
    directory is missing, unreadable, not a model, or fails to load, or the device is
    unavailable.
    """

    backend = "torch"
    numerics = "float"  # batched and one-token forwards differ by float rounding (~1e-5)

    def __init__(self, model_path: str | Path, *, n_ctx: int = DEFAULT_N_CTX, device: str = "auto",
                 dtype: str = "auto", n_threads: int | None = None, n_batch: int = 512,
                 sequences: int | str = 1):
        super().__init__()
        path = Path(model_path).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ModelError(f"not a Hugging Face model directory (no config.json): {path}; "
                                 "pass --model PATH to a GGUF file or a model directory")
        else:
            check_model_file(path)
        # OpenMP threads that spin while idle made torch ~30x slower on 2 cores shared
        # with other work (1.9 s per token instead of 60 ms, measured here); sleeping
        # threads avoid it. Takes effect only if torch is not imported yet.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            import torch
            import transformers  # noqa: F401
        except ImportError as e:
            raise ModelError(f"the torch backend needs torch and transformers ({e}): "
                             f"{INSTALL_HINT}") from None
        self._torch = torch
        self.n_threads = n_threads or len(os.sched_getaffinity(0))
        torch.set_num_threads(self.n_threads)
        self.device = _resolve_device(torch, device)
        self.dtype = _resolve_dtype(torch, self.device, dtype)
        torch_dtype = getattr(torch, self.dtype)
        self.cache_dir: Path | None = None  # the converted-weights cache dir, for a GGUF file
        self._vocab_text: list[str] | None = None
        try:
            with _quiet_transformers():
                if path.is_dir():
                    model, tok = _load_dir(path, torch_dtype)
                else:
                    model, tok = self._load_gguf(path, torch_dtype)
                model = model.to(device=self.device, dtype=torch_dtype).eval()
        except ModelError:
            raise
        except Exception as e:  # transformers raises OSError/ValueError/KeyError/struct.error/...
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
            what = "a complete model directory" if path.is_dir() else (
                "a complete GGUF model (re-download or re-install it)")
            raise ModelError(f"failed to load model {path} on {self.device}: {msg}; check that it is "
                             f"{what}, or pass --model PATH") from None
        self.model, self.tokenizer = model, tok
        self.model_path = str(path)
        config = model.config.get_text_config()
        self.n_ctx = min(n_ctx, getattr(config, "max_position_embeddings", None) or n_ctx)
        self.n_vocab = int(config.vocab_size)
        self.n_batch = n_batch
        self._setup_tokenizer(tok, model)
        from transformers import DynamicCache

        self._new_cache = DynamicCache  # no config: full-length layers, so any rollback is exact
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        element = torch.tensor([], dtype=model.dtype).element_size()
        self.kv_bytes_per_token = int(config.num_hidden_layers) * kv_heads * head_dim * 2 * element
        # One cache per sequence, grown on use (so "auto" costs nothing until used).
        self._init_sequences(choose_sequences(sequences, self.kv_bytes_per_token, self.n_ctx))
        self._caches = [DynamicCache() for _ in range(self.n_seq_max)]
        forward_params = inspect.signature(model.forward).parameters  # transformers 5.2x renamed it
        self._cache_kw = "cache" if "cache" in forward_params else "past_key_values"

    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) or super().chat_template()

    # -- loading ------------------------------------------------------------

    def _load_gguf(self, path: Path, torch_dtype):
        """Dense model + tokenizer for a GGUF file, from the cache or by converting it.

        Also keeps the file's vocab text (``self._vocab_text``), which llama.cpp uses
        as is and transformers may respell (Gemma's runs of spaces).
        """
        try:
            import gguf  # noqa: F401
        except ImportError:
            raise ModelError(f"loading a GGUF file on torch needs the gguf package: "
                             f"{INSTALL_HINT}") from None
        meta = gguf_metadata(path, {"tokenizer.ggml.tokens", "tokenizer.ggml.pre"})
        if "tokenizer.ggml.tokens" not in meta:
            raise ModelError(f"GGUF file has no tokenizer: {path}; pass --model PATH to a complete model")
        self._vocab_text = meta["tokenizer.ggml.tokens"]
        cached = cache_root() / "torch-weights" / file_sha256(path)
        self.cache_dir = cached
        if cached.is_dir():
            try:
                return _load_dir(cached, torch_dtype, strict=True)
            except Exception as e:
                warnings.warn(f"converted-weights cache {cached} is unusable ({type(e).__name__}: "
                              f"{str(e)[:200]}); removing it and converting {path} again",
                              RuntimeWarning, stacklevel=3)
                shutil.rmtree(cached, ignore_errors=True)
        model, tok = _convert_gguf(path, meta.get("tokenizer.ggml.pre"))
        _save_cache(model, tok, cached)
        return model, tok

    def _setup_tokenizer(self, tok, model) -> None:
        from tokenizers import Tokenizer, decoders

        # A private copy that treats special-token text as plain text (llama.cpp special=False).
        self._encoder = enc = Tokenizer.from_str(tok.backend_tokenizer.to_str())
        enc.encode_special_tokens = True
        special = {i for i, t in enc.get_added_tokens_decoder().items() if t.special}
        # llama.cpp's vocab text: the piece as the vocab spells it ("Ġdef", "▁x", "<0x0A>").
        vocab = self._vocab_text or [enc.id_to_token(i) for i in range(self.n_vocab)]
        texts = [vocab[i] if i < len(vocab) else None for i in range(self.n_vocab)]
        self.fingerprint = tokenizer_fingerprint((t or "").encode("utf-8") for t in texts)
        self._texts, self._special = texts, frozenset(special)
        byte_level = isinstance(enc.decoder, decoders.ByteLevel)
        self._piece_bytes = [piece_bytes(t, byte_level=byte_level, special=i in special)
                             for i, t in enumerate(texts)]
        self.bos_token_id = tok.bos_token_id
        self.add_bos = self.bos_token_id is not None and tok("a").input_ids[:1] == [self.bos_token_id]
        self.eos_token_ids = eog_ids(tok, model, texts)

    # -- Target -------------------------------------------------------------

    def _evaluate(self, tokens: list[int], rows: list[int], n_past: int) -> np.ndarray:
        torch = self._torch
        if any(not 0 <= r < len(tokens) for r in rows):
            raise ValueError(f"logits rows {rows} out of range for {len(tokens)} tokens")
        if self._cache.get_seq_length() != n_past:
            raise RuntimeError(f"KV cache holds {self._cache.get_seq_length()} positions, "
                               f"expected {n_past}")
        out = np.empty((len(rows), self.n_vocab), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(tokens), self.n_batch):
                chunk = tokens[start : start + self.n_batch]
                keep = [(i, r - start) for i, r in enumerate(rows) if start <= r < start + len(chunk)]
                pos = n_past + start
                logits = self.model(
                    input_ids=torch.tensor([chunk], device=self.device),
                    position_ids=torch.arange(pos, pos + len(chunk), device=self.device)[None],
                    logits_to_keep=torch.tensor([j for _, j in keep], dtype=torch.long, device=self.device),
                    use_cache=True,
                    **{self._cache_kw: self._cache},
                ).logits
                if keep:
                    out[[i for i, _ in keep]] = logits[0].float().cpu().numpy()
        return out

    @property
    def tree_leaves(self) -> int | None:
        """No bound: a tree is one forward with a tree mask, whatever its shape."""
        return None

    def _evaluate_tree(self, tree, n_past: int) -> np.ndarray:
        """All nodes in one forward: positions ``n_past + depth``, a 4-D mask
        ``[1, 1, n, n_past + n]`` (0 where a node may attend, the dtype's minimum
        elsewhere), and for sliding-window layers the same mask with keys more than
        ``sliding_window - 1`` positions back masked too. Logits for every node."""
        torch = self._torch
        if self._cache.get_seq_length() != n_past:
            raise RuntimeError(f"KV cache holds {self._cache.get_seq_length()} positions, "
                               f"expected {n_past}")
        n, dev = len(tree), self.device
        ancestor = torch.zeros((n, n), dtype=torch.bool)
        for i, p in enumerate(tree.parents):
            if p >= 0:
                ancestor[i] = ancestor[p]
            ancestor[i, i] = True
        visible = torch.cat([torch.ones((n, n_past), dtype=torch.bool), ancestor], dim=1)
        q_pos = n_past + torch.tensor(tree.depth)
        k_pos = torch.cat([torch.arange(n_past), q_pos])
        low = torch.finfo(self.model.dtype).min

        def additive(allowed):
            zero = torch.zeros((), dtype=self.model.dtype)
            return torch.where(allowed, zero, low)[None, None].to(dev)

        config = self.model.config.get_text_config()
        window = getattr(config, "sliding_window", None)
        mask = additive(visible)
        if window and "sliding_attention" in (getattr(config, "layer_types", None) or ()):
            recent = (q_pos[:, None] - k_pos[None, :]) < window
            mask = {"full_attention": mask, "sliding_attention": additive(visible & recent)}
        with torch.inference_mode():
            logits = self.model(
                input_ids=torch.tensor([list(tree.tokens)], device=dev),
                position_ids=q_pos[None].to(dev),
                attention_mask=mask,
                logits_to_keep=0,  # every row
                use_cache=True,
                **{self._cache_kw: self._cache},
            ).logits
        return logits[0].float().cpu().numpy()

    def _keep_path(self, tree, path: list[int], n_past: int) -> None:
        """Cut every layer's keys and values to the cached tokens plus the path's rows."""
        torch = self._torch
        with torch.inference_mode():
            rows = torch.tensor([n_past + i for i in path], device=self.device)
            for layer in self._cache.layers:
                layer.keys = torch.cat([layer.keys[..., :n_past, :], layer.keys.index_select(-2, rows)], -2)
                layer.values = torch.cat([layer.values[..., :n_past, :],
                                          layer.values.index_select(-2, rows)], -2)

    def _truncate(self, n: int) -> None:
        if n == 0:
            self._cache = self._new_cache()
            return
        with self._torch.inference_mode():
            for layer in self._cache.layers:  # per layer: a failed forward may have filled only some
                extra = layer.get_seq_length() - n
                if extra > 0:
                    layer.crop(-extra)

    def tokenize(self, text: str) -> list[int]:
        return self._encoder.encode(encodable(text), add_special_tokens=False).ids

    def detokenize(self, ids: Sequence[int], prev: Sequence[int] | None = None) -> str:
        """Concatenated piece bytes, decoded as UTF-8 (invalid bytes -> U+FFFD).

        Pieces carry their own leading spaces, so the text does not depend on ``prev``
        (as on llama.cpp); a space right after a leading BOS is dropped, as
        llama-cpp-python does.
        """
        ids = [int(i) for i in ids]
        data = b"".join(self._piece_bytes[i] for i in ids)
        if ids and ids[0] == self.bos_token_id and data[:1] == b" ":
            data = data[1:]
        return data.decode("utf-8", errors="replace")

    def pieces(self) -> list[bytes]:
        return [(t or "").encode("utf-8") for t in self._texts]

    def special_ids(self) -> frozenset[int]:
        return self._special

    @property
    def _cache(self):
        return self._caches[self.seq]

    @_cache.setter
    def _cache(self, cache) -> None:
        self._caches[self.seq] = cache

    def close(self) -> None:
        self.model = None
        self._caches = [None] * self.n_seq_max


# -- helpers -----------------------------------------------------------------


def _resolve_device(torch, device: str) -> str:
    if device == "auto":
        if torch.cuda.is_available():
            return f"cuda:{torch.cuda.current_device()}"
        mps = getattr(torch.backends, "mps", None)
        return "mps" if mps is not None and mps.is_available() else "cpu"
    if device == "cpu":
        return device
    if device == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ModelError("device 'mps' is not available in this torch build; pass --device cpu")
        return device
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if m is None:
        raise ModelError(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps")
    if not torch.cuda.is_available():
        raise ModelError(f"device {device!r} is not available (torch {torch.__version__} sees no CUDA "
                         "GPU); pass --device cpu")
    index = int(m.group(1)) if m.group(1) else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ModelError(f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s)")
    return f"cuda:{index}"


def _resolve_dtype(torch, device: str, dtype: str) -> str:
    if dtype == "auto":
        if device.startswith("cuda"):
            return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        return "float16" if device == "mps" else "float32"
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; use auto, {', '.join(DTYPES)}")
    return dtype


@contextlib.contextmanager
def _quiet_transformers():
    """No progress bars from transformers while loading (stderr may belong to a log)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _load_dir(path: Path, torch_dtype, *, strict: bool = False):
    """Model + tokenizer from a directory; raises ValueError on missing or mismatched weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and (strict or k != "unexpected_keys")}
    if bad:
        raise ValueError(f"weights do not match the model: {str(bad)[:300]}")
    return model, AutoTokenizer.from_pretrained(path)


def _convert_gguf(path: Path, pre: str | None):
    """Dequantize a GGUF file into a dense float32 model + its tokenizer (slow).

    ``pre``: the file's ``tokenizer.ggml.pre`` (e.g. ``"smollm"``).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {}
    with contextlib.suppress(ImportError):  # transformers >= 5.2x may keep GGUF blocks packed
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 **kwargs)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are dense now: let save_pretrained write them
        quantizer.remove_quantization_config(model)
    if pre in DIGIT_SPLIT_PRE:
        from tokenizers import pre_tokenizers

        backend = tok.backend_tokenizer
        if isinstance(backend.pre_tokenizer, pre_tokenizers.ByteLevel):
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ])
    return model, tok


def _save_cache(model, tok, dest: Path) -> None:
    """Write model + tokenizer to ``dest`` atomically (temp dir, then rename); warn on failure."""
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        for old in dest.parent.glob(f"{dest.name}.tmp-*"):  # left by a killed process
            pid = old.name.rpartition("-")[2]
            if pid.isdigit() and not process_alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.rename(tmp, dest)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if not dest.is_dir():  # else another process finished the same cache first
            warnings.warn(f"cannot cache the converted weights in {dest} ({type(e).__name__}: {e}); "
                          "the next load converts the GGUF file again. Set ASSISTD_CACHE_DIR to a "
                          "writable directory to cache them", RuntimeWarning, stacklevel=4)
