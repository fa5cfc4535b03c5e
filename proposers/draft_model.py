"""draft_model: a small LM of the Target's tokenizer drafts the next tokens.

The draft is a second, independent :class:`~assistd.targets.base.Target` (its own
llama.cpp context or torch model, its own KV cache); the Target's cache is never
touched. Before use, :func:`assistd.targets.compat.check_compatible` refuses a
draft whose tokenizer differs from the Target's.

One call drafts up to k tokens autoregressively, one draft forward per token.
The draft's KV cache is kept between calls and reused up to the longest common
prefix (:meth:`Target.reuse_prefix`): the context usually grows only by the
tokens just committed, and the accepted draft tokens are already cached, so a
round costs the draft about k one-token forwards.

Greedy drafting (``temperature=0``, the default) proposes the draft's argmax and
returns no ``q_rows``: in speculative sampling such a draft is a point mass
q = δ_d (docs/design.md, 'Exactness'), since the draft's softmax is not the distribution the token was
drawn from. With ``temperature > 0`` the draft samples each token from its own
softmax(logits / T) and returns those rows as ``q_rows``, and verification uses
the min(1, p/q) rule; set T to the Target's sampling temperature for the best
acceptance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from assistd.ground.errors import ModelError
from assistd.ground.options import DEFAULT_N_CTX
from assistd.ground.numerics import DEFAULT_NUMERICS, NUMERICS, tiled_mm
from assistd.targets.base import Target
from assistd.targets.compat import check_compatible
from proposers.base import Draft, Proposer, register

DEFAULT_MIN_PROB = 0.3


def window_start(n: int, k: int, n_ctx: int) -> int:
    """First context index the draft model sees, so that ``n - start + k <= n_ctx``.

    0 while the whole context fits; past that the window start moves in steps of
    ``n_ctx // 4``, so consecutive rounds share one window and the draft's KV cache
    (a window sliding by one token would re-evaluate it all every round).

    >>> window_start(100, 4, 512), window_start(600, 4, 512), window_start(637, 4, 512)
    (0, 128, 256)
    """
    over = n + k - n_ctx
    if over <= 0:
        return 0
    step = max(1, n_ctx // 4)
    return -(-over // step) * step


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """float64 ``[n_vocab]`` probabilities of one logits row at ``temperature`` (> 0).

    >>> softmax(np.array([0.0, np.log(3.0)])).round(3).tolist()
    [0.25, 0.75]
    """
    z = np.asarray(logits, dtype=np.float64)
    if temperature != 1.0:
        z = z / temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def model_file_bytes(model_path: str | Path) -> int:
    """Bytes of a model on disk: a GGUF file, or a Hugging Face directory's weight files."""
    path = Path(model_path)
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir()
                   if p.suffix in (".safetensors", ".bin", ".gguf", ".pt") and p.is_file())
    return 0


def kv_cache_bytes(model: Target) -> int:
    """Estimated bytes of a model's KV cache at its full ``n_ctx`` (an upper bound).

    n_layer · n_ctx · (K + V width per token) · 2 bytes (f16, llama.cpp's default
    cache type; torch's float32 counts 4). Read from the GGUF metadata, or from a
    torch model's config; 0 when neither is available.
    """
    path = Path(model.model_path)
    if path.is_file():
        from assistd.targets.gguf_header import gguf_metadata

        arch = gguf_metadata(path, {"general.architecture"}).get("general.architecture")
        keys = {f"{arch}.{k}" for k in ("block_count", "embedding_length", "attention.head_count",
                                         "attention.head_count_kv", "attention.key_length",
                                         "attention.value_length")}
        m = {k.removeprefix(f"{arch}."): v for k, v in gguf_metadata(path, keys).items()}
        if "block_count" in m and "embedding_length" in m and "attention.head_count" in m:
            head_count = m["attention.head_count"]
            head_count = max(head_count) if isinstance(head_count, list) else head_count
            kv_heads = m.get("attention.head_count_kv", head_count)
            kv_heads = max(kv_heads) if isinstance(kv_heads, list) else kv_heads
            head_dim = m["embedding_length"] // head_count
            k_dim = m.get("attention.key_length", head_dim)
            v_dim = m.get("attention.value_length", head_dim)
            elem = 2 if model.backend == "llama" else 4
            return int(m["block_count"] * model.n_ctx * kv_heads * (k_dim + v_dim) * elem)
    config = getattr(getattr(model, "model", None), "config", None)
    if config is not None:
        heads = getattr(config, "num_attention_heads", 0) or 1
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or getattr(config, "hidden_size", 0) // heads
        layers = getattr(config, "num_hidden_layers", 0)
        return int(layers * model.n_ctx * kv_heads * 2 * head_dim * 4)
    return 0


def draft_numerics(target: Target | None) -> str:
    """The numerics of a llama.cpp draft beside ``target``: ``llama`` beside a Target that
    runs llama.cpp's defaults (ggml reads ``GGML_CPU_TILED_MM`` once per process), else
    :data:`~assistd.ground.numerics.DEFAULT_NUMERICS`: a draft's numerics never reach the
    output, which the Target verifies.

    >>> draft_numerics(None)
    'fast'
    """
    numerics = getattr(target, "numerics", None)
    if numerics in NUMERICS and tiled_mm(numerics) != tiled_mm(DEFAULT_NUMERICS):
        return numerics
    return DEFAULT_NUMERICS


def open_draft(path: str | Path | None, *, backend: str = "llama", n_ctx: int = DEFAULT_N_CTX,
               n_threads: int | None = None, **target_options) -> Target:
    """Load a draft model: a second Target instance with its own context and KV cache.

    ``path``: a GGUF file (or for torch a Hugging Face directory); None = the embedded
    default model. The other options go to :func:`assistd.targets.open.open_target`; on
    llama.cpp the draft runs the default numerics unless told otherwise (beside a Target
    of ``llama`` numerics pass ``numerics=draft_numerics(target)``): its numerics never
    reach the output, which the Target verifies. Raises :class:`ModelError`.
    """
    from assistd.targets.open import open_target

    if backend == "llama":
        target_options.setdefault("numerics", DEFAULT_NUMERICS)
    return open_target(Path(path) if path is not None else None, backend=backend, n_ctx=n_ctx,
                       n_threads=n_threads, **target_options)


@register
class DraftModelProposer(Proposer):
    """Draft with a small LM of the Target's tokenizer.

    draft:       the draft model, a Target instance of its own (never the Target itself).
    target:      the Target; when given, the tokenizers are checked at construction
                 (:func:`check_compatible`; :class:`ModelError` names what differs).
    min_prob:    stop drafting when the draft's top probability at a position falls
                 below this (the draft is unsure there); a first position below it
                 means no draft (a plain step).
    temperature: 0 = greedy drafting (point-mass q); > 0 = sample from softmax(logits/T)
                 and return those rows as ``q_rows``.
    seed:        seed of the drafting random generator (temperature > 0).

    Counters (raw, as the ledger keeps them): ``calls``, ``drafts``, ``draft_tokens``,
    ``forward_tokens`` (tokens the draft evaluated, prefill included) and
    ``reused_tokens`` (context tokens whose draft KV was kept from the last call).
    ``memory_bytes``: the draft's model file plus its KV cache estimate, for the ledger.
    """

    name = "draft_model"

    def __init__(self, draft: Target, target: Target | None = None, *,
                 min_prob: float = DEFAULT_MIN_PROB, temperature: float = 0.0,
                 seed: int | None = None):
        if target is not None:
            if draft is target:
                raise ModelError("the draft model must be a second model instance with its own "
                                 "KV cache, not the Target itself; open it with open_draft(PATH)")
            check_compatible(target, draft)
        if not 0 <= min_prob <= 1:
            raise ValueError(f"min_prob must be in [0, 1], got {min_prob}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.draft = draft
        self.min_prob = float(min_prob)
        self.temperature = float(temperature)
        self._rng = np.random.default_rng(seed)
        self.model_bytes = model_file_bytes(draft.model_path)
        self.kv_bytes = kv_cache_bytes(draft)
        self.calls = self.drafts = self.draft_tokens = 0
        self.forward_tokens = self.reused_tokens = 0

    @property
    def memory_bytes(self) -> int:
        """Model file plus KV cache estimate of the draft model, in bytes."""
        return self.model_bytes + self.kv_bytes

    def propose(self, context: np.ndarray, k: int, *, scope: str | None = None,
                language: str | None = None) -> Draft | None:
        d = self.draft
        k = min(k, d.n_ctx // 2)
        if k < 1 or len(context) == 0:
            return None
        self.calls += 1
        bos = d.bos_token_id if d.add_bos else None
        start = window_start(len(context), k, d.n_ctx - (bos is not None))
        window = ([bos] if start and bos is not None else []) + np.asarray(context[start:]).tolist()

        # Keep the cached prefix (the context grew by the committed tokens; the
        # accepted draft tokens are cached too); the last token is always evaluated
        # again, for its logits row.
        n = min(d.reuse_prefix(window), len(window) - 1)
        d.truncate(n)
        self.reused_tokens += n
        self.forward_tokens += len(window) - n
        logits = d.evaluate(window[n:], [len(window) - n - 1])[0]

        tokens: list[int] = []
        probs: list[float] = []
        rows: list[np.ndarray] = []
        sample = self.temperature > 0
        for i in range(k):
            q = softmax(logits, self.temperature if sample else 1.0)
            if q.max() < self.min_prob:
                break
            tok = int(self._rng.choice(len(q), p=q)) if sample else int(q.argmax())
            tokens.append(tok)
            probs.append(float(q[tok]))
            if sample:
                rows.append(q)
            if i + 1 == k or tok in d.eos_token_ids:
                break
            logits = d.evaluate([tok], [0])[0]
            self.forward_tokens += 1
        if not tokens:
            return None
        self.drafts += 1
        self.draft_tokens += len(tokens)
        return Draft(
            tokens=np.array(tokens, dtype=np.int64),
            probs=np.array(probs, dtype=np.float64),
            source="model",
            match_len=0,
            document=None,
            q_rows=np.stack(rows) if sample else None,  # float64: a tiny q(d) must not round to 0
        )

    def close(self) -> None:
        """Release the draft model."""
        self.draft.close()
