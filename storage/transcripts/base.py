"""The parsing layer's vocabulary: ops, counters, the two parser shapes, the registry.

A transcript parser turns a coding agent's transcript into *records*: the text the
agent's model wrote (prose, or a tool call's input), each under a key that is stable
within its file. Parsers never touch the database; they emit ops that the caller applies:

- ``Put``: create or replace record ``key`` (a replaced record keeps its place in order);
- ``Append``: add ``text`` to record ``key`` on a new line (``old + "\\n" + text``),
  creating it (as just ``text``) if missing;
- ``Rewind``: drop record ``key`` and every record created after it in the same file.

``apply_ops`` is the reference semantics, used by the tests and usable by callers.

Two shapes, one obligatory method each:

- ``LineParser.feed_line(line)`` for append-only files (JSONL, aider markdown). The caller
  tails the file by byte offset and feeds complete lines; ``state()``/``load_state()``
  carry everything needed to resume from that offset in a new process.
- ``WholeParser.parse(data)`` for single-JSON files rewritten as a whole.

A new format is one module in this package: a class decorated with ``@register``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from assistd.ground import jsonlimits
from assistd.ground.errors import InputError
from assistd.ground.jsonlimits import TooDeep

ASSISTANT = "assistant"   # prose the model wrote
TOOL_INPUT = "tool_input"  # a tool call's input the model wrote (code, patch, command, JSON)
MODEL_KINDS = frozenset({ASSISTANT, TOOL_INPUT})
# What the model was shown, emitted only by parsers with ``context_turns`` on (offline
# replay needs the whole conversation; the history stores model output only):
USER = "user"              # a user's prompt
TOOL_RESULT = "tool_result"  # a tool's output handed back to the model
SYSTEM = "system"          # system/developer instructions, client notices


class TranscriptError(InputError):
    """A transcript file cannot be parsed at all (individual bad entries are only counted)."""


class WrongType(TypeError):
    """A tool call's input (or a field of it) of the wrong JSON type: null, a number or a
    list where an object or a string belongs. The call is skipped and counted as
    malformed, never stored as the text ``null`` or ``7``."""


def expect(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` if it is an instance of ``kind``, else :class:`WrongType` naming ``what``."""
    if not isinstance(value, kind):
        raise WrongType(f"{what} is {type(value).__name__}")
    return value


log = logging.getLogger("assistd.transcripts")

# What a parser's code may raise on a record of an unexpected shape (a list where a
# string was expected, a missing key, JSON nested past the recursion limit): the record
# is skipped and counted, never the file lost or the watcher stopped.
BAD_RECORD = (TypeError, AttributeError, KeyError, IndexError, ValueError, RecursionError)


# Deepest nesting of arrays and objects a transcript's JSON may have (real ones stay under
# 30). Deeper JSON is refused by a linear scan BEFORE json.loads, whose recursion (and that
# of the parsers walking the result) a document nested 100,000 deep would exhaust.
MAX_JSON_DEPTH = 256


def json_too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """:func:`assistd.ground.jsonlimits.json_too_deep` at the transcripts' limit."""
    return jsonlimits.json_too_deep(text, limit)


def prune_deep(text: str, limit: int = MAX_JSON_DEPTH) -> tuple[str, int]:
    """:func:`assistd.ground.jsonlimits.prune_deep` at the transcripts' limit."""
    return jsonlimits.prune_deep(text, limit)


def loads(text: str | bytes) -> Any:
    """``json.loads`` of ``text``, refused first (``TooDeep``) when nested deeper than
    ``MAX_JSON_DEPTH``. Raises ValueError (TooDeep included) for anything not JSON."""
    return jsonlimits.loads(text, MAX_JSON_DEPTH)


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` without lone surrogates (JSON's ``"\\ud800"`` decodes to one, and no UTF-8
    encoder takes it): each becomes ONE U+FFFD (json.loads already joins valid pairs).

    >>> clean_text("a\\ud800b") == "a\\ufffdb"
    True
    """
    return _SURROGATE.sub("\ufffd", text)


def decode_line(line: bytes, stats: "ParseStats") -> str:
    """``line`` decoded as UTF-8, invalid bytes as U+FFFD (counted in
    ``stats.decoded_with_replacement``, once per line or document)."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        stats.decoded_with_replacement += 1
        return line.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class _TextOp:
    """The fields of an op that carries text: the record's ``key``, its ``text``, its
    ``kind`` (ASSISTANT, TOOL_INPUT, ...), the project directory ``cwd`` and the
    ``language_id`` of code, when known; every string cleaned of lone surrogates."""
    key: str
    text: str
    kind: str
    cwd: str | None
    language_id: str | None = None

    def __post_init__(self):
        _clean_fields(self)


@dataclass(frozen=True)
class Put(_TextOp):
    """Create or replace one record."""


@dataclass(frozen=True)
class Append(_TextOp):
    """Add ``text`` to record ``key`` as ``old + "\\n" + text``; if the record is missing,
    create it with ``text`` alone."""


def _clean_fields(op) -> None:
    """Every string of a record (its key and cwd as well as its text) without lone
    surrogates: SQLite takes only UTF-8, and a JSON id of "\\ud800" is legal JSON."""
    for f in ("key", "text", "cwd", "language_id"):
        value = getattr(op, f, None)
        if isinstance(value, str) and not value.isascii():  # ASCII has no surrogates
            object.__setattr__(op, f, clean_text(value))


@dataclass(frozen=True)
class Rewind:
    """Drop record ``key`` and every record created after it in this file."""
    key: str

    def __post_init__(self):
        _clean_fields(self)


Op = Put | Append | Rewind


@dataclass
class ParseStats:
    """Raw counters of one parser instance (rates, if any, are computed by readers)."""
    lines: int = 0
    records: int = 0            # Put/Append ops emitted (ops that carry text)
    skipped_malformed: int = 0  # lines/entries that are not valid JSON or not the expected shape
    skipped_too_deep: int = 0   # of those: JSON nested past MAX_JSON_DEPTH (refused unparsed)
    skipped_unknown: int = 0    # record types this parser does not know
    skipped_duplicate: int = 0  # text already emitted for the same record
    dropped_blobs: int = 0      # images, signatures, encrypted reasoning, originalFile, ...
    decoded_with_replacement: int = 0  # lines (whole files) not valid UTF-8, read with U+FFFD

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _Parser:
    format: ClassVar[str] = ""
    # Capabilities, read by the caller and by detect_format.
    append_only: ClassVar[bool] = True      # False: the file is rewritten as a whole
    name_patterns: ClassVar[tuple[str, ...]] = ()  # fnmatch patterns on the file name (tie-breaker)
    # Opt-in, per instance: also emit what the model was shown (user prompts, tool results,
    # system prompts) as records of kind USER / TOOL_RESULT / SYSTEM under keys starting
    # with "ctx:", in file order among the model's records. Off, the ops are unchanged.
    context_turns: bool = False

    def __init__(self) -> None:
        self.stats = ParseStats()
        self._logged: set[str] = set()

    @classmethod
    def sniff(cls, head: "Head") -> int:
        """How surely ``head`` (the file's first bytes) is this format: 0 = not it,
        1 = plausible, 2 = likely, 3 = certain. Override per format."""
        return 0

    def _count(self, ops: list) -> list:
        self.stats.records += sum(1 for op in ops if not isinstance(op, Rewind))
        return ops  # their strings were cleaned of lone surrogates when they were made

    def _bad_record(self, e: BaseException) -> None:
        """Count a record the parser could not read, and log its kind once per parser."""
        self.stats.skipped_malformed += 1
        kind = type(e).__name__
        if kind not in self._logged:
            self._logged.add(kind)
            log.info("%s transcript: skipped a record of an unexpected shape (%s: %s)",
                     self.format, kind, str(e)[:200])

    def _too_deep(self, n: int = 1) -> None:
        """Count ``n`` values refused for nesting past ``MAX_JSON_DEPTH``, logged once."""
        self.stats.skipped_malformed += n
        self.stats.skipped_too_deep += n
        if "TooDeep" not in self._logged:
            self._logged.add("TooDeep")
            log.info("%s transcript: skipped JSON nested deeper than %d levels",
                     self.format, MAX_JSON_DEPTH)

    def _guarded(self, fn, *args) -> list:
        """``fn(*args)`` (the records of ONE entry), or [] with the entry counted as
        malformed when its shape is one the code cannot walk: the other entries stay."""
        try:
            return fn(*args)
        except BAD_RECORD as e:
            self._bad_record(e)
            return []


class LineParser(_Parser):
    """Append-only transcripts fed one complete line at a time.

    Subclasses implement ``_feed(line: str) -> list[Op]`` and list their resumable
    attributes in ``state_fields``; those must be JSON values and stay bounded.
    """
    append_only: ClassVar[bool] = True
    state_fields: ClassVar[tuple[str, ...]] = ()
    # One JSON object per line: a last line without its newline that is already a
    # whole JSON object is complete (the caller may take it before the newline lands).
    json_lines: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        # Lines fed since the file's start, this one included (1-based in ``_feed``); a
        # parser that keys records by line lists it in ``state_fields`` to resume it.
        self.line_no = 0

    def feed_line(self, line: bytes) -> list[Op]:
        """Ops for ONE complete line (without its newline). Never raises on bad input."""
        self.stats.lines += 1
        self.line_no += 1
        text = decode_line(line, self.stats).rstrip("\r")
        try:
            return self._count(self._feed(text))
        except BAD_RECORD as e:
            self._bad_record(e)
            return []

    def _feed(self, line: str) -> list[Op]:
        raise NotImplementedError

    def state(self) -> dict:
        """JSON-serializable resume state (persist it with the byte offset)."""
        return copy.deepcopy({name: getattr(self, name) for name in self.state_fields})

    def load_state(self, d: dict) -> None:
        """Restore ``state()`` output, e.g. into a fresh instance after a restart."""
        for name in self.state_fields:
            if name in d:
                setattr(self, name, copy.deepcopy(d[name]))

    # Helpers for JSONL formats.
    def _json(self, line: str) -> dict | None:
        """The line as a JSON object; None (counted as malformed) otherwise; None for blank lines."""
        if not line.strip():
            return None
        try:
            value = loads(line)
        except TooDeep:
            self._too_deep()
            return None
        except (ValueError, RecursionError):
            self.stats.skipped_malformed += 1
            return None
        if not isinstance(value, dict):
            self.stats.skipped_malformed += 1
            return None
        return value

    def _known(self, line: str, field: str, known: frozenset[str]) -> dict | None:
        """The line as a JSON object whose ``field`` (its record type, its role) is one of
        ``known``; None for a blank line, for one that is not a JSON object (counted in
        ``skipped_malformed``) and for an object of another kind (``skipped_unknown``).
        A ``field`` that is not a string (a list, an object) raises TypeError, which
        ``feed_line`` counts as malformed."""
        rec = self._json(line)
        if rec is None:
            return None
        if rec.get(field) not in known:
            self.stats.skipped_unknown += 1
            return None
        return rec


class WholeParser(_Parser):
    """Single-JSON transcripts, re-parsed whole whenever the file changes.

    Subclasses implement ``_parse(doc)``; ``parse`` decodes the bytes and counts.
    """
    append_only: ClassVar[bool] = False

    def parse(self, data: bytes) -> list[Put]:
        """Every record of the file, in order. Raises TranscriptError if it is not
        parseable at all (not JSON, or not the format's top-level shape); a bad entry
        (a shape the code cannot walk) is counted in ``stats`` and skipped, and a value
        nested past ``MAX_JSON_DEPTH`` is replaced by null and counted (``skipped_too_deep``)."""
        try:
            return self._count(list(self._parse(self._load(data))))
        except BAD_RECORD as e:
            raise TranscriptError(f"{self.format} transcript has an unexpected shape"
                                  f" ({type(e).__name__}: {str(e)[:200]})") from None

    def _parse(self, doc: Any) -> Iterable[Put]:
        """Records of the decoded JSON document; raise TranscriptError on a wrong shape."""
        raise NotImplementedError

    def _load(self, data: bytes) -> Any:
        text, pruned = prune_deep(decode_line(data, self.stats))
        if pruned:
            self._too_deep(pruned)
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as e:
            raise TranscriptError(
                f"{self.format} transcript is not valid JSON ({e}); "
                "check the file is complete, or pick another format") from None


# ---------------------------------------------------------------- registry

FORMATS: dict[str, type[LineParser] | type[WholeParser]] = {}


def register(cls):
    """Class decorator: make a parser known to ``parser_for`` and ``detect_format``."""
    if not cls.format or cls.format in FORMATS:
        raise ValueError(f"parser format name missing or taken: {cls.format!r}")
    FORMATS[cls.format] = cls
    return cls


@dataclass
class Head:
    """The first bytes of a file, pre-digested once for every ``sniff``.

    ``text``: decoded head; ``first_line``: its first line, possibly cut off (a JSONL line
    holding a pasted image can outgrow any head); ``objects``: the head's lines that parse
    as JSON objects (first 50); ``whole``: the head parsed as one JSON document, if it is one.
    """
    text: str
    objects: list[dict] = field(default_factory=list)
    whole: Any = None
    first_line: str = ""

    @classmethod
    def of(cls, head: bytes) -> "Head":
        text = head.decode("utf-8", errors="replace")
        objects = []
        for line in text.split("\n")[:50]:  # not splitlines(): JSON strings may hold U+2028
            line = line.strip()
            if line.startswith("{") and line.endswith("}"):
                try:
                    value = loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(value, dict):
                    objects.append(value)
        whole = None
        stripped = text.strip()
        if stripped[:1] in ("{", "["):
            try:
                whole = json.loads(prune_deep(stripped)[0])
            except (ValueError, RecursionError):
                whole = None
        first_line = text.lstrip("\ufeff").split("\n", 1)[0]
        return cls(text=text, objects=objects, whole=whole, first_line=first_line)

    def opens_with(self, opener: str, *patterns: str) -> bool:
        """The head (after leading whitespace) starts with ``opener`` (``"{"``, ``"["``)
        and every regex of ``patterns`` is found in it: a single-JSON file too long for
        the head to parse whole, known by the names it shows.

        >>> Head.of(b'  {"trajectory": [{"action": "ls"').opens_with("{", r'"action"\\s*:')
        True
        >>> Head.of(b'[{"action": 1}]').opens_with("{", r'"action"')
        False
        """
        return (self.text.lstrip().startswith(opener)
                and all(re.search(p, self.text) for p in patterns))


# ---------------------------------------------------------------- pure helpers

def text_hash(*parts: str) -> str:
    """Short stable digest used for duplicate detection in bounded parser state.

    >>> text_hash("a", "b") == text_hash("a", "b") != text_hash("ab")
    True
    """
    h = hashlib.sha1()
    for p in parts:
        h.update(p.encode("utf-8", errors="replace"))
        h.update(b"\x00")
    return h.hexdigest()[:16]


def remember(mapping: dict, key: str, value: Any, cap: int) -> None:
    """Insert ``key`` as the newest entry of ``mapping``, dropping the oldest beyond ``cap``.

    >>> m = {}
    >>> for k in "abcd": remember(m, k, 1, cap=3)
    >>> list(m)
    ['b', 'c', 'd']
    """
    mapping.pop(key, None)
    mapping[key] = value
    while len(mapping) > cap:
        del mapping[next(iter(mapping))]


def json_text(value: Any) -> str:
    """A tool input rendered as JSON, non-ASCII kept readable."""
    return json.dumps(value, ensure_ascii=False)


def shown_text(value: Any) -> str:
    """The text of something the model was shown (a prompt, a tool result): a string, a list
    of parts (``{"type": "text", "text": ...}``, nested ``content``), or an object with
    ``text``/``content``/``output``; anything else as JSON. Images and other blobs: nothing.

    >>> shown_text([{"type": "text", "text": "a"}, {"type": "image", "source": {}}, "b"])
    'a\\nb'
    >>> shown_text({"output": "ok"}), shown_text(None), shown_text({"exit": 0})
    ('ok', '', '{"exit": 0}')
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t for t in (shown_text(v) for v in value) if t)
    if isinstance(value, dict):
        if value.get("type") in ("image", "image_url", "input_image", "document"):
            return ""
        for name in ("text", "content", "output"):
            if name in value:
                return shown_text(value[name])
    return json_text(value)


def apply_ops(ops: Iterable[Op], records: dict[str, Put] | None = None) -> dict[str, Put]:
    """Reference semantics of the ops: the records they leave, in creation order.

    >>> r = apply_ops([Put("a", "x", "assistant", None), Put("b", "y", "assistant", None),
    ...                Append("a", "z", "assistant", None), Put("c", "w", "tool_input", None)])
    >>> [(k, p.text) for k, p in r.items()]
    [('a', 'x\\nz'), ('b', 'y'), ('c', 'w')]
    >>> list(apply_ops([Rewind("b")], r))
    ['a']
    """
    records = {} if records is None else records
    for op in ops:
        if isinstance(op, Put):
            records[op.key] = op  # dict keeps the first insertion position on replace
        elif isinstance(op, Append):
            old = records.get(op.key)
            text = op.text if old is None else old.text + "\n" + op.text
            records[op.key] = Put(op.key, text, op.kind, op.cwd if old is None else old.cwd,
                                  op.language_id if old is None else old.language_id)
        elif isinstance(op, Rewind):
            keys = list(records)
            if op.key in records:
                for k in keys[keys.index(op.key):]:
                    del records[k]
    return records


def parse_all(parser: LineParser | WholeParser, data: bytes) -> list[Op]:
    """Parse a finished file in one go (a final line without newline is fed too)."""
    if isinstance(parser, WholeParser):
        return list(parser.parse(data))
    ops: list[Op] = []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for line in lines:
        ops.extend(parser.feed_line(line))
    return ops
