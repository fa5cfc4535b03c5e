"""The torch Target on the real embedded GGUF: logits rows, KV rollback, speculative
greedy == plain greedy, agreement with the llama.cpp Target, the converted-weights
cache, and load errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

# Sleeping (not spinning) OpenMP threads: as TorchTarget sets it, but before torch is
# imported here; spinning threads made torch ~30x slower on this shared 2-core machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytest.importorskip("torch", reason="the torch backend needs torch: pip install 'assistd[torch]'")
pytest.importorskip("transformers", reason="the torch backend needs transformers: "
                    "pip install 'assistd[torch]'")

from assistd.decoding.engine import generate  # noqa: E402
from assistd.ground.errors import ModelError  # noqa: E402
from assistd.targets.open import default_model_path  # noqa: E402
from assistd.targets import hf  # noqa: E402
from assistd.targets.hf import TorchTarget  # noqa: E402
from proposers import make_proposer  # noqa: E402
from tests.decoding.test_engine import assert_same_up_to_near_tie, chat_prompt  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"
SNIPPETS = [
    CODE,
    "for i in range(100):\n    x[i] = i * 2 ** 31 + 0.5e10\n",  # digits: llama.cpp's "smollm" split
    "<|im_start|>user\nhi<|im_end|>\n",  # special-token text is plain text
    "naïve café — 日本語 🎉\r\n\tfoo  ",
    "   leading spaces\n\n\n  \t trailing   ",
    "it's we'll I'M don't",
]


@pytest.fixture(scope="module")
def torch_target(shared_cache_dir):
    """The embedded GGUF on torch (CPU), converted once into the test run's cache dir."""
    t = TorchTarget(default_model_path(), n_ctx=2048, device="cpu")
    assert t.cache_dir is not None and t.cache_dir.parent.parent == shared_cache_dir
    yield t
    t.close()


def test_requested_rows_equal_the_same_rows_of_a_full_evaluation(torch_target):
    """Logits for a subset of rows (any order, repeats, across chunks) match a full evaluation."""
    t = torch_target
    ids = t.tokenize(CODE * 3)
    t.truncate(0)
    full = t.evaluate(ids, range(len(ids)))
    assert full.shape == (len(ids), t.n_vocab) and full.dtype == np.float32
    rows = [len(ids) - 1, 0, 7, 7, 20]
    t.truncate(0)
    part = t.evaluate(ids, rows)
    t.truncate(0)
    t.n_batch = 8  # several forwards, rows spread over them
    try:
        chunked = t.evaluate(ids, rows)
    finally:
        t.n_batch = 512
    diffs = [float(np.abs(full[rows] - x).max()) for x in (part, chunked)]
    print(f"max |logit diff| subset vs full: {diffs[0]:.2e}, chunked by 8: {diffs[1]:.2e}")
    assert max(diffs) <= 1e-4
    assert (full[rows].argmax(1) == part.argmax(1)).all() and (part.argmax(1) == chunked.argmax(1)).all()
    t.truncate(0)
    assert t.evaluate(ids, []).shape == (0, t.n_vocab) and t.n_past == len(ids)


def test_rollback_then_new_tokens_equals_fresh_evaluation(torch_target):
    """Evaluate A+B, truncate to len(A), evaluate C == evaluate A+C fresh."""
    t = torch_target
    a, b, c = t.tokenize(CODE), t.tokenize("    return a - b\n"), t.tokenize("    return b - a  # swapped\n")
    # Same forward shapes on both sides: the rolled-back cache is bit-identical.
    t.truncate(0)
    t.evaluate(a, [])
    t.evaluate(b, range(len(b)))
    t.truncate(len(a))
    assert t.n_past == len(a)
    after = t.evaluate(c, range(len(c)))
    t.truncate(0)
    t.evaluate(a, [])
    fresh = t.evaluate(c, range(len(c)))
    same_shape = float(np.abs(after - fresh).max())
    # A+B in one forward, then C; against A+C in one forward.
    t.truncate(0)
    t.evaluate(a + b, [])
    t.truncate(len(a))
    after2 = t.evaluate(c, range(len(c)))
    t.truncate(0)
    fresh2 = t.evaluate(a + c, range(len(a), len(a) + len(c)))
    one_forward = float(np.abs(after2 - fresh2).max())
    print(f"max |logit diff| after rollback: same chunking {same_shape:.2e}, "
          f"A+B vs A+C in one forward {one_forward:.2e}")
    assert same_shape == 0.0
    assert one_forward <= 1e-4
    assert (after2.argmax(1) == fresh2.argmax(1)).all()


def test_failed_evaluation_leaves_the_cache_as_it_was(torch_target):
    """A row out of range or an evaluation past n_ctx raises ValueError and leaves n_past and
    the torch KV cache's length as they were."""
    t = torch_target
    ids = t.tokenize(CODE)
    t.truncate(0)
    t.evaluate(ids, [])
    with pytest.raises(ValueError):
        t.evaluate([5, 6], [2])  # row out of range
    with pytest.raises(ValueError):
        t.evaluate([5] * (t.n_ctx - t.n_past + 1), [])  # past n_ctx
    assert t.n_past == len(ids)
    assert t._cache.get_seq_length() == len(ids)


def retype(rel: str) -> str:
    """A file re-typed below itself: the continuation is in the context. The file's
    first 4,000 characters (~1,000 tokens), so that the prompt fits n_ctx 2048 however
    the file grows (proposers/base.py reached 2,686 tokens with token trees)."""
    text = (REPO / rel).read_text(encoding="utf-8")[:4000]
    return text + "\n\n# --- copy being edited ---\n" + text[: len(text) // 3]


PROMPTS = {
    "retype:proposers/base.py": lambda: retype("proposers/base.py"),
    "repo:ledger.py": lambda: (REPO / "assistd/ground/ledger.py").read_text(encoding="utf-8")[:1500],
}


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_speculative_greedy_equals_plain_up_to_near_ties(torch_target, name):
    """ngram speculation on torch commits plain greedy's tokens, or diverges first at a near-tie."""
    t = torch_target
    ids = t.tokenize(PROMPTS[name]())
    plain = generate(t, ids, None, max_tokens=40, trace=True)
    spec = generate(t, ids, make_proposer("ngram", history=None, alpha=0.5), max_tokens=40, k=8)
    assert_same_up_to_near_tie(name, plain, spec)
    led = spec.ledger
    assert led.accepted_tokens > 0, "the prompt repeats itself: accepted drafts expected"
    assert led.committed_tokens == led.accepted_tokens + led.rounds + led.plain_steps


def test_eos_stops_generation(torch_target):
    """A ChatML prompt ends in <|im_end|>, one of llama.cpp's end-of-generation ids."""
    t = torch_target
    g = generate(t, chat_prompt(t, "Reply with just the word: hello"), None, max_tokens=40)
    assert g.stop_reason == "eos" and g.tokens[-1] in t.eos_token_ids
    assert "<|im_end|>" not in g.text and g.text.strip()


def test_tokenizer_agrees_with_llama_cpp(torch_target, target):
    """Same fingerprint, EOS/BOS ids, vocab size, and token ids for code, digits, special text."""
    t = torch_target
    assert t.fingerprint == target.fingerprint
    assert t.eos_token_ids == target.eos_token_ids == frozenset({0, 2, 4})
    assert (t.bos_token_id, t.add_bos, t.n_vocab) == (target.bos_token_id, target.add_bos, target.n_vocab)
    texts = SNIPPETS + [p.read_text(encoding="utf-8") for p in sorted((REPO / "assistd").rglob("*.py"))]
    for text in texts:
        assert t.tokenize(text) == target.tokenize(text), text[:60]


def test_detokenize_agrees_with_llama_cpp_and_round_trips(torch_target, target):
    """Same text as llama.cpp for snippets and chat ids; tokenize -> detokenize is the identity."""
    t = torch_target
    for text in SNIPPETS:
        ids = target.tokenize(text)
        assert t.detokenize(ids) == target.detokenize(ids) == text
        assert t.detokenize(ids[3:], prev=ids[:3]) == target.detokenize(ids[3:], prev=ids[:3])
    chat = chat_prompt(t, "hi") + t.tokenize(" there")
    assert t.detokenize(chat) == target.detokenize(chat) == "user\nhi\nassistant\n there"
    assert t.detokenize([1] + t.tokenize(" x")) == target.detokenize([1] + t.tokenize(" x")) == "x"
    # Pieces over 32 bytes (newline + 32 spaces), which llama-cpp-python's own
    # detokenize drops; LlamaTarget has its own loop, so both backends agree.
    for path in [REPO / "assistd/ground/ledger.py", REPO / "assistd/decoding/engine.py", REPO / "assistd/runtime/session.py"]:
        text = path.read_text(encoding="utf-8")
        ids = t.tokenize(text)
        assert t.detokenize(ids) == target.detokenize(ids) == text


def test_second_load_is_served_from_the_cache(torch_target, monkeypatch):
    """The converted weights lie in <cache>/torch-weights/<sha256>/; a new Target loads them, same logits."""
    t = torch_target
    cache = t.cache_dir
    assert cache is not None and cache.parent.name == "torch-weights"
    assert cache.name == hf.file_sha256(default_model_path())
    assert list(cache.glob("*.safetensors")) and (cache / "config.json").is_file()
    assert (cache / "tokenizer.json").is_file()
    # No temp dir left (other models' caches, e.g. Gemma's from test_exactness, may lie beside it).
    assert not [p.name for p in cache.parent.iterdir() if ".tmp-" in p.name]
    ids = t.tokenize(CODE)
    t.truncate(0)
    ref = t.evaluate(ids, range(len(ids)))

    def no_conversion(path):
        raise AssertionError("converted the GGUF again instead of loading the cache")

    monkeypatch.setenv("ASSISTD_CACHE_DIR", str(cache.parents[1]))
    monkeypatch.setattr(hf, "_convert_gguf", no_conversion)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        again = TorchTarget(default_model_path(), device="cpu")
    assert again.cache_dir == cache and again.fingerprint == t.fingerprint
    assert again.eos_token_ids == t.eos_token_ids
    assert [again.tokenize(s) for s in SNIPPETS] == [t.tokenize(s) for s in SNIPPETS]
    out = again.evaluate(ids, range(len(ids)))
    again.close()
    diff = float(np.abs(out - ref).max())
    print(f"max |logit diff| cached load vs first load: {diff:.2e}")
    # Two loads of the same weights: equal up to float rounding. Torch's CPU kernels may
    # take another path for differently aligned buffers (8.6e-6 seen between two loads);
    # a wrong cache is off by whole logits.
    assert diff < 1e-4 and (out.argmax(1) == ref.argmax(1)).all()


def test_hugging_face_directory_loads(torch_target):
    """A model directory with config.json (the cache dir is one) gives the same tokenizer and logits."""
    t = torch_target
    d = TorchTarget(t.cache_dir, device="cpu", dtype="float32")
    assert d.cache_dir is None and d.model_path == str(t.cache_dir)
    assert (d.fingerprint, d.eos_token_ids, d.bos_token_id, d.add_bos) == (
        t.fingerprint, t.eos_token_ids, t.bos_token_id, t.add_bos)
    ids = t.tokenize(CODE)
    t.truncate(0)
    a, b = d.evaluate(ids, [0, len(ids) - 1]), t.evaluate(ids, [0, len(ids) - 1])
    assert float(np.abs(a - b).max()) < 1e-4 and (a.argmax(1) == b.argmax(1)).all()  # two loads: rounding only
    d.close()


def test_corrupt_cache_falls_back_to_conversion(torch_target, tmp_path, monkeypatch):
    """A truncated safetensors file in the cache: warn, delete it, convert again; a stale temp dir goes."""
    src = torch_target.cache_dir
    root = tmp_path / "cache"
    cache = root / "torch-weights" / src.name
    shutil.copytree(src, cache)
    weights = next(cache.glob("*.safetensors"))
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size // 3)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = cache.with_name(f"{cache.name}.tmp-{dead}")  # as a process killed mid-save leaves it
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    monkeypatch.setenv("ASSISTD_CACHE_DIR", str(root))
    with pytest.warns(RuntimeWarning, match="unusable"):
        t = TorchTarget(default_model_path(), device="cpu")
    assert not stale.exists()
    assert next(cache.glob("*.safetensors")).stat().st_size == next(src.glob("*.safetensors")).stat().st_size
    ids = t.tokenize(CODE)
    out = t.evaluate(ids, [len(ids) - 1])
    t.close()
    torch_target.truncate(0)
    ref = torch_target.evaluate(ids, [len(ids) - 1])
    # The same weights: equal up to float rounding (8.6e-6 seen; a bad conversion is off by whole logits).
    assert float(np.abs(out - ref).max()) < 1e-3


def test_unwritable_cache_warns_and_loads_anyway(torch_target, tmp_path):
    """Saving the converted weights under a path that cannot be a directory: a warning, no error."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.warns(RuntimeWarning, match="cannot cache"):
        hf._save_cache(torch_target.model, torch_target.tokenizer, blocker / "torch-weights" / "x")
    assert blocker.is_file()


def test_truncated_gguf_is_a_model_error(tmp_path, monkeypatch):
    """The first 1 MB of the model (header cut) or all but its last byte: a one-line ModelError."""
    monkeypatch.setenv("ASSISTD_CACHE_DIR", str(tmp_path / "cache"))
    data = default_model_path().read_bytes()
    for size in (1 << 20, len(data) - 1):
        part = tmp_path / f"truncated-{size}.gguf"
        part.write_bytes(data[:size])
        with pytest.raises(ModelError) as e:
            TorchTarget(part, device="cpu")
        print(e.value)
        assert str(part) in str(e.value) and "truncated" in str(e.value) and "\n" not in str(e.value)
    assert not any((tmp_path / "cache").glob("torch-weights/*"))


def test_missing_or_invalid_model_paths_are_model_errors(tmp_path):
    """A missing file, a non-GGUF file, a folder without config.json, an unknown device or dtype
    each raise ModelError saying which."""
    with pytest.raises(ModelError, match="not found"):
        TorchTarget(tmp_path / "nope.gguf")
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(ModelError, match="not a GGUF"):
        TorchTarget(tmp_path / "text.gguf")
    with pytest.raises(ModelError, match="config.json"):
        TorchTarget(tmp_path)
    with pytest.raises(ModelError, match="unknown device"):
        TorchTarget(default_model_path(), device="tpu")
    with pytest.raises(ModelError, match="unknown dtype"):
        TorchTarget(default_model_path(), dtype="int8")


def test_missing_torch_is_a_model_error_naming_the_fix(monkeypatch):
    """Without torch importable, TorchTarget raises ModelError naming assistd[torch] and the
    torch version to install."""
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(ModelError, match=r"assistd\[torch\].*torch==2\.13\.0"):
        TorchTarget(default_model_path())


def test_environment_names_the_cache_root(monkeypatch, tmp_path):
    """ASSISTD_CACHE_DIR names the converted-weights cache root; without it, an absolute folder
    named assistd."""
    monkeypatch.setenv("ASSISTD_CACHE_DIR", str(tmp_path))
    assert hf.cache_root() == tmp_path
    monkeypatch.delenv("ASSISTD_CACHE_DIR")
    assert hf.cache_root().name == "assistd" and os.path.isabs(hf.cache_root())


def test_sequences_keep_separate_caches(torch_target):
    """Two KV sequences on torch (one DynamicCache each): interleaved work in sequence 1
    leaves sequence 0's cache as it was, and each gives a one-sequence Target's logits
    (same process and threads; within 1e-4 of float rounding)."""
    t2 = TorchTarget(default_model_path(), n_ctx=512, device="cpu", sequences=2)
    try:
        assert t2.n_seq_max == 2 and t2.kv_bytes_per_token == 30 * 3 * 64 * 2 * 4  # float32
        a, b = t2.tokenize(CODE * 4)[:40], t2.tokenize("import os\nprint(os.getcwd())\n")
        t2.use_sequence(0)
        t2.evaluate(a[:30], [])
        t2.use_sequence(1)
        t2.evaluate(b, [])
        t2.truncate(3)
        t2.use_sequence(0)
        got = t2.evaluate(a[30:], range(10))
        assert t2.sequence_tokens(0) == a and t2.sequence_tokens(1) == b[:3]
        torch_target.truncate(0)
        ref = torch_target.evaluate(a, range(30, 40))
        assert np.abs(got - ref).max() < 1e-4
    finally:
        t2.close()
