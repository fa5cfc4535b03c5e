"""Fast apply against real edits: is the applied file the real "after" file?

    .venv/bin/python benchmarks/apply_correctness.py [--repo .] [--edits 12] [--model GGUF ...]

Each edit is a real commit's change to one text file (:mod:`assistd.measure.rewrite_cases`,
the 8-line edit window of the file before and after). The edit is sent two ways:

- **SEARCH/REPLACE**: one block per changed hunk of the real diff, with a line of
  context on each side (more while the SEARCH text is not unique), applied by rule;
- **lazy snippet**: the new hunks with their context lines, separated by the file
  type's elision comment (``# ... existing code ...``, ``// ... existing code ...``),
  merged by each Target given (the chat of :mod:`assistd.edits.merge`, the file as the
  predicted output). Files without line comments (Markdown, JSON) are left out here.

Reported per way and model: exact (the result equals the real after text), the mean
similarity (difflib ratio) where not exact, parses (where the original parsed), and for
the merges the accepted prediction tokens per output token and tokens/s.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.edits.fast_apply import apply_edit  # noqa: E402
from assistd.ground.errors import InputError  # noqa: E402
from assistd.measure.rewrite_cases import git_cases  # noqa: E402

COMMENT = {"python": "#", "shellscript": "#", "toml": "#", "yaml": "#", "ignore": "#",
           "lua": "--", "typescript": "//", "javascript": "//", "rust": "//", "go": "//",
           "c": "//", "cpp": "//", "java": "//"}


def hunks(before: str, after: str):
    """``[(i1, i2, j1, j2)]``: the changed line ranges of the real diff."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return a, b, [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def blocks_of(before: str, after: str) -> str:
    """SEARCH/REPLACE blocks for the real change: each hunk with a line of context on
    either side, widened until its SEARCH occurs once in the text it applies to."""
    a, b, hs = hunks(before, after)
    out, current = [], before
    for i1, i2, j1, j2 in hs:
        c = 1
        while True:
            lo, hi = max(0, i1 - c), min(len(a), i2 + c)
            search = "".join(a[lo:hi])
            replace = "".join(a[lo:i1]) + "".join(b[j1:j2]) + "".join(a[i2:hi])
            if (search and current.count(search) == 1) or (lo == 0 and hi == len(a)):
                break
            c += 1
        out.append(f"<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n")
        current = current.replace(search, replace, 1)
    return "".join(out)


def snippet_of(before: str, after: str, comment: str) -> str:
    """The lazy snippet of the real change: the new hunks with a context line each side,
    the unchanged code between them elided."""
    a, b, hs = hunks(before, after)
    marker = f"{comment} ... existing code ...\n"
    parts = [marker]
    for _, _, j1, j2 in hs:
        lo, hi = max(0, j1 - 1), min(len(b), j2 + 1)
        parts += ["".join(b[lo:hi]), marker]
    return "".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT)
    ap.add_argument("--edits", type=int, default=12)
    ap.add_argument("--model", action="append", default=None,
                    help="GGUF of a Target to merge snippets with (repeatable; default the"
                         " embedded SmolLM2-135M)")
    args = ap.parse_args()
    from assistd.runtime.runtime import Runtime
    from assistd.serving.apply_api import runtime_model
    from assistd.targets.open import default_model_path
    from assistd.targets.spec import TargetSpec

    edits = git_cases(args.repo, limit=args.edits, window=8, max_chars=2400)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for n, e in enumerate(edits):
            path = Path(tmp) / f"{n:02d}" / Path(e.path).name
            path.parent.mkdir()
            path.write_text(e.before)
            files.append(path)

        def score(name, results):
            exact = sum(r["text"] == e.after for r, e in results if r)
            sims = [difflib.SequenceMatcher(None, r["text"], e.after).ratio()
                    for r, e in results if r and r["text"] != e.after]
            parsed = [(r["after"]["ok"] is not False) for r, e in results
                      if r and r["before"]["ok"] is True]
            failed = sum(1 for r, _ in results if r is None)
            rows.append({"way": name, "edits": len(results), "exact": exact, "errors": failed,
                         "similarity": sum(sims) / len(sims) if sims else None,
                         "parses": f"{sum(parsed)}/{len(parsed)}"})

        results = []
        for path, e in zip(files, edits):
            try:
                results.append((apply_edit(path, blocks_of(e.before, e.after),
                                           scope=path.parent).as_dict(), e))
            except InputError:
                results.append((None, e))
        score("SEARCH/REPLACE (rule)", results)

        lazy = [(p, e) for p, e in zip(files, edits) if e.language in COMMENT]
        for model in args.model or [str(default_model_path())]:
            rt = Runtime.open(TargetSpec(model=model), db=Path(tmp) / "history.db")
            try:
                fn = runtime_model(rt)
                results, accepted, out_tokens, ms = [], 0, 0, 0.0
                for path, e in lazy:
                    try:
                        t0 = time.perf_counter()
                        r = apply_edit(path, snippet_of(e.before, e.after, COMMENT[e.language]),
                                       scope=path.parent, model=fn,
                                       instruction=e.instruction).as_dict()
                        ms += (time.perf_counter() - t0) * 1000
                        u = r["usage"] or {}
                        out_tokens += u.get("completion_tokens", 0)
                        accepted += (u.get("completion_tokens_details") or {}).get(
                            "accepted_prediction_tokens", 0)
                        results.append((r, e))
                    except InputError:
                        results.append((None, e))
                score(f"lazy snippet, {Path(model).name}", results)
                rows[-1]["accepted / output"] = (f"{accepted / out_tokens:.2f}"
                                                 if out_tokens else "-")
                rows[-1]["tokens/s"] = f"{out_tokens / (ms / 1000):.1f}" if ms else "-"
            finally:
                rt.close()

    table = Table(title=f"fast apply on {len(edits)} real edits of {args.repo}")
    cols = ["way", "edits", "exact", "errors", "similarity", "parses", "accepted / output",
            "tokens/s"]
    for c in cols:
        table.add_column(c, justify="left" if c == "way" else "right")
    for r in rows:
        sim = r["similarity"]
        table.add_row(*(str(r.get(c, "-")) if c != "similarity" else
                        ("-" if sim is None else f"{sim:.3f}") for c in cols))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
