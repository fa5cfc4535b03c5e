"""Which files of a repository belong in the history.

Ignore rules, lowest precedence first (as git orders them): built-in excludes, the
global excludes file (``core.excludesFile``, default ``$XDG_CONFIG_HOME/git/ignore``),
``.git/info/exclude``, then every ``.gitignore`` from the root down (a deeper file
overrides a shallower one), then ``.assistdignore`` files at the same levels.
Patterns use gitignore semantics through ``pathspec.GitIgnoreSpec``. An ignored
directory is not descended into, so, as in git, a file inside it cannot be
re-included. Symbolic links are not followed (git stores them as links).
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pathspec

BUILTIN_EXCLUDES = [
    ".git/", ".hg/", ".svn/", ".venv/", "venv/", ".env/", "node_modules/", "__pycache__/",
    ".mypy_cache/", ".pytest_cache/", ".ruff_cache/", ".tox/", ".nox/", "*.egg-info/",
    "build/", "dist/", "target/", ".idea/", ".DS_Store",
    # Files that exist to hold credentials: never history, whatever the detector says.
    ".env", ".env.*", "!.env.example", "*.pem", "*.key", "id_rsa", "id_ed25519", "id_ecdsa",
    ".netrc", ".pgpass", ".npmrc", ".pypirc",
]
IGNORE_FILES = (".gitignore", ".assistdignore")


@functools.cache
def global_excludes_file() -> Path | None:
    """git's global excludes file: ``git config core.excludesFile`` when git is
    installed, else the default ``$XDG_CONFIG_HOME/git/ignore`` (``~/.config/git/ignore``)."""
    try:
        out = subprocess.run(["git", "config", "--global", "--path", "--get", "core.excludesFile"],
                             capture_output=True, text=True, timeout=5)
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip()).expanduser()
    except (OSError, subprocess.SubprocessError):
        pass
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(xdg) / "git" / "ignore"


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
        for extra in (global_excludes_file(), root / ".git" / "info" / "exclude"):
            spec = _spec_from_file(extra) if extra is not None else None
            if spec is not None:
                base.append(spec)
        self._base = base
        self.load_dir("")

    def load_dir(self, rel_dir: str) -> None:
        """(Re)read the ignore files of one directory (relative POSIX path)."""
        d = self.root / rel_dir if rel_dir else self.root
        specs = list(self._base) if rel_dir == "" else []
        for name in IGNORE_FILES:
            spec = _spec_from_file(d / name)
            if spec is not None:
                specs.append(spec)
        self._specs[rel_dir] = specs

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether the POSIX path ``rel`` (relative to the root) is ignored by the
        specs loaded so far (a walk loads each directory's files as it descends)."""
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

    def excluded(self, rel: str, is_dir: bool) -> bool:
        """Whether ``rel`` or any directory above it is ignored, loading the ignore
        files of its ancestors first: the check for one path given by a watcher event."""
        parts = rel.split("/")
        for depth in range(len(parts)):
            base = "/".join(parts[:depth])
            if base not in self._specs:
                self.load_dir(base)
            if depth and self.ignored(base, True):
                return True
        return self.ignored(rel, is_dir)


def iter_files(root: Path, recursive: bool = True, rules: IgnoreRules | None = None,
               under: str = "") -> Iterator[tuple[str, Path]]:
    """Yield ``(relative POSIX path, absolute path)`` for every non-ignored regular file.

    With ``recursive=False`` only the files directly in ``root`` are yielded; with
    ``under`` (a relative directory, e.g. one a watcher saw moved in) only that subtree.
    """
    rules = rules if rules is not None else IgnoreRules(root)
    start = root / under if under else root
    if under and rules.excluded(under, True):
        return
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
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
