"""A ceiling for vLLM's speculative decoding, for benchmarks only: a custom proposer that
drafts what the Target will output because it has seen the same request decoded once.

Greedy decoding is deterministic here (float32, one request at a time), so a request sent
twice decodes the same tokens. The first time, this proposer drafts nothing and remembers
every row it is shown; the second time, a row that is a prefix of a remembered one gets
the remembered continuation as its draft, and every draft token is accepted. No proposer
can do better at the same ``num_speculative_tokens`` k: each step commits k + 1 tokens,
at the cost of verifying k drafts. ``benchmarks/vllm_proposers.py --arms oracle`` runs
each case twice and measures the second (vLLM's prefix cache reset in between, so the
prompt's prefill is paid again as in every other arm).

With ``ASSISTD_ORACLE_CAP_FILE`` naming a file that holds a whole number n, drafts are
cut to n tokens (read at every step): steps that verify exactly n drafts, all accepted,
give vLLM's t(n + 1), the time of a step over n + 1 tokens (the cost model of
:mod:`assistd.ground.costmodel`). ``ASSISTD_ORACLE_STATS`` names a JSON file that gets
the counts after every step (``decode_steps``: steps with at least one row decoding).

vLLM loads it with ``--speculative-config '{"method": "custom_class", "model":
"vllm_oracle.ReplayOracle", "num_speculative_tokens": 8}'`` and this folder on
``PYTHONPATH`` (the interface: :mod:`assistd.fleet.vllm_proposer`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


class ReplayOracle:
    """vLLM custom proposer: drafts the remembered continuation of a row (module docstring)."""

    def __init__(self, vllm_config):
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.seen: list[np.ndarray] = []  # the longest row seen of each request
        self.cap_file = os.environ.get("ASSISTD_ORACLE_CAP_FILE")
        self.stats_file = os.environ.get("ASSISTD_ORACLE_STATS")
        self.decode_steps = self.draft_tokens = 0

    def load_model(self, model) -> None:
        """No draft model."""

    def _cap(self) -> int:
        if not self.cap_file:
            return self.k
        try:
            return max(0, min(self.k, int(Path(self.cap_file).read_text())))
        except (OSError, ValueError):
            return self.k

    def _remember(self, row: np.ndarray) -> np.ndarray | None:
        """The remembered sequence ``row`` is a prefix of (None if none); ``row`` replaces
        one it extends, or is added."""
        n = len(row)
        for i, seq in enumerate(self.seen):
            m = min(n, len(seq))
            if np.array_equal(seq[:m], row[:m]):
                if n > len(seq):
                    self.seen[i] = row.copy()
                    return None
                return seq
        self.seen.append(row.copy())
        return None

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None, **_) -> list[list[int]]:
        cap = self._cap()
        drafts: list[list[int]] = []
        decoding = False
        for i, sampled in enumerate(sampled_token_ids):
            if not len(sampled):  # still in prefill
                drafts.append([])
                continue
            decoding = True
            n = int(num_tokens_no_spec[i])
            row = np.asarray(token_ids_cpu[i, :n], dtype=np.int64)
            seq = self._remember(row)
            draft = [] if seq is None else [int(t) for t in seq[n:n + cap]]
            self.draft_tokens += len(draft)
            drafts.append(draft)
        self.decode_steps += decoding
        if self.stats_file:
            Path(self.stats_file).write_text(json.dumps(
                {"decode_steps": self.decode_steps, "draft_tokens": self.draft_tokens}))
        return drafts
