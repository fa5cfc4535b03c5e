"""How close the cost model t(n, context) comes to fresh measurements at long contexts.

    .venv/bin/python benchmarks/cost_context.py [--contexts 1024,2048] [--repeats 5] [--threads N]

Calibrates the embedded SmolLM2-135M Q4_1 on llama.cpp afresh
(:meth:`CostModel.calibrate`, the cache left alone: levels at 64 and
``LONG_CONTEXT`` tokens), then measures forwards over n tokens (logits for every row,
as a round needs) after each of ``--contexts`` tokens of real source text, the same
statistic as the calibration (:func:`low_median` of interleaved repeats). Prints per
context and n: measured ms, the model's t(n, context), its error, and the error of
the reference level alone (t(n) at 64 tokens, what the cost model was before it knew
the context). A figure, not a test: on a busy machine both sides move (the
calibration says so in its note, and then has no long level).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.ground.costmodel import CostModel, low_median  # noqa: E402
from assistd.targets.llama import LlamaTarget  # noqa: E402
from assistd.targets.open import default_model_path  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32)


def measure(target, tokens: list[int], context: int, repeats: int) -> dict[int, float]:
    """``{n: ms}`` after ``context`` tokens of ``tokens``: low median of interleaved repeats."""
    target.truncate(0)
    target.evaluate(tokens[:context], [])
    samples: dict[int, list[float]] = {n: [] for n in SIZES}
    for _ in range(repeats):
        for n in SIZES:
            t0 = time.perf_counter()
            target.evaluate(tokens[context:context + n], range(n))
            samples[n].append((time.perf_counter() - t0) * 1000)
            target.truncate(context)
    target.truncate(0)
    return {n: low_median(ms) for n, ms in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="1024,2048", help="tokens of context, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None,
                    help="Target threads [default: all usable cores; 1 holds up better under load]")
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    target = LlamaTarget(default_model_path(), n_ctx=max(contexts) + max(SIZES) + 8,
                         n_threads=args.threads)
    text = "".join(p.read_text() for p in sorted((ROOT / "assistd").rglob("*.py")))
    tokens = [target.bos_token_id or 0] + [int(t) for t in target.tokenize(text)]
    t0 = time.perf_counter()
    cost = CostModel.calibrate(target)
    print(f"calibration: {time.perf_counter() - t0:.2f} s, levels at"
          f" {[cost.context, *sorted(cost.levels)]} tokens{'; ' + cost.note if cost.note else ''}")
    flat = CostModel(cost.points)  # the reference level alone: t(n) before the context
    print(f"{'context':>7} {'n':>3} {'measured':>9} {'model':>8} {'error':>7} {'t(n) alone':>10}"
          f" {'error':>7}")
    errors, flat_errors = [], []
    for context in contexts:
        got = measure(target, tokens, context, args.repeats)
        for n in SIZES:
            model, old = cost.t_ms(n, context), flat.t_ms(n)
            e, f = model / got[n] - 1, old / got[n] - 1
            errors.append(abs(e))
            flat_errors.append(abs(f))
            print(f"{context:>7} {n:>3} {got[n]:>9.1f} {model:>8.1f} {e:>+7.0%} {old:>10.1f}"
                  f" {f:>+7.0%}")
    print(f"mean |error|: model {sum(errors) / len(errors):.0%},"
          f" t(n) alone {sum(flat_errors) / len(flat_errors):.0%}")
    target.close()


if __name__ == "__main__":
    main()
