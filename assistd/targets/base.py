"""The Target interface: the one model whose output is final.

A backend implements :meth:`Target._evaluate` (append tokens to the KV cache and
return logits for the requested rows) and :meth:`Target._truncate` (roll the KV
cache back). The base class keeps the list of tokens whose keys/values are in the
cache (``kv_tokens``), so the engine can reuse the longest common prefix of the
previous request (:meth:`Target.reuse_prefix`) on every backend alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import ClassVar

import numpy as np


def tokenizer_fingerprint(pieces: Iterable[bytes]) -> str:
    """sha256 over the token->id map: ``pieces[i]`` is the byte string of token id i.

    Two tokenizers share a fingerprint only if every id maps to the same piece,
    so token ids stored for one model are never read by another. Backends feed
    the UTF-8 of each token as the vocabulary spells it (llama.cpp's
    ``llama_vocab_get_text``: ``"Ġdef"``, not ``b" def"``), so that the llama and
    torch backends of one GGUF share a fingerprint and a history.
    """
    h = hashlib.sha256()
    for i, piece in enumerate(pieces):
        h.update(i.to_bytes(4, "little"))
        h.update(len(piece).to_bytes(4, "little"))
        h.update(piece)
    return h.hexdigest()[:32]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    >>> common_prefix_length([1, 2, 3, 4], [1, 2, 5]), common_prefix_length([], [1])
    (2, 0)
    """
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


class Target:
    """Base class for Target backends.

    Attributes set by a backend: ``model_path`` (str), ``n_ctx`` (tokens),
    ``n_vocab``, ``bos_token_id`` (int or None), ``add_bos`` (bool: the model
    expects a BOS at the start), ``eos_token_ids`` (frozenset: every end-of-generation
    id), ``fingerprint`` (see :func:`tokenizer_fingerprint`), ``device`` (str, e.g.
    ``"cpu"``, ``"cuda:0"``, ``"cpu+gpu:12 layers"``).
    """

    backend: ClassVar[str] = ""
    model_path: str
    n_ctx: int
    n_vocab: int
    bos_token_id: int | None
    add_bos: bool
    eos_token_ids: frozenset[int]
    fingerprint: str
    device: str = "cpu"
    # How batched verification relates to one-token decoding on this Target:
    # "exact" (bit-identical: llama.cpp's batch-invariant CPU kernels), "fast"
    # (llama.cpp's defaults) or "float" (torch: the same maths, rounded per kernel).
    numerics: str = "exact"
    # Why speculation is off on this Target (None: it is on). The engine then decodes
    # plainly; status and the ledger JSON carry the reason.
    speculation_off: str | None = None

    def __init__(self) -> None:
        self.kv_tokens: list[int] = []

    @property
    def n_past(self) -> int:
        """Tokens in the KV cache (positions ``0 .. n_past-1``)."""
        return len(self.kv_tokens)

    def evaluate(self, tokens: Sequence[int], logits_rows: Iterable[int]) -> np.ndarray:
        """Append ``tokens`` at positions ``n_past ..`` and return logits for the given rows.

        ``logits_rows`` index into ``tokens``. Returns float32 ``[len(rows), n_vocab]``
        (``[0, n_vocab]`` when no row is asked for), raw logits before any sampling
        transform. Raises ValueError when the tokens would run past ``n_ctx`` and
        RuntimeError when the backend fails; either way the cache is left as it was.
        """
        tokens = [int(t) for t in tokens]
        rows = list(logits_rows)
        if self.n_past + len(tokens) > self.n_ctx:
            raise ValueError(
                f"evaluating {len(tokens)} tokens at position {self.n_past} exceeds n_ctx={self.n_ctx}"
            )
        before = self.n_past
        try:
            out = self._evaluate(tokens, rows, before)
        except BaseException:
            self._truncate(before)  # a failed chunk must not leave half a batch behind
            raise
        self.kv_tokens.extend(tokens)
        return out

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions of the KV cache and drop the rest."""
        if n < self.n_past:
            self._truncate(n)
            del self.kv_tokens[n:]

    def reuse_prefix(self, tokens: Sequence[int]) -> int:
        """Keep the longest cached prefix of ``tokens``, drop the rest; return its length.

        The next :meth:`evaluate` then only needs ``tokens[result:]``. This is the
        prefix KV reuse across requests (BRIEF §2: a prefix cache hit, not draft
        acceptance).
        """
        n = common_prefix_length(self.kv_tokens, tokens)
        self.truncate(n)
        return n

    # -- backend hooks -------------------------------------------------------

    def _evaluate(self, tokens: list[int], rows: list[int], n_past: int) -> np.ndarray:
        raise NotImplementedError

    def _truncate(self, n: int) -> None:
        raise NotImplementedError

    # -- tokenizer -----------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Text -> token ids, no BOS, special-token text treated as plain text."""
        raise NotImplementedError

    def detokenize(self, ids: Sequence[int], prev: Sequence[int] | None = None) -> str:
        """Token ids -> text; ``prev`` (the tokens before them) lets a tokenizer place spaces."""
        raise NotImplementedError

    def pieces(self) -> list[bytes]:
        """The token->id map: ``pieces()[i]`` is token id i as the vocabulary spells it.

        These are the byte strings :func:`tokenizer_fingerprint` hashes; a draft
        model's compatibility check (``assistd.targets.compat``) compares them id by id.
        """
        raise NotImplementedError

    def special_ids(self) -> frozenset[int]:
        """Ids of the control (special) tokens: BOS, EOS, chat-turn markers..."""
        raise NotImplementedError

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """Fill-in-the-middle ids ``(prefix, suffix, middle)`` when the model declares
        them (GGUF ``tokenizer.ggml.fim_*_token_id``, or the names llama.cpp's vocab
        loader recognises); None means prefix-only prompting. Base: None."""
        return None

    def chat_template(self) -> str | None:
        """The model's Jinja chat template (GGUF ``tokenizer.chat_template``, or the
        Hugging Face tokenizer's), or None when it declares none. Base: read from
        the model file when it is a GGUF."""
        from pathlib import Path

        from assistd.targets.gguf_header import gguf_metadata

        path = Path(self.model_path)
        if not path.is_file():
            return None
        try:
            return gguf_metadata(path, {"tokenizer.chat_template"}).get("tokenizer.chat_template")
        except Exception:  # noqa: BLE001 - not a GGUF, or unreadable: no template
            return None

    def close(self) -> None:
        """Release the model and its buffers."""
