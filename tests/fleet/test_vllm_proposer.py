"""assistd's vLLM proposer outside vLLM: built from a vLLM config's two fields it reads
(the served tokenizer's folder, num_speculative_tokens) and called with vLLM's argument
shapes, over a real history file that the real indexer wrote with the local Target's
tokenizer. tests/fleet/test_in_vllm.py runs it inside a real vLLM.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from assistd.fleet.vllm_proposer import FleetSettings, HistoryProposer
from assistd.ground.errors import HistoryError, InputError
from assistd.targets.remote.gguf_vocab import LlamaVocab
from assistd.targets.open import default_model_path
from storage.indexer import index_repository
from storage.store import HistoryStore
from tests.conftest import make_repo

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json",
                   "generation_config.json")
SOURCE = (REPO / "proposers" / "suffix.py").read_text()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The served model's tokenizer files: the embedded model as vLLM is given it
    (harness/vllm_server.py converts it with the torch Target), without the weights."""
    pytest.importorskip("transformers", reason="converting the GGUF to a folder needs torch")
    from harness.vllm_server import model_dir

    out = tmp_path_factory.mktemp("served")
    for name in TOKENIZER_FILES:
        shutil.copy(model_dir() / name, out / name)
    return out


@pytest.fixture(scope="module")
def vocab():
    v = LlamaVocab(default_model_path())
    yield v
    v.close()


@pytest.fixture
def history(tmp_path, vocab):
    """A repository indexed by the local Target's tokenizer (the GGUF's), as the daemon
    does: ``(db path, repo root)``."""
    root = make_repo(tmp_path / "repo", {"suffix.py": SOURCE})
    store = HistoryStore(tmp_path / "h.db")
    index_repository(store, root, vocab.tokenize, vocab.fingerprint)
    store.close()
    return tmp_path / "h.db", root


def vllm_config(folder: Path, k: int = 8):
    """The two fields of vLLM's VllmConfig the proposer reads (a stand-in for the real
    config object, which needs vLLM; test_in_vllm.py passes the real one)."""
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(tokenizer=str(folder)))


def rows(*contexts, width: int = 4096):
    """vLLM's ``num_tokens_no_spec`` and ``token_ids_cpu`` for ``contexts`` (int32 as vLLM's)."""
    buf = np.zeros((len(contexts), width), dtype=np.int32)
    for i, c in enumerate(contexts):
        buf[i, :len(c)] = c
    return np.array([len(c) for c in contexts]), buf


def test_drafts_the_history_continuation(folder, history, vocab, tmp_path):
    """A row that is a prefix of an indexed file drafts that file's next tokens (a chain
    of at most k); a row in prefill (no sampled token) gets no draft; the timing is
    counted per engine step and written where asked."""
    db, root = history
    stats = tmp_path / "stats.json"
    p = HistoryProposer(vllm_config(folder, k=6),
                        settings=FleetSettings(db=db, scope=str(root), stats_file=stats))
    ids = vocab.tokenize(SOURCE)
    cut = 400
    n, buf = rows(ids[:cut], ids[:50])
    drafts = p.propose([[ids[cut - 1]], []], n, buf)
    assert drafts[1] == []
    assert 1 <= len(drafts[0]) <= 6
    assert drafts[0] == ids[cut:cut + len(drafts[0])]
    p.write_stats()
    got = json.loads(stats.read_text())
    assert got["steps"] == 1 and got["rows"] == 1 and got["draft_tokens"] == len(drafts[0])
    assert got["scope"] == str(root.resolve()) and got["k"] == 6
    assert got["propose_ms"]["max"] >= got["propose_ms"]["p50"] > 0


def test_the_history_is_read_only_and_refreshed(folder, history, vocab):
    """The proposer never writes the database (SQLite refuses: it is opened mode=ro),
    and after refresh_s it drafts from what the daemon indexed since."""
    db, root = history
    p = HistoryProposer(vllm_config(folder), settings=FleetSettings(db=db, scope=str(root),
                                                                    refresh_s=0.01))
    with pytest.raises(Exception, match="readonly"):
        p.store.db.execute("delete from documents")
    fresh = "def brand_new_function(alpha, beta):\n    return alpha * beta + 42\n" * 3
    ids = vocab.tokenize(fresh)
    n, buf = rows(ids[:12])
    before = p.propose([[ids[11]]], n, buf)[0]
    (root / "new.py").write_text(fresh)
    writer = HistoryStore(db)
    index_repository(writer, root, vocab.tokenize, vocab.fingerprint)
    writer.close()
    time.sleep(0.02)
    after = p.propose([[ids[11]]], n, buf)[0]
    assert after and after == ids[12:12 + len(after)]
    assert len(after) > len(before) or before != after


def test_refuses_another_tokenizers_history(folder, history, tmp_path):
    """A served tokenizer whose vocabulary differs from the one the scope was indexed
    with (one control token added, as a fine-tune adds one: another fingerprint) is refused with both fingerprints;
    a scope the history lacks, and a file that is no history, are refused too."""
    db, root = history
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    spec = json.loads((other / "tokenizer.json").read_text())
    new_id = max(spec["model"]["vocab"].values()) + 1
    spec["added_tokens"].append({"id": new_id, "content": "<|tool_call|>", "single_word": False,
                                 "lstrip": False, "rstrip": False, "normalized": False,
                                 "special": True})
    (other / "tokenizer.json").write_text(json.dumps(spec))
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": new_id + 1}))
    with pytest.raises(InputError, match="another tokenizer") as e:
        HistoryProposer(vllm_config(other), settings=FleetSettings(db=db, scope=str(root)))
    assert "served model's" in str(e.value)
    with pytest.raises(InputError, match="no scope"):
        HistoryProposer(vllm_config(folder), settings=FleetSettings(db=db, scope="/nowhere"))
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(HistoryError):
        HistoryProposer(vllm_config(folder), settings=FleetSettings(db=junk, scope=str(root)))
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(HistoryError, match="must exist, in a folder this process may write"):
        HistoryProposer(vllm_config(folder),
                        settings=FleetSettings(db=tmp_path / "missing.db", scope=str(root)))
    assert not (tmp_path / "missing.db").exists()  # a reader creates nothing


def test_settings_from_the_environment_over_the_config_file(tmp_path):
    """``ASSISTD_VLLM_*`` over the config file's ``[vllm]`` table (which the daemon,
    reading the same file, leaves alone), ``$ASSISTD_DB`` as the db's default; a bad
    value names its variable; an unknown key is refused."""
    config = tmp_path / "config.toml"
    config.write_text('[vllm]\nscope = "/from/file"\nrefresh_s = 5\ncost = "flat"\n')
    env = {"ASSISTD_CONFIG": str(config), "ASSISTD_VLLM_REFRESH_S": "0.5",
           "ASSISTD_DB": str(tmp_path / "x.db")}
    s = FleetSettings.load(env)
    assert (s.scope, s.refresh_s, s.cost, s.db) == ("/from/file", 0.5, "flat", tmp_path / "x.db")
    with pytest.raises(InputError, match="ASSISTD_VLLM_REFRESH_S"):
        FleetSettings.load({**env, "ASSISTD_VLLM_REFRESH_S": "-1"})
    with pytest.raises(InputError, match="ASSISTD_VLLM_SCOPE"):  # (no config file here)
        FleetSettings.load({})
    from assistd.serving.config import load_config  # the daemon reads the same file

    load_config(config, environ={})  # and leaves [vllm] to the proposer
    config.write_text('[vllm]\nscope = "/s"\nsurprise = 1\n')
    with pytest.raises(InputError, match="SURPRISE"):
        FleetSettings.load({"ASSISTD_CONFIG": str(config)})


def test_a_secret_in_the_repository_is_never_drafted(folder, tmp_path, vocab):
    """A GitHub token in an indexed file is redacted before it is stored, so a row that
    reaches the token's line drafts the redaction, never the token's characters."""
    token = "ghp_" + "Zq7rT2mXb9LcV4nHs8KdW1pYf6GuJ3eA5oQi"
    text = f'CONFIG = {{\n    "github": "{token}",\n    "retries": 3,\n}}\n' * 2
    root = make_repo(tmp_path / "repo", {"settings.py": text})
    store = HistoryStore(tmp_path / "h.db")
    index_repository(store, root, vocab.tokenize, vocab.fingerprint)
    store.close()
    p = HistoryProposer(vllm_config(folder, k=16),
                        settings=FleetSettings(db=tmp_path / "h.db", scope=str(root)))
    prefix = vocab.tokenize('CONFIG = {\n    "github": "')
    n, buf = rows(prefix)
    draft = p.propose([[prefix[-1]]], n, buf)[0]
    assert draft, "the indexed file's continuation should be drafted"
    drafted = vocab.detokenize(draft)
    assert token[:8] not in drafted and "Zq7rT2" not in drafted



def test_the_suffix_caps_are_settings(folder, history):
    """``alpha`` and ``min_token_prob`` reach the suffix proposer; unset, its own
    chain caps stay (1 and 0.1), whatever the cost model."""
    db, root = history
    default = HistoryProposer(vllm_config(folder), settings=FleetSettings(db=db, scope=str(root)))
    assert (default.suffix.alpha, default.suffix.min_token_prob) == (1.0, 0.1)
    given = HistoryProposer(vllm_config(folder),
                            settings=FleetSettings(db=db, scope=str(root), alpha=8,
                                                   min_token_prob=0))
    assert (given.suffix.alpha, given.suffix.min_token_prob) == (8.0, 0.0)


def test_a_failing_history_or_stats_file_never_fails_the_step(folder, history, vocab, tmp_path):
    """vLLM calls propose with nothing around it: a history file damaged under the
    proposer (its bytes overwritten) and a stats file that cannot be written are logged
    and drafting goes on from what was loaded; a stats file in no folder is refused at
    start, and "~" in paths is the home folder."""
    import sqlite3

    db, root = history
    with pytest.raises(ValueError, match="is not a folder"):
        FleetSettings(db=db, scope=str(root), stats_file=tmp_path / "nowhere" / "s.json")
    assert FleetSettings(db="~/h.db", scope="s").db == Path.home() / "h.db"
    stats = tmp_path / "stats"
    stats.mkdir()
    p = HistoryProposer(vllm_config(folder), settings=FleetSettings(
        db=db, scope=str(root), refresh_s=0.001, stats_file=stats / "s.json"))
    ids = vocab.tokenize(SOURCE)
    n, buf = rows(ids[:400])
    before = p.propose([[ids[399]]], n, buf)
    conn = sqlite3.connect(db)
    conn.execute("pragma wal_checkpoint(TRUNCATE)")
    conn.close()
    size = db.stat().st_size
    db.write_bytes(b"\x00damaged" * (size // 8))
    (stats / "s.json").unlink()
    stats.rmdir()  # the stats file can no longer be written either
    time.sleep(0.01)
    assert p.propose([[ids[399]]], n, buf) == before
    assert p._sync_failed and p._stats_failed
