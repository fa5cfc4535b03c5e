"""`assistd bench` output: the report dict as a rich table, Markdown, two PNGs and a folder.

Data: a hand-written report (no model) with two workloads:

- agent: plain decoding, suffix (k auto, speedup 1.23 over repeats 1.18..1.27, 5 exact
  outputs and 1 near-tie of 6) and the llama-cpp-python PLD peer library, which exposes
  no acceptance (every acceptance field None or empty);
- novel: plain decoding, suffix that never drafted (no acceptance, coverage 0, one output
  DIFFERS) and the same peer library with no speedup measured (None).

So the acceptance plot has one line in agent and "no drafts" in novel.
"""

from __future__ import annotations

import copy
import json

import pytest

from assistd.measure.bench_report import (ledger_markdown, plot_acceptance, plot_speedup, print_ledger,
                                  write_report)
from assistd.ground.errors import InputError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PEER = "llama-cpp-python PLD (library)"


def _arm(name, kind, **over):
    arm = {"arm": name, "kind": kind, "proposer": None, "k": 0,
           "committed_tokens": 576, "draft_tokens": 0, "accepted_tokens": 0, "rounds": 0,
           "plain_steps": 576, "acceptance_rate": None, "mean_acceptance_length": None,
           "coverage": 0.0, "accepted_per_position": [], "reached_per_position": [],
           "tried_per_position": [], "conditional_acceptance": [],
           "draft_ms": 0.0, "verify_ms": 5000.0, "decode_ms": 5200.0,
           "draft_ms_per_token": 0.0, "verify_ms_per_token": 8.7, "tokens_per_s": 111.5,
           "speedup": 1.0, "speedup_min": 1.0, "speedup_max": 1.0,
           "speedup_per_repeat": [1.0, 1.0, 1.0], "extra_memory_bytes": 0,
           "output_match": {"exact": 6, "near_tie": 0, "differs": 0, "max_gap": None,
                            "cases": [{"case": f"c{i}", "status": "exact", "first_diff": None,
                                       "gap": None} for i in range(6)]}}
    arm.update(over)
    return arm


def _peer(**over):
    fields = dict(k=10, coverage=None, draft_tokens=None, accepted_tokens=None, rounds=None,
                  plain_steps=None, draft_ms=None, draft_ms_per_token=None,
                  verify_ms_per_token=None, extra_memory_bytes=None,
                  conditional_acceptance=None, tokens_per_s=120.3, speedup=1.08,
                  speedup_min=1.02, speedup_max=1.11, speedup_per_repeat=[1.02, 1.11, 1.1])
    return _arm(PEER, "peer-library", **{**fields, **over})


SUFFIX_AGENT = _arm(
    "suffix", "proposer", proposer="suffix", k="auto", draft_tokens=900, accepted_tokens=600,
    rounds=300, plain_steps=276, acceptance_rate=0.667, mean_acceptance_length=3.0,
    coverage=0.52, accepted_per_position=[246, 180, 108, 66],
    reached_per_position=[300, 246, 180, 108], tried_per_position=[300, 240, 180, 130],
    conditional_acceptance=[0.82, 0.75, 0.6, 0.508], draft_ms=120.0,
    draft_ms_per_token=0.21, verify_ms_per_token=7.1, tokens_per_s=137.2, speedup=1.23,
    speedup_min=1.18, speedup_max=1.27, speedup_per_repeat=[1.18, 1.24, 1.27],
    extra_memory_bytes=3 * 2**20 + 2**19,
    output_match={"exact": 5, "near_tie": 1, "differs": 0, "max_gap": 0.03,
                  "cases": [{"case": "c0", "status": "near-tie", "first_diff": 12,
                             "gap": 0.03}]})

SUFFIX_NOVEL = _arm(
    "suffix", "proposer", proposer="suffix", k="auto", conditional_acceptance=[None, None],
    speedup=0.99, speedup_min=0.97, speedup_max=1.01, tokens_per_s=110.0,
    output_match={"exact": 5, "near_tie": 0, "differs": 1, "max_gap": 0.4,
                  "cases": [{"case": "c3", "status": "differs", "first_diff": 40,
                             "gap": 0.4}]})

REPORT = {
    "version": 1,
    "command": "assistd bench --workload agent --workload novel --repeats 3 --out bench/",
    "started": "2026-11-30T09:00:00Z", "wall_s": 812.3,
    "machine": {"cpu": "AMD EPYC 7B13", "cores": 2, "platform": "Linux-6.1-x86_64",
                "python": "3.12.3", "llama_cpp_python": "0.3.16", "threads": 2,
                "memory_bytes": 8_000_000_000},
    "target": {"backend": "llama", "model": "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
               "n_ctx": 2048},
    "settings": {"k": "auto", "max_tokens": 96, "repeats": 3, "cases": 6, "near_tie_gap": 0.1},
    "cost_model": {"source": "measured", "points": {"1": 8.7, "5": 11.2}},
    "workloads": [
        {"name": "agent", "source": "tests/data/bench/agent", "description": "An agent turn.",
         "cases": 6, "prompt_tokens": 7000, "history_tokens": 180000, "history_documents": 385,
         "arms": [_arm("plain", "plain"), SUFFIX_AGENT, _peer()]},
        {"name": "novel", "source": "prose never seen", "description": "New prose.",
         "cases": 6, "prompt_tokens": 3000, "history_tokens": None, "history_documents": None,
         "arms": [_arm("plain", "plain"), SUFFIX_NOVEL,
                  _peer(speedup=None, speedup_min=None, speedup_max=None, tokens_per_s=None)]},
    ],
}


def _render(report) -> str:
    from rich.console import Console

    console = Console(record=True, width=200, emoji=False, markup=False)
    print_ledger(report, console=console)
    return console.export_text()


def test_write_report_writes_json_markdown_and_two_pngs(tmp_path):
    """The folder (and its parents) is created; the four files are there, the PNGs valid."""
    import matplotlib.image

    paths = write_report(REPORT, tmp_path / "out" / "bench")
    assert [p.name for p in paths] == ["ledger.json", "ledger.md", "speedup.png",
                                       "acceptance.png"]
    assert all(p.parent == tmp_path / "out" / "bench" and p.is_file() for p in paths)
    for png in paths[2:]:
        assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 1000
        assert matplotlib.image.imread(png).shape[0] > 100


def test_ledger_json_round_trips_with_nulls(tmp_path):
    """ledger.json is the report itself: None as null, floats as they were."""
    json_path = write_report(REPORT, tmp_path)[0]
    text = json_path.read_text()
    assert json.loads(text) == json.loads(json.dumps(REPORT)) and "null" in text
    assert '"mean_acceptance_length": 3.0' in text


def test_markdown_has_a_heading_per_workload_every_arm_and_the_command():
    """README's Performance block: headings, arm rows, machine, settings, reproduce command."""
    md = ledger_markdown(REPORT)
    assert "### agent" in md and "### novel" in md
    for name in ("plain", "suffix", PEER):
        assert f"| {name} |" in md
    assert "```sh\n" + REPORT["command"] + "\n```" in md
    assert "AMD EPYC 7B13" in md and "SmolLM2-135M-Instruct.Q4_1.gguf" in md
    assert "near_tie_gap=0.1" in md
    assert "1.23× (1.18–1.27)" in md and "5/6 +1 near-tie" in md
    assert "5/6 **1 DIFFERS**" in md and ".82 .75 .60 .51" in md
    assert "| 3.5 |" in md  # extra memory in MiB
    assert "/models/" not in md  # the model's file name only


def test_print_ledger_formats_speedup_match_and_positions():
    """One table per workload: speedup with its range, matches, the first 4 a_i, - for None."""
    text = _render(REPORT)
    assert "agent: 6 cases, 7,000 prompt tokens, 180,000 history tokens" in text
    assert "novel: 6 cases, 3,000 prompt tokens" in [ln.strip() for ln in text.splitlines()]
    assert "1.23× (1.18–1.27)" in text and "1.00×" in text and "1.00× (" not in text
    assert ".82 .75 .60 .51" in text and "5/6 +1 near-tie" in text and "1 DIFFERS" in text
    peer_rows = [ln for ln in text.splitlines() if PEER in ln]
    assert len(peer_rows) == 2 and all(" - " in ln for ln in peer_rows)
    assert "machine: AMD EPYC 7B13, 2 cores" in text and "settings: k=auto" in text


def test_all_none_and_empty_fields_never_crash(tmp_path):
    """An arm with every field None or missing, a workload with no arms, no workloads at all."""
    report = copy.deepcopy(REPORT)
    report["workloads"][0]["arms"].append({"arm": "empty", "kind": "proposer",
                                           "output_match": None, "speedup": None})
    report["workloads"][1]["arms"] = []
    report["machine"], report["settings"] = None, {}
    assert len(write_report(report, tmp_path / "a")) == 4
    assert "| empty | - | - |" in ledger_markdown(report)
    assert "empty" in _render(report)
    bare = {"command": "assistd bench", "workloads": []}
    assert len(write_report(bare, tmp_path / "b")) == 4
    assert "no workloads" in _render(bare)


def test_plots_draw_measured_arms_only(tmp_path):
    """Acceptance: suffix in agent only; speedup: bars for suffix and the peer, not plain."""
    agent, novel = plot_acceptance(REPORT, tmp_path / "acc.png").axes
    assert [ln.get_label() for ln in agent.lines] == ["suffix"]
    assert list(agent.lines[0].get_ydata()) == [0.82, 0.75, 0.6, 0.508]
    assert not novel.lines and "no drafts" in [t.get_text() for t in novel.texts]
    (ax,) = plot_speedup(REPORT, tmp_path / "speed.png").axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["baseline: plain (1.0)", "suffix", PEER]  # a report without plain:llama
    heights = sorted(round(b.get_height(), 2) for b in ax.patches)
    assert heights == [0.99, 1.08, 1.23]  # the peer has no speedup in novel: no bar
    for name in ("acc.png", "speed.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_SIGNATURE


def test_directory_that_is_a_file_is_an_input_error(tmp_path):
    """--out pointing at an existing file: InputError naming the folder and the fix."""
    blocker = tmp_path / "ledger"
    blocker.write_text("not a folder")
    with pytest.raises(InputError, match="cannot write the bench report into .*ledger"):
        write_report(REPORT, blocker)
    with pytest.raises(InputError, match="another output folder"):
        write_report(REPORT, blocker / "below")


def test_tree_columns_only_where_a_tree_ran():
    """A workload with a tree arm gets 'tree rounds' and 'nodes/round' after coverage
    (the other arms show 0 and their D / R); one without keeps the usual columns."""
    report = copy.deepcopy(REPORT)
    tree = _arm("suffix+tree", "proposer", proposer="suffix", k="auto", draft_tokens=3000,
                accepted_tokens=700, rounds=300, plain_steps=276, tree_rounds=250,
                nodes_per_round=10.0, coverage=0.52)
    agent = report["workloads"][0]
    agent["arms"].insert(2, tree)
    agent["arms"][1]["tree_rounds"], agent["arms"][1]["nodes_per_round"] = 0, 3.0
    md = ledger_markdown(report)
    agent_md, novel_md = md.split("### novel")
    assert "| coverage | tree rounds | nodes/round |" in agent_md
    assert "| 0.52 | 250 | 10.00 |" in agent_md and "| 0.52 | 0 | 3.00 |" in agent_md
    assert "tree rounds" not in novel_md.split("\n\n")[2]  # novel's table: no tree columns
    assert "nodes/round = draft tokens (tree nodes)" in md
    text = _render(report)
    assert "nodes/round" in text and "suffix+tree" in text
    assert "tree rounds" not in ledger_markdown(REPORT)


def test_the_ceiling_and_an_unexplained_difference_are_shown():
    """The ceiling cell is at-coverage / at-1; a difference nothing reproduced says so."""
    report = copy.deepcopy(REPORT)
    arm = report["workloads"][0]["arms"][1]
    arm["ceiling"] = {"measured": 1.31, "full": 1.52, "k": 4, "k_full": 6}
    arm["output_match"] = {"exact": 5, "near_tie": 0, "differs": 1, "numerics": 0,
                           "unexplained": 1, "cases": []}
    text, md = _render(report), ledger_markdown(report)
    assert "| 1.31× / 1.52× |" in md and "5/6 **1 DIFFERS 1 UNEXPLAINED**" in md
    assert "1.31× /" in text and "UNEXPLAINED" in text  # the terminal may wrap a cell
