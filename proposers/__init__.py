"""Proposers: guess the next tokens from the context and the history, in the Target's token space.

A proposer is one class with one required method, ``propose(context, k, *, scope,
language)``, and a ``name`` class attribute; ``@register`` makes it available by
name, so a new proposer is one new file. Proposers never touch the Target or its KV
cache. ``suffix`` (the default of ``assistd complete``), ``ngram`` and ``draft_model``
are ours; ``peer:...`` are other projects' rules, kept for same-run comparisons.
The history they draft from is :class:`proposers.index.HistoryIndex`.
"""

from proposers.base import Draft, Proposer, available, make_proposer, register
from proposers import ngram as _ngram  # noqa: F401  (registers "ngram")
from proposers import peers as _peers  # noqa: F401  (registers the "peer:..." lookup rules)
from proposers import suffix as _suffix  # noqa: F401  (registers "suffix")
from proposers import suffixdecoding as _suffixdecoding  # noqa: F401  (the SuffixDecoding peer)
from proposers import draft_model as _draft_model  # noqa: F401  (registers "draft_model")
from proposers import arctic as _arctic  # noqa: F401  (the real Arctic build, if built)

__all__ = ["Draft", "Proposer", "available", "make_proposer", "register"]
