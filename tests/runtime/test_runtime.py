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


def test_open_reports_its_stages_and_closes_the_store_when_the_model_fails(tmp_path):
    """Editors show these stages as work-done progress; a model that fails to load
    must not leave the store open (the session retries with other settings)."""
    from assistd.ground.errors import ModelError
    from assistd.runtime.runtime import CALIBRATING, LOADING

    stages: list[str] = []
    rt = Runtime.open(db=tmp_path / "h.db", n_ctx=256, progress=stages.append)
    try:
        assert stages == [LOADING, CALIBRATING]
    finally:
        rt.close()
    stages.clear()
    with pytest.raises(ModelError):
        Runtime.open(tmp_path / "missing.gguf", db=tmp_path / "h2.db", progress=stages.append)
    assert stages == [LOADING]
    # The store was closed: no -wal/-shm files kept open for it (SQLite removes them at
    # the last close of a WAL database).
    assert not (tmp_path / "h2.db-wal").exists()


def test_the_stats_line_says_a_promise_short_of_exact_where_drafts_were_verified():
    """`complete`'s stderr line (in-process and through the daemon): ``promise=batch-argmax``
    when the Target verified drafts without exact numerics; nothing for exact numerics, a
    remote Target (promise None) or a generation without rounds."""
    from assistd.ground.ledger import Ledger
    from assistd.runtime.session import summary_line

    def line(promise, rounds):
        led = Ledger(rounds=rounds, draft_tokens=4 * rounds, committed_tokens=rounds)
        return summary_line({"ledger": led.as_dict(), "stop_reason": "max_tokens",
                             "target": {"numerics": "x", "promise": promise}})

    assert line("batch-argmax", 2).endswith(" stop=max_tokens promise=batch-argmax")
    assert "promise=" not in line("batch-argmax", 0)
    assert "promise=" not in line("exact", 2) and "promise=" not in line(None, 2)
