"""prediction: drafts from a request's predicted output (OpenAI's Predicted Outputs).

A client that rewrites a file already holds most of the answer: the file. It sends it
as the request's ``prediction`` (OpenAI's ``{"type": "content", "content": ...}``), and
:class:`PredictionProposer` drafts from it, the way speculative edits do (Cursor's
"speculative edits", the predicted-outputs pull requests to vLLM, #23450 and #24568):

- **keeping its place**: ``pos`` is the index in the predicted tokens of the next token
  the output is expected to copy. Every committed token that equals ``prediction[pos]``
  moves it on; the draft is ``prediction[pos : pos + k]``.
- **finding its place again** after a divergence (the edit itself: inserted, changed or
  deleted code): the output's last tokens (up to :data:`MAX_MATCH`) are matched against
  the prediction, and the draft resumes after an occurrence of at least
  :data:`MIN_MATCH` tokens. Among the occurrences, a longer match wins up to
  :data:`SURE_MATCH` tokens (a long match is rarely a coincidence); between equally
  sure ones, the nearest at or after the place it was lost (an edit moves forward
  through the file), then the nearest before it. Until such a match exists (the first
  tokens of an inserted block), the prediction drafts nothing.

The prediction is the user's claim, not a statistic, so its drafts carry an estimate
that grows with the run of output tokens that agreed with it since the place was last
found: token j of a draft after a run of m tokens is wrong with probability
``(FAIL_SCALE / (m + j + 1)^2 + FAIL_FLOOR) * (1 + misses)`` (fitted on real edits, see
the constants), ``misses`` counting the places lost since a run last reached
:data:`SURE_MATCH` tokens: in a short, repetitive file every re-found place can be
wrong (a .gitignore's lines), and each miss makes the next draft shorter until the
output agrees with the prediction again. With the Target's cost model the draft is cut to the
length that maximises expected committed tokens per ms (:func:`proposers.suffix.best_length`),
and the other proposer of the request (``inner``: suffix over the context and the
history) competes under the same cost: the round drafts whichever of the two promises
more tokens per ms. Chains only (trees pay nothing on a CPU: docs/design.md).

A prediction belongs to one request: it is never stored in the history or logged
(it is the user's code). One :class:`PredictionProposer` per generation.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import numpy as np

from assistd.ground.costmodel import REFERENCE_CONTEXT, CostModel, context_bucket
from proposers.base import Draft, Proposer
from proposers.match import match_lengths
from proposers.suffix import best_length

# Re-finding the place: the output's last MAX_MATCH tokens are matched; a match needs
# MIN_MATCH tokens (1-2 token matches such as "\n    " land anywhere in code) and one
# of SURE_MATCH tokens or more is taken as sure, whatever its distance.
MAX_MATCH = 32
MIN_MATCH = 3
SURE_MATCH = 8
# Trust in prediction token j after a run of m agreeing output tokens, x = m + j:
# 1 - (FAIL_SCALE / (x + 1)^2 + FAIL_FLOOR) * (1 + misses), at least MIN_TRUST. Fitted
# on the replay of real edits (`assistd replay --rewrite`, this repository's commits
# 150-300 back): a draft token after x agreeing tokens was wrong 10-24% of the time at
# x = 3 (a place just re-found), 1-2% at 8-15, 0.5% at 16-31, 0.3% past 32; a
# 1 / x-shaped prior (the suffix proposer's) put long runs at 3%, cutting drafts short.
# A request starts with START_RUN agreeing tokens credited: a client's prediction is
# where its output starts (bench: every case's first token agreed), unless the answer
# opens with something else (a code fence), which loses the place at once.
FAIL_SCALE = 2.5
FAIL_FLOOR = 0.002
MIN_TRUST = 0.05
START_RUN = 6
# The longest draft: a round then evaluates at most 64 rows (the last committed token
# and 63 drafts), the ceiling the rewrite oracle is held to as well.
K_MAX = 63


class PredictionProposer(Proposer):
    """Drafts from ``prediction`` (int64-able token ids in the Target's vocabulary).

    start:  index in the context where the output begins (the prompt's length): the
            output is ``context[start:]``, and it is what follows the prediction.
    inner:  the request's other proposer (suffix over the context and the history), or
            None for the prediction alone; the better of the two drafts each round.
    cost:   the Target's cost model (t(n) per forward); None drafts the prediction's
            next ``k`` tokens whenever it has its place, and prefers it to ``inner``.
    """

    name = "prediction"

    def __init__(self, prediction: Sequence[int], *, start: int, inner: Proposer | None = None,
                 cost: CostModel | None = None, fail_scale: float = FAIL_SCALE,
                 fail_floor: float = FAIL_FLOOR, start_run: int = START_RUN,
                 min_match: int = MIN_MATCH, sure_match: int = SURE_MATCH,
                 max_match: int = MAX_MATCH):
        if start < 0 or min_match < 1 or sure_match < min_match or max_match < sure_match:
            raise ValueError("need start >= 0 and 1 <= min_match <= sure_match <= max_match")
        if fail_scale < 0 or not 0 <= fail_floor < 1 or start_run < 0:
            raise ValueError("need fail_scale >= 0, 0 <= fail_floor < 1 and start_run >= 0")
        self.prediction = np.asarray(list(prediction), dtype=np.int64)
        self.start, self.inner, self.cost = start, inner, cost
        self.fail_scale, self.fail_floor = fail_scale, fail_floor
        self.min_match, self.sure_match, self.max_match = min_match, sure_match, max_match
        self.pos: int | None = 0  # next prediction token the output should copy; None: lost
        self.lost_at = 0  # where the place was last lost (re-finding looks forward from it)
        self.run = start_run  # output tokens that agreed since the place was found
        self.misses = 0  # places lost since a run last reached sure_match tokens
        self.seen = 0  # output tokens already followed
        # What happened, for the closing table and tests: place losses and re-finds.
        self.losses = 0
        self.refinds = 0
        self._tables: dict[int, list[float]] = {}

    @property
    def memory_bytes(self) -> int:
        inner = self.inner.memory_bytes if self.inner is not None else 0
        return int(self.prediction.nbytes) + inner

    # -- place keeping -------------------------------------------------------------

    def follow(self, output: np.ndarray) -> None:
        """Move the place along the output tokens not seen yet (int64 ``[n]``, the whole
        output so far); lose it at the first token that differs from the prediction, and
        try to find it again after the last one."""
        new = output[self.seen:]
        self.seen = len(output)
        if not len(new):
            return
        pred, n = self.prediction, len(self.prediction)
        if self.pos is not None:
            # The agreeing prefix of the new tokens, compared at once.
            ahead = pred[self.pos: self.pos + len(new)]
            same = ahead == new[: len(ahead)]
            agree = int(np.cumprod(same).sum()) if len(same) else 0
            if agree == len(new):
                self.pos += agree
                self.run += agree
                if self.run >= self.sure_match:
                    self.misses = 0
                return
            self.lost_at = min(self.pos + agree, n)
            self.pos, self.run = None, 0
            self.losses += 1
            self.misses += 1
        self._refind(output)

    def _refind(self, output: np.ndarray) -> None:
        """Find the place after the output's last tokens: the occurrence in the
        prediction of its longest suffix (at most ``max_match`` tokens, at least
        ``min_match``), sure ones (``sure_match`` tokens or more) first, then the
        nearest at or after :attr:`lost_at`, then the nearest before it."""
        pred = self.prediction
        tail = output[-self.max_match:]
        if len(tail) < self.min_match or not len(pred):
            return
        ends = np.flatnonzero(pred == tail[-1]) + 1  # candidate places: after a match
        if not len(ends):
            return
        lengths = match_lengths(pred, ends, tail, self.max_match)
        ok = lengths >= self.min_match
        if not ok.any():
            return
        ends, lengths = ends[ok], lengths[ok]
        sure = np.minimum(lengths, self.sure_match)
        forward = ends >= self.lost_at
        distance = np.abs(ends - self.lost_at)
        # lexsort: the last key is the primary one.
        best = np.lexsort((distance, ~forward, -sure))[0]
        self.pos, self.run = int(ends[best]), int(lengths[best])
        self.refinds += 1

    # -- drafting --------------------------------------------------------------------

    def _round_ms(self, context: int) -> list[float]:
        key = context_bucket(context)
        if key not in self._tables:
            self._tables[key] = self.cost.table(K_MAX, context=max(key, REFERENCE_CONTEXT)).tolist()
        return self._tables[key]

    def _from_prediction(self, k: int) -> Draft | None:
        if self.pos is None or self.pos >= len(self.prediction):
            return None
        tokens = self.prediction[self.pos: self.pos + min(k, K_MAX)]
        x = self.run + np.arange(len(tokens))
        fail = (self.fail_scale / (x + 1.0) ** 2 + self.fail_floor) * (1 + self.misses)
        return Draft(tokens=tokens.copy(), probs=np.clip(1.0 - fail, MIN_TRUST, 1.0),
                     source="prediction",
                     match_len=self.run)

    def propose(self, context: np.ndarray, k: int, *, scope: str | None = None,
                language: str | None = None) -> Draft | None:
        if k < 1:
            return None
        context = np.asarray(context, dtype=np.int64)
        self.follow(context[self.start:])
        own = self._from_prediction(k)
        other = (self.inner.propose(context, k, scope=scope, language=language)
                 if self.inner is not None else None)
        if self.cost is None:
            return own if own is not None else other
        ms = self._round_ms(len(context) - 1)
        best, best_rate = None, 1.0 / ms[0]  # a plain step's rate
        for d in (own, other):
            if d is None:
                continue
            if d.is_tree:  # (an inner tree proposer) priced as a forward of all its nodes
                cum = d.cumulative()
                n = len(d.tokens) if len(d.tokens) < len(ms) else 0
                rate = (1 + (d.depth if cum is None else cum.sum())) / ms[n] if n else 0.0
                cut = d
            else:
                probs = (np.ones(len(d.tokens)) if d.probs is None else d.probs).tolist()
                n = best_length(probs, ms)
                if n == 0:
                    continue
                cut = d.first(n)
                rate = (1 + float(np.cumprod(probs[:n]).sum())) / ms[n]
            if rate > best_rate:
                best, best_rate = cut, rate
        return best


def prediction_usage(prediction: Sequence[int], completion: Sequence[int]) -> tuple[int, int]:
    """``(accepted, rejected)`` as OpenAI's usage defines them for Predicted Outputs:
    prediction tokens that appear in the completion, and those that do not (counted
    from the prediction's side: ``accepted + rejected == len(prediction)``). "Appear"
    is taken in order: the matching blocks of :class:`difflib.SequenceMatcher` (no
    junk heuristic) between the two token lists, a close approximation of their
    longest common subsequence.

    >>> prediction_usage([1, 2, 3, 4, 5], [1, 2, 9, 4, 5, 6])
    (4, 1)
    """
    a, b = list(map(int, prediction)), list(map(int, completion))
    blocks = difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
    accepted = sum(block.size for block in blocks)
    return accepted, len(a) - accepted
