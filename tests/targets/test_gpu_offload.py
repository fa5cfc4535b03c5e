"""A llama.cpp GPU offload keeps speculation on, under every numerics mode.

This machine has no GPU build of llama.cpp, so the offload check itself is faked
(``llama_supports_gpu_offload`` answers True): a fault we cannot provoke otherwise. With
``n_gpu_layers=-1`` a CPU build then loads every layer on the CPU, as it would offload
them on a GPU build, and the Target reports the offload. The GPU's own cost model is
measured on that device, never here.
"""

from __future__ import annotations

import numpy as np
import pytest

from assistd.decoding.engine import generate
from assistd.targets.llama import LlamaTarget
from assistd.targets.open import default_model_path
from proposers import make_proposer
from proposers.index import HistoryIndex

@pytest.mark.parametrize("numerics", ["exact", "fast"])
def test_a_gpu_offload_keeps_speculation_on_and_says_its_promise(monkeypatch, numerics):
    """With GPU offload reported available (patched: no GPU here), a Target with all layers
    offloaded keeps speculation on and promises batch-argmax under both exact and fast numerics
    (a GPU's kernels are not batch-invariant), and n-gram drafting runs rounds."""
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    t = LlamaTarget(default_model_path(), n_ctx=512, n_gpu_layers=-1, numerics=numerics)
    try:
        assert t.device.startswith("gpu (") and t.n_gpu_layers > 0
        assert t.speculation_off is None
        # a GPU's kernels are not batch-invariant: even exact promises the batch's argmax
        assert t.numerics == numerics and t.promise == "batch-argmax"
        ids = t.tokenize("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
        index = HistoryIndex()

        index.put("s", 1, np.asarray(ids * 3, dtype=np.int64), "doc")
        g = generate(t, [t.bos_token_id] + ids, make_proposer("ngram", history=index),
                     max_tokens=24, k=4, scope="s")
        assert g.speculation_off is None and g.ledger.rounds >= 1
    finally:
        t.close()
