"""The remote Target's API key: read from a 0600 file or ``$ASSISTD_TARGET_KEY``
(:func:`read_key`), sent as a bearer header (:class:`KeyFile` reads a rotated file
again). The key goes only to the configured URL and never into a log, message or repr
(:func:`assistd.targets.remote.errors.redact_key`)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import httpx

from assistd.ground.errors import InputError

log = logging.getLogger("assistd.targets.remote")  # one logger for the whole remote Target

KEY_ENV = "ASSISTD_TARGET_KEY"


def read_key(path: Path | str | None, environ=None) -> str | None:
    """The API key: the file at ``path`` (whitespace stripped), else ``$ASSISTD_TARGET_KEY``,
    else None. Raises :class:`InputError` for a file that is missing, unreadable, empty,
    or readable by its group or others (the fix: ``chmod 600``)."""
    environ = os.environ if environ is None else environ
    if path is None:
        return _checked_key(environ.get(KEY_ENV, ""), f"${KEY_ENV}") or None
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as e:
        raise InputError(f"target key file {p}: {e.strerror}; pass a file holding the key") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"target key file {p} is not a regular file")
    if st.st_mode & 0o077:
        raise InputError(f"target key file {p} is readable by others (mode"
                         f" {stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {p}")
    try:
        key = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read target key file {p}: {e}") from None
    if not key:
        raise InputError(f"target key file {p} is empty")
    return _checked_key(key, f"target key file {p}")


def _checked_key(key: str, where: str) -> str:
    """``key`` without surrounding whitespace; InputError if it holds whitespace or a
    control character inside (it would not fit an HTTP header: httpx would refuse the
    request with a protocol error naming nothing)."""
    key = key.strip()
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in key):
        raise InputError(f"{where} holds whitespace or a control character inside the key"
                         " (a key is one line of printable characters)")
    return key


class KeyFile(httpx.Auth):
    """The bearer key of a key file, read again when the file changes (its mtime, size
    or mode), so that a key rotated in place is used from the next request on without a
    restart. A file that turns bad (mode, empty, gone) keeps the last good key and
    warns once per change."""

    def __init__(self, path: Path | str, key: str | None):
        self.path, self.key = Path(path).expanduser(), key
        self._seen = self._stamp()

    def _stamp(self):
        try:
            st = self.path.stat()
            return (st.st_mtime_ns, st.st_size, st.st_mode)
        except OSError:
            return None

    def auth_flow(self, request):
        stamp = self._stamp()
        if stamp != self._seen:
            self._seen = stamp
            try:
                self.key = read_key(self.path)
                log.info("target key file %s changed: the new key is used", self.path)
            except InputError as e:
                log.warning("warning: %s; the key read before is still used", e)
        if self.key:
            request.headers["Authorization"] = f"Bearer {self.key}"
        yield request
