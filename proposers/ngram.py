"""ngram: prompt lookup over the live context and the scope's history.

Take the context tail, find earlier occurrences of it (longest length n in
[min_n, max_n] wins), and propose the tokens that followed. Reference: prompt
lookup decoding (Saxena 2023); llama-cpp-python ``LlamaPromptLookupDecoding``,
transformers ``prompt_lookup_num_tokens`` and vLLM's ``NgramProposer`` (longest n,
earliest occurrence). Here the occurrence policy is a parameter:
``"recent"`` (latest occurrence) or ``"earliest"``.

The history is indexed once per proposer as a sorted array of n-gram keys, so a
lookup is a binary search plus a vectorised match extension over the candidates;
no per-token Python loop runs on the decode path.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from proposers.base import Draft, Proposer, register

SEPARATOR = -1  # between documents in the concatenated history; never a token id
_KEY_BITS = 20  # token ids < 2**20; a key packs up to 3 ids in an int64
_MAX_CANDIDATES = 4096  # cap on occurrences examined per lookup (bounds a round's cost)

Policy = Literal["recent", "earliest"]


def match_lengths(tokens: np.ndarray, ends: np.ndarray, tail: np.ndarray, max_n: int) -> np.ndarray:
    """Length of the common suffix of ``tokens[:e]`` and ``tail``, per candidate end ``e``.

    tokens: int64 ``[N]``; ends: int64 ``[c]`` (exclusive end of each occurrence,
    i.e. where its continuation starts); tail: int64 ``[t]``. Returns int64 ``[c]``,
    each at most ``min(max_n, t)``.

    >>> match_lengths(np.array([1, 2, 3, 4, 2, 3]), np.array([3, 6]), np.array([9, 2, 3]), 4)
    array([2, 2])
    """
    n = min(max_n, len(tail))
    if n == 0 or len(ends) == 0:
        return np.zeros(len(ends), dtype=np.int64)
    idx = ends[:, None] - 1 - np.arange(n)[None, :]  # [c, n]
    valid = idx >= 0
    got = tokens[np.where(valid, idx, 0)]
    want = tail[::-1][:n]
    eq = (got == want[None, :]) & valid
    return np.cumprod(eq, axis=1).sum(axis=1)


def pick(ends: np.ndarray, lengths: np.ndarray, policy: Policy) -> tuple[int, int]:
    """The occurrence to follow: longest match, ties broken by ``policy``.

    ``ends`` must be in increasing order. Returns ``(end, length)``; ``(-1, 0)`` if empty.

    >>> pick(np.array([3, 8, 12]), np.array([2, 4, 4]), "recent")
    (12, 4)
    >>> pick(np.array([3, 8, 12]), np.array([2, 4, 4]), "earliest")
    (8, 4)
    """
    if len(ends) == 0:
        return -1, 0
    best = int(lengths.max())
    at = np.flatnonzero(lengths == best)
    i = at[-1] if policy == "recent" else at[0]
    return int(ends[i]), best


def lookup_context(context: np.ndarray, min_n: int, max_n: int, policy: Policy) -> tuple[int, int]:
    """Find the tail of ``context`` earlier in ``context`` itself, without overlapping it.

    An occurrence ``[e - m, e)`` must end where the tail ``[L - m, L)`` begins or
    earlier, so a match is cut to ``L - e`` tokens. Returns ``(end, length)`` or
    ``(-1, 0)`` when no occurrence of at least ``min_n`` tokens exists.

    Worked example: context ``[1, 2, 3, 4, 2, 3]``, min_n 2: the tail ``[2, 3]``
    occurs ending at 3, so the continuation starts at index 3 -> draft ``[4, 2, 3]``.

    >>> lookup_context(np.array([1, 2, 3, 4, 2, 3]), 2, 4, "recent")
    (3, 2)
    """
    L = len(context)
    if L < min_n + 1:
        return -1, 0
    ends = np.flatnonzero(context[: L - 1] == context[L - 1]) + 1  # candidate ends in [1, L-1]
    if len(ends) > _MAX_CANDIDATES:
        ends = ends[-_MAX_CANDIDATES:] if policy == "recent" else ends[:_MAX_CANDIDATES]
    lengths = np.minimum(match_lengths(context, ends, context, max_n), L - ends)
    keep = lengths >= min_n
    return pick(ends[keep], lengths[keep], policy)


def _keys(tokens: np.ndarray, ends: np.ndarray, key_n: int) -> np.ndarray:
    key = np.zeros(len(ends), dtype=np.int64)
    for i in range(key_n):
        key = (key << _KEY_BITS) | tokens[ends - key_n + i]
    return key


class HistoryIndex:
    """Concatenated token ids of a scope's documents with an n-gram lookup table.

    tokens: int64 ``[N]``, documents joined by ``SEPARATOR``. The table maps the
    ``key_n`` tokens before each position to that position (sorted keys, stable,
    so equal keys keep increasing positions). Build cost O(N log N); memory about
    24 bytes per history token.
    """

    def __init__(self, documents: list[tuple[str, np.ndarray]], key_n: int = 2):
        self.key_n = max(1, min(key_n, 3))
        parts, starts, names = [], [], []
        pos = 0
        for name, ids in documents:
            ids = np.asarray(ids, dtype=np.int64)
            if len(ids) == 0:
                continue
            starts.append(pos)
            names.append(name)
            parts.append(ids)
            parts.append(np.array([SEPARATOR], dtype=np.int64))
            pos += len(ids) + 1
        self.tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.doc_starts = np.array(starts, dtype=np.int64)
        self.doc_names = names
        N = len(self.tokens)
        ends = np.arange(self.key_n, N, dtype=np.int64)  # continuation starts at e < N
        ok = self.tokens[ends] != SEPARATOR
        for i in range(1, self.key_n + 1):
            ok &= self.tokens[ends - i] != SEPARATOR
        ends = ends[ok]
        keys = _keys(self.tokens, ends, self.key_n)
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        self._ends = ends[order]

    def __len__(self) -> int:
        return len(self.tokens) - len(self.doc_names)

    def lookup(self, tail: np.ndarray, min_n: int, max_n: int, policy: Policy) -> tuple[int, int]:
        """Longest occurrence of the end of ``tail`` (at least ``min_n`` tokens); ``(-1, 0)`` if none."""
        if len(tail) < max(min_n, self.key_n) or len(self._keys) == 0:
            return -1, 0
        key = _keys(tail, np.array([len(tail)]), self.key_n)[0]
        lo, hi = np.searchsorted(self._keys, key, "left"), np.searchsorted(self._keys, key, "right")
        if hi - lo > _MAX_CANDIDATES:
            lo, hi = (hi - _MAX_CANDIDATES, hi) if policy == "recent" else (lo, lo + _MAX_CANDIDATES)
        ends = self._ends[lo:hi]
        lengths = match_lengths(self.tokens, ends, tail, max_n)
        keep = lengths >= min_n
        return pick(ends[keep], lengths[keep], policy)

    def continuation(self, end: int, k: int) -> np.ndarray:
        """Up to ``k`` tokens from ``end``, stopping at the end of that document."""
        seg = self.tokens[end : end + k]
        stop = np.flatnonzero(seg == SEPARATOR)
        return seg[: stop[0]] if len(stop) else seg

    def document_name(self, pos: int) -> str:
        return self.doc_names[int(np.searchsorted(self.doc_starts, pos, "right")) - 1]


@register
class NgramProposer(Proposer):
    """Prompt lookup over the live context and (optionally) a :class:`HistoryIndex`.

    min_n / max_n: shortest / longest context suffix to match, in tokens.
    policy: which occurrence to follow among the longest matches.
    alpha: if set, cap the draft at ``ceil(alpha * match_len)`` tokens, so a short
        match (weak evidence) gives a short draft (after SuffixDecoding's α·m cap).
    The longer match wins across the two sources; on a tie the live context
    wins under ``"recent"`` and the history under ``"earliest"``.
    """

    name = "ngram"

    def __init__(self, history: HistoryIndex | None = None, *, min_n: int = 3,
                 max_n: int = 16, policy: Policy = "recent", alpha: float | None = None):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        if policy not in ("recent", "earliest"):
            raise ValueError(f"policy must be 'recent' or 'earliest', got {policy!r}")
        if history is not None and history.key_n > min_n:
            raise ValueError(f"history index keys {history.key_n} tokens; min_n {min_n} is shorter")
        self.history = history
        self.min_n, self.max_n, self.policy, self.alpha = min_n, max_n, policy, alpha

    def propose(self, context: np.ndarray, k: int) -> Draft | None:
        if k < 1:
            return None
        context = np.asarray(context, dtype=np.int64)
        c_end, c_len = lookup_context(context, self.min_n, self.max_n, self.policy)
        h_end, h_len = -1, 0
        if self.history is not None:
            tail = context[-self.max_n :]
            h_end, h_len = self.history.lookup(tail, self.min_n, self.max_n, self.policy)
        use_history = h_len > c_len or (h_len == c_len and h_len > 0 and self.policy == "earliest")
        if use_history:
            tokens = self.history.continuation(h_end, k)
            source, length = "history:" + self.history.document_name(h_end), h_len
        elif c_len > 0:
            tokens = context[c_end : c_end + k]
            source, length = "context", c_len
        else:
            return None
        if self.alpha is not None:
            tokens = tokens[: max(1, math.ceil(self.alpha * length))]
        if len(tokens) == 0:
            return None
        return Draft(tokens=tokens.copy(), probs=None, source=source, match_len=length)
