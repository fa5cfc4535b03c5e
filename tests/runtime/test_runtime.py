"""The Runtime's own rules, on the real embedded Target."""

from __future__ import annotations

import pytest

from assistd.decoding.tuner import Tuner
from assistd.ground.costmodel import CostModel
from assistd.ground.errors import InputError
from assistd.runtime.runtime import Runtime
from assistd.targets.llama import LlamaTarget
from assistd.targets.open import default_model_path


@pytest.fixture
def small(store):
    """A 256-token context (the tuner on the reference costs: no calibration)."""
    t = LlamaTarget(default_model_path(), n_ctx=256)
    rt = Runtime(t, store, tuner=Tuner(None, "t", CostModel.brief()))
    yield rt
    t.close()


def test_the_end_of_the_context_is_the_stop_reason_not_max_tokens(small):
    """A prompt 2 tokens short of n_ctx asked for 10 tokens: the context ends first, and
    the stop reason says so (an agent must not read it as its own max_tokens)."""
    t = small.target
    prompt = [t.bos_token_id] + t.tokenize("word " * 400)[: t.n_ctx - 3]
    plan = small.plan("none", 0)
    g = small.run(prompt, plan, max_tokens=10)
    assert g.stop_reason == "n_ctx" and len(prompt) + len(g.tokens) == t.n_ctx + 1
    g = small.run(prompt, plan, max_tokens=2)  # max_tokens first: that is the reason
    assert g.stop_reason == "max_tokens" and len(g.tokens) == 2
    with pytest.raises(InputError, match="context window"):
        small.run(prompt + [prompt[-1]] * 2, plan)
