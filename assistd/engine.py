"""The speculative decoding loop: history -> proposer -> Target -> verification -> ledger.

Greedy speculative decoding after Leviathan et al. 2023 / Chen et al. 2023, laid
out as llama.cpp's ``examples/speculative-simple``: the KV cache holds every
committed token but the last; a step evaluates ``[last] + draft`` in one Target
call and reads the argmax of every row. A step without a draft evaluates
``[last]`` alone, so plain decoding (``proposer=None``) runs through the same code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from assistd.ledger import Ledger
from assistd.targets.base import Target
from assistd.verify import greedy_accept, top2_gap
from proposers.base import Proposer


@dataclass
class Generation:
    """Result of :func:`generate`.

    tokens: committed token ids after the prompt (a final EOS included).
    text: the completion text (EOS excluded).
    stop_reason: ``"eos"``, ``"max_tokens"`` or ``"n_ctx"`` (context window full).
    top2_gaps: with ``trace=True``, the Target's top-2 logit gap at each committed
        token's position, aligned with ``tokens``; else empty.
    """

    tokens: list[int]
    text: str
    stop_reason: str
    ledger: Ledger
    top2_gaps: list[float] = field(default_factory=list)


def generate(
    target: Target,
    prompt: list[int],
    proposer: Proposer | None = None,
    *,
    max_tokens: int = 64,
    k: int = 8,
    trace: bool = False,
) -> Generation:
    """Greedy decoding of up to ``max_tokens`` tokens after ``prompt`` (token ids, non-empty).

    ``k`` is the draft-length ceiling per round (0 = plain decoding). Drafts are cut
    so that no round runs past ``max_tokens`` or the context window
    (position + k + 1 <= n_ctx). EOS and max_tokens are checked on every committed
    token, inside an accepted block too. Raises ValueError on an empty prompt or a
    prompt that does not fit the context window.
    """
    if not prompt:
        raise ValueError("empty prompt: pass at least one token (e.g. BOS)")
    if len(prompt) >= target.n_ctx:
        raise ValueError(f"prompt of {len(prompt)} tokens does not fit n_ctx={target.n_ctx}")
    ledger = Ledger(prompt_tokens=len(prompt))
    eos = target.eos_token_ids
    t_start = time.perf_counter()

    target.truncate(0)
    target.evaluate(prompt[:-1], [])  # prefill: no logits needed (BRIEF §5)
    ledger.prefill_ms = (time.perf_counter() - t_start) * 1000

    # Context buffer for the proposer: a view of it is passed each step, no copies.
    ctx = np.empty(len(prompt) + max_tokens + k + 1, dtype=np.int64)
    ctx[: len(prompt)] = prompt
    n = len(prompt)  # committed tokens; the KV cache holds n - 1 of them
    out: list[int] = []
    gaps: list[float] = []
    stop = None
    while stop is None:
        room = target.n_ctx - n  # batch positions n-1 .. n-1+k must be < n_ctx
        if room < 0:
            stop = "n_ctx"
            break
        k_cap = min(k, max_tokens - len(out) - 1, room)
        draft = None
        if proposer is not None and k_cap >= 1:
            t0 = time.perf_counter()
            d = proposer.propose(ctx[:n], k_cap)
            ledger.draft_ms += (time.perf_counter() - t0) * 1000
            if d is not None:
                draft = np.asarray(d.tokens[:k_cap], dtype=np.int64)
        num_draft = 0 if draft is None else len(draft)

        t0 = time.perf_counter()
        batch = [int(ctx[n - 1])] + ([] if draft is None else draft.tolist())
        logits = target.evaluate(batch, range(len(batch)))  # [1 + num_draft, n_vocab]
        argmax = logits.argmax(axis=1)
        j = greedy_accept(draft, argmax) if num_draft else 0
        # Keep KV for the tokens before the last committed one: roll back the rest.
        target.truncate(n + j)
        ledger.verify_ms += (time.perf_counter() - t0) * 1000

        new = ([] if draft is None else draft[:j].tolist()) + [int(argmax[j])]
        committed = 0
        for i, tok in enumerate(new):
            ctx[n] = tok
            n += 1
            out.append(tok)
            committed += 1
            if trace:
                gaps.append(top2_gap(logits[i]))
            if tok in eos:
                stop = "eos"
                break
            if len(out) >= max_tokens:
                stop = "max_tokens"
                break
        if num_draft:
            # A stop inside an accepted block: the last committed token plays the
            # role of the round's Target token, so committed = C + R + P holds.
            ledger.record_round(num_draft, committed - 1)
        else:
            ledger.record_plain_step()

    ledger.total_ms = (time.perf_counter() - t_start) * 1000
    text_ids = out[:-1] if stop == "eos" else out
    text = target.detokenize(text_ids, prev=prompt)
    return Generation(tokens=out, text=text, stop_reason=stop, ledger=ledger, top2_gaps=gaps)
