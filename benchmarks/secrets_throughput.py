"""Throughput of the secrets filter on real source code: with and without the prefilter.

    .venv/bin/python benchmarks/secrets_throughput.py [--root DIR] [--subset-mb 1.5] [--json]

Corpus: every ``*.py`` file of this interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``, site-packages excluded), read from disk as UTF-8, or of
``--root`` (e.g. ``.venv/lib/python3.11/site-packages``). Reported:

* ``with prefilter``: :func:`storage.secrets.redact` over the whole corpus, MB/s on one core
  (MB = 10^6 bytes of UTF-8 input; rate = bytes / seconds, computed here from the raw counters).
* ``without prefilter``: ``redact(text, prefilter=False)``, i.e. detect-secrets on every line,
  on an evenly spread subset of files (``--subset-mb``); the prefiltered run is timed on the
  same subset, and both must give the same text (the prefilter only skips lines that cannot
  hold a secret).
* ``detect-secrets alone``: its own line scan (``detect_secrets.core.scan.
  _process_line_based_plugins``, default plugins and filters) over every line of the same
  subset, finding secrets without replacing them: what calling the library per line costs.
* redactions per MB over the whole corpus, by detect-secrets kind: on the standard library
  these are false positives (test vectors, example keys, hashes), the price of the detector.
* ``--baseline REV`` (a git revision, or a path to a ``secrets.py`` or a ``secrets/`` package):
  the same corpus through that version of the filter too, timed in the same run, so false
  positives per MB and MB/s are compared before/after (e.g. ``--baseline e5ba8f5``, the last
  commit before issue 21).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storage.secrets import redact  # noqa: E402


def corpus_texts(root: Path) -> list[tuple[str, str]]:
    """(relative path, text) for every .py file under ``root``; for the stdlib, its
    site-packages are left out."""
    skip_site = "site-packages" not in root.parts
    out = []
    for p in sorted(root.rglob("*.py")):
        if skip_site and ("site-packages" in p.parts or "dist-packages" in p.parts):
            continue
        try:
            out.append((str(p.relative_to(root)), p.read_text("utf-8", errors="replace")))
        except OSError:
            continue
    return out


def timed(texts: list[str], **kwargs) -> tuple[float, list]:
    t0 = time.perf_counter()
    results = [redact(t, **kwargs) for t in texts]
    return time.perf_counter() - t0, results


def load_baseline(spec: str):
    """The secrets filter of a git revision (``storage/secrets.py``, or the ``storage/secrets/``
    package it later became) or of a path (a ``secrets.py`` file or a package folder), imported
    as ``baseline_secrets`` beside the current one (the package's imports are relative)."""
    path = Path(spec)
    if not path.exists():
        tmp = Path(tempfile.mkdtemp())
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", spec,
                                 "storage/"], capture_output=True, text=True, check=True).stdout
        if "storage/secrets.py" in listed.split():
            path = tmp / "baseline_secrets.py"
            path.write_text(subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{spec}:storage/secrets.py"],
                capture_output=True, text=True, check=True).stdout)
        else:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", spec, "storage/secrets"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
            path = tmp / "storage" / "secrets"
    if path.is_dir():
        mod_spec = importlib.util.spec_from_file_location(
            "baseline_secrets", path / "__init__.py", submodule_search_locations=[str(path)])
    else:
        mod_spec = importlib.util.spec_from_file_location("baseline_secrets", path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules["baseline_secrets"] = module  # dataclasses look their module up
    mod_spec.loader.exec_module(module)
    return module


def baseline_counters(module, texts: list[str], total_bytes: int) -> dict:
    """Seconds, redactions and redactions per MB of another version of the filter."""
    module.redact("warm-up: api_key = 'x'")
    t0 = time.perf_counter()
    results = [module.redact(t) for t in texts]
    seconds = time.perf_counter() - t0
    kinds: dict[str, int] = {}
    for r in results:
        for k, n in r.kinds.items():
            kinds[k] = kinds.get(k, 0) + n
    redactions = sum(r.count for r in results)
    return {"seconds": round(seconds, 3), "redactions": redactions,
            "redactions_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "redactions_per_mb": round(redactions / (total_bytes / 1e6), 2),
            "mb_per_s": round(total_bytes / 1e6 / seconds, 2)}


def detect_secrets_alone(files: list[tuple[str, str]]) -> tuple[float, int]:
    """Seconds and findings of detect-secrets' own scan of every line (no redaction)."""
    from detect_secrets.core.scan import _process_line_based_plugins
    from detect_secrets.settings import default_settings

    with default_settings():
        t0 = time.perf_counter()
        found = 0
        for path, text in files:
            lines = list(enumerate(text.splitlines(), start=1))
            found += sum(1 for _ in _process_line_based_plugins(lines, filename=path))
        return time.perf_counter() - t0, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(sysconfig.get_paths()["stdlib"]),
                    help="directory of .py files (default: the standard library)")
    ap.add_argument("--subset-mb", type=float, default=1.5,
                    help="size of the no-prefilter comparison subset (default 1.5 MB)")
    ap.add_argument("--top", type=int, default=8, help="files with most redactions to list")
    ap.add_argument("--json", action="store_true", help="print the counters as JSON")
    ap.add_argument("--baseline", metavar="REV|FILE", default=None,
                    help="also run this version of the secrets filter (git revision, file or "
                         "package folder)")
    args = ap.parse_args()

    files = corpus_texts(args.root)
    texts = [t for _, t in files]
    sizes = [len(t.encode("utf-8", "surrogatepass")) for t in texts]
    total_bytes = sum(sizes)
    redact("warm-up: api_key = 'x'")  # loads the detect-secrets plugins once

    full_s, results = timed(texts)
    redactions = sum(r.count for r in results)
    kinds: dict[str, int] = {}
    for r in results:
        for k, n in r.kinds.items():
            kinds[k] = kinds.get(k, 0) + n

    # Evenly spread subset of about --subset-mb for the slow path.
    stride = max(1, round(total_bytes / (args.subset_mb * 1e6)))
    subset = list(range(0, len(texts), stride))
    sub_texts = [texts[i] for i in subset]
    sub_bytes = sum(sizes[i] for i in subset)
    sub_with_s, sub_with = timed(sub_texts)
    sub_without_s, sub_without = timed(sub_texts, prefilter=False)
    mismatches = [files[i][0] for i, a, b in zip(subset, sub_with, sub_without) if a != b]
    ds_s, ds_found = detect_secrets_alone([files[i] for i in subset])

    counters = {
        "corpus": str(args.root),
        "files": len(texts),
        "bytes": total_bytes,
        "seconds_with_prefilter": round(full_s, 3),
        "redactions": redactions,
        "redactions_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        "subset_files": len(subset),
        "subset_bytes": sub_bytes,
        "subset_seconds_with_prefilter": round(sub_with_s, 3),
        "subset_seconds_without_prefilter": round(sub_without_s, 3),
        "subset_mismatches": mismatches,
        "subset_seconds_detect_secrets_alone": round(ds_s, 3),
        "subset_detect_secrets_alone_findings": ds_found,
    }
    if args.baseline:
        counters["baseline"] = {"version": args.baseline, **baseline_counters(
            load_baseline(args.baseline), texts, total_bytes)}
    mb = total_bytes / 1e6
    sub_mb = sub_bytes / 1e6
    rates = {
        "with_prefilter_mb_per_s": mb / full_s,  # bytes / seconds, whole corpus
        "subset_with_prefilter_mb_per_s": sub_mb / sub_with_s,
        "without_prefilter_mb_per_s": sub_mb / sub_without_s,  # subset only
        "detect_secrets_alone_mb_per_s": sub_mb / ds_s,  # subset only
        "redactions_per_mb": redactions / mb,
    }
    if args.json:
        print(json.dumps({**counters, **{k: round(v, 2) for k, v in rates.items()}}, indent=2))
        return

    print(f"corpus: {args.root}  ({len(texts)} files, {mb:.1f} MB)")
    print(f"with prefilter:     {rates['with_prefilter_mb_per_s']:7.1f} MB/s  (whole corpus)")
    print(f"without prefilter:  {rates['without_prefilter_mb_per_s']:7.2f} MB/s  "
          f"(subset: {len(subset)} files, {sub_mb:.2f} MB; prefiltered on it: "
          f"{rates['subset_with_prefilter_mb_per_s']:.1f} MB/s, "
          f"speed-up x{sub_without_s / sub_with_s:.0f})")
    print(f"detect-secrets alone: {rates['detect_secrets_alone_mb_per_s']:5.2f} MB/s  "
          f"(its own line scan over every line of the subset, {ds_found} findings)")
    same = "yes" if not mismatches else "NO: " + ", ".join(mismatches)
    print(f"same output on the subset: {same}")
    print(f"redactions: {redactions} = {rates['redactions_per_mb']:.2f} per MB")
    for k, n in counters["redactions_by_kind"].items():
        print(f"  {k:32s} {n:6d}  {n / mb:6.2f}/MB")
    if args.baseline:
        b = counters["baseline"]
        print(f"baseline {b['version']}: redactions {b['redactions']} ="
              f" {b['redactions_per_mb']:.2f} per MB (now {rates['redactions_per_mb']:.2f},"
              f" x{rates['redactions_per_mb'] / max(b['redactions_per_mb'], 1e-9):.2f});"
              f" {b['mb_per_s']:.1f} MB/s (now {rates['with_prefilter_mb_per_s']:.1f})")
        for k, n in counters["redactions_by_kind"].items():
            was = b["redactions_by_kind"].get(k, 0)
            if n != was:
                print(f"  {k:32s} {was:6d} -> {n:6d}")
    top = sorted(zip(files, results), key=lambda fr: -fr[1].count)[: args.top]
    print("files with most redactions:")
    for (path, _), r in top:
        if r.count:
            print(f"  {r.count:5d}  {path}")


if __name__ == "__main__":
    main()
