"""What limits `suffix` on a workload: its stopping rule against an oracle, modeled.

    .venv/bin/python benchmarks/draft_oracle.py --workload agent=PATH --workload edit=PATH
        [--cases 6] [--max-tokens 96] [--t-ms BENCH.json] [--numerics fast]

The Target's greedy output on `assistd bench`'s prompts is the oracle (plain decoding,
one generation per case). The script then walks each output token by token, as a
speculative loop would, and asks the proposer for a draft at every step; a round
commits the draft's tokens up to its first wrong one plus the Target's token. Its cost is
t(draft + 1) ms, a plain step's t(1): the modeled speedup is plain's modeled time over
the arm's. No Target runs in the walk, so the figures do not depend on the machine's load,
only on t(n): by default this run's calibration (back-to-back forwards), or with
``--t-ms`` the ``t_ms`` a `assistd bench --json` run measured inside its loop (rounds
there cost 8-10% more than calibrated on 2 cores, so the calibrated figures run high).
The walk drafts at k = 16 (no tuner) and prices every forward at t(n) alone, so it reads
high against `assistd bench` even on the bench's own t(n): on 2026-12-06 (SmolLM2, 2
cores) 1.33x / 1.26x modeled on agent / edit against 1.05x / 1.07x measured in the run
whose t(n) it took. Read its arms against each other, not against the bench.

Arms, each on the same steps:

- ``suffix``: the proposer with its defaults and its cost cut priced by the t(n) above,
  at a ceiling of 16 tokens (no tuner: a completion's ``--k auto`` may cap it lower);
- ``suffix, no cost cut``: the same candidates, every draft verified in full
  (SuffixDecoding's own floors only);
- ``oracle cut``: suffix's longest candidate (``alpha=4``, no probability floor), cut at
  its first wrong token (a draft only where its first token is right): the best any
  stopping rule could do. The gap between ``suffix`` and this arm is its stopping rule's
  and its caps' (draft cap and floor); what this arm leaves is coverage (steps where no
  candidate holds the Target's next token).

Per arm: modeled speedup, coverage (rounds / steps), acceptance rate, and accepted
draft tokens per round (the Target's own token not counted: `assistd bench`'s mean
acceptance length is 1 + this). With ``--t-ms`` every ``--workload`` needs a workload of
the same name in that file; a t(n) that falls by more than 10% from one size to the next
(the machine's speed moved under that run) is refused, a smaller dip raised to the
running maximum.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.decoding.engine import generate  # noqa: E402
from assistd.ground.costmodel import CostModel  # noqa: E402
from assistd.ground.errors import InputError, ModelError  # noqa: E402
from assistd.ground.numerics import DEFAULT_NUMERICS, NUMERICS  # noqa: E402
from assistd.measure.bench import index_width  # noqa: E402
from assistd.measure.bench_workloads import build_workload  # noqa: E402
from assistd.targets.open import open_target  # noqa: E402
from proposers.index import HistoryIndex  # noqa: E402
from proposers.suffix import SuffixProposer  # noqa: E402

SCOPE = "oracle"


def accepted(tokens, truth: np.ndarray) -> int:
    """How many leading draft tokens equal the Target's tokens.

    >>> accepted([5, 6, 7], np.array([5, 6, 9, 1]))
    2
    """
    n = min(len(tokens), len(truth))
    same = np.asarray(tokens[:n]) == truth[:n]
    return n if same.all() else int(np.argmin(same))


def walk(cases, index: HistoryIndex, propose, cut, t_ms) -> dict:
    """Model one arm over ``cases`` ``[(prompt, language, seed docs, output)]``.
    ``propose(context, k, language)`` -> Draft or None; ``cut(draft, truth)`` -> tokens
    drafted; ``t_ms(n, context)`` -> ms of a forward over n tokens."""
    arm_ms = plain_ms = 0.0
    steps = rounds = drafted = hits = 0
    doc = 10_000
    for prompt, language, seed, out in cases:
        for name, ids in seed:
            if len(ids):
                doc += 1
                index.put(SCOPE, doc, ids, name)
        ctx = np.asarray(list(prompt) + list(out), dtype=np.int64)
        pos = 0
        while pos < len(out):
            at = len(prompt) + pos
            room = len(out) - pos - 1
            d = propose(ctx[:at], min(16, room), language) if room >= 1 else None
            n = 0 if d is None else cut(d, ctx[at:at + len(d.tokens)])
            a = accepted(d.tokens[:n], ctx[at:]) if n else 0
            arm_ms += t_ms(n + 1, at)
            plain_ms += sum(t_ms(1, at + i) for i in range(a + 1))
            steps, rounds, drafted, hits = steps + 1, rounds + (n > 0), drafted + n, hits + a
            pos += a + 1
    return {"speedup": plain_ms / arm_ms, "coverage": rounds / steps,
            "acceptance": hits / drafted if drafted else None,
            "accepted_per_round": hits / rounds if rounds else None}


def bench_t_ms(path: Path) -> tuple[dict[str, CostModel], list[str]]:
    """Each workload's measured t(n) in an `assistd bench --json` file, and that run's
    warnings. Raises :class:`InputError` for a file that is not such a report, or a t(n)
    that falls somewhere (t(n + 1) < t(n) by more than 10%: a run the machine's speed moved
    under; a smaller dip, measurement noise, is raised to the running maximum).

    >>> import tempfile, os
    >>> f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    >>> _ = f.write(json.dumps({"workloads": [{"name": "agent",
    ...     "t_ms": {"1": 60.6, "2": 33.8}}]})); f.close()
    >>> try:
    ...     bench_t_ms(Path(f.name))
    ... except InputError as e:
    ...     print(str(e).split(": ")[2])
    t(2) = 33.8 ms < t(1) = 60.6 ms
    >>> os.unlink(f.name)
    """
    try:
        report = json.loads(path.read_text())
        workloads = report["workloads"]
        out = {}
        for w in workloads:
            ns = sorted(int(n) for n in w["t_ms"])
            ms = [float(w["t_ms"][str(n)]) for n in ns]
            for a, b, x, y in zip(ns, ns[1:], ms, ms[1:]):
                if y < 0.9 * x:
                    raise InputError(
                        f"--t-ms {path}: workload {w['name']}: t({b}) = {y:.1f} ms < t({a}) ="
                        f" {x:.1f} ms: the machine's speed moved under that run; rerun the bench")
            top = np.maximum.accumulate(ms).tolist()  # noise: t(4) a little under t(3)
            out[w["name"]] = CostModel(dict(zip(ns, top)), source=f"bench {w['name']}")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(f"--t-ms {path}: not an `assistd bench --json` report"
                         f" ({type(e).__name__}: {e})") from None
    return out, [str(x) for x in report.get("warnings", [])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", required=True,
                    help="NAME=PATH as `assistd bench --workload` takes it; repeat")
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-prompt-tokens", type=int, default=1536)
    ap.add_argument("--numerics", choices=NUMERICS, default=DEFAULT_NUMERICS)
    ap.add_argument("--t-ms", type=Path, default=None,
                    help="an `assistd bench --json` file: the t_ms of its workloads of the"
                         " same names (every --workload must have one)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = ap.parse_args()
    try:
        run(args)
    except (InputError, ModelError) as e:
        sys.exit(f"error: {e}")


def run(args) -> None:
    if args.cases < 1 or args.max_tokens < 1 or args.max_prompt_tokens < 16:
        raise InputError("--cases and --max-tokens must be at least 1, --max-prompt-tokens 16")
    if args.json is not None:
        try:  # before the run, not after it
            args.json.touch()
        except OSError as e:
            raise InputError(f"--json {args.json}: {e.strerror}") from None
    measured: dict[str, CostModel] = {}
    if args.t_ms is not None:
        measured, warned = bench_t_ms(args.t_ms)
        for w in warned:
            print(f"warning: that bench run warned: {w}", file=sys.stderr)
    target = open_target(None, backend="llama", n_ctx=2048, numerics=args.numerics)
    rows = {}
    for spec in args.workload:
        w = build_workload(target, spec, cases=args.cases, budget=args.max_prompt_tokens)
        if args.t_ms is not None and w.name not in measured:
            raise InputError(f"--t-ms {args.t_ms} has no workload named {w.name!r}"
                             f" (it has {', '.join(sorted(measured)) or 'none'})")
        cost = measured.get(w.name)
        if cost is None:  # frozen: relabelled, since its source names the backend alone
            cost = dataclasses.replace(CostModel.calibrate(target), source="this run's calibration")
        cases = []
        for c in w.cases:
            g = generate(target, c.prompt, None, max_tokens=args.max_tokens, k=0,
                         reuse_prefix=False)
            cases.append((c.prompt, c.language, c.seed, g.tokens))

        def arm(make, cut):
            index = HistoryIndex(width=index_width(target))
            for i, (name, ids) in enumerate(w.history):
                if len(ids):
                    index.put(SCOPE, i + 1, ids, name)
            prop = make(index)
            return walk(cases, index,
                        lambda ctx, k, lang: prop.propose(ctx, k, scope=SCOPE, language=lang),
                        cut, cost.t_ms)

        full = lambda d, truth: len(d.tokens)  # noqa: E731
        rows[w.name] = {
            "suffix": arm(lambda ix: SuffixProposer(ix, cost=cost), full),
            "suffix, no cost cut": arm(lambda ix: SuffixProposer(ix), full),
            "oracle cut": arm(lambda ix: SuffixProposer(ix, alpha=4, min_token_prob=0.0),
                              lambda d, truth: accepted(d.tokens, truth)),
            "t(n)": cost.source,
        }
    target.close()

    table = Table(title="suffix's stopping rule against an oracle (modeled)")
    for col in ("workload", "arm", "speedup", "coverage", "acceptance", "accepted/round", "t(n)"):
        table.add_column(col, justify="left" if col in ("workload", "arm", "t(n)") else "right")
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    for name, arms in rows.items():
        for arm_name, r in arms.items():
            if arm_name == "t(n)":
                continue
            table.add_row(name, arm_name, f"{r['speedup']:.3f}x", fmt(r["coverage"]),
                          fmt(r["acceptance"]), fmt(r["accepted_per_round"]), arms["t(n)"])
    Console(width=None if sys.stdout.isatty() else 140).print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
