"""The Target interface: the one model whose output is final.

A backend implements :meth:`Target.evaluate` (append tokens to the KV cache and
return logits for the requested rows) and :meth:`Target.truncate` (roll the KV
cache back); tokenizer access and metadata are attributes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import ClassVar

import numpy as np


def tokenizer_fingerprint(pieces: Iterable[bytes]) -> str:
    """sha256 over the token->id map: ``pieces[i]`` is the byte string of token id i.

    Two tokenizers share a fingerprint only if every id maps to the same piece,
    so token ids stored for one model are never read by another.
    """
    h = hashlib.sha256()
    for i, piece in enumerate(pieces):
        h.update(i.to_bytes(4, "little"))
        h.update(len(piece).to_bytes(4, "little"))
        h.update(piece)
    return h.hexdigest()[:32]


class Target:
    """Base class for Target backends.

    Attributes set by a backend: ``model_path`` (str), ``n_ctx`` (tokens),
    ``n_vocab``, ``bos_token_id`` (int or None), ``eos_token_ids`` (frozenset),
    ``fingerprint`` (see :func:`tokenizer_fingerprint`), ``n_past`` (tokens in the KV cache).
    """

    backend: ClassVar[str] = ""
    model_path: str
    n_ctx: int
    n_vocab: int
    bos_token_id: int | None
    eos_token_ids: frozenset[int]
    fingerprint: str
    n_past: int

    def evaluate(self, tokens: Sequence[int], logits_rows: Iterable[int]) -> np.ndarray:
        """Append ``tokens`` at positions ``n_past ..`` and return logits for the given rows.

        ``logits_rows`` index into ``tokens``. Returns float32 ``[len(rows), n_vocab]``
        (``[0, n_vocab]`` when no row is asked for). Raises RuntimeError when the
        backend fails to evaluate.
        """
        raise NotImplementedError

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions of the KV cache and drop the rest."""
        raise NotImplementedError

    def tokenize(self, text: str) -> list[int]:
        """Text -> token ids, no BOS, special-token text treated as plain text."""
        raise NotImplementedError

    def detokenize(self, ids: Sequence[int], prev: Sequence[int] | None = None) -> str:
        """Token ids -> text; ``prev`` (the tokens before them) lets a tokenizer place spaces."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the model and its buffers."""
