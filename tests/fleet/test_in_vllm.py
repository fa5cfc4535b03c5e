"""assistd's proposer inside a real vLLM (its CPU build, harness/vllm_server.py): vLLM
loads ``assistd.fleet.vllm_proposer.HistoryProposer`` by ``--speculative-config``, drafts
from a history the real indexer wrote, verifies, and answers what the same vLLM answers
without speculation. Runs in the ``pytest --target vllm`` pass (.ci/run), beside the
session's plain vLLM server; skipped elsewhere (starting two vLLM servers takes ~4 min).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from assistd.targets.open import default_model_path
from assistd.targets.remote.gguf_vocab import LlamaVocab
from harness.openai_server import stop_llama_server
from harness.ports import free_port
from storage.indexer import index_repository
from storage.store import HistoryStore
from tests.conftest import make_repo, on_vllm

REPO = Path(__file__).resolve().parents[2]
K = 8
# Files the history holds; the prompts are their beginnings, so that the model's greedy
# continuation often copies them (the SmolLM2-135M continues code it was shown).
FILES = ("proposers/suffix.py", "storage/walk.py")

pytestmark = pytest.mark.skipif(not on_vllm(), reason=(
    "runs in the `pytest --target vllm` pass (.ci/run): it starts a second vLLM server"))


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    """vLLM with assistd's proposer (k 8) over a history of FILES, indexed by the local
    Target's tokenizer (the served folder's fingerprint is the same: one history)."""
    from harness import vllm_server as vllm

    tmp = tmp_path_factory.mktemp("fleet")
    root = make_repo(tmp / "repo", {Path(f).name: (REPO / f).read_text() for f in FILES})
    vocab = LlamaVocab(default_model_path())
    store = HistoryStore(tmp / "history.db")
    index_repository(store, root, vocab.tokenize, vocab.fingerprint)
    store.close()
    vocab.close()
    env = vllm.environment()
    env.update(ASSISTD_DB=str(tmp / "history.db"), ASSISTD_VLLM_SCOPE=str(root),
               ASSISTD_VLLM_STATS_FILE=str(tmp / "stats.json"))
    config = {"method": "custom_class", "model": "assistd.fleet.vllm_proposer.HistoryProposer",
              "num_speculative_tokens": K}
    proc = vllm.start(port := free_port(), tmp / "server.log", "--speculative-config",
                      json.dumps(config), env=env)
    yield f"http://127.0.0.1:{port}", tmp / "stats.json", tmp / "server.log"
    stop_llama_server(proc)


def complete(url: str, prompt: str, max_tokens: int = 64) -> str:
    r = httpx.post(f"{url}/v1/completions", timeout=600, json={
        "model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def spec_counters(url: str) -> dict[str, float]:
    """vLLM's own spec-decode counters from its /metrics."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name.startswith("vllm:spec_decode_num_") and s.name.endswith("_total") \
                    and "position" not in s.labels:
                out[s.name.removeprefix("vllm:spec_decode_num_").removesuffix("_total")] = s.value
    return out


def test_drafts_from_the_history_inside_vllm(spec_server, vllm_server):
    """Inside vLLM the proposer drafts from the history and vLLM accepts some of it
    (its own spec_decode counters), the step timing is written, and every greedy answer
    equals the same vLLM's without speculation (float32)."""
    url, stats, log = spec_server
    prompts = [(REPO / f).read_text()[:1200] for f in FILES]
    got = [complete(url, p) for p in prompts]
    plain = [complete(vllm_server, p) for p in prompts]
    assert got == plain
    counts = spec_counters(url)
    assert counts["drafts"] > 0, log.read_text()[-2000:]
    assert 0 < counts["accepted_tokens"] <= counts["draft_tokens"] <= K * counts["drafts"]
    timing = json.loads(stats.read_text())
    assert timing["k"] == K and timing["steps"] > 0 and timing["propose_ms"]["p50"] > 0
