"""Ingest coding-agent transcripts into the history, tailing appended files by byte offset.

Each transcript file has a row in ``transcripts``: its format, the byte ``offset``
read up to, the line parser's state at that offset, and a hash of its head. A pass
reads only the bytes after ``offset``, applies the parser's operations (put, append,
rewind) to the records of that file, and commits the records, the new offset and
the parser state in ONE transaction: a crash or kill at any moment leaves the
history as it was after some complete pass, and the next pass resumes exactly
there, with no record duplicated or lost.

- A partly written last line (no newline yet) is left for the next pass, unless
  it is already a complete JSON value (writers flush the newline separately).
- A file that shrank, changed inode, or whose first bytes changed was rewritten
  or truncated: its records are forgotten and it is read again from byte 0.
- Whole-JSON formats (rewritten on every save) and ``.zst`` archives are read
  whole when their size or mtime changes; records that disappeared are forgotten.
  A ``.zst`` is decompressed as a stream, a line at a time: one that inflates past
  ``MAX_WHOLE_BYTES`` (a bomb) is read as if cut there, its earlier records kept and
  the cut counted (``TranscriptReport.truncated``); memory stays about one line.
- A transcript file that vanished keeps its records (agents delete old sessions;
  the history is the memory of them) until ``assistd history forget``.
- A path that is not a regular file (a FIFO, a socket, a device; one swapped in since
  it was listed too) is refused and counted by reason (``TranscriptReport.refused``):
  it is opened without blocking and checked, never waited on.

Records are scoped by the project they belong to (the record's ``cwd``, resolved
to its git root), so one project's transcripts never draft in another.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from assistd.ground.errors import InputError
from assistd.ground.paths import is_dir, user_path
from storage.indexer import find_repository_root
from storage.secrets import redact
from storage.store import HistoryStore
from storage.transcripts.base import (
    Append,
    LineParser,
    Rewind,
    TranscriptError,
    WholeParser,
    loads,
)
from storage.transcripts.detect import HEAD_BYTES as SNIFF_BYTES
from storage.transcripts.detect import detect_format, iter_decompressed, open_bytes, parser_for
from storage.walk import NOT_REGULAR, SYMLINK, Refused, open_checked

log = logging.getLogger(__name__)

HEAD_BYTES = 4096  # hashed to tell a rewritten file from an appended one
CHUNK_BYTES = 1 << 20  # read (and commit) at most this much of a file per transaction
MAX_LINE_BYTES = 64 << 20  # a longer line is skipped and counted (a pasted blob, a runaway log)
MAX_WHOLE_BYTES = 256 << 20  # a whole-JSON or .zst transcript (decompressed) is read up to this
DEFAULT_MAX_RECORD_BYTES = 1_000_000  # as ``assistd index --max-bytes`` for repository files
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# A ``truncated`` reason: a .zst line format that decompresses past the cap.
OVER_WHOLE = f"decompressed past {MAX_WHOLE_BYTES >> 20} MB"


@dataclass
class TranscriptReport:
    """Counts from ingesting transcript files (records are model-output records)."""

    files: int = 0  # transcript files read (new bytes or rewritten)
    unchanged: int = 0
    unknown_format: int = 0  # files whose content matches no known format
    unparseable: int = 0  # whole-JSON files that do not parse (e.g. mid-rewrite); retried
    skipped_large: int = 0  # records over max_record_bytes, lines over 64 MiB, files over 256 MiB
    vanished: int = 0
    rewritten: int = 0  # truncated or rewritten files read again from byte 0
    records_put: int = 0  # records created or changed
    records_removed: int = 0
    tokens: int = 0
    skipped_malformed: int = 0  # lines/entries not JSON or not the format's shape
    skipped_too_deep: int = 0  # JSON nested past MAX_JSON_DEPTH (not in skipped_malformed)
    skipped_unknown: int = 0
    skipped_duplicate: int = 0
    dropped_blobs: int = 0
    redactions: int = 0
    formats: dict[str, int] = field(default_factory=dict)
    # Paths not read, by reason (storage.walk.NOT_REGULAR, SYMLINK, EMPTY_FOLDER) -> count.
    refused: dict[str, int] = field(default_factory=dict)
    # Files read only in part, their records up to the cut kept (a .zst line format
    # decompressing past MAX_WHOLE_BYTES), by reason -> count.
    truncated: dict[str, int] = field(default_factory=dict)
    # Lines (whole-JSON: files) read with U+FFFD: not valid UTF-8, or holding a JSON
    # escape of a lone surrogate ("\ud800"), which is stored as U+FFFD.
    decoded_with_replacement: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    def add(self, other: TranscriptReport) -> None:
        for k, v in asdict(other).items():
            if isinstance(v, dict):
                mine = getattr(self, k)
                for f, n in v.items():
                    mine[f] = mine.get(f, 0) + n
            else:
                setattr(self, k, getattr(self, k) + v)

    def truncate(self, path, reason: str) -> None:
        self.truncated[reason] = self.truncated.get(reason, 0) + 1
        log.info("%s: %s; read up to there, its records before kept", path, reason)

    def refuse(self, path, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        log.debug("refused %s: %s", path, reason)


# A JSON escape of a UTF-16 surrogate: the backslashes before it (odd: an escape), the
# hex digit that tells a high one (8-b) from a low one (c-f).
_SURROGATE_ESCAPE = re.compile(rb"(\\+)u[dD]([89a-fA-F])[0-9a-fA-F]{2}")


def _lone_surrogate(data: bytes) -> bool:
    """Whether the JSON text ``data`` escapes a lone surrogate (``"\\ud800"``, not part of
    a high-low pair): json.loads gives one, which the parsers store as U+FFFD.

    >>> _lone_surrogate(rb'"\\ud800"'), _lone_surrogate(rb'"\\ud83d\\ude00"')
    (True, False)
    >>> _lone_surrogate(rb'"\\\\ud800"'), _lone_surrogate(rb'"\\ude00 \\ud83d"')
    (False, True)
    """
    if b"\\u" not in data:
        return False
    found = [m for m in _SURROGATE_ESCAPE.finditer(data) if len(m.group(1)) % 2]
    i = 0
    while i < len(found):
        m = found[i]
        nxt = found[i + 1] if i + 1 < len(found) else None
        if (m.group(2) in b"89abAB" and nxt is not None and nxt.start() == m.end()
                and len(nxt.group(1)) == 1 and nxt.group(2) in b"cdefCDEF"):
            i += 2  # a pair: one character
            continue
        return True
    return False


def _feed(parser: LineParser, line: bytes) -> list:
    """``parser.feed_line(line)``, a line escaping a lone surrogate counted as read with
    replacement (once: a line that is not UTF-8 already counted itself)."""
    before = parser.stats.decoded_with_replacement
    ops = parser.feed_line(line)
    if parser.stats.decoded_with_replacement == before and _lone_surrogate(line):
        parser.stats.decoded_with_replacement += 1
    return ops


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _language(kind: str, language_id: str | None) -> str:
    """A record's language id: the file a tool call writes, else Markdown for prose."""
    if language_id:
        return language_id
    return "markdown" if kind == "assistant" else "plaintext"


class TranscriptIngester:
    """Brings the records of transcript files up to date in the history for one tokenizer.

    ``default_scope`` is used for records that name no project (e.g. an aider
    history found in a repository: that repository); otherwise such records get
    the scope ``transcripts:<the transcript's directory>``.
    """

    def __init__(self, store: HistoryStore, tokenize: Callable[[str], list[int]],
                 fingerprint: str, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES):
        self.max_record_bytes = max_record_bytes
        self.store = store
        self.tokenize = tokenize
        self.fingerprint = fingerprint
        self._scope_cache: dict[str, str] = {}

    # -- public ---------------------------------------------------------------

    def ingest(self, path: Path, default_scope: str | None = None, *,
                follow: bool = True) -> TranscriptReport:
        """Read what is new in one transcript file. Never raises for bad content.

        A path that is not a regular file, or (``follow=False``) is a symbolic link, is
        refused and counted in ``refused``; nothing is opened in a way that can block."""
        report = TranscriptReport()
        path = Path(os.path.abspath(path))
        source = str(path)
        row = self.store.transcript_state(source)
        try:  # no open yet: the open of a FIFO would block
            st = path.stat() if follow else path.lstat()
        except OSError:
            report.vanished += 1
            return report
        if not stat.S_ISREG(st.st_mode):
            report.refuse(source, SYMLINK if stat.S_ISLNK(st.st_mode) else NOT_REGULAR)
            return report
        if row is not None and row["size"] == st.st_size and row["mtime_ns"] == st.st_mtime_ns \
                and row["inode"] == st.st_ino:
            report.unchanged += 1
            return report
        fallback = default_scope or self._gemini_scope(path) or f"transcripts:{path.parent}"
        try:
            # One checked open serves the whole pass: the stat above named a regular
            # file, but what is read is what this opened (it may be swapped since).
            with open_checked(path, follow=follow) as f:
                st = os.fstat(f.fileno())
                sniff = f.read(SNIFF_BYTES)
                head = sniff[:HEAD_BYTES]
                compressed = head.startswith(ZSTD_MAGIC)
                fmt = row["format"] if row is not None else None
                if fmt is None:
                    if compressed:
                        sniff = open_bytes(path, max_bytes=SNIFF_BYTES, file=f)
                    fmt = detect_format(path, sniff)
                if fmt is None:
                    report.unknown_format += 1
                    log.info("skipped %s: not a known transcript format", source)
                    return report
                parser = parser_for(fmt)
                if isinstance(parser, WholeParser) or compressed:
                    self._ingest_whole(path, f, st, fmt, parser, fallback, report)
                else:
                    self._ingest_tail(path, f, st, fmt, parser, row, head, fallback, report)
        except TranscriptError as e:  # e.g. a whole-JSON file caught mid-rewrite
            report.unparseable += 1
            log.info("skipped %s: %s", source, e)
            return report
        except Refused as e:  # swapped for a FIFO (or a link) since the stat
            report.refuse(source, e.reason)
            return report
        except OSError as e:  # vanished or unreadable mid-read: counted, records kept
            report.vanished += 1
            log.info("skipped %s: %s", source, e.strerror or e)
            return report
        report.files += 1
        report.formats[fmt] = report.formats.get(fmt, 0) + 1
        return report

    # -- whole files ----------------------------------------------------------

    def _ingest_whole(self, path, f, st, fmt, parser, fallback, report) -> None:
        if isinstance(parser, WholeParser):
            data = _read_capped(path, f)
            if data is None:
                report.skipped_large += 1  # cut short it would not parse
                log.info("skipped %s: over %d bytes", path, MAX_WHOLE_BYTES)
                return
            before = parser.stats.decoded_with_replacement
            ops, size, head = parser.parse(data), len(data), data[:HEAD_BYTES]
            if parser.stats.decoded_with_replacement == before and _lone_surrogate(data):
                parser.stats.decoded_with_replacement += 1  # once per document, as bad UTF-8
            del data
        else:  # a compressed line format: streamed line by line into a fresh parser
            ops, size, head = self._feed_stream(path, f, parser, report)
        source = str(path)
        with self.store.transaction():
            # A whole file is the complete truth: rebuild its record set from scratch,
            # but only rewrite records whose text changed.
            records = self._apply(ops, {}, source)
            stored = self.store.transcript_records(source)
            gone = [doc_id for key, (doc_id, _, _) in stored.items() if key not in records]
            report.records_removed += self.store.remove_documents(gone)
            self._write_records(source, records, stored, fallback, report, force=False)
            self._save_state(path, st, fmt, size, head, parser, {}, report)

    def _feed_stream(self, path, f, parser: LineParser, report) -> tuple[list, int, bytes]:
        """Feed the decompressed lines of ``f`` to ``parser`` -> (ops, bytes read, head).

        Holds one line at most (never more than ``MAX_LINE_BYTES``; a longer one is
        skipped and counted) and stops at ``MAX_WHOLE_BYTES``: a bomb is read as if
        truncated there, its records before the cap kept (``report.truncated``)."""
        f.seek(0)
        ops, head, total = [], b"", 0
        pending, skipping = bytearray(), False  # the current line; True: a giant being dropped
        for chunk in iter_decompressed(f, path):
            if len(head) < HEAD_BYTES:
                head += chunk[:HEAD_BYTES - len(head)]
            over = total + len(chunk) > MAX_WHOLE_BYTES
            if over:
                chunk = chunk[:MAX_WHOLE_BYTES - total]
            total += len(chunk)
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                if not skipping:
                    ops.extend(_feed(parser, bytes(pending) + chunk[start:end]))
                pending.clear()
                skipping, start = False, end + 1
            if not skipping:
                pending += chunk[start:]
                if len(pending) > MAX_LINE_BYTES:
                    report.skipped_large += 1
                    pending.clear()
                    skipping = True
            if over:
                report.truncate(path, OVER_WHOLE)
                return ops, total, head  # the cut last line is not fed: it is incomplete
        if pending and not skipping:
            ops.extend(_feed(parser, bytes(pending)))
        return ops, total, head

    # -- appended files ---------------------------------------------------------

    def _ingest_tail(self, path, f, st, fmt, parser: LineParser, row, head, fallback,
                     report) -> None:
        source = str(path)
        offset, base = 0, {}
        reset = False
        if row is not None:
            old_head_len = min(row["offset"], HEAD_BYTES)
            reset = (st.st_size < row["offset"] or row["inode"] != st.st_ino
                     or _sha(head[:old_head_len]) != row["head_sha256"])
            if reset:
                report.rewritten += 1
                log.info("%s was rewritten or truncated: reading it again", source)
            else:
                offset, base = row["offset"], row
                parser.load_state(json.loads(row["state"] or "{}"))
        size = CHUNK_BYTES
        while True:
            f.seek(offset)
            chunk = f.read(size)
            at_eof = len(chunk) < size
            lines, consumed = _complete_lines(chunk, at_eof and parser.json_lines)
            if consumed == 0 and not at_eof:  # one line longer than the chunk
                if size < MAX_LINE_BYTES:
                    size *= 2
                    continue
                end = _next_newline(f, offset + size)
                if end is None:
                    break  # still being written: wait for its end
                with self.store.transaction():  # skip the giant line, keep the place
                    offset = end
                    report.skipped_large += 1
                    f.seek(0)
                    self._save_state(path, st, fmt, offset, f.read(min(offset, HEAD_BYTES)),
                                     parser, base, report, complete=False)
                size = CHUNK_BYTES
                continue
            if consumed == 0 and not reset:
                break  # nothing complete yet: a partly written last line waits
            with self.store.transaction():
                if reset:  # forgetting and re-reading commit together
                    report.records_removed += self.store.forget_transcript(source)
                    reset = False
                ops = []
                for line in lines:  # blank lines too: aider replies have paragraphs
                    ops.extend(_feed(parser, line))
                stored = self.store.transcript_records(source)
                records = self._apply(ops, stored, source)
                self._write_records(source, records, stored, fallback, report, force=True)
                offset += consumed
                f.seek(0)
                self._save_state(path, st, fmt, offset, f.read(min(offset, HEAD_BYTES)),
                                 parser, base, report, complete=at_eof)
            if at_eof:
                break

    # -- shared -------------------------------------------------------------------

    def _apply(self, ops, stored: dict, source: str) -> dict[str, dict | None]:
        """Fold parser operations into ``key -> record`` (None = delete that record).

        ``stored`` (key -> (doc id, ordinal, scope)) gives the ordinals of records
        committed by earlier passes, which a Rewind and an Append may refer to.
        """
        records: dict[str, dict | None] = {}
        next_ordinal = 1 + max((o for _, o, _ in stored.values() if o is not None), default=-1)

        def ordinal_of(key):
            rec = records.get(key)
            if rec is not None:
                return rec["ordinal"]
            return stored[key][1] if key in stored else None

        for op in ops:
            if isinstance(op, Rewind):
                cut = ordinal_of(op.key)
                if cut is None:
                    continue
                # gemini-cli: $rewindTo drops the named message and everything after it.
                for key in list(records):
                    if records[key] is not None and records[key]["ordinal"] >= cut:
                        records[key] = None
                for key, (_, o, _) in stored.items():
                    if o is not None and o >= cut and records.get(key, 0) is not None:
                        records[key] = None
                next_ordinal = cut
                continue
            rec = records.get(op.key)
            if rec is None and isinstance(op, Append) and op.key in stored \
                    and records.get(op.key, 0) is not None:
                doc_id, o, _ = stored[op.key]
                rec = {"text": self._stored_text(doc_id), "ordinal": o, "kind": op.kind,
                       "cwd": op.cwd, "language_id": op.language_id}
            if isinstance(op, Append) and rec is not None:
                rec = dict(rec, text=rec["text"] + "\n" + op.text)
            else:
                ordinal = ordinal_of(op.key)
                if ordinal is None or records.get(op.key, 0) is None:
                    ordinal, next_ordinal = next_ordinal, next_ordinal + 1
                rec = {"text": op.text, "ordinal": ordinal, "kind": op.kind, "cwd": op.cwd,
                       "language_id": op.language_id}
            if rec.get("language_id") is None and op.language_id:
                rec["language_id"] = op.language_id
            records[op.key] = rec
        return records

    def _stored_text(self, doc_id: int) -> str:
        """The raw (pre-redaction) text is not kept; appending continues the stored one."""
        return self.store.document_text(doc_id)

    def _write_records(self, source, records, stored, fallback, report, force) -> None:
        for key, rec in records.items():
            old = stored.get(key)
            if rec is None:
                if old is not None:
                    report.records_removed += self.store.remove_documents([old[0]])
                continue
            scope = self._scope(rec["cwd"], fallback)
            raw = rec["text"].encode("utf-8", "surrogatepass")
            if len(raw) > self.max_record_bytes:
                report.skipped_large += 1
                if old is not None:
                    report.records_removed += self.store.remove_documents([old[0]])
                continue
            content_hash = _sha(raw)
            if old is not None:
                if old[2] != scope:  # the record moved project: drop the old copy
                    self.store.remove_documents([old[0]])
                elif not force and self._hash_of(old[0]) == content_hash:
                    continue
            clean = redact(rec["text"])
            report.redactions += clean.count
            ids = self.tokenize(clean.text)
            self.store.put_document(
                scope=scope, path=f"{source}#{key}", source_kind="transcript",
                language_id=_language(rec["kind"], rec["language_id"]),
                content_hash=content_hash, num_bytes=len(clean.text.encode("utf-8", "replace")),
                mtime_ns=0, text=clean.text, decoded_with_replacement=False,
                fingerprint=self.fingerprint, token_ids=ids, source=source, record_key=key,
                ordinal=rec["ordinal"], record_kind=rec["kind"], redactions=clean.count,
            )
            report.records_put += 1
            report.tokens += len(ids)

    def _hash_of(self, doc_id: int) -> str:
        return self.store.db.execute(
            "select content_hash from documents where id = ?", [doc_id]).fetchone()[0]

    def _save_state(self, path, st, fmt, offset, head, parser, base, report,
                    complete: bool = True) -> None:
        """Persist the tailing state; the skip counters are cumulative over passes
        (``base`` is the row this pass continued from, or {} when it started over).
        ``complete=False`` (a pass that stopped between chunks) records no size, so a
        pass that was killed there is not mistaken for an unchanged file."""
        source = str(path)
        counters = {}
        for name in ("skipped_malformed", "skipped_unknown", "skipped_duplicate",
                     "dropped_blobs"):
            now = getattr(parser.stats, name)
            if name == "skipped_malformed":  # the parsers count too deep as malformed too:
                now -= parser.stats.skipped_too_deep  # each line is counted once here
            counters[name] = (base.get(name) or 0) + now
            setattr(report, name, now)
        report.skipped_too_deep = parser.stats.skipped_too_deep
        report.decoded_with_replacement = parser.stats.decoded_with_replacement
        records = self.store.db.execute(
            "select count(*) from documents where source = ? and source_kind = 'transcript'",
            [source]).fetchone()[0]
        state = parser.state() if isinstance(parser, LineParser) else {}
        self.store.save_transcript_state({
            "path": source, "format": fmt, "offset": offset,
            "size": st.st_size if complete else -1,
            "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
            "head_sha256": _sha(head[:min(offset, HEAD_BYTES)]),
            "state": json.dumps(state), "records": records,
            "redactions": (base.get("redactions") or 0) + report.redactions,
            "updated_utc": time.time(), **counters,
        })

    def _gemini_scope(self, path: Path) -> str | None:
        """Gemini CLI keeps sessions in ``~/.gemini/tmp/<sha256 of the project root>/chats``
        and records no cwd: the scope is the indexed repository whose root hashes so."""
        project = path.parent.parent.name
        if path.parent.name != "chats" or len(project) != 64:
            return None
        for (root,) in self.store.db.execute("select root from scopes"):
            if hashlib.sha256(root.encode("utf-8")).hexdigest() == project:
                return root
        return None

    def _scope(self, cwd: str | None, fallback: str) -> str:
        """The scope of a record: the git root of its ``cwd`` (as ``assistd index`` names
        it), the ``cwd`` itself when that directory is not on this machine, else ``fallback``."""
        if not cwd:
            return fallback
        if cwd not in self._scope_cache:
            try:  # a cwd of ~nosuchuser or too long a name: not a directory here
                p = user_path(cwd)
                root = str(find_repository_root(p)) if is_dir(p) else None
            except (InputError, OSError, ValueError):
                root = None
            self._scope_cache[cwd] = root or os.path.normpath(cwd)
        return self._scope_cache[cwd]


def _read_capped(path, f) -> bytes | None:
    """The whole (decompressed) file ``f``, or None when it is over ``MAX_WHOLE_BYTES``:
    a whole-JSON document cut short does not parse. Holds at most the cap (plus a chunk)."""
    f.seek(0)
    if f.read(4) != ZSTD_MAGIC:
        f.seek(0)
        data = f.read(MAX_WHOLE_BYTES + 1)
        return data if len(data) <= MAX_WHOLE_BYTES else None
    f.seek(0)
    chunks, total = [], 0
    for chunk in iter_decompressed(f, path):
        total += len(chunk)
        if total > MAX_WHOLE_BYTES:
            return None  # the chunks go with the frame: a bomb's peak is the cap
        chunks.append(chunk)
    return b"".join(chunks)


def _next_newline(f, start: int) -> int | None:
    """Offset just past the first newline at or after ``start`` in file ``f``, or None."""
    pos = start
    while True:
        f.seek(pos)
        block = f.read(CHUNK_BYTES)
        if not block:
            return None
        i = block.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(block)


def _complete_lines(chunk: bytes, at_eof: bool) -> tuple[list[bytes], int]:
    """Split ``chunk`` into complete lines -> (lines without newlines, bytes consumed).

    An unterminated last line counts as complete only at the end of the file and
    only if it is already a whole JSON object (a writer mid-line has not closed it).

    >>> _complete_lines(b'{"a":1}\\n{"b":', True)
    ([b'{"a":1}'], 8)
    >>> _complete_lines(b'{"a":1}\\n{"b":2}', True)
    ([b'{"a":1}', b'{"b":2}'], 15)
    """
    end = chunk.rfind(b"\n") + 1
    lines = chunk[:end].split(b"\n")[:-1] if end else []
    rest = chunk[end:]
    if at_eof and rest.strip().startswith(b"{"):
        try:
            whole = isinstance(loads(rest), dict)
        except ValueError:  # TooDeep included: a line nested 100,000 deep is never parsed
            whole = False
        if whole:
            lines.append(rest)
            end = len(chunk)
    return lines, end


def ingest_paths(store: HistoryStore, paths, tokenize, fingerprint,
                 default_scope: str | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> TranscriptReport:
    """Ingest transcript files and folders (walked recursively; each file's format is
    detected from its content). Returns the summed report."""
    ingester = TranscriptIngester(store, tokenize, fingerprint, max_record_bytes=max_record_bytes)
    total = TranscriptReport()
    files = list(iter_transcript_files(paths, total))
    for n, f in enumerate(files, 1):
        total.add(ingester.ingest(f, default_scope))
        if progress is not None:
            progress(n, len(files))
    return total


TRANSCRIPT_SUFFIXES = (".jsonl", ".json", ".zst", ".traj", ".md")
EMPTY_FOLDER = "a folder with no transcript files"  # a ``refused`` reason, as walk's


def iter_transcript_files(paths, report: TranscriptReport | None = None, *,
                          warn_given: bool = True):
    """Files given, plus the candidate files under folders given (sorted, no symlinks
    followed); candidates are those with a transcript-like suffix.

    Not yielded, and with ``report`` counted in ``report.refused`` by reason (plus one
    warning per path given, since the user named it): a path given that is neither a
    file nor a folder (a FIFO, a socket), a folder given that holds no candidate, and
    candidates under folders that are symbolic links or not regular files.
    ``warn_given=False`` (a watcher's event, not a user's word): counted, not warned."""
    warn = log.warning if report is not None and warn_given else log.debug
    report = report if report is not None else TranscriptReport()
    for p in paths:
        p = Path(p)
        if p.is_file():
            yield p
        elif p.is_dir():
            found = False
            for dirpath, dirnames, filenames in os.walk(p, followlinks=False):
                dirnames.sort()
                for name in sorted(filenames):
                    if name.endswith(TRANSCRIPT_SUFFIXES):
                        full = Path(dirpath) / name
                        if full.is_symlink():
                            report.refuse(full, SYMLINK)
                        elif not full.is_file():  # a FIFO named like a transcript
                            report.refuse(full, NOT_REGULAR)
                        else:
                            found = True
                            yield full
            if not found:
                report.refuse(p, EMPTY_FOLDER)
                warn("%s: no transcript files (%s) in this folder", p,
                            ", ".join(f"*{s}" for s in TRANSCRIPT_SUFFIXES))
        elif p.exists():
            report.refuse(p, NOT_REGULAR)
            warn("%s: not a regular file or a folder (a FIFO, socket or device);"
                        " skipped", p)
