"""Paths a user or a client supplies, expanded and checked without surprises.

``Path.expanduser`` raises RuntimeError for ``~nosuchuser``, and ``is_dir()`` raises for a
name the OS refuses (too long: ENAMETOOLONG; a NUL byte: ValueError). Paths from clients,
settings and transcript records go through here, so such a path is a clear InputError (or,
for a record's ``cwd``, simply not a directory of this machine), never a 500 or a lost file.
"""

from __future__ import annotations

import os
from pathlib import Path

from assistd.ground.errors import InputError


def user_path(value: str | os.PathLike) -> Path:
    """``value`` as a Path, a leading ``~`` or ``~user`` expanded.

    Raises InputError when ``~user`` names no user, or the path holds a NUL byte.

    >>> user_path("/tmp/x") == Path("/tmp/x"), user_path("~") == Path.home()
    (True, True)
    """
    text = os.fspath(value)
    if "\0" in str(text):
        raise InputError(f"{str(text)[:80]!r}: a path cannot hold a NUL byte")
    try:
        return Path(text).expanduser()
    except RuntimeError:  # "Could not determine home directory."
        user = str(text).split("/", 1)[0]
        raise InputError(f"{str(text)[:80]!r}: cannot expand {user[:40]}: no such user") from None


def is_dir(path: Path) -> bool:
    """``path.is_dir()``, False where the OS refuses the name (too long, a NUL byte)."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False
