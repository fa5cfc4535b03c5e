"""Rewrite cases from real edits, for the Predicted Outputs benchmark: a file before an
edit (what the client holds and sends as ``prediction``), the file after it, and the
change described.

Two sources, both read as they are (no model, no network):

- git (:func:`git_cases`): commits of a repository, newest first. One case is one file
  a commit modified: its text at the parent and at the commit, the commit's subject
  (+ the body's first paragraph) as the instruction.
- agent transcripts (:func:`assistd.measure.rewrite_transcripts.transcript_cases`):
  Claude Code and Codex edits whose file text before the edit the transcript holds.

Every case is optionally cut to its *edit window* (:func:`edit_window`): the changed
lines plus ``window`` lines of context either side, the same region of both texts, as
Copilot's next-edit suggestions cut theirs. Sizes are in characters (``max_chars``,
str length) and lines (``window``, ``"\\n"``-terminated lines). A case is kept only when
the edit is modest: the changed lines (difflib, counting a replaced block by its longer
side) are at most ``max_changed`` (default 0.4) of the window's lines.
"""

from __future__ import annotations

import difflib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from assistd.ground.languages import language_id

MAX_CHANGED = 0.4  # changed lines / window lines above which an edit is a rewrite, not an edit
MAX_BLOB_BYTES = 1_000_000  # git: larger file versions are skipped unread
BINARY_PROBE_BYTES = 8000  # git: a NUL in the first 8000 bytes means binary (git's own test)


@dataclass(frozen=True)
class RewriteCase:
    """One edit: ``before`` (str, the text the client holds: the ``prediction``) and
    ``after`` (the real text after the edit), both whole files or both the same edit
    window of them. ``name`` is unique and stable (``git:<7 hex>:<path>`` or
    ``<source>:<transcript file name>:<n>``, n counting that file's cases from 1);
    ``path`` as the repository or transcript names it; ``language`` an LSP id
    (:func:`assistd.ground.languages.language_id`); ``source`` is git, claude-code or codex.
    """

    name: str
    path: str
    language: str
    before: str
    after: str
    instruction: str
    source: str


# ------------------------------------------------------------------ windows and filters

def _lines(text: str) -> list[str]:
    """``text`` cut after each ``"\\n"`` (only that: splitlines also cuts at \\r, \\f,
    U+2028, which git and editors count as inside a line); ``"".join`` gives it back."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def edit_window(before: str, after: str, context_lines: int) -> tuple[str, str]:
    """The same region of ``before`` and ``after``: from ``context_lines`` lines above the
    first changed line to ``context_lines`` lines below the last one (fewer at the file's
    ends). The lines above and below the window are equal in both texts, so each window
    is a substring of its text at the same line offset, and the windows differ exactly
    where the texts do. Raises ValueError when the texts are equal or ``context_lines``
    is negative.

    >>> edit_window("a\\nb\\nc\\nd\\ne\\n", "a\\nb\\nC\\nd\\ne\\n", 1)
    ('b\\nc\\nd\\n', 'b\\nC\\nd\\n')
    """
    if context_lines < 0:
        raise ValueError(f"context_lines must be >= 0, got {context_lines}")
    if before == after:
        raise ValueError("no edit: before and after are equal")
    a, b = _lines(before), _lines(after)
    top = 0
    while top < min(len(a), len(b)) and a[top] == b[top]:
        top += 1
    tail = 0
    while tail < min(len(a), len(b)) - top and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    start = max(0, top - context_lines)
    below = min(tail, context_lines)  # equal lines kept under the last change, both sides
    return "".join(a[start:len(a) - tail + below]), "".join(b[start:len(b) - tail + below])


def changed_share(before: str, after: str) -> float:
    """Changed lines over lines, in [0, 1]: the lines of difflib's replace/delete/insert
    blocks (a replaced block counts its longer side) over the longer text's line count.

    >>> changed_share("a\\nb\\nc\\nd\\n", "a\\nB\\nc\\nd\\n")
    0.25
    """
    a, b = _lines(before), _lines(after)
    if not a and not b:
        return 0.0
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    changed = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")
    return changed / max(len(a), len(b))


def cut(before: str, after: str, *, window: int | None, max_chars: int,
        max_changed: float = MAX_CHANGED) -> tuple[str, str] | None:
    """(before, after) as a case holds them: cut to the edit window (``window`` context
    lines, or whole with None), or None when the case is skipped: no change, a window
    over ``max_chars`` characters on either side, or more than ``max_changed`` of its
    lines changed."""
    if before == after:
        return None
    if window is not None:
        before, after = edit_window(before, after, window)
    if len(before) > max_chars or len(after) > max_chars:
        return None
    if changed_share(before, after) > max_changed:
        return None
    return before, after


def _instruction(subject: str, body: str) -> str:
    """A commit's subject, then its body's first paragraph (when there is one)."""
    para = re.split(r"\n\s*\n", body.strip(), maxsplit=1)[0].strip() if body.strip() else ""
    return f"{subject.strip()}\n\n{para}" if para else subject.strip()


# ------------------------------------------------------------------------------- git

@dataclass(frozen=True)
class _Commit:
    sha: str
    parents: tuple[str, ...]
    subject: str
    body: str
    modified: tuple[str, ...]  # text files modified (numstat not "-"), changed lines > 0


def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True,
                          capture_output=True).stdout


def _commits(repo: Path, rev: str, max_commits: int) -> list[_Commit]:
    """The last ``max_commits`` commits reachable from ``rev``, newest first, merges left
    out (no single "before"), with the paths each modifies (renames seen as delete+add,
    so not modified). Paths that are not UTF-8 are left out."""
    out = _git(repo, "-c", "core.quotePath=false", "log", "--no-merges", "-z", "--no-renames",
               "--diff-filter=M", "--numstat", f"-n{max_commits}",
               "--format=%x1e%H%x1f%P%x1f%s%x1f%b%x1f", rev, "--")
    commits = []
    for chunk in out.split(b"\x1e")[1:]:
        sha, parents, subject, body, tail = chunk.split(b"\x1f", 4)
        modified = []
        for entry in tail.split(b"\0"):
            added, _, rest = entry.lstrip(b"\n").partition(b"\t")
            deleted, _, path = rest.partition(b"\t")
            if not path or added == b"-" or (added, deleted) == (b"0", b"0"):
                continue  # binary by git's numstat, or a mode-only change
            try:
                modified.append(path.decode("utf-8"))
            except UnicodeDecodeError:
                continue
        commits.append(_Commit(sha.decode(), tuple(parents.decode().split()),
                               subject.decode("utf-8", "replace"),
                               body.decode("utf-8", "replace"), tuple(modified)))
    return commits


class _Blobs:
    """``git cat-file --batch``: file versions by ``<commit>:<path>``, one process."""

    def __init__(self, repo: Path):
        self.proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def text(self, commit: str, path: str) -> str | None:
        """The file's text, or None: missing, over MAX_BLOB_BYTES, binary (a NUL in its
        first BINARY_PROBE_BYTES), or not UTF-8. Its bytes are decoded as they are
        (no CRLF or encoding conversion)."""
        if "\n" in path:
            return None  # the batch protocol is line based
        self.proc.stdin.write(f"{commit}:{path}\n".encode())
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        if len(header) != 3 or header[1] != b"blob":
            return None
        data = self.proc.stdout.read(int(header[2]) + 1)[:-1]
        if len(data) > MAX_BLOB_BYTES or b"\0" in data[:BINARY_PROBE_BYTES]:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def _git_candidates(repo: Path, *, max_chars: int, window: int | None, rev: str,
                    max_commits: int, max_changed: float) -> list[tuple[int, RewriteCase]]:
    """(commit index, case) for every kept modified file of every commit, newest first."""
    found = []
    blobs = _Blobs(repo)
    try:
        for index, c in enumerate(_commits(repo, rev, max_commits)):
            if len(c.parents) != 1:
                continue  # the root commit: no before
            for path in sorted(c.modified):
                before, after = blobs.text(c.parents[0], path), blobs.text(c.sha, path)
                if before is None or after is None:
                    continue
                pair = cut(before, after, window=window, max_chars=max_chars,
                           max_changed=max_changed)
                if pair is None:
                    continue
                found.append((index, RewriteCase(
                    name=f"git:{c.sha[:7]}:{path}", path=path, language=language_id(path),
                    before=pair[0], after=pair[1], instruction=_instruction(c.subject, c.body),
                    source="git")))
    finally:
        blobs.close()
    return found


def git_cases(repo: Path, *, limit: int = 12, max_chars: int = 6000, window: int | None = 30,
              rev: str = "HEAD", max_commits: int = 400,
              max_changed: float = MAX_CHANGED) -> list[RewriteCase]:
    """Up to ``limit`` rewrite cases from the last ``max_commits`` commits of ``rev`` in
    the git repository ``repo``, newest first, at most one per commit.

    A case is a file the commit modified (not added, deleted or renamed; merges and the
    root commit skipped): ``before`` its text at the parent, ``after`` at the commit, cut
    by :func:`cut` (skipped: binary, not UTF-8, over 1 MB, windows over ``max_chars``
    characters, edits changing more than ``max_changed`` of the window's lines). The
    instruction is the commit's subject, then its body's first paragraph if any.

    Languages are spread: the cases are picked round-robin over the languages (in order
    of their newest case), each turn taking that language's newest case from a commit
    not yet used. Deterministic for a fixed ``rev`` (pass a hash when the branch moves).
    Raises subprocess.CalledProcessError when git fails (not a repository, bad ``rev``).
    """
    found = _git_candidates(Path(repo), max_chars=max_chars, window=window, rev=rev,
                            max_commits=max_commits, max_changed=max_changed)
    by_lang: dict[str, list[tuple[int, RewriteCase]]] = {}
    for index, case in found:
        by_lang.setdefault(case.language, []).append((index, case))
    queues = list(by_lang.values())  # dicts keep insertion order: newest first
    used: set[int] = set()
    picked: list[tuple[int, RewriteCase]] = []
    while len(picked) < limit and any(queues):
        for queue in queues:
            while queue and queue[0][0] in used:
                queue.pop(0)
            if queue and len(picked) < limit:
                index, case = queue.pop(0)
                used.add(index)
                picked.append((index, case))
    return [case for _, case in sorted(picked, key=lambda p: p[0])]
