"""The Target interface: the one model whose output is final.

A backend implements :meth:`Target._evaluate` (append tokens to the KV cache and
return logits for the requested rows) and :meth:`Target._truncate` (roll the KV
cache back). The base class keeps the list of tokens whose keys/values are in the
cache (``kv_tokens``), so the engine can reuse the longest common prefix of the
previous request (:meth:`Target.reuse_prefix`) on every backend alike.

A Target may keep several KV sequences (``n_seq_max``, each up to ``n_ctx`` tokens):
:meth:`Target.use_sequence` picks the one that ``evaluate``, ``truncate`` and
``reuse_prefix`` act on, so that several clients keep their prefixes warm. Which
client gets which sequence is the runtime's choice (``assistd.runtime.sequences``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import ClassVar

import numpy as np


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """``text`` with each lone surrogate as U+FFFD. A Python str holds one when it came
    from JSON's ``"\\ud800"`` (valid pairs are joined by then); no UTF-8 encoder takes it,
    so both backends' tokenizers see U+FFFD instead, as a transcript's text does.

    >>> encodable("a\\ud800b") == "a\\ufffdb"
    True
    """
    return _LONE_SURROGATE.sub("\ufffd", text)


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

    # KV sequences kept (each holds up to n_ctx tokens), and the KV cache bytes one
    # token takes in one sequence (0: unknown), for status and the memory bound.
    n_seq_max: int = 1
    kv_bytes_per_token: int = 0

    def __init__(self) -> None:
        self._kv: list[list[int]] = [[]]  # per sequence: the tokens whose K/V are cached
        self.seq = 0  # the sequence evaluate/truncate/reuse_prefix act on

    def _init_sequences(self, n: int) -> None:
        self.n_seq_max, self._kv, self.seq = n, [[] for _ in range(n)], 0

    @property
    def kv_tokens(self) -> list[int]:
        """Tokens in the current sequence's KV cache."""
        return self._kv[self.seq]

    def use_sequence(self, seq: int) -> None:
        """Make ``seq`` (0 .. n_seq_max-1) the sequence the next calls act on. Raises
        ValueError for a sequence this Target does not keep."""
        if not 0 <= seq < self.n_seq_max:
            raise ValueError(f"sequence {seq} is not in 0..{self.n_seq_max - 1}")
        self.seq = seq

    def sequence_tokens(self, seq: int) -> list[int]:
        """Tokens cached in sequence ``seq`` (a read-only view: do not modify)."""
        return self._kv[seq]

    def drop_sequence(self, seq: int) -> None:
        """Empty sequence ``seq``'s KV cache (an eviction); the current one stays current."""
        current = self.seq
        self.use_sequence(seq)
        try:
            self.truncate(0)
        finally:
            self.seq = current

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
        prefix KV reuse across requests: a prefix cache hit, not draft acceptance
        (docs/design.md, "Vocabulary").
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


# Memory the KV sequences of one Target may reserve when their number is "auto".
KV_BUDGET_BYTES = 512 * 2**20
AUTO_SEQUENCES_MAX = 4


def choose_sequences(requested: int | str | None, kv_bytes_per_token: int, n_ctx: int) -> int:
    """How many KV sequences to keep: ``requested`` when it is a number (>= 1), else as
    many full-context sequences as fit in ``KV_BUDGET_BYTES`` (at least 1, at most
    ``AUTO_SEQUENCES_MAX``; the maximum when the per-token size is unknown).

    >>> choose_sequences("auto", 23_040, 2048), choose_sequences("auto", 524_288, 4096), choose_sequences(2, 1, 1)
    (4, 1, 2)
    """
    if requested not in (None, "auto"):
        n = int(requested)
        if n < 1:
            raise ValueError(f"sequences must be at least 1, not {requested!r}")
        return n
    if kv_bytes_per_token <= 0:
        return AUTO_SEQUENCES_MAX
    return max(1, min(AUTO_SEQUENCES_MAX, KV_BUDGET_BYTES // (kv_bytes_per_token * n_ctx)))
