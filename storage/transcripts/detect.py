"""Which parser reads a transcript file: decided from its content, the name only breaks ties.

Each registered parser scores the file's first ``HEAD_BYTES`` (after zstd decompression)
with its ``sniff`` (0 = not it ... 3 = certain); the best score wins, equal scores go to a
parser whose ``name_patterns`` match the file name, then to the first registered. So a
Claude Code JSONL renamed ``x.txt`` is still ``claude_code``, and content nobody
recognises is None whatever its name.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
from pathlib import Path
from typing import BinaryIO

import zstandard

from storage.transcripts.base import (
    BAD_RECORD,
    FORMATS,
    Head,
    LineParser,
    TranscriptError,
    WholeParser,
)
from storage.walk import open_checked

HEAD_BYTES = 64 * 1024
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def iter_decompressed(raw: BinaryIO, path: Path, chunk_bytes: int = 1 << 20):
    """The zstd stream ``raw`` decompressed, in chunks of at most ``chunk_bytes``; a caller
    that stops iterating stops the decompression (a 48 KB bomb of 4 GB costs one chunk).
    Raises TranscriptError when the stream is damaged (or still being written)."""
    # Streaming: Codex archives may lack the frame content size, and may hold several frames.
    try:
        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True,
                                                           closefd=False) as reader:
            while chunk := reader.read(chunk_bytes):
                yield chunk
    except zstandard.ZstdError as e:
        raise TranscriptError(f"cannot decompress {path} ({e}); the archive is damaged "
                              "or still being written") from None


def _decompress(raw: BinaryIO, max_bytes: int | None, path: Path) -> bytes:
    out = bytearray()
    for chunk in iter_decompressed(raw, path):
        out += chunk if max_bytes is None else chunk[:max_bytes - len(out)]
        if max_bytes is not None and len(out) >= max_bytes:
            break  # never more than max_bytes held, however far the stream goes
    return bytes(out)


def open_bytes(path: str | Path, max_bytes: int | None = None, *,
               file: BinaryIO | None = None) -> bytes:
    """The file's bytes, zstd-decompressed when it starts with the zstd magic 28 B5 2F FD.

    ``max_bytes`` reads only that many (decompressed) bytes, e.g. ``HEAD_BYTES`` for detection.
    ``file``: read this already opened file (from its start) instead of opening ``path``.
    Opening never blocks: a FIFO, a directory or a device raises
    :class:`storage.walk.Refused` (an OSError), as do the other OSErrors of a read.
    """
    path = Path(path)
    if file is None:
        with open_checked(path, follow=True) as f:
            return open_bytes(path, max_bytes, file=f)
    file.seek(0)
    magic = file.read(4)
    file.seek(0)
    if magic == ZSTD_MAGIC:
        return _decompress(file, max_bytes, path)
    return file.read() if max_bytes is None else file.read(max_bytes)


def _sniff(cls, head: Head) -> int:
    """``cls.sniff(head)``, leaving out the head's records of a shape the sniffer cannot
    walk (a ``role`` that is a list, say): one poison line must not hide the format."""
    try:
        return cls.sniff(head)
    except BAD_RECORD:
        pass
    ok = []
    for obj in head.objects:
        try:
            cls.sniff(dataclasses.replace(head, objects=[obj]))
            ok.append(obj)
        except BAD_RECORD:
            pass
    try:
        return cls.sniff(dataclasses.replace(head, objects=ok, whole=None))
    except BAD_RECORD:
        return 0


def detect_format(path: Path, head: bytes) -> str | None:
    """Format name for a file from its first bytes (decompressed), or None if unknown.

    >>> line = b'{"type":"user","uuid":"u1","message":{"role":"user","content":"hi"}}\\n'
    >>> detect_format(Path("x.txt"), line)
    'claude_code'
    >>> detect_format(Path("x.jsonl"), b"hello") is None
    True
    """
    if head.startswith(ZSTD_MAGIC):
        head = _decompress(io.BytesIO(head), HEAD_BYTES, Path(path))
    digest = Head.of(head)
    name = Path(path).name
    best, best_key = None, (0, False)
    for fmt, cls in FORMATS.items():
        score = _sniff(cls, digest)
        if score <= 0:
            continue
        key = (score, any(fnmatch.fnmatch(name, p) for p in cls.name_patterns))
        if key > best_key:
            best, best_key = fmt, key
    return best


def parser_for(fmt: str, *, context_turns: bool = False) -> LineParser | WholeParser:
    """A fresh parser instance for a format name (see ``FORMATS``); ``context_turns``
    makes it emit the non-model turns too (see ``_Parser.context_turns``)."""
    try:
        parser = FORMATS[fmt]()
    except KeyError:
        raise TranscriptError(f"unknown transcript format {fmt!r}; "
                              f"known formats: {', '.join(sorted(FORMATS))}") from None
    parser.context_turns = context_turns
    return parser
