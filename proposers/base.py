"""The proposer interface and registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np


@dataclass(frozen=True)
class Draft:
    """Draft tokens for one round.

    tokens:    int64 ``[k]`` proposed token ids, ``1 <= k <=`` the ceiling asked for.
    probs:     float ``[k]`` estimated probability per token, or None when the
               proposer has no estimate. Never used as q in sampling (BRIEF §3).
    source:    where the continuation came from: ``"context"`` or ``"history:<path>"``.
    match_len: tokens of context suffix that matched at the source (0 if not a lookup).
    q_rows:    float ``[k, n_vocab]``, a draft model's full distribution at each
               position, or None for model-free drafts (then q = δ_d in sampling).
    """

    tokens: np.ndarray
    probs: np.ndarray | None
    source: str
    match_len: int
    q_rows: np.ndarray | None = None


class Proposer:
    """Base class. Subclasses set ``name`` and implement :meth:`propose`."""

    name: ClassVar[str] = ""

    def propose(self, context: np.ndarray, k: int) -> Draft | None:
        """Draft up to ``k`` tokens to follow ``context`` (int64 ``[n]`` committed ids).

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


def make_proposer(name: str, **kwargs) -> Proposer:
    """Instantiate a registered proposer; ``KeyError`` names the known ones."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown proposer {name!r}; known: {', '.join(available())}") from None
    return cls(**kwargs)
