"""The rewrite workload of ``assistd bench``: cases from a real edit, the oracle, the
per-case table, and one short run on the real model whose prediction arms match plain
decoding and draft from the prediction."""

import json
import subprocess
import sys
from pathlib import Path

from assistd.measure.bench_arms import arms_for
from assistd.measure.bench_report import rewrite_table
from assistd.measure.bench_rewrite import (case_rows, continuation_split, oracle_lengths,
                                           oracle_ms, overlap, summary)
from assistd.measure.bench_workloads import rewrite_workload
from tests.measure.test_bench import edit_repo  # noqa: F401 - a fixture: one real edit

ROOT = Path(__file__).resolve().parents[2]


def test_the_oracle_drafts_the_longest_run_the_output_continues_with():
    """At each step the longest prediction run the output continues with, capped by the
    tokens left and by max_draft; a token the prediction lacks is a plain step."""
    assert oracle_lengths([1, 2, 3, 4], [1, 2, 3, 4]) == [3]
    assert oracle_lengths([7, 1, 2], [1, 2]) == [0, 1]
    assert oracle_lengths(list(range(10)), list(range(10)), max_draft=4) == [4, 4]
    assert oracle_lengths([5, 6, 5, 6, 9], [5, 6, 5, 6, 9]) == [4]
    assert oracle_ms([0, 2], lambda n: {1: 10.0, 3: 16.0}[n]) == 26.0


def test_overlap_is_the_share_of_output_copied_from_the_prediction():
    """Output tokens in the prediction's matching blocks over output tokens."""
    assert overlap([1, 2, 3, 9], [1, 2, 3]) == 0.75
    assert overlap([], [1]) is None


def test_a_continuation_case_splits_after_the_first_change():
    """The prompt is the new text to the end of its first changed block; the prediction
    is the old text after that block."""
    before = "a\nb\nc\nd\n"
    after = "a\nB\nc\nd\n"
    assert continuation_split(before, after) == ("a\nB\n", "c\nd\n")
    assert continuation_split("a\n", "a\nz\n") is None  # nothing left to predict


def test_case_rows_price_the_oracle_with_t_and_compare_the_arms():
    """A case whose output is the prediction: the oracle's modelled speedup is plain's
    t(1) per token over its rounds' t(L + 1); a prediction arm's ratio to it is its
    measured speedup over the oracle's; the summary takes geometric means per kind."""
    output = list(range(8))
    details = [{"case": "c", "kind": "file", "output": output, "prediction": output,
                "arms": {"plain": [8, 800.0], "prediction": [8, 200.0], "suffix": [8, 400.0]},
                "place": {"prediction": {"losses": 0, "refinds": 0}}}]
    t = lambda n: 100.0 + 10.0 * (n - 1)  # noqa: E731
    rows = case_rows(details, t, baseline="plain")
    row = rows[0]
    assert row["overlap"] == 1.0
    assert row["oracle_speedup"] == round(800.0 / 170.0, 3)  # one round of 7 drafts
    assert row["speedup"]["prediction"] == 4.0
    assert row["to_oracle"]["prediction"] == round(4.0 / (800.0 / 170.0), 3)
    s = summary(rows)["file"]
    assert s["to_suffix"]["prediction"] == 2.0
    headers, table = rewrite_table({"cases": rows, "summary": summary(rows)})
    assert "oracle" in headers and len(table) == 2


def test_the_prediction_arms_are_arms_of_their_own():
    """prediction and prediction+suffix are arms of kind "prediction", beside the
    proposers (which tree_arms checks as before)."""
    arms = arms_for(["suffix", "prediction", "prediction+suffix"], "auto", library_peer=None)
    kinds = {a.name: a.kind for a in arms}
    assert kinds["prediction"] == kinds["prediction+suffix"] == "prediction"
    assert kinds["suffix"] == "proposer"


def test_the_workload_makes_a_file_case_and_a_prediction_case_per_edit(edit_repo, target):
    """From one commit: a chat case whose prompt holds the old window and a completion
    case whose prompt is the new text to the change; both predict the old text."""
    w = rewrite_workload(target, edit_repo, 2, 1500)
    kinds = {c.kind: c for c in w.cases}
    assert set(kinds) == {"file", "prediction"}
    file_case, pred_case = kinds["file"], kinds["prediction"]
    assert "record_plain_step" in target.detokenize(file_case.prediction)
    assert "def plain_step(" in target.detokenize(pred_case.prompt)
    assert "def plain_step(" not in target.detokenize(pred_case.prediction)


def test_a_short_rewrite_run_matches_plain_and_drafts_from_the_prediction(edit_repo):
    """``assistd bench --workload rewrite=REPO`` with the prediction arms: every arm's
    output matches plain decoding (exact numerics: batched rows equal one-token rows),
    the prediction arms draft from the prediction, and the rewrite table has a row per
    case with the oracle."""
    cmd = [sys.executable, "-m", "assistd", "bench", "--workload", f"rewrite={edit_repo}",
           "--proposer", "suffix", "--proposer", "prediction", "--proposer", "prediction+suffix",
           "--cases", "1", "--max-tokens", "32", "--repeats", "1", "--no-library-peer",
           "--numerics", "exact", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    w = json.loads(proc.stdout)["workloads"][0]
    arms = {a["arm"]: a for a in w["arms"]}
    for name in ("prediction", "prediction+suffix", "suffix"):
        match = arms[name]["output_match"]
        assert match["exact"] == len(match["cases"]) == 2, (name, match)
    for name in ("prediction", "prediction+suffix"):
        assert arms[name]["draft_tokens"] > 0, arms[name]
    rows = w["rewrite"]["cases"]
    assert {r["kind"] for r in rows} == {"file", "prediction"}
    assert all(r["oracle_speedup"] is not None for r in rows)
    for r in rows:  # (how much the model copies is the model's: the table reports it)
        assert 0.0 <= r["overlap"] <= 1.0 and 1 <= r["output_tokens"] <= 32
        assert set(r["place"]) == {"prediction", "prediction+suffix"}


def test_replay_rewrite_walks_the_real_edit_with_every_arm_and_the_oracle(edit_repo):
    """``assistd replay --rewrite REPO``: the real edited text is the output. Where only
    the prediction holds the rest of the file, the prediction arms commit far more
    tokens per call than suffix (which has nothing to copy), and no arm beats the oracle
    under a flat cost (tokens per call is the speedup there)."""
    cmd = [sys.executable, "-m", "assistd", "replay", "--rewrite", str(edit_repo),
           "--cost-model", "flat", "--k", "64", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds = json.loads(proc.stdout)["kinds"]
    assert set(kinds) == {"file", "prediction"}
    arms = kinds["prediction"]["arms"]
    assert arms["prediction"]["tokens_per_call"] > 3 * arms["suffix"]["tokens_per_call"]
    for kind in kinds.values():
        assert (kind["arms"]["prediction"]["tokens_per_call"]
                <= kind["arms"]["oracle"]["tokens_per_call"] + 1e-3)  # (rounded to 3 places)


def test_replay_rewrite_refuses_other_inputs_beside_it(edit_repo):
    """--rewrite runs its own arms on its own inputs: a --proposer beside it is a usage
    error, not silently dropped."""
    proc = subprocess.run([sys.executable, "-m", "assistd", "replay", "--rewrite",
                           str(edit_repo), "--proposer", "suffix"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "--rewrite" in proc.stderr
