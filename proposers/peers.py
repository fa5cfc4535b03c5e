"""Peers: the prompt-lookup rules of llama-cpp-python and transformers, with their defaults.

They are here so that ``assistd replay`` compares them with our proposers in the same run,
on the same data and tokens. Both look only at the live context (no history):

- ``peer:llama-cpp-python-pld``: ``LlamaPromptLookupDecoding(max_ngram_size=2,
  num_pred_tokens=10)`` (llama_cpp/llama_speculative.py): for n from
  ``min(max_ngram_size, len - 1)`` down to 1, the EARLIEST occurrence of the last n
  tokens that is not the tail itself; draft the (up to ``num_pred_tokens``) tokens after
  it, which may run into the tail. No match at any n: no draft.
- ``peer:transformers-pld``: ``PromptLookupCandidateGenerator`` with
  ``prompt_lookup_num_tokens=10, max_matching_ngram_size=2``
  (transformers/generation/candidate_generator.py): the same search, then the draft is
  cut before its first EOS token; if that leaves nothing, no draft (it does not look
  for another match). Its logits-processor filter (drop a candidate a processor forbids)
  is a no-op under plain greedy decoding and is not reproduced.

The kernels are vectorised re-implementations, checked token for token against the real
libraries on random inputs (tests/measure/test_replay.py); the originals build every sliding
window of the context per call.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from proposers.base import Draft, Proposer, register


def earliest_lookup(context: np.ndarray, max_ngram_size: int, num_pred_tokens: int
                    ) -> tuple[np.ndarray, int]:
    """llama-cpp-python's ``find_candidate_pred_tokens``: ``(draft, n)``, n = matched length.

    context: int ``[L]``. For n = min(max_ngram_size, L - 1) .. 1: the first index i with
    ``context[i:i+n] == context[L-n:]`` and ``i + n < L``; draft
    ``context[i+n : min(i+n+num_pred_tokens, L)]``. ``(empty, 0)`` when nothing matches.

    Worked example: context ``[1, 2, 3, 4, 2, 3]``, n 2: the tail ``[2, 3]`` first occurs
    at 1, so the draft is what follows it, up to 10 tokens: ``[4, 2, 3]``.

    >>> earliest_lookup(np.array([1, 2, 3, 4, 2, 3]), 2, 10)
    (array([4, 2, 3]), 2)
    >>> earliest_lookup(np.array([5, 9, 7, 9]), 2, 10)  # n 2 fails, n 1: the first 9
    (array([7, 9]), 1)
    """
    context = np.asarray(context)
    L = len(context)
    for n in range(min(max_ngram_size, L - 1), 0, -1):
        tail = context[L - n :]
        starts = np.flatnonzero(context[: L - n] == tail[0])  # i <= L-n-1, so i+n < L
        for j in range(1, n):
            starts = starts[context[starts + j] == tail[j]]
        if len(starts):
            begin = int(starts[0]) + n
            return context[begin : min(begin + num_pred_tokens, L)], n
    return context[:0], 0


def cut_at_eos(draft: np.ndarray, eos_token_ids: Iterable[int]) -> np.ndarray:
    """transformers' candidate trim: the draft before its first EOS token.

    >>> cut_at_eos(np.array([7, 2, 8]), [2])
    array([7])
    """
    eos = np.flatnonzero(np.isin(draft, list(eos_token_ids)))
    return draft[: eos[0]] if len(eos) else draft


class _PeerLookup(Proposer):
    """Common shape of the two peers: no history (``history`` is accepted and ignored,
    so every proposer is built the same way), a fixed draft length ``num_pred_tokens``
    cut to the ceiling ``k`` asked for."""

    def __init__(self, history=None, *, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        if max_ngram_size < 1 or num_pred_tokens < 1:
            raise ValueError("max_ngram_size and num_pred_tokens must be >= 1")
        self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens

    def _lookup(self, context: np.ndarray, k: int) -> tuple[np.ndarray, int]:
        return earliest_lookup(np.asarray(context, dtype=np.int64), self.max_ngram_size,
                               min(self.num_pred_tokens, k))

    def _draft(self, tokens: np.ndarray, n: int) -> Draft | None:
        if len(tokens) == 0:
            return None
        return Draft(tokens=tokens.copy(), probs=None, source="context", match_len=n)


@register
class LlamaCppPromptLookup(_PeerLookup):
    """llama-cpp-python ``LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)``."""

    name = "peer:llama-cpp-python-pld"

    def propose(self, context, k, *, scope=None, language=None):
        if k < 1:
            return None
        return self._draft(*self._lookup(context, k))


@register
class TransformersPromptLookup(_PeerLookup):
    """transformers ``prompt_lookup_num_tokens=10, max_matching_ngram_size=2``.

    eos_token_ids: the Target's EOS ids (transformers passes the generation config's);
    default SmolLM2's ``<|im_end|>`` (2).
    """

    name = "peer:transformers-pld"

    def __init__(self, history=None, *, max_ngram_size: int = 2, num_pred_tokens: int = 10,
                 eos_token_ids: Iterable[int] = (2,)):
        super().__init__(history, max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens)
        self.eos_token_ids = tuple(eos_token_ids)

    def propose(self, context, k, *, scope=None, language=None):
        if k < 1:
            return None
        tokens, n = self._lookup(context, k)
        return self._draft(cut_at_eos(tokens, self.eos_token_ids), n)
