"""Fast apply: one edit to one file, given back as the new text or a unified diff; never written.

:func:`apply_edit` reads the file only when it is a regular file inside ``scope`` that the
history's path rules admit (:mod:`storage.walk`: the built-in excludes, so ``.env*``,
keys and ``.git/`` are refused, then ``.gitignore`` and ``.assistdignore``; opened by
:func:`storage.walk.open_checked`, so a FIFO, a symbolic link or a path that resolves out
of the scope is refused), not binary and not over the indexer's size cap
(:mod:`storage.indexer`), and UTF-8. Each refusal is an :class:`InputError` that says why.

Routing: SEARCH/REPLACE blocks apply by rule (:mod:`assistd.edits.blocks`), no model. Any
other edit is a snippet to merge (a lazy one elides unchanged code with ``// ... existing
code ...``): the caller's ``model`` does it (:mod:`assistd.edits.merge`), with the
original file as the predicted output. Either way the result is parsed before and after
(:mod:`assistd.edits.validate`).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path

from assistd.edits.blocks import (
    BlockResult, apply_blocks, check_filenames, clean_filename, has_blocks, lazy_markers,
    parse_blocks,
)
from assistd.edits.merge import (  # noqa: F401 - re-exported: the model path's parts
    MergeJob, ModelFn, ModelRewrite, extract_code, merge_prompt, merge_warnings,
    prediction_text, restore_blank_lines,
)
from assistd.edits.validate import Validation, broke, validate
from assistd.ground.errors import InputError
from assistd.ground.languages import language_id
from assistd.ground.paths import is_dir, user_path
from storage.indexer import DEFAULT_MAX_BYTES, is_binary
from storage.secrets import redact
from storage.walk import (NOT_REGULAR, OUTSIDE, SYMLINK, WOULD_BLOCK, IgnoreRules, Refused,
                          open_checked)

_REFUSED = {
    SYMLINK: "is a symbolic link; pass the path of the file it points to",
    NOT_REGULAR: "is not a regular file (a directory, FIFO, socket or device)",
    OUTSIDE: "resolves outside the scope",
    WOULD_BLOCK: "is a special file whose read would wait (/proc/kmsg, say), not a text file",
}


@dataclass(frozen=True)
class SourceFile:
    """A file read for an edit: ``rel`` (POSIX, relative to the scope), its ``text``
    and its LSP ``language`` id."""

    rel: str
    text: str
    language: str


@dataclass
class ApplyResult:
    """One edit's outcome (nothing written).

    ``path``: the file, relative to the scope; ``method``: "search_replace" or "model";
    ``changed``: the text differs; ``text``: the new text (when asked for text) or
    ``diff``: a unified diff ``a/PATH`` -> ``b/PATH`` ("" when unchanged); ``blocks``:
    how each block matched (search_replace); ``lazy_markers``: the snippet's elision
    lines (model); ``before``/``after``: the parse checks; ``usage``: the model's token
    counts as the engine reports them (model; accepted and rejected prediction tokens
    included when it fills them); ``warnings``: what looks wrong without being an error.
    """

    path: str
    method: str
    changed: bool
    text: str | None
    diff: str | None
    before: Validation
    after: Validation
    blocks: list[BlockResult] = field(default_factory=list)
    lazy_markers: list[tuple[int, str]] = field(default_factory=list)
    usage: dict | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def broke(self) -> bool:
        """The file parsed before the edit and does not after."""
        return broke(self.before, self.after)

    def as_dict(self) -> dict:
        return {"path": self.path, "method": self.method, "changed": self.changed,
                "text": self.text, "diff": self.diff, "broke": self.broke,
                "before": self.before.as_dict(), "after": self.after.as_dict(),
                "blocks": [b.as_dict() for b in self.blocks],
                "lazy_markers": [{"line": n, "text": t} for n, t in self.lazy_markers],
                "usage": self.usage, "warnings": list(self.warnings)}


def _locate(path: str | os.PathLike, scope: str | os.PathLike) -> tuple[Path, Path, str]:
    """``(resolved scope, the file's path with its directories resolved, rel)``. A
    relative ``path`` is taken from the scope. Raises InputError when the scope is not a
    directory or the file's directory resolves outside it."""
    scope_p = user_path(scope)
    if not is_dir(scope_p):
        raise InputError(f"scope {os.fspath(scope)!r} is not a directory; pass the repository"
                         " (or directory) the file belongs to")
    root = scope_p.resolve()
    p = user_path(path)
    p = Path(os.path.abspath(p if p.is_absolute() else root / p))
    # The directories resolved (a linked directory pointing out is outside), not the
    # file's own name: open_checked refuses a link there itself.
    full = p.parent.resolve() / p.name
    try:
        rel = full.relative_to(root).as_posix()
    except ValueError:
        raise InputError(f"{os.fspath(path)} is outside the scope {root}; edit files inside"
                         " it only") from None
    if rel in ("", "."):
        raise InputError(f"{os.fspath(path)} is the scope itself; pass a file inside it")
    return root, full, rel


# Folders that hold version-control internals or credentials: a file under one is never
# read, whatever the scope (a client's scope of ".git" or "~/.aws" would otherwise make
# the ignore rules, which are relative to it, see nothing to exclude).
DENIED_DIRS = frozenset({".git", ".hg", ".svn", ".ssh", ".aws", ".gnupg", ".docker", ".kube",
                         ".azure", ".gcloud", ".password-store"})
DENIED_NAMES = frozenset({".git-credentials", ".netrc", ".pgpass", ".npmrc", ".pypirc",
                          "credentials", ".htpasswd"})


def _denied(full: Path, root: Path) -> str | None:
    """Why the file at ``full`` (its directories resolved) is never read, or None: a
    scope of the filesystem root or the home folder itself (a repository, please), a
    credentials or version-control folder on its path, a credentials file name, any
    ``.env`` variant (case-insensitive, ``prod.env`` included)."""
    if root == Path(root.anchor) or root == Path.home().resolve():
        return (f"the scope {root} is too wide: pass the repository (or project folder) the"
                " file belongs to")
    parts = {p.lower() for p in full.parts[:-1]}
    hit = parts & DENIED_DIRS
    if hit:
        return f"it is under {sorted(hit)[0]}/ (version control or credentials)"
    name = full.name.lower()
    if name == ".env.example":  # a template without values, as the history keeps it
        return None
    if name in DENIED_NAMES or name.startswith(".env") or name.endswith(".env"):
        return "a credentials or environment file"
    return None


def read_source(path: str | os.PathLike, scope: str | os.PathLike, *,
                max_bytes: int = DEFAULT_MAX_BYTES) -> SourceFile:
    """The text of ``path`` for an edit, under the history's path rules (module doc).
    ``max_bytes``: the size cap (the indexer's default). Raises :class:`InputError`
    naming the file and the rule it broke: a scope too wide, a credentials or
    version-control folder or file (:func:`_denied`), outside the scope, ignored, not a
    regular file, a symbolic link, missing, unreadable, too large, binary, not UTF-8, or
    holding a secret (the history's filter, :func:`storage.secrets.redact`: the result
    goes back to an agent whole, and secrets never leave through assistd)."""
    root, full, rel = _locate(path, scope)
    if IgnoreRules(root).excluded(rel, False):
        raise InputError(f"{rel}: refused: the history's ignore rules exclude it (built-in"
                         " excludes such as .git/, .env*, keys and credentials files, then"
                         " .gitignore and .assistdignore)")
    if (why := _denied(full, root)) is not None:
        raise InputError(f"{rel}: refused: {why}")
    try:
        with open_checked(full, root=root) as f:
            data = f.read(max_bytes + 1)
    except Refused as e:
        raise InputError(f"{rel}: refused: it {_REFUSED.get(e.reason, e.reason)}") from None
    except FileNotFoundError:
        raise InputError(f"{rel}: file not found in {root}; fast apply edits existing files"
                         " (an empty SEARCH fills an existing empty file)") from None
    except OSError as e:
        raise InputError(f"{rel}: cannot read it: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise InputError(f"{rel}: larger than {max_bytes} bytes (the history's cap); edit it"
                         " with another tool")
    if is_binary(data):
        raise InputError(f"{rel}: a binary file (a NUL byte in its first 8 KiB); only text"
                         " files are edited")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{rel}: not UTF-8 text (invalid byte at offset {e.start}); only"
                         " UTF-8 files are edited") from None
    found = redact(text, filename=rel)
    if found.count:
        kinds = ", ".join(sorted(found.kinds)) or "a secret"
        raise InputError(f"{rel}: refused: it holds {found.count} secret value(s) ({kinds});"
                         " fast apply gives files back whole and never passes secrets on."
                         " Edit it yourself, or move the secret out of the file")
    return SourceFile(rel, text, language_id(rel))


def _lines(text: str) -> list[str]:
    """Lines ending in "\\n" (the last may not): split on "\\n" only, as patch and git
    do (``str.splitlines`` also splits on form feeds and other separators)."""
    parts = [line + "\n" for line in text.split("\n")]
    parts[-1] = parts[-1][:-1]
    return parts if parts[-1] else parts[:-1]


def unified_diff(rel: str, old: str, new: str, context: int = 3) -> str:
    """The unified diff from ``old`` to ``new`` with ``a/REL`` and ``b/REL`` headers, git
    style; a last line without a newline is marked ``\\ No newline at end of file``, so
    the diff applies back with patch or git apply. "" when the texts are equal."""
    out = []
    for line in difflib.unified_diff(_lines(old), _lines(new), f"a/{rel}", f"b/{rel}",
                                     n=context):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _unwrap(edit: str) -> str:
    """A snippet sent inside one code fence (a filename line above it allowed, as in
    blocks): the fence's body; otherwise the edit as it is."""
    lines = edit.strip().split("\n")
    if len(lines) >= 3 and lines[1].startswith(("```", "~~~")) and clean_filename(lines[0]):
        lines = lines[1:]
    first, last = lines[0].strip(), lines[-1].strip()
    if len(lines) >= 2 and first[:3] in ("```", "~~~") and last and set(last) == {first[0]}:
        return extract_code("\n".join(lines))
    return edit


def _like(original: str, new: str) -> str:
    """The model's text with the original's line endings: CRLF kept, and no final newline
    added where the file had none (the model writes LF and ends with one)."""
    if "\r\n" in original and original.count("\r\n") == original.count("\n"):
        new = new.replace("\r\n", "\n").replace("\n", "\r\n")
    if original and not original.endswith("\n"):
        new = new.removesuffix("\r\n") if new.endswith("\r\n") else new.removesuffix("\n")
    return new


def _merge(src: SourceFile, snippet: str, instruction: str, model: ModelFn | None
           ) -> tuple[str, dict, list[str]]:
    if model is None:
        raise InputError(f"the edit for {src.rel} is a code snippet, not SEARCH/REPLACE blocks:"
                         " merging it needs the model, and none is available here; send"
                         " '<<<<<<< SEARCH' / '=======' / '>>>>>>> REPLACE' blocks instead")
    job = MergeJob(path=src.rel, language=src.language, original=src.text, snippet=snippet,
                   instruction=instruction,
                   messages=merge_prompt(src.rel, src.language, src.text, snippet, instruction),
                   prediction=prediction_text(src.language, src.text, snippet))
    answer = model(job)
    new, restored = restore_blank_lines(src.text, _like(src.text, extract_code(answer.text)))
    warnings = merge_warnings(src.text, snippet, new, src.language)
    if restored:
        warnings.append(f"restored {restored} blank line(s) the model dropped")
    return new, dict(answer.usage), warnings


def apply_edit(path: str | os.PathLike, edit: str, *, scope: str | os.PathLike,
               model: ModelFn | None = None, diff: bool = False, instruction: str = "",
               max_bytes: int = DEFAULT_MAX_BYTES) -> ApplyResult:
    """Apply ``edit`` to the file ``path`` (absolute, or relative to ``scope``, a
    directory) and return the result; the file is never written.

    ``edit``: SEARCH/REPLACE blocks (applied by rule, ``model`` not called) or a code
    snippet, lazy or not (``model(MergeJob) -> ModelRewrite`` merges it: the daemon's or
    the in-process Runtime's chat, generating with ``job.prediction`` as the predicted
    output). ``diff``: give a unified diff instead of the new text. ``instruction``: the
    agent's intent, for the model. Raises :class:`InputError` (the file refused, a block
    that matches nothing or several places, a snippet without a model, a cut-off model
    answer).
    """
    if not edit.strip():
        raise InputError("the edit is empty; send SEARCH/REPLACE blocks or a code snippet")
    src = read_source(path, scope, max_bytes=max_bytes)
    results, markers, usage, warnings = [], [], None, []
    if has_blocks(edit):
        blocks = parse_blocks(edit)
        check_filenames(blocks, src.rel)
        new, results = apply_blocks(src.text, blocks, src.rel)
        method = "search_replace"
    else:
        snippet = _unwrap(edit)
        markers = lazy_markers(snippet, src.language)
        new, usage, warnings = _merge(src, snippet, instruction, model)
        method = "model"
    return ApplyResult(
        path=src.rel, method=method, changed=new != src.text,
        text=None if diff else new, diff=unified_diff(src.rel, src.text, new) if diff else None,
        before=validate(src.text, src.rel), after=validate(new, src.rel), blocks=results,
        lazy_markers=markers, usage=usage, warnings=warnings)
