"""Texts that both the tests and the benchmarks feed the engine."""

from __future__ import annotations

import textwrap

# A file that repeats its own block, cut inside the third copy: the copy-heavy case,
# where drafts from the context itself should be accepted (coverage > 0).
COPY_HEAVY = textwrap.dedent('''\
    def load_users(path):
        with open(path, encoding="utf-8") as f:
            rows = [line.rstrip("\\n").split(",") for line in f]
        return [{"name": r[0], "email": r[1], "age": int(r[2])} for r in rows]


    def load_orders(path):
        with open(path, encoding="utf-8") as f:
            rows = [line.rstrip("\\n").split(",") for line in f]
        return [{"name": r[0], "email": r[1], "age": int(r[2])} for r in rows]


    def load_items(path):
        with open(path, encoding="utf-8") as f:
    ''')
