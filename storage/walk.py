"""Which files of a repository belong in the history.

Ignore rules, lowest precedence first (as git orders them): built-in excludes,
``.git/info/exclude``, then every ``.gitignore`` from the root down (a deeper file
overrides a shallower one), then ``.assistdignore`` files at the same levels.
Patterns use gitignore semantics through ``pathspec.GitIgnoreSpec``. An ignored
directory is not descended into, so, as in git, a file inside it cannot be
re-included. Symbolic links are not followed (git stores them as links).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pathspec

BUILTIN_EXCLUDES = [
    ".git/", ".hg/", ".svn/", ".venv/", "venv/", ".env/", "node_modules/", "__pycache__/",
    ".mypy_cache/", ".pytest_cache/", ".ruff_cache/", ".tox/", ".nox/", "*.egg-info/",
    "build/", "dist/", "target/", ".idea/", ".DS_Store",
]


def _spec_from_file(path: Path) -> pathspec.GitIgnoreSpec | None:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)


class IgnoreRules:
    """Stack of gitignore specs, each anchored at a directory (``""`` = the root)."""

    def __init__(self, root: Path):
        self.root = root
        self._specs: dict[str, list[pathspec.GitIgnoreSpec]] = {}
        base = [pathspec.GitIgnoreSpec.from_lines(BUILTIN_EXCLUDES)]
        exclude = _spec_from_file(root / ".git" / "info" / "exclude")
        if exclude is not None:
            base.append(exclude)
        self._specs[""] = base
        self.load_dir("")

    def load_dir(self, rel_dir: str) -> None:
        """Read the ignore files of one directory (relative POSIX path)."""
        d = self.root / rel_dir if rel_dir else self.root
        specs = self._specs.setdefault(rel_dir, [])
        for name in (".gitignore", ".assistdignore"):
            spec = _spec_from_file(d / name)
            if spec is not None:
                specs.append(spec)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether the POSIX path ``rel`` (relative to the root) is ignored."""
        parts = rel.split("/")
        result = False
        for depth in range(len(parts)):
            base = "/".join(parts[:depth])
            for spec in self._specs.get(base, ()):
                sub = "/".join(parts[depth:]) + ("/" if is_dir else "")
                check = spec.check_file(sub)
                if check.include is not None:
                    result = check.include
        return result


def iter_files(root: Path, recursive: bool = True) -> Iterator[tuple[str, Path]]:
    """Yield ``(relative POSIX path, absolute path)`` for every non-ignored regular file.

    With ``recursive=False`` only the files directly in ``root`` are yielded.
    """
    rules = IgnoreRules(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        if rel_dir:
            rules.load_dir(rel_dir)
        keep = []
        for name in sorted(dirnames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if not os.path.islink(os.path.join(dirpath, name)) and not rules.ignored(rel, True):
                keep.append(name)
        dirnames[:] = keep if recursive else []
        for name in sorted(filenames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            full = Path(dirpath) / name
            try:
                mode = full.lstat().st_mode
            except OSError:  # vanished since the directory was listed
                continue
            # Regular files only: no symlinks, and never a FIFO or device (a read would block).
            if not stat.S_ISREG(mode) or rules.ignored(rel, False):
                continue
            yield rel, full
