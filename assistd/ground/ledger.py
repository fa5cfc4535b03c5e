"""The acceptance ledger of one generation: raw counters, rates computed on read.

Names and formulas are those of docs/design.md, 'Vocabulary'. With D draft tokens proposed, C draft
tokens accepted, R rounds and P plain steps:

    acceptance_rate        = C / D
    mean_acceptance_length = 1 + C / R      (tokens committed per round, bonus included)
    coverage               = R / (R + P)
    committed tokens       = C + R + P      (each round and each plain step commits
                                             exactly one Target token beyond C)

A ratio whose denominator is zero is ``None``, never an error.

Beyond those rates the ledger keeps what the tuner (``assistd.decoding.tuner``) needs to predict
a round under any draft ceiling: how many steps asked the proposer at all
(``propose_calls``; a step with ceiling 0 does not), how many rounds were cut by
their ceiling at each length (``ceiling_stops``, the censored ones), and per draft
length L (0 = plain step) the steps, draft ms and verify ms. Counters are ints in
one generation and decayed floats once aggregated (:meth:`Ledger.scaled`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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

    def record_round(self, num_draft: int, num_accepted: int, *, ceiling: int | None = None,
                     draft_ms: float = 0.0, verify_ms: float = 0.0) -> None:
        """One verification round: ``num_draft`` proposed, leading ``num_accepted`` committed.

        ``ceiling``: the most the proposer was allowed (None: unknown, not censored);
        ``draft_ms`` / ``verify_ms``: the round's propose() and Target time, added to
        the totals as well as to the per-length sums.
        """
        assert 0 <= num_accepted <= num_draft and num_draft >= 1
        self.rounds += 1
        self.propose_calls += 1
        self.draft_tokens += num_draft
        self.accepted_tokens += num_accepted
        self.committed_tokens += num_accepted + 1
        _grow(self.reached_per_position, num_draft)
        _grow(self.accepted_per_position, num_draft)
        for i in range(num_draft):
            self.reached_per_position[i] += 1
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1
        _grow(self.tried_per_position, num_draft)
        for i in range(min(num_accepted + 1, num_draft)):
            self.tried_per_position[i] += 1
        if ceiling is not None and num_draft >= ceiling:
            _grow(self.ceiling_stops, num_draft)
            self.ceiling_stops[num_draft - 1] += 1
        self._timed(num_draft, draft_ms, verify_ms)

    def record_plain_step(self, *, proposed: bool = False, draft_ms: float = 0.0,
                          verify_ms: float = 0.0) -> None:
        """One decode step without a draft. ``proposed``: the proposer was asked and
        had nothing (counts against coverage); False when the ceiling was 0."""
        self.plain_steps += 1
        self.committed_tokens += 1
        self.propose_calls += int(proposed)
        self._timed(0, draft_ms, verify_ms)

    def _timed(self, length: int, draft_ms: float, verify_ms: float) -> None:
        for xs in (self.steps_by_len, self.draft_ms_by_len, self.verify_ms_by_len):
            _grow(xs, length + 1)
        self.steps_by_len[length] += 1
        self.draft_ms_by_len[length] += draft_ms
        self.verify_ms_by_len[length] += verify_ms
        self.draft_ms += draft_ms
        self.verify_ms += verify_ms

    # -- aggregation (the persisted, decayed ledger of assistd.decoding.tuner) ----------

    COUNTERS = ("draft_tokens", "accepted_tokens", "rounds", "plain_steps",
                "committed_tokens", "propose_calls", "draft_ms", "verify_ms")
    ARRAYS = ("accepted_per_position", "reached_per_position", "tried_per_position",
              "ceiling_stops",
              "steps_by_len", "draft_ms_by_len", "verify_ms_by_len")

    def add(self, other: Ledger, weight: float = 1.0) -> None:
        """Add ``other``'s decode counters times ``weight`` into this one (prompt,
        prefill and memory fields are per generation and not aggregated)."""
        for name in self.COUNTERS:
            setattr(self, name, getattr(self, name) + weight * getattr(other, name))
        for name in self.ARRAYS:
            mine, theirs = getattr(self, name), getattr(other, name)
            _grow(mine, len(theirs))
            for i, x in enumerate(theirs):
                mine[i] += weight * x

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


def _grow(xs: list[int], n: int) -> None:
    if len(xs) < n:
        xs.extend([0] * (n - len(xs)))
