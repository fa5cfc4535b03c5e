"""Logging for the commands that speak a protocol on stdio (`assistd lsp`, `assistd mcp`).

stdout (or the socket) carries the protocol, so the log goes to stderr, and there only
warnings and errors, since an editor or agent shows stderr to its user; ``--log-file``
keeps everything. Imports nothing of assistd.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(log_file: Path | str | None = None, verbose: bool = False) -> None:
    """Configure the root logger: warnings and errors to stderr; with ``log_file``,
    every record from INFO (DEBUG when ``verbose``) to that file too.

    Through :func:`logging.basicConfig`, so it does nothing when the root logger
    already has handlers (the first configuration of a process wins)."""
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setLevel(logging.WARNING)
    handlers: list[logging.Handler] = [stderr]
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=handlers,
                        format=FORMAT)
