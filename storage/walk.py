"""Which files of a repository belong in the history.

Ignore rules, lowest precedence first (as git orders them): built-in excludes, the
global excludes file (``core.excludesFile``, default ``$XDG_CONFIG_HOME/git/ignore``),
``.git/info/exclude``, then every ``.gitignore`` from the root down (a deeper file
overrides a shallower one), then ``.assistdignore`` files at the same levels.
Patterns use gitignore semantics through ``pathspec.GitIgnoreSpec``. An ignored
directory is not descended into, so, as in git, a file inside it cannot be
re-included. Symbolic links are not followed (git stores them as links).

A listing is only a hint: a file can be swapped between the walk and the read (for a
FIFO, whose open would block forever, or a symbolic link out of the repository).
:func:`open_checked` opens without blocking or following and then checks what it
opened; the callers count each refusal by its reason. Its reads never block either:
some files that stat() calls regular are not (``/proc/kmsg``, 0 bytes, waits for the
next kernel message), and are refused (``WOULD_BLOCK``) at the read that would wait.

Pseudo filesystems (procfs, sysfs, devtmpfs...: :data:`PSEUDO_FS_TYPES`) hold the
kernel's state, not anyone's files: the walk does not descend into one (``/proc`` under
``/``), nor walk a root on one (``assistd index /proc``), and says so through
:meth:`IgnoreRules.skipped` (``PSEUDO_FS``). Other mounts are walked, as ripgrep does.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pathspec

BUILTIN_EXCLUDES = [
    ".git/", ".hg/", ".svn/", ".venv/", "venv/", ".env/", "node_modules/", "__pycache__/",
    ".mypy_cache/", ".pytest_cache/", ".ruff_cache/", ".tox/", ".nox/", "*.egg-info/",
    "build/", "dist/", "target/", ".idea/", ".DS_Store",
    # Files that exist to hold credentials: never history, whatever the detector says.
    ".env*", "!.env.example", "*.pem", "*.key", "id_rsa", "id_ed25519", "id_ecdsa",
    ".netrc", ".pgpass", ".npmrc", ".pypirc",
]
IGNORE_FILES = (".gitignore", ".assistdignore")

# Why open_checked refused a file (the keys of the callers' ``refused`` counts).
NOT_REGULAR = "not a regular file"   # a FIFO, socket, device or directory
SYMLINK = "a symbolic link"          # where links are not followed (repository files)
OUTSIDE = "outside the scope"        # it resolved outside the root it was listed under
WOULD_BLOCK = "a special file whose read would block"  # 'regular' by stat(): /proc/kmsg
PSEUDO_FS = "a pseudo filesystem (procfs, sysfs, devtmpfs...), not walked"  # a directory

# Filesystems of the kernel's state (Linux names, as /proc/self/mountinfo gives them):
# reading them is at best noise, at worst a wait (/proc/kmsg) or a side effect.
# Not tmpfs: /tmp and /dev/shm hold real files.
PSEUDO_FS_TYPES = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "debugfs", "tracefs", "securityfs", "cgroup",
    "cgroup2", "pstore", "bpf", "configfs", "fusectl", "mqueue", "binfmt_misc", "efivarfs",
    "selinuxfs", "autofs", "rpc_pipefs", "nsfs", "hugetlbfs",
})
MOUNTINFO = "/proc/self/mountinfo"


class Refused(OSError):
    """:func:`open_checked` would not read this file; ``reason`` is one of NOT_REGULAR,
    SYMLINK, OUTSIDE, or WOULD_BLOCK (raised by a read)."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.reason = reason


def _real_path(fd: int, path) -> str:
    try:  # what the descriptor points at, not what the name points at now
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc (macOS): the name's, which a swap may have moved
        return os.path.realpath(path)


class _NonBlockingFile(io.FileIO):
    """A file descriptor opened with ``O_NONBLOCK``, read without ever waiting: where the
    OS would block (EAGAIN, which FileIO turns into None), :class:`Refused`
    (``WOULD_BLOCK``) is raised instead, even after some bytes (/proc/kmsg gives the
    messages already queued, then would wait). A file on a disk never blocks: Linux and
    the BSDs ignore ``O_NONBLOCK`` for regular files of real filesystems."""

    def __init__(self, fd: int, path):
        super().__init__(fd, "rb")
        self.path = path

    def readinto(self, b):  # what BufferedReader calls
        n = super().readinto(b)
        if n is None:
            raise Refused(self.path, WOULD_BLOCK)
        return n

    def read(self, size: int | None = -1):
        if size is None or size < 0:
            return self.readall()
        data = super().read(size)
        if data is None:
            raise Refused(self.path, WOULD_BLOCK)
        return data

    def readall(self):  # FileIO's own returns what it had at EAGAIN, as if at the end
        chunks = []
        while chunk := self.read(io.DEFAULT_BUFFER_SIZE):
            chunks.append(chunk)
        return b"".join(chunks)


def open_checked(path, *, root: Path | None = None, follow: bool = False) -> BinaryIO:
    """``path`` opened for binary reading, after checking what was opened.

    The open never blocks (``O_NONBLOCK``: a FIFO opens at once and is refused) and,
    unless ``follow``, does not follow a symbolic link in the last component
    (``O_NOFOLLOW``). Refused (:class:`Refused`, an OSError): anything but a regular
    file, a link when not following, and with ``root`` (a resolved directory) a file
    whose real path is outside it (a directory on the way swapped for a link).
    Reads never block either: the descriptor stays non-blocking, and a read that would
    wait (a special file stat() calls regular, as /proc/kmsg) raises Refused
    (``WOULD_BLOCK``). Other OSErrors (vanished, no permission) pass through.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow and e.errno in (errno.ELOOP, errno.EMLINK):  # EMLINK: the BSDs
            raise Refused(path, SYMLINK) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(path, NOT_REGULAR)
        if root is not None:
            real, top = _real_path(fd, path), str(root)
            if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
                raise Refused(path, OUTSIDE)
        # Non-blocking still: a pseudo file's read must fail, not wait (_NonBlockingFile).
        return io.BufferedReader(_NonBlockingFile(fd, path))
    except BaseException:
        os.close(fd)
        raise


def _read_mount_types() -> dict[int, str]:
    """Device (``st_dev``) -> filesystem type of every mount, from /proc/self/mountinfo
    (Linux); empty where there is none (macOS, a system without /proc mounted).

    >>> types = _read_mount_types()
    >>> not types or types.get(os.stat(MOUNTINFO).st_dev) == "proc"
    True
    """
    types = {}
    try:  # the kernel's own table: a small file that never blocks
        with open(MOUNTINFO, "rb") as f:
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return types
    for line in lines:  # "36 35 0:22 / /proc rw,nosuid - proc proc rw"
        fields = line.split()
        try:
            major, minor = fields[2].split(":")
            kind = fields[fields.index("-", 6) + 1]
            types[os.makedev(int(major), int(minor))] = kind
        except (ValueError, IndexError):
            continue
    return types


_MOUNT_TYPES: dict[int, str | None] = {}  # st_dev -> filesystem type, None: not a mount


def mount_type(dev: int) -> str | None:
    """The filesystem type of device ``dev`` (an ``st_dev``), None if it is not in the
    mount table. Remembered: the table is read again only for a device not seen yet."""
    if dev not in _MOUNT_TYPES:
        _MOUNT_TYPES.update(_read_mount_types())  # mounts change: a new device, a new read
        _MOUNT_TYPES.setdefault(dev, None)
    return _MOUNT_TYPES[dev]


def pseudo_filesystem(path, parent_dev: int | None = None) -> str | None:
    """The type of the pseudo filesystem (:data:`PSEUDO_FS_TYPES`) the directory ``path``
    is on, else None (also when it cannot be stat'ed: the walk then finds that itself).

    With ``parent_dev``, the ``st_dev`` of the directory above, a directory on that same
    device is not looked up: only a mount point can start another filesystem (one lstat
    per directory; the mount table is read for devices only).

    >>> pseudo_filesystem("/proc") in (None, "proc")  # None: no procfs mounted there
    True
    """
    try:
        dev = os.lstat(path).st_dev
    except OSError:
        return None
    if dev == parent_dev:
        return None
    kind = mount_type(dev)
    return kind if kind in PSEUDO_FS_TYPES else None


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
    try:  # a FIFO named .gitignore must not hang the walk
        with open_checked(path, follow=True) as f:
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:  # missing, unreadable or refused: no rules from it
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

    def skipped(self, rel: str, reason: str) -> None:
        """The walk passed over ``rel`` unread for ``reason`` (``PSEUDO_FS``): nothing
        here; a subclass that counts (the indexer's) records it."""

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
    A pseudo filesystem (``/proc``...) is not walked, at the start or below it; each one
    passed over is told to ``rules.skipped`` (``PSEUDO_FS``).
    """
    rules = rules if rules is not None else IgnoreRules(root)
    start = root / under if under else root
    if under and rules.excluded(under, True):
        return
    if pseudo_filesystem(start) is not None:  # `assistd index /proc`: nothing to read there
        rules.skipped(under or ".", PSEUDO_FS)
        return
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        if rel_dir:
            rules.load_dir(rel_dir)
        dirnames[:] = _subdirs(rules, dirpath, rel_dir, sorted(dirnames)) if recursive else []
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


def _subdirs(rules: IgnoreRules, dirpath: str, rel_dir: str, names: list[str]) -> list[str]:
    """Of the directories ``names`` in ``dirpath`` (``rel_dir`` from the root), those to
    descend into: not a link, not ignored, not a pseudo filesystem mounted there (told to
    ``rules.skipped``)."""
    try:
        dev = os.lstat(dirpath).st_dev
    except OSError:  # vanished: os.walk finds nothing below it either
        dev = None
    keep = []
    for name in names:
        rel = f"{rel_dir}/{name}" if rel_dir else name
        full = os.path.join(dirpath, name)
        if os.path.islink(full) or rules.ignored(rel, True):
            continue
        if pseudo_filesystem(full, dev) is not None:
            rules.skipped(rel, PSEUDO_FS)
            continue
        keep.append(name)
    return keep
