"""What ``assistd replay`` replays: sessions of turns, from transcripts or a git history.

A *session* is what one decoder would see from its start: a list of turns, each the
text of one role. Model turns (the agent's prose and tool-call inputs, or a file's new
version) are the oracle output to walk through; the other turns (user prompts, tool
results, system prompts, a file's path) are context, appended without proposing.

- Transcripts: every format of ``storage.transcripts``, read with ``context_turns`` on,
  one session per file, turns in file order (the records ``apply_ops`` leaves).
- Git: ``git_sessions(repo, commits)`` walks the last ``commits`` first-parent commits
  oldest first. Each text file a commit adds or modifies is one session: a context turn
  with its path, then its new version as the model turn. The file's previous version
  (the parent commit's) is put in the history before it (``Session.seed``), so the
  history holds the older versions, and every replayed version joins it after its turn.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from assistd.ground.errors import InputError
from assistd.ground.languages import language_id
from storage.ingest import DEFAULT_MAX_RECORD_BYTES, iter_transcript_files
from storage.walk import NOT_REGULAR, Refused
from storage.transcripts import (
    ASSISTANT, HEAD_BYTES, MODEL_KINDS, TranscriptError, apply_ops, detect_format, open_bytes,
    parse_all, parser_for,
)

MAX_FILE_BYTES = 1_000_000  # git: larger file versions are skipped and counted (as `index`)
BINARY_PROBE_BYTES = 8192  # git: a NUL in the first 8 KiB means binary (as `index`)


@dataclass(frozen=True)
class Turn:
    """One turn: ``role`` (a transcript record kind: assistant, tool_input, user,
    tool_result, system; or ``path`` for a git file header), its text, whether the model
    wrote it, and its language id (a hint passed to proposers)."""

    role: str
    text: str
    is_model: bool
    language: str | None = None


@dataclass
class Session:
    """Turns one decoder sees in order; ``seed``: ``(name, text)`` documents put in the
    history just before the session (git: the file's previous version)."""

    name: str
    source: str  # a transcript format name, or "git"
    turns: list[Turn]
    seed: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class InputReport:
    """Counts of what was read (raw counters)."""

    files: list[str] = field(default_factory=list)
    formats: dict[str, int] = field(default_factory=dict)
    unknown_format: int = 0  # files under a folder whose content is no known format
    git_commits: int = 0
    git_files: int = 0  # file versions replayed
    skipped_binary: int = 0
    skipped_large: int = 0

    def as_dict(self) -> dict:
        return {
            "files": list(self.files), "formats": dict(sorted(self.formats.items())),
            "unknown_format": self.unknown_format, "git_commits": self.git_commits,
            "git_files": self.git_files, "skipped_binary": self.skipped_binary,
            "skipped_large": self.skipped_large,
        }


def _turn_language(kind: str, language: str | None) -> str:
    """As the history stores a record: the file a tool call writes, else Markdown for prose."""
    return language or ("markdown" if kind == ASSISTANT else "plaintext")


def transcript_session(path: Path, fmt: str | None = None, report: InputReport | None = None,
                       max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Session:
    """One transcript file as a session. A record over ``max_record_bytes`` (UTF-8) is
    left out and counted in ``report.skipped_large``, as ``assistd index`` leaves it out
    of the history (a peer's step scans the whole context, so one 5 MB message made a
    replay run for hours). Raises :class:`InputError` when the file is missing, not a
    regular file (a FIFO, a socket, a device: never opened to wait on) or unreadable, its
    format unknown, or it does not parse at all."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"file not found: {path}")
    if not path.is_file():
        raise InputError(_not_regular(path))
    try:
        fmt = fmt or detect_format(path, open_bytes(path, max_bytes=HEAD_BYTES))
        if fmt is None:
            raise InputError(
                f"{path}: not a known transcript format; Claude Code, Codex CLI, aider,"
                " Gemini CLI, SWE-agent, mini-swe-agent, OpenHands and {role, content} JSONL"
                " files are read (a repository's history: `replay --git REPO`,"
                " `bench --workload edit=REPO`)")
        parser = parser_for(fmt, context_turns=True)
        records = apply_ops(parse_all(parser, open_bytes(path)))
    except TranscriptError as e:
        raise InputError(f"{path}: {e}") from None
    except Refused as e:  # swapped for a FIFO (or the like) since the check above
        raise InputError(_not_regular(path) if e.reason == NOT_REGULAR else str(e)) from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    kept = [r for r in records.values()
            if len(r.text.encode("utf-8", "surrogatepass")) <= max_record_bytes]
    if report is not None:
        report.skipped_large += len(records) - len(kept)
    turns = [Turn(r.kind, r.text, r.kind in MODEL_KINDS,
                  _turn_language(r.kind, r.language_id) if r.kind in MODEL_KINDS else None)
             for r in kept]
    return Session(name=str(path), source=fmt, turns=turns)


def _not_regular(path: Path) -> str:
    kind = "a folder" if path.is_dir() else "a FIFO, socket or device"
    return f"{path}: {NOT_REGULAR} ({kind}); pass a transcript file or a folder of them"


def transcript_sessions(paths: Iterable[Path], report: InputReport) -> list[Session]:
    """Sessions of the files given, in order; a folder gives its transcript-like files
    (sorted; those of no known format are skipped and counted). A file given by name
    must be a transcript (:class:`InputError` otherwise)."""
    sessions = []
    for given in paths:
        given = Path(given)
        if not given.exists():
            raise InputError(f"file not found: {given}")
        if not given.is_dir() and not given.is_file():  # named by the user: say so, not skip
            raise InputError(_not_regular(given))
        for path in iter_transcript_files([given]):
            fmt = None
            if given.is_dir():
                fmt = detect_format(path, open_bytes(path, max_bytes=HEAD_BYTES))
                if fmt is None:
                    report.unknown_format += 1
                    continue
            session = transcript_session(path, fmt, report)
            sessions.append(session)
            report.files.append(str(path))
            report.formats[session.source] = report.formats.get(session.source, 0) + 1
    return sessions


# ---------------------------------------------------------------- git


def _git(repo: Path, *args: str) -> bytes:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True)
    except FileNotFoundError:
        raise InputError("git is not installed; install git to replay a repository's history")\
            from None
    except subprocess.CalledProcessError as e:
        msg = e.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InputError(f"git {args[0]} failed in {repo}: {msg[-1] if msg else e}") from None
    return out.stdout


class _Blobs:
    """``git cat-file --batch`` over one process: blob bytes by ``<rev>:<path>``."""

    def __init__(self, repo: Path):
        self._p = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def get(self, spec: str) -> bytes | None:
        self._p.stdin.write(spec.encode("utf-8", "surrogateescape") + b"\n")
        self._p.stdin.flush()
        header = self._p.stdout.readline().split()
        if len(header) < 3 or header[-1] == b"missing":
            return None
        data = self._p.stdout.read(int(header[2]))
        self._p.stdout.read(1)  # the newline after the contents
        return data if header[1] == b"blob" else None

    def close(self) -> None:
        self._p.stdin.close()
        self._p.wait()


def _text(data: bytes | None, report: InputReport) -> str | None:
    if data is None:
        return None
    if b"\0" in data[:BINARY_PROBE_BYTES]:
        report.skipped_binary += 1
        return None
    if len(data) > MAX_FILE_BYTES:
        report.skipped_large += 1
        return None
    return data.decode("utf-8", errors="replace")


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


def git_sessions(repo: Path, commits: int, report: InputReport) -> list[Session]:
    """Sessions of the last ``commits`` first-parent commits of ``repo``'s HEAD, oldest
    first: one per text file added or modified (renames count as added), in the order
    ``git diff`` lists them. Raises :class:`InputError` when ``repo`` is not a git
    repository or has no commits."""
    repo = Path(repo)
    if not repo.is_dir():
        raise InputError(f"not a directory: {repo}; --git takes a repository's folder")
    _git(repo, "rev-parse", "--git-dir")
    shas = _git(repo, "rev-list", "--first-parent", "--reverse", f"--max-count={commits}",
                "HEAD").decode().split()
    if not shas:
        raise InputError(f"{repo} has no commits to replay")
    sessions = []
    in_history: set[tuple[str, str]] = set()  # (path, hash of text) already seeded or replayed
    blobs = _Blobs(repo)
    try:
        for sha in shas:
            report.git_commits += 1
            parents = _git(repo, "rev-list", "--parents", "--max-count=1", sha).decode().split()[1:]
            base = parents[0] if parents else None
            if base is None:
                raw = _git(repo, "diff-tree", "--root", "-r", "--no-commit-id", "--no-renames",
                           "--name-status", "-z", sha)
            else:
                raw = _git(repo, "diff", "--no-renames", "--name-status", "-z", base, sha)
            fields = raw.decode("utf-8", "surrogateescape").split("\0")
            for status, path in zip(fields[0::2], fields[1::2]):
                if status not in ("A", "M"):
                    continue
                new = _text(blobs.get(f"{sha}:{path}"), report)
                if new is None or not new.strip():
                    continue
                old = _text(blobs.get(f"{base}:{path}"), report) if status == "M" else None
                seed = []
                if old and (path, _digest(old)) not in in_history:
                    seed.append((f"{base[:12]}:{path}", old))
                    in_history.add((path, _digest(old)))
                in_history.add((path, _digest(new)))
                report.git_files += 1
                sessions.append(Session(
                    name=f"{sha[:12]}:{path}", source="git",
                    turns=[Turn("path", f"{path}\n", False),
                           Turn("file", new, True, language_id(path))],
                    seed=seed))
    finally:
        blobs.close()
    return sessions
