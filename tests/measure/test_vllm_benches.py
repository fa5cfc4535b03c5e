"""The vLLM benchmarks' own logic, without vLLM: benchmarks/vllm_oracle.py's ceiling
proposer (what it drafts, on the second pass only) and benchmarks/vllm_fleet.py's cases
(a history holds only what was written before each request).

The oracle is called as vLLM 0.32 calls a custom proposer (``propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu)``); the config is a namespace with the one field it
reads. Inside a real vLLM both run in the benchmarks (docs/scale.md)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # (the scripts import each other by name)
oracle_module = importlib.import_module("vllm_oracle")
fleet_module = importlib.import_module("vllm_fleet")


def config(k: int):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k))


def step(oracle, rows: list[list[int]], sampled=None) -> list[list[int]]:
    """One engine step over ``rows`` (each row's tokens so far), as vLLM lays them out."""
    width = max(len(r) for r in rows) + 16
    ids = np.zeros((len(rows), width), dtype=np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    sampled = sampled if sampled is not None else [[r[-1]] for r in rows]
    return oracle.propose(sampled, np.array([len(r) for r in rows]), ids)


def decode(oracle, prompt: list[int], output: list[int]) -> list[list[int]]:
    """The drafts of a request that decodes ``output`` one token a step."""
    return [step(oracle, [prompt + output[:i + 1]])[0] for i in range(len(output))]


def test_oracle_drafts_the_remembered_continuation_on_the_second_pass_only(monkeypatch):
    monkeypatch.delenv("ASSISTD_ORACLE_CAP_FILE", raising=False)
    monkeypatch.delenv("ASSISTD_ORACLE_STATS", raising=False)
    oracle = oracle_module.ReplayOracle(config(3))
    prompt, output = [5, 6, 7], [10, 11, 12, 13, 14, 15]
    assert decode(oracle, prompt, output) == [[]] * 6  # first pass: nothing known
    # Second pass: after output[:i+1], the next 3 tokens (fewer near the end).
    assert decode(oracle, prompt, output) == [[11, 12, 13], [12, 13, 14], [13, 14, 15],
                                              [14, 15], [15], []]
    # A prompt sharing the first tokens but not the rest gets nothing of the other.
    assert decode(oracle, [5, 6, 8], [10, 11]) == [[], []]
    # A row still in prefill (no sampled token) gets no draft.
    assert step(oracle, [prompt + output[:1]], sampled=[[]]) == [[]]


def test_oracle_cap_file_cuts_drafts_and_stats_count_decoding_steps(tmp_path, monkeypatch):
    cap, stats = tmp_path / "cap", tmp_path / "stats.json"
    cap.write_text("2")
    monkeypatch.setenv("ASSISTD_ORACLE_CAP_FILE", str(cap))
    monkeypatch.setenv("ASSISTD_ORACLE_STATS", str(stats))
    oracle = oracle_module.ReplayOracle(config(8))
    prompt, output = [1, 2], [20, 21, 22, 23, 24]
    decode(oracle, prompt, output)
    assert decode(oracle, prompt, output)[0] == [21, 22]
    cap.write_text("0")
    assert step(oracle, [prompt + output[:1]]) == [[]]
    step(oracle, [prompt + output[:1]], sampled=[[]])  # a prefill-only step: not decoding
    assert json.loads(stats.read_text()) == {"decode_steps": 11, "draft_tokens": 7}


def test_fleet_histories_hold_only_text_written_before_each_request():
    texts = ["".join(f"a{i:05d}\n" for i in range(3000)),
             "".join(f"b{i:05d}\n" for i in range(2000)),
             "".join(f"c{i:05d}\n" for i in range(1500))]
    shared, silos = fleet_module.fleet_cases(texts, requests=3)
    assert [c["name"].partition("@")[0] for c in shared] == ["agent0", "agent1", "agent2"] * 3
    ends = fleet_module.request_ends
    for idx, case in enumerate(shared):
        a, j = int(case["name"][5]), idx // 3
        end = ends(texts[a], 3)[j]
        assert case["prompt"] == texts[a][end - fleet_module.CHUNK_CHARS:end]
        assert texts[a][end - 1] == "\n"  # the prompt ends at a line start
        history = case["history"]
        assert history[f"agent{a}.md"] == texts[a][:end]  # its own, up to its prompt's end
        for b in range(3):
            if b == a:
                continue
            # another agent's text: up to its request of this round if it went first,
            # else up to its last round's (nothing before its first request)
            upto = ends(texts[b], 3)[j] if b < a else (ends(texts[b], 3)[j - 1] if j else 0)
            assert history.get(f"agent{b}.md", "") == texts[b][:upto]
        silo = silos[a][j]
        assert silo["prompt"] == case["prompt"]
        assert silo["history"] == {f"agent{a}.md": texts[a][:end]}
