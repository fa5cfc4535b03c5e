"""``assistd replay --rewrite PATH``: the proposers on real edits, the real "after" text
standing in for the Target's output.

Where ``assistd bench --workload rewrite`` measures what the model writes (a 135M model
rarely makes the real edit), the replay walks the real edited text as
:func:`assistd.measure.replay.walk_turn` walks a recorded model turn: at each position
the proposer drafts from the context (the prompt, then the edited text so far), and a
draft is accepted as far as it agrees with the real text. Each edit
(:mod:`assistd.measure.rewrite_cases`) is replayed in both case kinds of
:mod:`assistd.measure.bench_rewrite`: ``file`` (the prompt holds the old text, the
output is the new text) and ``prediction`` (the prompt is the new text to the end of its
first change, the output the rest of it; the old rest is only in the prediction). The
prediction is the old text in both.

Arms: ``suffix`` (the live context only: an edit's history is the request), the
peers' prompt lookup (``peer:llama-cpp-python-pld``, as vLLM's ``ngram`` looks up the
prompt), ``prediction`` and ``prediction+suffix``, all under the same cost model; and
the oracle of :func:`assistd.measure.bench_rewrite.oracle_lengths` priced by it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from assistd.ground.costmodel import CostModel
from assistd.ground.errors import InputError
from assistd.measure.bench_rewrite import (OPEN_ANSWER, continuation_split, oracle_lengths,
                                           oracle_ms)
from assistd.measure.replay import ReplayCounts, build_proposer, metrics, walk_turn
from proposers.prediction import K_MAX, PredictionProposer

ARMS = ("suffix", "peer:llama-cpp-python-pld", "prediction", "prediction+suffix")


def file_prompt(path: str, instruction: str, before: str) -> str:
    """The ``file`` case's prompt as plain text (no chat template: the replay has no
    model): the file in a code block, the change, and the answer's opening fence."""
    change = (instruction.strip().splitlines() or [""])[0]
    return (f"Here is the file {path}:\n```\n{before}```\nRewrite the whole file with this"
            f" change: {change}\n{OPEN_ANSWER}")


def rewrite_turns(edits, tokenize: Callable[[str], list[int]]) -> list[dict]:
    """Per edit and kind: ``{"name", "kind", "tokens" (int64, prompt + output), "start"
    (the output's first index), "prediction" (ids)}``."""
    out = []
    for e in edits:
        pred = tokenize(e.before)
        prompt = tokenize(file_prompt(e.path, e.instruction, e.before))
        after = tokenize(e.after)
        out.append({"name": f"file:{e.name}", "kind": "file", "prediction": pred,
                    "tokens": np.array(prompt + after, dtype=np.int64), "start": len(prompt)})
        split = continuation_split(e.before, e.after)
        if split is not None:
            head, rest = tokenize(split[0]), tokenize(e.after[len(split[0]):])
            if head and rest:
                out.append({"name": f"prediction:{e.name}", "kind": "prediction",
                            "prediction": tokenize(split[1]),
                            "tokens": np.array(head + rest, dtype=np.int64),
                            "start": len(head)})
    return out


def _make(name: str, turn: dict, cost: CostModel):
    if name == "prediction":
        return PredictionProposer(turn["prediction"], start=turn["start"], cost=cost)
    if name == "prediction+suffix":
        return PredictionProposer(turn["prediction"], start=turn["start"], cost=cost,
                                  inner=build_proposer("suffix", None, cost))
    return build_proposer(name, None, cost)


def replay_turns(turns: Sequence[dict], cost: CostModel, *, k: int = K_MAX,
                 arms: Sequence[str] = ARMS) -> dict:
    """Every arm over every turn, by kind: ``{kind: {arm: metrics, "oracle": {...}}}``
    (:func:`assistd.measure.replay.metrics` per arm; the oracle's modelled speedup and
    tokens per call)."""
    report: dict = {}
    for kind in sorted({t["kind"] for t in turns}):
        mine = [t for t in turns if t["kind"] == kind]
        row = {}
        for name in arms:
            counts = ReplayCounts()
            for t in mine:
                prop = _make(name, t, cost)
                walk_turn(lambda ctx, k_cap, lang, p=prop: p.propose(ctx, k_cap), t["tokens"],
                          t["start"], len(t["tokens"]), k, counts)
            counts.ledger.draft_ms = float(sum(counts.propose_ms))
            row[name] = metrics(counts, cost)
        plain_ms = oracle = steps = tokens = 0.0
        for t in mine:
            out = t["tokens"][t["start"]:]
            lengths = oracle_lengths(out, t["prediction"], min(k, K_MAX))
            oracle += oracle_ms(lengths, cost.t_ms)
            plain_ms += len(out) * cost.t_ms(1)
            steps += len(lengths)
            tokens += len(out)
        row["oracle"] = {"modeled_speedup": round(plain_ms / oracle, 3) if oracle else None,
                         "tokens_per_call": round(tokens / steps, 3) if steps else None}
        report[kind] = {"cases": len(mine), "output_tokens": int(tokens), "arms": row}
    return report


def rewrite_edits(path: Path, *, limit: int = 24) -> list:
    """Rewrite cases (:mod:`assistd.measure.rewrite_cases`) from ``path``: a git
    repository, or transcripts (a file or a folder of ``.jsonl``). Raises
    :class:`InputError` when git fails there (no commits yet) or there is no case: before
    any model loads."""
    import subprocess

    from assistd.measure.bench_rewrite import MAX_CASE_CHARS, WINDOW_LINES
    from assistd.measure.rewrite_cases import git_cases
    from assistd.measure.rewrite_transcripts import transcript_cases

    options = {"limit": limit, "window": WINDOW_LINES, "max_chars": MAX_CASE_CHARS}
    if (path / ".git").exists():
        try:
            edits = git_cases(path, **options)
        except subprocess.CalledProcessError:
            raise InputError(f"--rewrite {path}: git cannot read its history (no commits"
                             " yet?); pick a repository with history") from None
    else:
        files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
        edits = transcript_cases(files, **options)
    if not edits:
        raise InputError(f"--rewrite {path}: no edit found (a git repository with history,"
                         " or transcripts whose edits carry the file before them)")
    return edits


def replay_rewrite(edits: list, source: Path, tokenize: Callable[[str], list[int]],
                   cost: CostModel, *, k: int = K_MAX) -> dict:
    """``edits`` (:func:`rewrite_edits` of ``source``) replayed by :func:`replay_turns`."""
    return {"source": str(source), "edits": len(edits),
            "kinds": replay_turns(rewrite_turns(edits, tokenize), cost, k=k)}
