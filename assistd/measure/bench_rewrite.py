"""The ``rewrite`` workload of ``assistd bench``: real edits, the file as the prediction.

Each real edit (:mod:`assistd.measure.rewrite_cases`: git commits, agent transcripts'
Edit and apply_patch calls; the file before and after, cut to the edit's window) makes
two cases, both sending the text before the edit as the request's ``prediction``
(OpenAI's Predicted Outputs):

- ``file``: the prompt holds the file (a chat request: the file in a code block, the
  change described, "rewrite the whole file"; the answer opened with a code fence, as
  an apply prompt does), as Continue's apply and OpenAI's own Predicted Outputs
  examples send it. Lookup over the prompt (suffix, the peers'
  prompt lookup) can copy the file too; the prediction knows where the output is in it.
- ``prediction``: only the prediction holds it (a completion request: the new text up
  to the end of its first change; the model writes on): what a client sends when the
  rest of the file is not in the prompt, as next-edit providers do with the edit window.

The Target writes its own answer in both: the real "after" text is never the answer
here (a 135M model does not make the real edit); each case's overlap (output tokens
copied from the prediction / output tokens) says how much there was to copy.

The **oracle** drafts, at every step, the longest run of the prediction that the output
really continues with (at most 63 tokens, so a round is at most 64 forward rows, the
prediction proposer's own ceiling), each
round priced by the run's measured t(L + 1) and a step without a run by t(1): the
speedup a prediction proposer could reach on that output, with perfect place keeping.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

import numpy as np

from proposers.prediction import K_MAX, prediction_usage

# The arms that draft from a case's prediction ("prediction+suffix": the suffix
# proposer competes under the same cost model, as the API runs it).
PREDICTION_ARMS = ("prediction", "prediction+suffix")
OPEN_ANSWER = "```\n"  # the answer's start, after the chat template's assistant header
WINDOW_LINES = 8  # lines of context around an edit: the cases stay a few hundred tokens
MAX_CASE_CHARS = 2400  # before or after window, characters


def is_prediction_arm(name: str) -> bool:
    return name in PREDICTION_ARMS


def file_messages(path: str, instruction: str, before: str) -> list[dict]:
    """The chat of a ``file`` case: the file in a code block, then the change asked for
    (its first line). SmolLM2-135M copies the file under this prompt (overlap 0.8-0.9 on
    most of this repository's edits) where a system prompt first and the change first
    made it describe the file instead."""
    change = (instruction.strip().splitlines() or [""])[0]
    return [{"role": "user", "content": f"Here is the file {path}:\n```\n{before}```\n"
                                        f"Rewrite the whole file with this change: {change}"}]


def continuation_split(before: str, after: str) -> tuple[str, str] | None:
    """``(prompt text, predicted rest)`` of a ``prediction`` case: the new text up to the
    end of its first changed block, and the old text after the same block (what the
    client holds of the rest). None when the first change is at the very end."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    if not ops:
        return None
    _, _, i2, _, j2 = ops[0]
    rest = "".join(a[i2:])
    if not rest.strip() or j2 == 0:
        return None
    return "".join(b[:j2]), rest


# ------------------------------------------------------------------------- the oracle


def oracle_lengths(output: Sequence[int], prediction: Sequence[int],
                   max_draft: int = K_MAX) -> list[int]:
    """The oracle's draft length at each of its steps over ``output``: the longest run of
    ``prediction`` (anywhere in it) that the output continues with from there, at most
    ``max_draft`` and the tokens left after the step's own; 0 is a plain step. A round
    of L drafts commits L + 1 tokens.

    >>> oracle_lengths([1, 2, 3, 9, 4, 5], [1, 2, 3, 4, 5])
    [3, 1]
    """
    out = np.asarray(list(output), dtype=np.int64)
    pred = np.asarray(list(prediction), dtype=np.int64)
    lengths, i = [], 0
    while i < len(out):
        room = min(max_draft, len(out) - i - 1)
        best = 0
        if room > 0 and len(pred):
            starts = np.flatnonzero(pred == out[i])
            for s in starts.tolist():
                n = min(room, len(pred) - s, len(out) - i)
                eq = pred[s: s + n] == out[i: i + n]
                run = int(np.cumprod(eq).sum())
                best = max(best, run)
                if best >= room:
                    break
        lengths.append(best)
        i += best + 1
    return lengths


def oracle_ms(lengths: Sequence[int], t_ms: Callable[[int], float]) -> float:
    """The oracle's decode time: each step priced t(L + 1), in ms."""
    return float(sum(t_ms(L + 1) for L in lengths))


def overlap(output: Sequence[int], prediction: Sequence[int]) -> float | None:
    """Output tokens copied from the prediction / output tokens (the matching blocks
    of :func:`proposers.prediction.prediction_usage`); None for an empty output."""
    if not len(output):
        return None
    accepted, _ = prediction_usage(prediction, output)
    return accepted / len(output)


def case_rows(details: list[dict], t_ms: Callable[[int], float], baseline: str) -> list[dict]:
    """Per case: kind, overlap, every arm's tokens/s and its speedup over ``baseline``,
    the oracle's modelled speedup and each arm's ratio to it. ``details``: per case
    ``{"case", "kind", "output", "prediction", "arms": {name: [committed, decode ms]},
    "place": {"losses", "refinds"}}``."""
    rows = []
    for d in details:
        arms = {name: (c / (ms / 1000.0) if ms > 0 else None) for name, (c, ms) in d["arms"].items()}
        base = arms.get(baseline) or arms.get("plain")
        lengths = oracle_lengths(d["output"], d["prediction"])
        plain_model = sum(t_ms(1) for _ in range(len(d["output"])))
        oracle = plain_model / oracle_ms(lengths, t_ms) if lengths else None
        speedups = {n: (v / base if v and base else None) for n, v in arms.items()}
        rows.append({
            "case": d["case"], "kind": d["kind"], "output_tokens": len(d["output"]),
            "prediction_tokens": len(d["prediction"]),
            "overlap": None if (o := overlap(d["output"], d["prediction"])) is None else round(o, 3),
            "tokens_per_s": {n: None if v is None else round(v, 2) for n, v in arms.items()},
            "speedup": {n: None if v is None else round(v, 3) for n, v in speedups.items()},
            "oracle_speedup": None if oracle is None else round(oracle, 3),
            "oracle_rounds": sum(1 for L in lengths if L), "oracle_steps": len(lengths),
            "to_oracle": {n: (round(v / oracle, 3) if v and oracle else None)
                          for n, v in speedups.items() if is_prediction_arm(n)},
            "place": d.get("place", {}),
        })
    return rows


def summary(rows: list[dict]) -> dict:
    """Per kind (``file``, ``prediction``): the geometric means of each arm's speedup and
    of the oracle's, the prediction arms' ratio to the oracle and to suffix."""
    out = {}
    for kind in sorted({r["kind"] for r in rows}):
        rs = [r for r in rows if r["kind"] == kind]

        def gmean(xs):
            xs = [x for x in xs if x]
            return round(float(np.exp(np.mean(np.log(xs)))), 3) if xs else None

        names = sorted({n for r in rs for n in r["speedup"]})
        speed = {n: gmean([r["speedup"].get(n) for r in rs]) for n in names}
        oracle = gmean([r["oracle_speedup"] for r in rs])
        out[kind] = {
            "cases": len(rs), "overlap_mean": round(float(np.mean(
                [r["overlap"] for r in rs if r["overlap"] is not None] or [0])), 3),
            "speedup_gmean": speed, "oracle_gmean": oracle,
            "to_oracle": {n: (round(speed[n] / oracle, 3) if speed.get(n) and oracle else None)
                          for n in PREDICTION_ARMS if n in speed},
            "to_suffix": {n: (round(speed[n] / speed["suffix"], 3)
                              if speed.get(n) and speed.get("suffix") else None)
                          for n in PREDICTION_ARMS if n in speed},
        }
    return out
