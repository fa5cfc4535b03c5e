"""The fuzz suite's Hypothesis profiles: a bounded, reproducible budget for CI.

- ``ci`` (the default): derandomized (the same examples every run), no example
  database (nothing written to the tree), no per-example deadline (2 busy cores make
  timings meaningless); ``max_examples`` per test is the profile's figure scaled by a
  test's own ``@settings`` where it is slower, so the folder runs in about a minute.
- ``long``: for local hunting, random and many examples; the failures it finds are
  replayed first on the next run from an example database outside the tree
  (``ASSISTD_FUZZ_DB``, default ``<tmp>/assistd-fuzz-examples``).

Pick a profile with ``HYPOTHESIS_PROFILE=long``; ``ASSISTD_FUZZ_EXAMPLES=N`` sets the
examples per test of either profile, e.g.
``ASSISTD_FUZZ_EXAMPLES=5000 HYPOTHESIS_PROFILE=long .venv/bin/python -m pytest tests/fuzz``.
Every failure Hypothesis found is kept as an explicit ``@example`` or plain test beside
its property (see /tmp/notes/fuzz_findings.md for the write-ups).
"""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_EXAMPLES = os.environ.get("ASSISTD_FUZZ_EXAMPLES")
# Slow tests name a fraction of the budget: examples(0.2) -> a fifth of the profile's.
BASE = {"ci": 100, "long": 2000}
# Big generated inputs (huge strings, deep nesting) are the point here, not a smell.
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
          HealthCheck.function_scoped_fixture]

settings.register_profile(
    "ci", max_examples=int(_EXAMPLES or BASE["ci"]), deadline=None, derandomize=True,
    database=None, print_blob=True, suppress_health_check=_QUIET)
settings.register_profile(
    "long", max_examples=int(_EXAMPLES or BASE["long"]), deadline=None, derandomize=False,
    database=DirectoryBasedExampleDatabase(os.environ.get(
        "ASSISTD_FUZZ_DB", os.path.join(tempfile.gettempdir(), "assistd-fuzz-examples"))),
    print_blob=True, suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(fraction: float) -> int:
    """``fraction`` of the loaded profile's max_examples (at least 1): for the tests
    whose one example costs a database write, an HTTP request or an LSP round trip."""
    return max(1, int(settings().max_examples * fraction))
