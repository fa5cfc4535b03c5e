"""Index a repository into the history: tokenize changed text files, forget deleted ones.

Incremental: a file whose size and mtime match the stored document is not read; a
file whose bytes hash to the stored content hash is not re-tokenized. Binary files
(a NUL byte in the first 8 KiB, as git decides) and files over ``max_bytes`` are
skipped and counted; non-UTF-8 text is decoded with replacement characters and
counted; a file that vanishes or cannot be read mid-index is counted, not fatal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from assistd.languages import language_id
from storage.store import HistoryStore
from storage.walk import iter_files

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
    skipped_unreadable: int = 0
    decoded_with_replacement: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


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


def index_repository(
    store: HistoryStore,
    root: Path,
    tokenize: Callable[[str], list[int]],
    fingerprint: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    recursive: bool = True,
) -> IndexReport:
    """Bring the history of the repository at ``root`` up to date for one tokenizer.

    ``tokenize`` maps text to Target token ids; ``fingerprint`` identifies that
    tokenizer (see ``Target.fingerprint``). The scope is the resolved root path.
    ``recursive=False`` indexes only the files directly in ``root`` (used when a
    file outside any git repository is completed, so that completing ``~/notes.txt``
    does not index the whole home directory).
    """
    root = root.resolve()
    scope = str(root)
    report = IndexReport(scope=scope)
    known = store.documents(scope)
    tokenized = store.tokenized_ids(scope, fingerprint)
    seen: set[str] = set()

    for rel, full in iter_files(root, recursive):
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:  # a non-UTF-8 file name cannot be a history path
            report.skipped_unreadable += 1
            continue
        try:
            st = full.stat()
        except OSError:
            report.skipped_unreadable += 1
            continue
        if st.st_size > max_bytes:
            report.skipped_large += 1
            continue
        doc = known.get(rel)
        if (
            doc is not None
            and doc.mtime_ns == st.st_mtime_ns
            and doc.num_bytes == st.st_size
            and tokenized.get(doc.id) == doc.content_hash
        ):
            seen.add(rel)
            report.unchanged += 1
            continue
        try:
            data = full.read_bytes()
        except OSError:  # vanished or unreadable between walk and read
            report.skipped_unreadable += 1
            continue
        if is_binary(data):
            report.skipped_binary += 1
            continue
        seen.add(rel)
        content_hash = hashlib.sha256(data).hexdigest()
        if doc is not None and doc.content_hash == content_hash:
            if tokenized.get(doc.id) != content_hash:
                text = store.document_text(doc.id)
                ids = tokenize(text)
                store.add_tokenization(doc.id, fingerprint, content_hash, ids)
                report.tokenized += 1
                report.tokens += len(ids)
            else:
                report.unchanged += 1
            if doc.mtime_ns != st.st_mtime_ns:
                store.touch(doc.id, st.st_mtime_ns)
            continue
        try:
            text = data.decode("utf-8")
            replaced = False
        except UnicodeDecodeError:
            text = data.decode("utf-8", errors="replace")
            replaced = True
            report.decoded_with_replacement += 1
        ids = tokenize(text)
        store.put_document(
            scope=scope, path=rel, source_kind="repo", language_id=language_id(rel),
            content_hash=content_hash, num_bytes=len(data), mtime_ns=st.st_mtime_ns,
            text=text, decoded_with_replacement=replaced, fingerprint=fingerprint,
            token_ids=ids,
        )
        report.tokenized += 1
        report.tokens += len(ids)

    gone = [doc.id for rel, doc in known.items() if rel not in seen]
    store.remove_documents(gone)
    report.removed = len(gone)
    report.documents = len(seen)
    store.mark_indexed(scope, recursive)
    return report
