"""Follow repositories and transcript locations live (watchdog) and keep the history current.

watchdog's observer threads only put raw events on a queue. One thread (the one
that calls :meth:`HistoryWatcher.run`, which owns the SQLite connection) takes a
batch: it waits for a first event, then keeps draining until the events pause
for ``debounce_s`` or ``max_delay_s`` has passed since it started collecting. Every path
touched in the batch is then checked once, so a ``git checkout`` that touches
thousands of files, or an editor's save as write-temp + rename, costs one read
and at most one tokenization per file. Between batches the thread blocks on the
queue: an idle watcher uses no CPU.

Events are routed by location: under a repository root to that repository's
:class:`~storage.indexer.RepoIndexer` (ignore rules apply there), an aider
``.aider.chat.history.md`` in a repository and any file under a transcript
location to the :class:`~storage.ingest.TranscriptIngester`.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

from storage.indexer import IndexReport, RepoIndexer
from storage.ingest import (
    TRANSCRIPT_SUFFIXES,
    TranscriptIngester,
    TranscriptReport,
    iter_transcript_files,
)
from storage.store import HistoryStore

log = logging.getLogger(__name__)

AIDER_HISTORY = ".aider.chat.history.md"
_KEEP = {"created", "modified", "deleted", "moved", "closed"}


@dataclass
class BatchReport:
    """What one batch of events did."""

    events: int = 0
    repo_paths: int = 0  # distinct repository paths re-checked
    transcript_files: int = 0
    repos: list[IndexReport] = field(default_factory=list)
    transcripts: TranscriptReport = field(default_factory=TranscriptReport)
    first_event_monotonic: float = 0.0  # when the batch's first event was queued
    done_monotonic: float = 0.0  # when its changes were committed
    started_utc: float = 0.0  # wall clock when the batch began applying changes

    @property
    def tokenized(self) -> int:
        return sum(r.tokenized for r in self.repos) + self.transcripts.records_put


class _Enqueue(FileSystemEventHandler):
    def __init__(self, q: queue.SimpleQueue):
        self.q = q

    def on_any_event(self, event):
        # A directory's "modified" only says its listing changed; the entries' own
        # events carry the change (walking the directory for it would cost a scan).
        if event.event_type in _KEEP and not (event.is_directory
                                              and event.event_type == "modified"):
            self.q.put((time.monotonic(), event.event_type, os.fsdecode(event.src_path),
                        os.fsdecode(getattr(event, "dest_path", "") or "")))


class HistoryWatcher:
    """Keeps repositories and transcripts in the history current as files change.

    ``repos``: repository roots (scopes). ``transcripts``: transcript folders or files
    (default locations are found by :func:`default_transcript_locations`). Call
    :meth:`scan` once, then :meth:`run` in the thread that owns ``store``.
    """

    def __init__(self, store: HistoryStore, tokenize: Callable[[str], list[int]],
                 fingerprint: str, *, repos=(), transcripts=(), max_bytes: int = 1_000_000,
                 debounce_s: float = 0.05, max_delay_s: float = 0.5,
                 on_batch: Callable[[BatchReport], None] | None = None):
        self.store = store
        self.indexers = [RepoIndexer(store, Path(r), tokenize, fingerprint, max_bytes=max_bytes)
                         for r in repos]
        self.ingester = TranscriptIngester(store, tokenize, fingerprint,
                                           max_record_bytes=max_bytes)
        self.transcripts = [Path(os.path.abspath(t)) for t in transcripts]
        self.debounce_s = debounce_s
        self.max_delay_s = max_delay_s
        self.on_batch = on_batch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._observer = None
        self._handler = _Enqueue(self._queue)
        self._missing: set[int] = set()  # indexers whose root is gone (its watch died with it)

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        """Start watching (events queue up until :meth:`run` or :meth:`process_batch`).
        Start before :meth:`scan` so that no change made during the scan is missed."""
        observer = Observer()
        handler = self._handler
        self._watches = {}
        for i, ix in enumerate(self.indexers):
            self._watches[i] = observer.schedule(handler, str(ix.root), recursive=True)
        for t in self.transcripts:
            if t.is_dir():
                observer.schedule(handler, str(t), recursive=True)
            elif t.parent.is_dir():
                observer.schedule(handler, str(t.parent), recursive=False)
        observer.start()
        self._observer = observer

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None

    def scan(self, progress=None) -> tuple[list[IndexReport], TranscriptReport]:
        """Initial pass over everything watched."""
        repo_reports = []
        for ix in self.indexers:
            repo_reports.append(ix.scan(progress))
        report = TranscriptReport()
        for ix in self.indexers:
            aider = ix.root / AIDER_HISTORY
            if aider.is_file():  # inside a repository: a link is not followed, as there
                report.add(self.ingester.ingest(aider, ix.scope, follow=False))
        for f in iter_transcript_files(self.transcripts, report):
            report.add(self.ingester.ingest(f))
        return repo_reports, report

    def run(self, stop: threading.Event | None = None, poll_s: float = 1.0) -> None:
        """Process batches until ``stop`` is set (or KeyboardInterrupt)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            self.process_batch(timeout=poll_s)
            self._check_roots()

    def run_until_stopped(self, on_batch: Callable[[BatchReport], None] | None = None,
                          poll_s: float = 1.0) -> None:
        """:meth:`run` until SIGTERM or SIGINT (Ctrl-C), then :meth:`stop`.

        Call from the main thread (only it can install signal handlers), after
        :meth:`start` and :meth:`scan`; ``on_batch``, when given, replaces
        :attr:`on_batch`. SIGTERM (a service manager, ``kill``) stops as cleanly as
        Ctrl-C: the batch in hand is committed and the observer joined. SIGINT is
        handled explicitly too: a process started with SIGINT ignored (inherited from
        its parent, as under an asyncio test runner) would otherwise never see
        KeyboardInterrupt. The previous handlers are back on return; closing the
        store stays with the caller."""
        import signal

        if on_batch is not None:
            self.on_batch = on_batch
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set())
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.run(stop, poll_s)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
            for sig, handler in previous.items():
                if handler is not None:  # None: installed outside Python, cannot restore
                    signal.signal(sig, handler)

    def _check_roots(self) -> None:
        """A repository deleted while watched takes its inotify watch with it: warn, and
        when it comes back (re-cloned, restored), watch and scan it again."""
        for i, ix in enumerate(self.indexers):
            present = ix.root.is_dir()
            if not present and i not in self._missing:
                self._missing.add(i)
                log.warning("%s is gone; watching for it to come back", ix.root)
            elif present and i in self._missing:
                self._missing.discard(i)
                if self._observer is not None:
                    old = self._watches.pop(i, None)
                    if old is not None:  # the dead watch, or schedule() would return it
                        try:
                            self._observer.unschedule(old)
                        except (KeyError, OSError):
                            pass
                    self._watches[i] = self._observer.schedule(self._handler, str(ix.root),
                                                               recursive=True)
                report = ix.scan()
                log.warning("%s is back: rescanned (%d documents)", ix.root, report.documents)
                if self.on_batch is not None:
                    self.on_batch(BatchReport(repos=[report], started_utc=time.time()))

    # -- batches ------------------------------------------------------------------

    def process_batch(self, timeout: float | None = None) -> BatchReport | None:
        """Wait up to ``timeout`` s for an event, then coalesce and apply one batch."""
        try:
            first = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        events = [first]
        start = time.monotonic()
        while True:
            try:  # take everything already queued (a backlog is one batch, not many)
                events.append(self._queue.get_nowait())
                continue
            except queue.Empty:
                pass
            if time.monotonic() - start >= self.max_delay_s:
                break
            try:  # then wait for the burst to pause
                events.append(self._queue.get(timeout=self.debounce_s))
            except queue.Empty:
                break
        batch = BatchReport(events=len(events), first_event_monotonic=first[0],
                            started_utc=time.time())
        repo_paths: dict[int, set[str]] = {}
        transcript_files: dict[str, str | None] = {}
        for _, kind, src, dest in events:
            for p in (src, dest) if kind == "moved" else (src,):
                if p:
                    self._route(p, repo_paths, transcript_files)
        for i, rels in repo_paths.items():
            try:
                batch.repos.append(self.indexers[i].update(rels))
            except Exception:  # noqa: BLE001 - a watcher must outlive any one bad batch
                log.exception("updating %s failed", self.indexers[i].root)
            batch.repo_paths += len(rels)
        for f, scope in transcript_files.items():
            path = Path(f)
            # Refusals under a folder are counted in the batch, as the initial scan's are.
            files = (list(iter_transcript_files([path], batch.transcripts, warn_given=False))
                     if path.is_dir() else [path])
            for tf in files:
                try:  # a link is followed only where the user named it
                    batch.transcripts.add(self.ingester.ingest(
                        tf, scope, follow=tf in self.transcripts))
                except Exception:  # noqa: BLE001
                    log.exception("ingesting %s failed", tf)
                batch.transcript_files += 1
        batch.done_monotonic = time.monotonic()
        if self.on_batch is not None:
            self.on_batch(batch)
        return batch

    def _route(self, p: str, repo_paths, transcript_files) -> None:
        for t in self.transcripts:
            ts = str(t)
            if p == ts or p.startswith(ts + os.sep):
                if t.is_dir() and not (p.endswith(TRANSCRIPT_SUFFIXES) or os.path.isdir(p)):
                    return
                transcript_files.setdefault(p, None)
                return
        for i, ix in enumerate(self.indexers):
            rs = str(ix.root)
            if p.startswith(rs + os.sep):
                rel = Path(p).relative_to(ix.root).as_posix()
                if rel == AIDER_HISTORY:
                    transcript_files[p] = ix.scope
                    return
                repo_paths.setdefault(i, set()).add(rel)
                return


def default_transcript_locations() -> list[Path]:
    """Coding agents' transcript folders that exist on this machine: Claude Code
    ``~/.claude/projects``, Codex ``$CODEX_HOME/sessions`` (default ``~/.codex``),
    Gemini CLI ``~/.gemini/tmp``."""
    home = Path.home()
    codex_home = Path(os.environ.get("CODEX_HOME") or home / ".codex")
    candidates = [home / ".claude" / "projects", codex_home / "sessions", home / ".gemini" / "tmp"]
    return [p for p in candidates if p.is_dir()]
