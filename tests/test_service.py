"""The daemon's engine in-process: LSP sessions share one index and expire when idle."""

from __future__ import annotations

import pytest

import assistd.serving.service as service_mod
from assistd.serving.config import Config
from assistd.serving.scheduler import EDITOR
from assistd.serving.service import Service
from editors.completer import host
from tests.conftest import make_repo


@pytest.fixture
def service(tmp_path):
    s = Service(Config(db=str(tmp_path / "h.db"), n_ctx=1024), lsp_host=host)
    s.start()
    yield s
    s.close()


def test_idle_lsp_sessions_are_closed_and_leave_the_shared_index(service, tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "repo", {"a.py": "def a():\n    return 1\n"})
    uri = (repo / "b.py").as_uri()

    def call(session, op, args):
        return service.submit(lambda: service.lsp_job(session, op, args), EDITOR, op).result(120)

    for session in ("s1", "s2"):
        call(session, "configure", {"settings": {"maxLatencyMs": 0, "maxTokens": 4}})
        out = call(session, "complete", {"uri": uri, "text": "def b():\n    return 2\n",
                                         "offset": 9, "language": "python"})
        assert out["source"] in ("target", "type-through")
    # Two sessions, one id space: each buffer is its own history document.
    ids = {sid: service.lsp_sessions[sid]._buffers[uri][0] for sid in ("s1", "s2")}
    assert ids["s1"] != ids["s2"] and all(service.index.has(i) for i in ids.values())
    monkeypatch.setattr(service_mod, "LSP_SESSION_IDLE_S", 0.0)
    call("s3", "stats", {})
    assert set(service.lsp_sessions) == {"s3"}
    assert not any(service.index.has(i) for i in ids.values())
    call("s3", "close", {})
    assert service.lsp_sessions == {} and service.status()["lsp_sessions"] == 0
