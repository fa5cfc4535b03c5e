"""The speculative decoding loop: history -> proposer -> Target -> verification -> ledger.

Speculative decoding after Leviathan et al. 2023 / Chen et al. 2023, laid out as
llama.cpp's ``examples/speculative-simple``: the KV cache holds every committed
token but the last; a round evaluates ``[last] + draft`` in one Target call and
verifies every row, greedily (argmax) or by speculative sampling. A step without a
draft evaluates ``[last]`` alone, so plain decoding (``proposer=None``) runs through
the same code and the same logits processing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from assistd.ground.ledger import Ledger
from assistd.ground.sampling import GREEDY, SamplingParams, target_distribution
from assistd.targets.base import Target
from assistd.decoding.verify import (greedy_accept, greedy_accept_tree, sample_accept,
                                     sample_accept_tree, sample_accept_with_q, top2_gap)
from proposers.base import Draft, Proposer


# Prefill chunk (tokens) when a generation may be preempted: ~0.07 s of a 135M model's
# prefill on 2 CPU cores, the most an editor keystroke waits for an agent's prefill.
PREFILL_CHUNK = 32


@dataclass
class Generation:
    """Result of :func:`generate`.

    tokens: committed token ids after the prompt (a final EOS included; with a stop
        string, up to the token that completed it).
    text: the completion text (EOS and the stop string excluded).
    stop_reason: ``"eos"``, ``"stop"`` (a stop string or ``stop_at``), ``"max_tokens"``,
        ``"n_ctx"`` (context window full) or ``"cancelled"`` (``cancelled()`` turned true).
    top2_gaps: with ``trace=True``, the Target's top-2 logit gap at each committed
        token's position, aligned with ``tokens``; else empty.
    speculation_off: why a proposer given was not used (``Target.speculation_off``), or None.
    shapes: per chain step, ``(rows evaluated, rows kept in the KV cache)``: a plain
        step ``(1, 1)``, a round ``(1 + L, 1 + accepted)``; a tree round ``(0, 0)``.
        Which rows a forward shared decides their rounding outside exact numerics, so
        this is what replays a generation's numerics (``assistd bench``).
    """

    tokens: list[int]
    text: str
    stop_reason: str
    ledger: Ledger
    top2_gaps: list[float] = field(default_factory=list)
    speculation_off: str | None = None
    shapes: list[tuple[int, int]] = field(default_factory=list)


class _StopStrings:
    """Finds the first stop string in the text committed so far, scanning only new text."""

    def __init__(self, target: Target, prompt: list[int], stops: Sequence[str]):
        self.target, self.prompt = target, prompt
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.scanned = 0  # characters of text already known to hold no stop string

    def check(self, out: list[int]) -> str | None:
        """The text cut before the earliest stop string, or None if none occurs yet."""
        text = self.target.detokenize(out, prev=self.prompt)
        start = max(0, self.scanned - self.longest + 1)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        # A character split over tokens decodes as U+FFFD until its last byte arrives,
        # and the text then changes there: count only the text before it as scanned.
        self.scanned = len(text.rstrip("\ufffd"))
        return text[: min(hits)] if hits else None


class _StopCallback:
    """Stop strings first, then a caller's boundary function over the decoded text."""

    def __init__(self, target: Target, prompt: list[int], fn, strings: _StopStrings | None):
        self.target, self.prompt, self.fn, self.strings = target, prompt, fn, strings

    def check(self, out: list[int]) -> str | None:
        if self.strings is not None and (text := self.strings.check(out)) is not None:
            return text
        text = self.target.detokenize(out, prev=self.prompt)
        # A character split over tokens is U+FFFD until its last byte: not yet text.
        cut = self.fn(text.rstrip("\ufffd"))
        return None if cut is None else text[:cut]


def generate(
    target: Target,
    prompt: list[int],
    proposer: Proposer | None = None,
    *,
    max_tokens: int = 64,
    k: int = 8,
    sampling: SamplingParams = GREEDY,
    stop: Sequence[str] = (),
    reuse_prefix: bool = True,
    trace: bool = False,
    scope: str | None = None,
    language: str | None = None,
    ceiling: Callable[[], int] | None = None,
    stop_at: Callable[[str], int | None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    between_rounds: Callable[[], bool] | None = None,
) -> Generation:
    """Decode up to ``max_tokens`` tokens after ``prompt`` (token ids, non-empty).

    ``k`` is the draft-length ceiling per round (0 = plain decoding). Drafts are cut
    so that no round runs past ``max_tokens`` or the context window
    (position + k + 1 <= n_ctx). EOS, stop strings and max_tokens are checked on
    every committed token, inside an accepted block too. ``sampling`` is greedy by
    default; otherwise verification is speculative sampling, lossless in
    distribution. With ``reuse_prefix`` the Target's KV cache from the previous
    call is kept up to the longest common prefix with this prompt, and only the
    rest is evaluated (counted in the ledger as ``prompt_tokens_reused`` /
    ``prompt_tokens_evaluated``). Raises ValueError on an empty prompt or a
    prompt that does not fit the context window. ``scope`` and ``language`` go to the
    proposer (the history scope to draft from, the document's language id).
    ``ceiling``, when given, is called before every step for that step's draft
    ceiling (at most ``k``; 0 = a plain step without asking the proposer): the
    tuner's choice (:meth:`assistd.decoding.tuner.Tuner.policy`). ``stop_at``, when given, is
    called with the completion text after every committed token and returns the index
    where the completion ends (the text is cut there, stop_reason ``"stop"``) or None:
    an editor's end-of-line / end-of-block boundary. ``cancelled`` is polled before
    every step (one Target call): when it returns True the loop ends with stop_reason
    ``"cancelled"``, so a cancelled request costs at most one more round.
    ``between_rounds``, when given, is called before every step too; it may use the
    Target for other work (a more urgent request, :meth:`assistd.runtime.scheduler.Scheduler.preempt`)
    and returns True if it did: the KV cache is then restored to the committed tokens
    (prefix reuse, re-evaluating what the other work evicted) before the step, so the
    output is the same as without the interruption. With ``between_rounds`` the prompt
    is also prefilled in chunks of ``PREFILL_CHUNK`` tokens with a call between them: a
    2,000-token agent prompt (~4 s on 2 CPU cores) does not hold an editor's keystroke
    for its whole prefill (exact numerics make chunked and whole prefill equal, bit for
    bit; ``cancelled`` is polled there too). A Target whose batched evaluation
    could change its output (``target.speculation_off``) decodes plainly whatever
    ``proposer`` says; the Generation carries the reason.
    """
    off = target.speculation_off if proposer is not None else None
    if off:
        proposer = None
    if not prompt:
        raise ValueError("empty prompt: pass at least one token (e.g. BOS)")
    if len(prompt) >= target.n_ctx:
        raise ValueError(f"prompt of {len(prompt)} tokens does not fit n_ctx={target.n_ctx}")
    prompt = [int(t) for t in prompt]
    ledger = Ledger(prompt_tokens=len(prompt))
    eos = target.eos_token_ids
    stops = _StopStrings(target, prompt, stop) if any(stop) else None
    if stop_at is not None:
        stops = _StopCallback(target, prompt, stop_at, stops)
    rng = sampling.rng()
    t_start = time.perf_counter()

    # Prefill all but the last prompt token, without logits (no prompt row needs them).
    reused = target.reuse_prefix(prompt[:-1]) if reuse_prefix else 0
    if not reuse_prefix:
        target.truncate(0)
    if between_rounds is None:
        target.evaluate(prompt[reused:-1], [])
    else:  # in chunks, so that more urgent work can run between them
        pos = reused
        while pos < len(prompt) - 1 and not (cancelled is not None and cancelled()):
            if pos > reused and between_rounds():
                pos = target.reuse_prefix(prompt[:pos])  # what the other work left of ours
            end = min(pos + PREFILL_CHUNK, len(prompt) - 1)
            target.evaluate(prompt[pos:end], [])
            pos = end
    ledger.prompt_tokens_reused = reused
    ledger.prompt_tokens_evaluated = len(prompt) - 1 - reused
    ledger.prefill_ms = (time.perf_counter() - t_start) * 1000

    # Context buffer for the proposer: a view of it is passed each step, no copies.
    ctx = np.empty(len(prompt) + max_tokens + k + 1, dtype=np.int64)
    ctx[: len(prompt)] = prompt
    n = len(prompt)  # committed tokens; the KV cache holds n - 1 of them
    out: list[int] = []
    gaps: list[float] = []
    shapes: list[tuple[int, int]] = []
    text = None
    stop_reason = None
    while stop_reason is None:
        if cancelled is not None and cancelled():
            stop_reason = "cancelled"
            break
        if between_rounds is not None and between_rounds():
            kept = target.reuse_prefix(ctx[: n - 1].tolist())
            target.evaluate(ctx[kept : n - 1].tolist(), [])
        room = target.n_ctx - n  # batch positions n-1 .. n-1+k must be < n_ctx
        if room < 0:
            stop_reason = "n_ctx"
            break
        k_step = k if ceiling is None else min(k, ceiling())
        k_cap = min(k_step, max_tokens - len(out) - 1, room)
        draft = d = None
        asked = proposer is not None and k_cap >= 1
        draft_ms = 0.0
        if asked:
            t0 = time.perf_counter()
            d = proposer.propose(ctx[:n], k_cap, scope=scope, language=language)
            draft_ms = (time.perf_counter() - t0) * 1000
            if d is not None:
                d = fit_draft(d, depth=k_cap, nodes=room, leaves=target.tree_leaves)
                draft = np.asarray(d.tokens, dtype=np.int64)
        num_draft = 0 if draft is None else len(draft)

        kv = n - 1  # tokens in the KV cache before this forward: its cost's context
        t0 = time.perf_counter()
        tree = d.tree(int(ctx[n - 1])) if num_draft and d.is_tree else None
        if tree is not None:
            # One forward over every node (tree attention), the accepted branch kept.
            logits = target.evaluate_tree(tree)  # [1 + num_draft, n_vocab]
            if sampling.greedy:
                path, last = greedy_accept_tree(tree, logits.argmax(axis=1))
            else:
                path, last = _sample_tree(logits, tree, ctx, n, sampling, rng)
            target.keep_path(path)
            rows = path
            shapes.append((0, 0))
            accepted = [tree.tokens[i] for i in path[1:]]
        else:
            batch = [int(ctx[n - 1])] + ([] if draft is None else draft.tolist())
            logits = target.evaluate(batch, range(len(batch)))  # [1 + num_draft, n_vocab]
            if sampling.greedy:
                argmax = logits.argmax(axis=1)
                j = greedy_accept(draft, argmax) if num_draft else 0
                last = int(argmax[j])
            else:
                j, last = _sample_round(logits, draft, d, ctx, n, sampling, rng)
            # Keep KV for the tokens before the last committed one: roll back the rest.
            target.truncate(n + j)
            rows = range(j + 1)
            shapes.append((len(batch), j + 1))
            accepted = [] if draft is None else draft[:j].tolist()
        verify_ms = (time.perf_counter() - t0) * 1000

        new = accepted + [last]
        if not out:
            ledger.first_token_ms = (time.perf_counter() - t_start) * 1000
        committed = 0
        for i, tok in enumerate(new):
            ctx[n] = tok
            n += 1
            out.append(tok)
            committed += 1
            if trace:
                gaps.append(top2_gap(logits[rows[i]]))
            if tok in eos:
                stop_reason = "eos"
                break
            if stops is not None and (text := stops.check(out)) is not None:
                stop_reason = "stop"
                break
            if len(out) >= max_tokens:
                stop_reason = "max_tokens"
                break
        if num_draft:
            # A stop inside an accepted block: the last committed token plays the
            # role of the round's Target token, so committed = C + R + P holds.
            leaf = not tree.children(path[-1]) if tree is not None else None
            ledger.record_round(num_draft, committed - 1, ceiling=k_cap,
                                depth=d.depth if tree is not None else None, leaf=leaf,
                                draft_ms=draft_ms, verify_ms=verify_ms, context=kv,
                                source=d.source)
        else:
            ledger.record_plain_step(proposed=asked, draft_ms=draft_ms, verify_ms=verify_ms,
                                     context=kv)

    ledger.total_ms = (time.perf_counter() - t_start) * 1000
    if proposer is not None:
        ledger.proposer_memory_bytes = int(getattr(proposer, "memory_bytes", 0) or 0)
    if text is None:
        text = target.detokenize(out[:-1] if stop_reason == "eos" else out, prev=prompt)
        if stop_reason in ("max_tokens", "n_ctx", "cancelled"):
            text = _hold_unfinished(target, out, text)
    return Generation(tokens=out, text=text, stop_reason=stop_reason, ledger=ledger,
                      top2_gaps=gaps, speculation_off=off, shapes=shapes)


def _hold_unfinished(target: Target, out: list[int], text: str) -> str:
    """``text`` (of ``out``) less a character cut off mid-way: its bytes decode as U+FFFD,
    which an editor would insert, so trailing U+FFFD are held back, unless the last
    token is itself a whole U+FFFD the model wrote (its text tokenizes back to it: a
    byte token of an unfinished character does not). Only what ends in U+FFFD pays
    the one tokenize."""
    if not text.endswith("\ufffd") or not out:
        return text
    last = target.detokenize(out[-1:])
    if last.endswith("\ufffd") and target.tokenize(last) == out[-1:]:
        return text  # a written U+FFFD (SmolLM2 repeats it after one in the prompt)
    return text.rstrip("\ufffd")


def fit_draft(d: Draft, *, depth: int, nodes: int, leaves: int | None) -> Draft:
    """``d`` cut to what this round may verify: at most ``depth`` tokens on a branch
    (the ceiling, the tokens left to ``max_tokens``), ``nodes`` tokens in all (the
    context window's room) and, for a tree, ``leaves`` branches (the Target's
    :attr:`~assistd.targets.base.Target.tree_leaves`; None: any). Tokens are kept in
    the draft's order (the likeliest branch first), each only with its parent."""
    if not d.is_tree:
        return d.first(min(depth, nodes))
    if leaves == 1:  # the Target evaluates trees branch by branch: the first branch only
        branch, i = [], 0
        while i < len(d.tokens) and (not branch or d.parents[i] == branch[-1]):
            branch.append(i)
            i += 1
        return d.first(min(depth, nodes, len(branch)))
    keep: dict[int, int] = {}  # old index -> new index
    level: list[int] = []
    leaf_count, has_child = 0, set()
    for i, p in enumerate(d.parents.tolist()):
        if len(keep) >= nodes:
            break
        if p >= 0 and p not in keep:
            continue
        lv = 1 if p < 0 else level[keep[p]] + 1
        # A child of a kept leaf keeps the leaf count; any other new node adds a leaf.
        grows = p < 0 or p in has_child
        if lv > depth or (grows and leaves is not None and leaf_count >= leaves):
            continue
        leaf_count += int(grows)
        if p >= 0:
            has_child.add(p)
        keep[i] = len(keep)
        level.append(lv)
    idx = np.fromiter(keep, dtype=np.int64, count=len(keep))
    parents = np.array([-1 if d.parents[i] < 0 else keep[int(d.parents[i])] for i in idx],
                       dtype=np.int64)
    return Draft(d.tokens[idx], None if d.probs is None else d.probs[idx], d.source,
                 d.match_len, d.document, None, parents)


def _sample_tree(logits, tree, ctx, n, sampling, rng) -> tuple[list[int], int]:
    """Speculative sampling over a tree round's logits rows -> ``(path, next token)``."""
    window = sampling.penalty_last_n if sampling.repetition_penalty != 1.0 else 0
    recent = ctx[max(0, n - window) : n] if window else ()

    def dist(i: int):
        # Penalty state: committed tokens plus the draft tokens on node i's branch.
        branch = [tree.tokens[j] for j in tree.path_to(i)[1:]]
        seen = np.concatenate([recent, branch])[-window:] if window and branch else recent
        return target_distribution(logits[i], sampling, seen)

    return sample_accept_tree(tree, dist, rng)


def _sample_round(logits, draft, d, ctx, n, sampling, rng) -> tuple[int, int]:
    """Speculative sampling over one round's logits rows -> ``(accepted, next token)``."""
    window = sampling.penalty_last_n if sampling.repetition_penalty != 1.0 else 0
    recent = ctx[max(0, n - window) : n] if window else ()

    def dist(i: int):
        # Penalty state: committed tokens plus the draft tokens accepted before row i.
        seen = np.concatenate([recent, draft[:i]])[-window:] if window and i else recent
        return target_distribution(logits[i], sampling, seen)

    if draft is None:
        return 0, dist(0).sample(rng)
    if d.q_rows is not None:
        return sample_accept_with_q(draft, d.q_rows[: len(draft)], dist, rng)
    return sample_accept(draft, dist, rng)
