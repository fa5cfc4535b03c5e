"""Logging for the commands that speak a protocol on stdio (`assistd lsp`, `assistd mcp`).

stdout (or the socket) carries the protocol, so the log goes to stderr, and there only
warnings and errors, since an editor or agent shows stderr to its user; ``--log-file``
keeps everything. Imports nothing of assistd.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
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
    limit = RateLimitFilter()
    for h in handlers:
        h.addFilter(limit)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=handlers,
                        format=FORMAT)


class RateLimitFilter(logging.Filter):
    """A flood of one message is counted, not repeated; a flood of many is capped.

    Warnings and errors are keyed by (logger, level, message template: ``record.msg``
    before its arguments), so a flood of one complaint with many arguments is one
    line; INFO and DEBUG records by their formatted text, so that a log asked for
    (``-v``: one line per editor request, its timing and ledger) keeps every line that
    says something new, and only exact repeats are counted. The first record of a key passes; the others within ``window_s``
    seconds are dropped and counted; the first of the key after the window passes
    with `` [repeated N more times in the last S s, not logged]`` added to its message.
    Beyond that, at most ``per_s`` records a second pass (bursts of ``burst``), whatever
    their keys: text formatted before logging makes every record a new key. Those
    dropped are told on the next record that passes. :meth:`pending` tells what is
    counted but not yet reported, :meth:`log_pending` says it (at exit), each message as
    its last dropped record formatted it, never its bare template.

    Put one instance on every handler: the decision is made once per record (kept on
    the record), so the handlers agree. At most ``max_keys`` keys are remembered, the
    least recently seen forgotten. ``clock``: seconds, monotonic. Thread-safe."""

    def __init__(self, window_s: float = 60.0, max_keys: int = 4096, per_s: float = 20.0,
                 burst: float = 200.0, clock=time.monotonic):
        super().__init__()
        self._clock = clock  # seconds; a test's own clock
        self.window_s, self.max_keys, self.per_s, self.burst = window_s, max_keys, per_s, burst
        # key -> [window start (monotonic), dropped, last dropped message formatted]
        self._seen: dict[tuple, list] = {}
        self._tokens, self._refilled = burst, clock()
        self._over = 0  # dropped by the overall rate since the last record that passed
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        decided = getattr(record, "_assistd_rate_limit", None)
        if decided is not None:
            return decided
        if record.levelno >= logging.WARNING:
            text = str(record.msg)
        else:
            try:
                text = record.getMessage()
            except (TypeError, ValueError):  # bad arguments: logging reports it itself
                text = str(record.msg)
        key = (record.name, record.levelno, text)
        now = self._clock()
        with self._lock:
            self._tokens = min(self.burst, self._tokens + (now - self._refilled) * self.per_s)
            self._refilled = now
            entry = self._seen.pop(key, None)
            passed = False
            if entry is not None and now - entry[0] < self.window_s:
                _count_dropped(entry, record, text)
            elif self._tokens < 1:
                self._over += 1
                if entry is not None:
                    _count_dropped(entry, record, text)
            else:
                self._tokens -= 1
                notes = []
                if entry is not None and entry[1]:
                    notes.append(f"repeated {entry[1]} more times in the last"
                                 f" {now - entry[0]:.0f} s, not logged")
                if self._over:
                    notes.append(f"{self._over} records dropped before this one: over"
                                 f" {self.per_s:g} records/s")
                    self._over = 0
                if notes:
                    record.msg = f"{record.msg} [{'; '.join(notes)}]"
                entry = [now, 0, None]
                passed = True
            if entry is None:  # dropped by the overall rate before it was ever logged
                pass
            else:
                self._seen[key] = entry  # last: the least recently seen is forgotten first
            if len(self._seen) > self.max_keys:
                del self._seen[next(iter(self._seen))]
        record._assistd_rate_limit = passed
        return passed

    def pending(self, formatted: bool = False) -> list[tuple[str, str, int]]:
        """``(logger, message template or text, dropped)`` for every key with dropped
        records not yet reported; ``formatted``: the message as the last of them was
        formatted (a warning's key is its template, ``'%s: %d file(s) not read: %s'``)."""
        with self._lock:
            return [(k[0], (e[2] or k[2]) if formatted else k[2], e[1])
                    for k, e in self._seen.items() if e[1]]

    def log_pending(self, logger: logging.Logger) -> None:
        """Say on ``logger`` (INFO) what was dropped and not yet reported, one line per
        message, formatted: what a process says as it stops."""
        for name, text, n in self.pending(formatted=True):
            logger.info("%s: %r was repeated %d more times, not logged", name, text, n)


def _count_dropped(entry: list, record: logging.LogRecord, key_text: str) -> None:
    """One more record of ``entry``'s key dropped; keep its message, formatted (a key's
    text is a warning's bare template), for :meth:`RateLimitFilter.pending`."""
    entry[1] += 1
    if record.levelno < logging.WARNING:
        return  # an INFO key is its formatted text already
    try:
        entry[2] = record.getMessage()
    except (TypeError, ValueError):  # bad arguments: the template says what it was
        entry[2] = key_text
