"""The ``assistd`` command line: a thin layer over the runtime, the history and the
Targets. One module per command family registers its commands on :data:`cli`
(:mod:`assistd.cli.app`), and :mod:`assistd.cli.render` prints every report, as JSON
or for people:

- ``complete``: :mod:`assistd.cli.complete` (the Target's flags: :mod:`assistd.cli.target`)
- ``index``, ``history``: :mod:`assistd.cli.history`
- ``serve``, ``status``: :mod:`assistd.cli.daemon`
- ``mcp``, ``lsp``: :mod:`assistd.cli.frontends`
- ``replay``, ``bench``, ``stats``, ``peers``: :mod:`assistd.cli.measure`
"""

from __future__ import annotations

from assistd.cli import complete, daemon, frontends, history, measure  # noqa: F401 (register)
from assistd.cli.app import cli

__all__ = ["cli", "main"]


def main():
    cli(prog_name="assistd")
