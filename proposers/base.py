"""The proposer interface and registry.

A proposer turns the committed context (token ids of the Target) into a draft of
at most ``k`` tokens. It is one class with one required method,
:meth:`Proposer.propose`, and a ``name``; ``@register`` makes it available by
name, so a new proposer is one new file. Proposers never touch the Target or its
KV cache (a draft model owns its own model and cache).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from assistd.targets.base import TokenTree


@dataclass(frozen=True)
class Draft:
    """Draft tokens for one round.

    tokens:    int64 ``[k]`` proposed token ids, ``1 <= k <=`` the ceiling asked for.
    probs:     float ``[k]`` estimated probability that each token is accepted given
               the ones before it were (so ``cumprod(probs)`` estimates the
               cumulative acceptance A_i), or None when the proposer has no estimate.
               Never used as q in sampling (docs/design.md, 'Exactness').
    source:    where the continuation came from: ``"context"`` (the live request),
               ``"history"`` (the scope's persistent history) or ``"model"`` (a draft model).
    match_len: tokens of context suffix that matched at the source (0 if not a lookup).
    document:  the history document the continuation was read from (its path or
               name), or None.
    q_rows:    float ``[k, n_vocab]``, a draft model's full distribution at each
               position, or None for model-free drafts (then q = δ_d in sampling).
    parents:   int64 ``[k]``, or None for a chain. A token tree: ``parents[i]`` is the
               index in ``tokens`` of token i's parent, -1 for a child of the last
               committed token; ``parents[i] < i`` (topological order), siblings carry
               different tokens, the likeliest branch first (depth-first, likeliest
               child first: a Target keeps that branch's KV cheapest). ``probs[i]`` is
               then the estimate that token i is accepted given its parent was.
               Trees never carry ``q_rows`` (only model-free drafts branch).
    """

    tokens: np.ndarray
    probs: np.ndarray | None
    source: str
    match_len: int
    document: str | None = None
    q_rows: np.ndarray | None = None
    parents: np.ndarray | None = None

    def __post_init__(self):
        if self.parents is not None:
            if self.q_rows is not None:
                raise ValueError("a token tree cannot carry q_rows (model-free drafts only)")
            if len(self.parents) != len(self.tokens):
                raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")

    @property
    def is_tree(self) -> bool:
        """True when some token has a sibling (a chain given as parents is no tree)."""
        return self.parents is not None and bool(
            (np.asarray(self.parents) != np.arange(-1, len(self.tokens) - 1)).any())

    @property
    def depth(self) -> int:
        """Tokens on the longest branch (the draft length for a chain)."""
        if self.parents is None or not len(self.tokens):
            return len(self.tokens)
        d = np.zeros(len(self.tokens), dtype=np.int64)
        for i, p in enumerate(np.asarray(self.parents).tolist()):
            d[i] = 1 if p < 0 else d[p] + 1
        return int(d.max())

    def cumulative(self) -> np.ndarray | None:
        """float ``[k]``: each token's estimated chance to be accepted, Π of ``probs``
        along its branch (A_i for a chain); None without estimates."""
        if self.probs is None:
            return None
        if self.parents is None:
            return np.cumprod(self.probs)
        cum = np.empty(len(self.tokens))
        for i, (p, q) in enumerate(zip(np.asarray(self.parents).tolist(), self.probs)):
            cum[i] = q if p < 0 else cum[p] * q
        return cum

    def tree(self, last: int) -> TokenTree:
        """The round's :class:`~assistd.targets.base.TokenTree`: ``last`` (the last
        committed token) as the root, then these tokens (a chain for a chain draft)."""
        if self.parents is None:
            return TokenTree.chain([int(last)] + [int(t) for t in self.tokens])
        return TokenTree((int(last), *map(int, self.tokens)),
                         (-1, *(int(p) + 1 for p in self.parents)))

    def first(self, n: int) -> Draft:
        """The draft cut to its first ``n`` tokens (a subtree, since parents come first)."""
        if n >= len(self.tokens):
            return self
        cut = lambda x: None if x is None else x[:n]  # noqa: E731
        return Draft(self.tokens[:n], cut(self.probs), self.source, self.match_len,
                     self.document, cut(self.q_rows), cut(self.parents))

    @property
    def score(self) -> float:
        """Expected accepted tokens by the proposer's own estimate: Σ_i Π_{j≤i} probs_j
        over every token (SuffixDecoding's path / tree score); the draft length (a
        chain) or depth (a tree) when there is no estimate."""
        cum = self.cumulative()
        return float(self.depth if cum is None else cum.sum())


class Proposer:
    """Base class. Subclasses set ``name`` and implement :meth:`propose`."""

    name: ClassVar[str] = ""

    @property
    def memory_bytes(self) -> int:
        """RAM held beside the Target (history index arrays, a draft model), in bytes."""
        history = getattr(self, "history", None)
        return int(history.nbytes) if history is not None else 0

    def propose(self, context: np.ndarray, k: int, *, scope: str | None = None,
                language: str | None = None) -> Draft | None:
        """Draft up to ``k`` tokens to follow ``context`` (int64 ``[n]`` committed ids).

        scope:    the history scope to draft from (a repository root), or None for
                  the proposer's default (the live context only, or the only scope).
        language: the document's language id (``"python"``, ``"markdown"``...), a hint.
        Returns None when there is nothing worth proposing (the step is then a
        plain decode step, not a round).
        """
        raise NotImplementedError


_REGISTRY: dict[str, type[Proposer]] = {}


def register(cls: type[Proposer]) -> type[Proposer]:
    """Class decorator: make a proposer available to :func:`make_proposer` by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list[str]:
    return sorted(_REGISTRY)


# What a front end may offer every proposer; each takes the ones its constructor names.
CONTEXT_KWARGS = ("history", "cost", "target")


def make_proposer(name: str, **kwargs) -> Proposer:
    """Instantiate a registered proposer; ``KeyError`` names the known ones.

    The context objects of :data:`CONTEXT_KWARGS` (``history``: a
    :class:`proposers.index.HistoryIndex`, ``cost``: the Target's
    :class:`assistd.ground.costmodel.CostModel`, ``target``: the Target) are passed only to
    proposers whose constructor takes them, so callers can offer all of them to any
    proposer; other keyword arguments are passed as given.
    """
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown proposer {name!r}; known: {', '.join(available())}") from None
    params = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k not in CONTEXT_KWARGS or k in params}
    return cls(**kwargs)
