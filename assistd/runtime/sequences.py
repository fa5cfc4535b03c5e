"""Which KV sequence of the Target serves which request.

Several clients of one daemon (an editor session, each agent, ``assistd complete``)
keep their prompts warm in separate KV sequences (``Target.n_seq_max``). A request
takes the sequence whose cached tokens share the longest prefix with its prompt, when
that prefix is at least half of what the sequence holds (the agent's next turn, the
editor's next keystroke); else an empty sequence; else it evicts the least recently
used one. This is llama.cpp server's slot choice (``--slot-prompt-similarity``, then
least recently used), keyed on the prompt rather than on who sent it, so two agents
without ids still keep two sequences. The owner label is only reported.

A sequence in use by a generation is pinned: a more urgent request that preempts it
between rounds takes another one, unless the Target keeps a single sequence; the
preempted generation then re-evaluates its context when it resumes (the engine checks
the cache after every preemption). One allocation serves every kind of use: a token
tree's branches (several sequence ids for one round) will take ids from here too.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from assistd.targets.base import Target, common_prefix_length


@dataclass
class Slot:
    seq: int
    owner: str | None = None
    last_used: float = field(default_factory=time.monotonic)
    pins: int = 0


class SequencePool:
    """Assigns the Target's KV sequences to requests (see the module)."""

    def __init__(self, target: Target):
        self.target = target
        self.slots = [Slot(i, last_used=0.0) for i in range(target.n_seq_max)]
        self.evictions = 0

    def choose(self, prompt: list[int], owner: str) -> int:
        """The sequence for a request with ``prompt`` (token ids) from ``owner`` (a label
        such as ``"api"``, ``"lsp:<session>"``, ``"complete"``). Taking over a sequence
        that holds another prompt counts as an eviction; the engine's prefix reuse then
        keeps whatever prefix the two share."""
        free = [s for s in self.slots if s.pins == 0] or self.slots  # pinned: in use
        best, best_len = None, 0
        for slot in free:
            cached = self.target.sequence_tokens(slot.seq)
            n = common_prefix_length(cached, prompt)
            if cached and n * 2 >= len(cached) and n > best_len:
                best, best_len = slot, n
        if best is None:
            empty = [s for s in free if not self.target.sequence_tokens(s.seq)]
            best = empty[0] if empty else min(free, key=lambda s: s.last_used)
            self.evictions += not empty
        best.owner, best.last_used = owner, time.monotonic()
        return best.seq

    @contextlib.contextmanager
    def pinned(self, seq: int):
        """Keep ``seq`` from eviction while a generation runs on it."""
        slot = self.slots[seq]
        slot.pins += 1
        try:
            yield
        finally:
            slot.pins -= 1
            slot.last_used = time.monotonic()

    def status(self) -> dict:
        """``{"n_seq", "evictions", "kv_bytes_reserved", "slots": [{seq, owner, tokens,
        kv_bytes, idle_s}]}``: bytes are the K/V of the cached tokens (f16), reserved is
        what the Target holds for all sequences at full context."""
        t, now = self.target, time.monotonic()
        per = t.kv_bytes_per_token
        return {
            "n_seq": len(self.slots), "evictions": self.evictions,
            "kv_bytes_reserved": per * t.n_ctx * len(self.slots),
            "slots": [{"seq": s.seq, "owner": s.owner,
                       "tokens": len(t.sequence_tokens(s.seq)),
                       "kv_bytes": per * len(t.sequence_tokens(s.seq)),
                       "idle_s": round(now - s.last_used, 1) if s.owner else None}
                      for s in self.slots],
        }
