"""The acceptance ledger of one generation: raw counters, rates computed on read.

Names and formulas are those of docs/design.md, 'Vocabulary'. With D draft tokens proposed, C draft
tokens accepted, R rounds and P plain steps:

    acceptance_rate        = C / D
    mean_acceptance_length = 1 + C / R      (tokens committed per round, bonus included)
    coverage               = R / (R + P)
    committed tokens       = C + R + P      (each round and each plain step commits
                                             exactly one Target token beyond C)

A ratio whose denominator is zero is ``None``, never an error.

A round whose draft is a token tree counts every node it verified in D (so C / D is
the share of verified nodes that were committed) and its accepted branch in C; its
per-position counters are by depth, along the accepted branch (``tree_rounds`` and
``nodes_by_depth`` say how many nodes a round of each depth verified).

Beyond those rates the ledger keeps what the tuner (``assistd.decoding.tuner``) needs to predict
a round under any draft ceiling: how many steps asked the proposer at all
(``propose_calls``; a step with ceiling 0 does not), how many rounds were cut by
their ceiling at each length (``ceiling_stops``, the censored ones), and per draft
length L (0 = plain step) the steps, draft ms and verify ms. Counters are ints in
one generation and decayed floats once aggregated (:meth:`Ledger.scaled`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from assistd.ground.costmodel import REFERENCE_CONTEXT, context_bucket


def ratio(num: float, den: float) -> float | None:
    return num / den if den else None


@dataclass
class Ledger:
    """Counters for one generation. Times in milliseconds."""

    draft_tokens: int = 0  # D
    accepted_tokens: int = 0  # C
    rounds: int = 0  # R
    plain_steps: int = 0  # P
    committed_tokens: int = 0  # C + R + P, counted independently as a check
    prompt_tokens: int = 0
    # Prefix KV reuse across requests (a prefix cache hit, not draft acceptance):
    # prompt tokens whose KV was kept from the previous request vs evaluated now.
    # The last prompt token is evaluated by the first decode step, in neither count.
    prompt_tokens_reused: int = 0
    prompt_tokens_evaluated: int = 0
    # accepted_per_position[i]: rounds whose draft position i+1 was accepted;
    # reached_per_position[i]: rounds that proposed a token at position i+1.
    accepted_per_position: list[int] = field(default_factory=list)
    reached_per_position: list[int] = field(default_factory=list)
    # tried_per_position[i]: rounds that proposed position i+1 with positions 1..i
    # accepted, so that position i+1 was verified (the denominators of a_i).
    tried_per_position: list[int] = field(default_factory=list)
    prefill_ms: float = 0.0
    first_token_ms: float = 0.0  # time to first token: prefill + the first decode step
    draft_ms: float = 0.0
    verify_ms: float = 0.0  # Target forward passes of rounds and plain steps
    total_ms: float = 0.0  # prefill + decode, wall clock
    # RAM the proposer holds beside the Target (a draft model's weights and KV cache,
    # a history index's arrays), in bytes; 0 for none.
    proposer_memory_bytes: int = 0
    propose_calls: int = 0  # steps whose ceiling was >= 1, so the proposer was asked
    # ceiling_stops[i]: rounds whose draft had i+1 tokens and the ceiling was i+1, so
    # the proposer might have gone on (censored at position i+1).
    ceiling_stops: list[int] = field(default_factory=list)
    # Per draft length L (index L; 0 = plain step): steps, and their draft and verify ms.
    # draft_ms_by_len[0] counts only plain steps that asked the proposer.
    steps_by_len: list[int] = field(default_factory=list)
    draft_ms_by_len: list[float] = field(default_factory=list)
    verify_ms_by_len: list[float] = field(default_factory=list)
    # Token trees: rounds whose draft branched, and per depth d (index d - 1) the draft
    # nodes that rounds of that depth verified (d per round for a chain).
    tree_rounds: int = 0
    nodes_by_depth: list[float] = field(default_factory=list)
    # The forwards whose context was given, by (tokens in the forward, context bucket of
    # costmodel.context_bucket): [forwards, verify ms, context tokens summed]. Per
    # generation (the tuner learns t(n, context) from it), not aggregated.
    forwards_by_context: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    # Per draft source (Draft.source: "context", "history", "model", "prediction"):
    # [draft tokens, accepted tokens] of the rounds it drafted.
    by_source: dict[str, list[int]] = field(default_factory=dict)

    def record_round(self, num_draft: int, num_accepted: int, *, depth: int | None = None,
                     leaf: bool | None = None, ceiling: int | None = None,
                     draft_ms: float = 0.0, verify_ms: float = 0.0,
                     context: int | None = None, source: str | None = None) -> None:
        """One verification round: ``num_draft`` draft tokens (tree nodes) verified,
        ``num_accepted`` of them committed (the accepted branch).

        ``depth``: the draft's longest branch (None: a chain, ``num_draft``); ``leaf``:
        the accepted branch ended at a leaf, so nothing past it was verified (None: a
        chain, ``num_accepted == num_draft``). ``ceiling``: the most the proposer was
        allowed in depth (None: unknown, not censored); ``draft_ms`` / ``verify_ms``:
        the round's propose() and Target time, added to the totals as well as to the
        per-length sums (by ``num_draft``: what the forward cost depends on);
        ``context``: tokens in the KV cache before the round's forward (None: unknown);
        ``source``: where the draft came from (counted in :attr:`by_source`; None: not).
        """
        depth = num_draft if depth is None else depth
        leaf = num_accepted == num_draft if leaf is None else leaf
        assert 0 <= num_accepted <= depth <= num_draft and num_draft >= 1
        self.rounds += 1
        self.propose_calls += 1
        self.draft_tokens += num_draft
        self.accepted_tokens += num_accepted
        self.committed_tokens += num_accepted + 1
        self.tree_rounds += int(depth < num_draft)
        for xs in (self.reached_per_position, self.accepted_per_position,
                   self.tried_per_position, self.nodes_by_depth):
            grow(xs, depth)
        for i in range(depth):
            self.reached_per_position[i] += 1
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1
        for i in range(min(num_accepted + (0 if leaf else 1), depth)):
            self.tried_per_position[i] += 1
        self.nodes_by_depth[depth - 1] += num_draft
        if ceiling is not None and depth >= ceiling:
            grow(self.ceiling_stops, depth)
            self.ceiling_stops[depth - 1] += 1
        if source is not None:
            counts = self.by_source.setdefault(source, [0, 0])
            counts[0] += num_draft
            counts[1] += num_accepted
        self._timed(num_draft, draft_ms, verify_ms, context)

    def record_plain_step(self, *, proposed: bool = False, draft_ms: float = 0.0,
                          verify_ms: float = 0.0, context: int | None = None) -> None:
        """One decode step without a draft. ``proposed``: the proposer was asked and
        had nothing (counts against coverage); False when the ceiling was 0.
        ``context``: tokens in the KV cache before its forward (None: unknown)."""
        self.plain_steps += 1
        self.committed_tokens += 1
        self.propose_calls += int(proposed)
        self._timed(0, draft_ms, verify_ms, context)

    def _timed(self, length: int, draft_ms: float, verify_ms: float,
               context: int | None = None) -> None:
        for xs in (self.steps_by_len, self.draft_ms_by_len, self.verify_ms_by_len):
            grow(xs, length + 1)
        self.steps_by_len[length] += 1
        self.draft_ms_by_len[length] += draft_ms
        self.verify_ms_by_len[length] += verify_ms
        self.draft_ms += draft_ms
        self.verify_ms += verify_ms
        if context is not None:
            f = self.forwards_by_context.setdefault((length + 1, context_bucket(context)),
                                                    [0, 0.0, 0])
            f[0] += 1
            f[1] += verify_ms
            f[2] += max(0, int(context))

    def forward_times(self) -> dict[tuple[int, int], tuple[float, float, float]]:
        """The generation's Target forwards, ``{(n_tokens, context bucket): (verify ms
        summed, forwards, context tokens summed)}``: a forward whose context was not
        given counts at :data:`~assistd.ground.costmodel.REFERENCE_CONTEXT` (what
        t(n) meant before it knew the context)."""
        out = {key: (ms, float(count), float(ctx))
               for key, (count, ms, ctx) in self.forwards_by_context.items()}
        for L, steps in enumerate(self.steps_by_len):
            known = [v for (n, _), v in self.forwards_by_context.items() if n == L + 1]
            rest = steps - sum(c for c, _, _ in known)
            if rest > 0:
                ms = self.verify_ms_by_len[L] - sum(m for _, m, _ in known)
                key = (L + 1, context_bucket(REFERENCE_CONTEXT))
                old = out.get(key, (0.0, 0.0, 0.0))
                out[key] = (old[0] + ms, old[1] + rest, old[2] + rest * REFERENCE_CONTEXT)
        return out

    # -- aggregation (the persisted, decayed ledger of assistd.decoding.tuner) ----------

    COUNTERS = ("draft_tokens", "accepted_tokens", "rounds", "plain_steps",
                "committed_tokens", "propose_calls", "draft_ms", "verify_ms", "tree_rounds")
    ARRAYS = ("accepted_per_position", "reached_per_position", "tried_per_position",
              "ceiling_stops",
              "steps_by_len", "draft_ms_by_len", "verify_ms_by_len", "nodes_by_depth")

    def add(self, other: Ledger, weight: float = 1.0) -> None:
        """Add ``other``'s decode counters times ``weight`` into this one (prompt,
        prefill and memory fields are per generation and not aggregated)."""
        for name in self.COUNTERS:
            setattr(self, name, getattr(self, name) + weight * getattr(other, name))
        for name in self.ARRAYS:
            mine, theirs = getattr(self, name), getattr(other, name)
            grow(mine, len(theirs))
            for i, x in enumerate(theirs):
                mine[i] += weight * x
        for src, (d, a) in other.by_source.items():
            counts = self.by_source.setdefault(src, [0, 0])
            counts[0] += weight * d
            counts[1] += weight * a

    def scaled(self, factor: float) -> Ledger:
        """A copy of the decode counters times ``factor`` (decay)."""
        out = Ledger()
        out.add(self, factor)
        return out

    def counters(self) -> dict:
        """The raw decode counters, JSON-ready (what the store persists)."""
        return {name: getattr(self, name) for name in self.COUNTERS + self.ARRAYS}

    @classmethod
    def from_counters(cls, data: dict) -> Ledger:
        out = cls()
        for name in cls.COUNTERS:
            setattr(out, name, float(data.get(name, 0)))
        for name in cls.ARRAYS:
            setattr(out, name, [float(x) for x in data.get(name, [])])
        return out

    @property
    def steps(self) -> float:
        """S = rounds + plain steps (every decode opportunity)."""
        return self.rounds + self.plain_steps

    def conditional_acceptance(self) -> list[float | None]:
        """a_i = P(position i accepted | positions < i accepted), for i = 1..: accepted
        at i over the rounds that verified position i."""
        return [ratio(a, t) for a, t in zip(self.accepted_per_position, self.tried_per_position)]

    def cumulative_acceptance(self) -> list[float | None]:
        """A_i = Π_{j<=i} a_j: the chance that positions 1..i are all accepted."""
        out, cum = [], 1.0
        for a in self.conditional_acceptance():
            cum = None if a is None or cum is None else cum * a
            out.append(cum)
        return out

    @property
    def acceptance_rate(self) -> float | None:
        return ratio(self.accepted_tokens, self.draft_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        return None if not self.rounds else 1 + self.accepted_tokens / self.rounds

    @property
    def coverage(self) -> float | None:
        return ratio(self.rounds, self.rounds + self.plain_steps)

    @property
    def decode_ms(self) -> float:
        return self.total_ms - self.prefill_ms

    @property
    def tokens_per_s(self) -> float | None:
        """Decode throughput: committed tokens per second of decoding (prefill excluded)."""
        r = ratio(self.committed_tokens, self.decode_ms / 1000.0)
        return r

    def as_dict(self) -> dict:
        return {
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "rounds": self.rounds,
            "tree_rounds": self.tree_rounds,
            "plain_steps": self.plain_steps,
            "committed_tokens": self.committed_tokens,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_reused": self.prompt_tokens_reused,
            "prompt_tokens_evaluated": self.prompt_tokens_evaluated,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "coverage": self.coverage,
            "accepted_per_position": list(self.accepted_per_position),
            "reached_per_position": list(self.reached_per_position),
            "prefill_ms": round(self.prefill_ms, 3),
            "first_token_ms": round(self.first_token_ms, 3),
            "draft_ms": round(self.draft_ms, 3),
            "verify_ms": round(self.verify_ms, 3),
            "total_ms": round(self.total_ms, 3),
            "tokens_per_s": self.tokens_per_s,
            "proposer_memory_bytes": self.proposer_memory_bytes,
            "by_source": {src: {"draft_tokens": d, "accepted_tokens": a}
                          for src, (d, a) in sorted(self.by_source.items())},
        }

    def summary(self) -> str:
        """One line for stderr."""
        def f(x, fmt):
            return "n/a" if x is None else format(x, fmt)

        return (
            f"tokens={self.committed_tokens} rounds={self.rounds} plain_steps={self.plain_steps}"
            f" draft={self.draft_tokens} accepted={self.accepted_tokens}"
            f" acceptance_rate={f(self.acceptance_rate, '.2f')}"
            f" mean_acceptance_length={f(self.mean_acceptance_length, '.2f')}"
            f" coverage={f(self.coverage, '.2f')} draft_ms={self.draft_ms:.1f}"
            f" verify_ms={self.verify_ms:.1f} prefill_ms={self.prefill_ms:.1f}"
            f" prompt_reused={self.prompt_tokens_reused}/{self.prompt_tokens}"
            f" tokens_per_s={f(self.tokens_per_s, '.1f')}"
        )


def grow(xs: list, n: int) -> None:
    """Pad the per-position (or per-length) counter list ``xs`` with zeros, in place, to
    at least ``n`` entries; a longer list is left as it is.

    >>> xs = [3, 1]
    >>> grow(xs, 4); xs
    [3, 1, 0, 0]
    >>> grow(xs, 2); xs
    [3, 1, 0, 0]
    """
    if len(xs) < n:
        xs.extend([0] * (n - len(xs)))
