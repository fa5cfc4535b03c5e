"""Index a repository into the history: tokenize changed text files, forget deleted ones.

Incremental: a file whose size and mtime match the stored document is not read; a
file whose bytes hash to the stored content hash is not re-tokenized. Binary files
(a NUL byte in the first 8 KiB, as git decides) and files over ``max_bytes`` are
skipped and counted; non-UTF-8 text is decoded with replacement characters and
counted; a file that vanishes (``vanished``: deleted between the walk and the read) or
cannot be read (``skipped_unreadable``) mid-index is counted, not fatal.
A file is read through :func:`storage.walk.open_checked`: one swapped for a FIFO, a
symbolic link or a path out of the repository since the walk listed it is refused and
counted by reason (``IndexReport.refused``), never waited on or stored. A FIFO, socket
or device the walk finds (not ignored) is counted there too (``NOT_REGULAR``), unread, as
are a file whose read would block though stat() calls it regular (``WOULD_BLOCK``:
/proc/kmsg) and a pseudo filesystem the walk does not enter (``PSEUDO_FS``: /proc, /sys).
Secrets are redacted (:mod:`storage.secrets`) before the text is stored or tokenized.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from assistd.ground.languages import language_id
from storage.secrets import redact
from storage.store import HistoryStore
from storage.walk import (
    IGNORE_FILES, NOT_REGULAR, SYMLINK, IgnoreRules, Refused, iter_files, open_checked,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 1_000_000
BINARY_SNIFF_BYTES = 8192


@dataclass
class IndexReport:
    """Counts from one indexing pass (documents, except ``tokens``)."""

    scope: str
    documents: int = 0  # text documents in the history after the pass
    tokens: int = 0  # tokens added by this pass
    tokenized: int = 0  # documents (re-)tokenized by this pass
    unchanged: int = 0
    removed: int = 0
    skipped_binary: int = 0
    skipped_large: int = 0
    skipped_unreadable: int = 0  # no permission, a non-UTF-8 name, an I/O error
    vanished: int = 0  # listed by the walk, deleted (or moved away) before it was read
    decoded_with_replacement: int = 0
    redactions: int = 0  # secret values replaced before storing
    # Files not read, by reason (storage.walk: NOT_REGULAR, SYMLINK, OUTSIDE, WOULD_BLOCK,
    # and PSEUDO_FS for a directory not walked) -> count.
    refused: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    def refuse(self, rel: str, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        log.debug("refused %s: %s", rel, reason)  # the summary line is per reason

    def not_found(self, rel: str, e: OSError) -> None:
        """Count a file that could not be stat'ed or read: ``vanished`` when it is gone
        (deleted or moved away since the walk listed it: no longer there to read, not a
        fault), else ``skipped_unreadable``."""
        if e.errno in (errno.ENOENT, errno.ENOTDIR):  # ENOTDIR: a folder above it replaced
            self.vanished += 1
            log.debug("vanished %s: %s", rel, e.strerror)
        else:
            self.skipped_unreadable += 1
            log.info("skipped %s: %s", rel, e.strerror)

    def log_refused(self) -> None:
        """One log line per refusal reason, with its count (never one per file)."""
        for reason, n in sorted(self.refused.items()):
            log.warning("%s: %d file(s) not read: %s", self.scope, n, reason)


def is_repository(path: Path) -> bool:
    return (path / ".git").exists()


def find_repository_root(path: Path) -> Path:
    """The nearest ancestor of ``path`` (a file or directory) holding ``.git``; else its directory."""
    path = path.resolve()
    start = path if path.is_dir() else path.parent
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return start


def is_binary(data: bytes) -> bool:
    """git's heuristic: a NUL byte in the first 8 KiB means binary."""
    return b"\0" in data[:BINARY_SNIFF_BYTES]


class _CountingRules(IgnoreRules):
    """The walk's ignore rules, which also count, in each directory a walk loads (as
    :func:`storage.walk.iter_files` does when it descends), the entries that are not
    ignored and are neither regular files, directories nor links (a FIFO, a socket, a
    device): the walk skips them unread, ``report`` counts them (``NOT_REGULAR``).
    ``report`` None: nothing is counted (a watcher's check of one path)."""

    def __init__(self, root: Path, report: IndexReport | None = None):
        self.report = report
        super().__init__(root)

    def load_dir(self, rel_dir: str) -> None:
        super().load_dir(rel_dir)
        if self.report is None:
            return
        try:
            entries = list(os.scandir(self.root / rel_dir if rel_dir else self.root))
        except OSError:  # vanished or unreadable: the walk skips it too
            return
        for e in entries:
            try:  # the type readdir gave: no stat, never an open
                special = not (e.is_file(follow_symlinks=False) or e.is_dir(follow_symlinks=False)
                               or e.is_symlink())
            except OSError:
                continue
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            if special and not self.ignored(rel, False):
                self.report.refuse(rel, NOT_REGULAR)

    def skipped(self, rel: str, reason: str) -> None:
        """A directory the walk did not enter (a pseudo filesystem), counted by reason."""
        if self.report is not None:
            self.report.refuse(rel, reason)


class RepoIndexer:
    """Keeps one repository's documents in the history current for one tokenizer.

    :meth:`scan` is a full incremental pass; :meth:`update` re-checks only the paths a
    watcher reported (files or directories, created, changed, moved or deleted). Both
    tokenize a file only when its bytes changed, so a burst of events for one file
    (a ``git checkout``, an editor's write-temp-then-rename save) costs one tokenization.

    ``log_refusals``: log each pass's files not read, one line per reason (the daemon's
    only account of them); False where the caller prints the report itself (``assistd
    index`` prints the same counts in its summary: once is enough).
    """

    def __init__(self, store: HistoryStore, root: Path, tokenize: Callable[[str], list[int]],
                 fingerprint: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 recursive: bool = True, log_refusals: bool = True):
        self.store = store
        self.root = root.resolve()
        self.scope = str(self.root)
        self.tokenize = tokenize
        self.fingerprint = fingerprint
        self.max_bytes = max_bytes
        self.recursive = recursive
        self.log_refusals = log_refusals
        self.rules = _CountingRules(self.root)

    def scan(self, progress: Callable[[int, int], None] | None = None) -> IndexReport:
        """Bring every document of the repository up to date; forget deleted files.

        ``progress(done, total)`` is called after each file (for a progress bar).
        """
        report = IndexReport(scope=self.scope)
        # Ignore files may have changed since; the rules count what the walk skips.
        self.rules = _CountingRules(self.root, report)
        known = self.store.documents(self.scope)
        tokenized = self.store.tokenized_ids(self.scope, self.fingerprint)
        files = list(iter_files(self.root, self.recursive, self.rules))
        seen: set[str] = set()
        for n, (rel, full) in enumerate(files, 1):
            if self._index_file(rel, full, known.get(rel), tokenized, report):
                seen.add(rel)
            if progress is not None:
                progress(n, len(files))
        self.rules.report = None  # later checks of one path (update) count nothing here
        gone = [doc.id for rel, doc in known.items() if rel not in seen]
        report.removed = self.store.remove_documents(gone)
        report.documents = len(seen)
        self.store.mark_indexed(self.scope, self.recursive)
        if self.log_refusals:
            report.log_refused()
        return report

    def update(self, rel_paths) -> IndexReport:
        """Re-check the given relative POSIX paths (files or directories).

        A path that no longer exists, became ignored or is not a regular file is
        forgotten together with everything stored under it; a directory is walked.
        A change to an ignore file re-reads the rules and rescans the repository.
        """
        rel_paths = sorted(set(rel_paths))
        if any(p.rsplit("/", 1)[-1] in IGNORE_FILES or p in (".git/info/exclude",)
               for p in rel_paths):
            return self.scan()
        report = IndexReport(scope=self.scope)
        known = self.store.documents(self.scope)
        tokenized = self.store.tokenized_ids(self.scope, self.fingerprint)
        ordered = sorted(known)
        gone: set[int] = set()
        walked: list[str] = []  # directories walked in this call (sorted order: parents first)
        for rel in rel_paths:
            if rel in ("", ".") or rel == ".git" or rel.startswith(".git/"):
                continue
            if any(rel.startswith(d + "/") for d in walked):
                continue  # already checked by its directory's walk
            if not self.recursive and "/" in rel:
                continue
            full = self.root / rel
            try:
                mode = full.lstat().st_mode
            except OSError:
                mode = None
            under = _under(known, ordered, rel)
            if mode is not None and stat.S_ISDIR(mode) and not self.rules.excluded(rel, True):
                walked.append(rel)
                present = set()
                self.rules.report = report  # the FIFOs of the folders this walk loads
                try:
                    for frel, ffull in iter_files(self.root, self.recursive, self.rules,
                                                  under=rel):
                        if self._index_file(frel, ffull, known.get(frel), tokenized, report):
                            present.add(frel)
                finally:
                    self.rules.report = None
                gone.update(d.id for d in under if d.path not in present)
            elif (mode is not None and stat.S_ISREG(mode)
                  and not self.rules.excluded(rel, False)):
                if not self._index_file(rel, full, known.get(rel), tokenized, report):
                    gone.update(d.id for d in under)
            else:  # deleted, moved away, ignored, a symlink, or a FIFO (counted, unread)
                if (mode is not None and not stat.S_ISLNK(mode) and not stat.S_ISDIR(mode)
                        and not stat.S_ISREG(mode) and not self.rules.excluded(rel, False)):
                    report.refuse(rel, NOT_REGULAR)
                gone.update(d.id for d in under)
        report.removed = self.store.remove_documents(sorted(gone))
        report.documents = self.store.db.execute(
            "select count(*) from documents where scope = ? and source_kind = 'repo'",
            [self.scope]).fetchone()[0]
        if self.log_refusals:
            report.log_refused()
        return report

    def _index_file(self, rel: str, full: Path, doc, tokenized: dict[int, str],
                    report: IndexReport) -> bool:
        """Index one regular file; return whether it belongs in the history now."""
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:  # a non-UTF-8 file name cannot be a history path
            report.skipped_unreadable += 1
            log.info("skipped %r: file name is not UTF-8", rel)
            return False
        try:
            st = full.lstat()  # never follows a link, never opens (a FIFO's open blocks)
        except OSError as e:  # deleted since the walk listed it, most likely
            report.not_found(rel, e)
            return False
        if not stat.S_ISREG(st.st_mode):  # swapped since the walk listed it
            report.refuse(rel, SYMLINK if stat.S_ISLNK(st.st_mode) else NOT_REGULAR)
            return False
        if st.st_size > self.max_bytes:
            report.skipped_large += 1
            return False
        if (
            doc is not None
            and doc.mtime_ns == st.st_mtime_ns
            and doc.num_bytes == st.st_size
            and tokenized.get(doc.id) == doc.content_hash
        ):
            report.unchanged += 1
            return True
        try:  # and what is opened is checked again: it may be swapped after the lstat
            with open_checked(full, root=self.root) as f:
                st = os.fstat(f.fileno())
                data = f.read(self.max_bytes + 1)
        except Refused as e:
            report.refuse(rel, e.reason)
            return False
        except OSError as e:  # vanished or unreadable between walk and read
            report.not_found(rel, e)
            return False
        if len(data) > self.max_bytes:  # grew since the stat
            report.skipped_large += 1
            return False
        if is_binary(data):
            report.skipped_binary += 1
            return False
        content_hash = hashlib.sha256(data).hexdigest()
        if doc is not None and doc.content_hash == content_hash:
            if tokenized.get(doc.id) != content_hash:
                text = self.store.document_text(doc.id)
                ids = self.tokenize(text)
                self.store.add_tokenization(doc.id, self.fingerprint, content_hash, ids)
                tokenized[doc.id] = content_hash
                report.tokenized += 1
                report.tokens += len(ids)
            else:
                report.unchanged += 1
            if doc.mtime_ns != st.st_mtime_ns:
                self.store.touch(doc.id, st.st_mtime_ns)
            return True
        try:
            text = data.decode("utf-8")
            replaced = False
        except UnicodeDecodeError:
            text = data.decode("utf-8", errors="replace")
            replaced = True
            report.decoded_with_replacement += 1
        clean = redact(text, filename=rel)
        report.redactions += clean.count
        ids = self.tokenize(clean.text)
        doc_id = self.store.put_document(
            scope=self.scope, path=rel, source_kind="repo", language_id=language_id(rel),
            content_hash=content_hash, num_bytes=len(data), mtime_ns=st.st_mtime_ns,
            text=clean.text, decoded_with_replacement=replaced, fingerprint=self.fingerprint,
            token_ids=ids, redactions=clean.count,
        )
        tokenized[doc_id] = content_hash
        report.tokenized += 1
        report.tokens += len(ids)
        return True


def _under(known: dict, ordered: list[str], rel: str) -> list:
    """Documents stored at ``rel`` or below it (``ordered`` = sorted(known)), by bisection.

    >>> docs = {"a": 1, "a/b": 2, "a/c/d": 3, "a.py": 4, "ab": 5}
    >>> _under(docs, sorted(docs), "a")
    [1, 2, 3]
    """
    out = [known[rel]] if rel in known else []
    prefix = rel + "/"
    i = bisect.bisect_left(ordered, prefix)
    while i < len(ordered) and ordered[i].startswith(prefix):
        out.append(known[ordered[i]])
        i += 1
    return out


def index_repository(
    store: HistoryStore,
    root: Path,
    tokenize: Callable[[str], list[int]],
    fingerprint: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    recursive: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> IndexReport:
    """Bring the history of the repository at ``root`` up to date for one tokenizer.

    ``tokenize`` maps text to Target token ids; ``fingerprint`` identifies that
    tokenizer (see ``Target.fingerprint``). The scope is the resolved root path.
    ``recursive=False`` indexes only the files directly in ``root`` (used when a
    file outside any git repository is completed, so that completing ``~/notes.txt``
    does not index the whole home directory).
    """
    return RepoIndexer(store, root, tokenize, fingerprint, max_bytes=max_bytes,
                       recursive=recursive).scan(progress)
