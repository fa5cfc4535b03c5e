"""What a remote Target's server said, made fit to show: its errors as one escaped line
without the key (:class:`RemoteTargetError`, :func:`printable`, :func:`redact_key`).

A server may quote the request back (the key, whole or cut) in an error, a header or a
model id, and may write terminal escape sequences: the key is replaced before anything
is cut, control characters are escaped after."""

from __future__ import annotations

import re

from assistd.ground import jsonlimits
from assistd.ground.errors import ModelError

ERROR_CHARS = 200  # the server's own error text kept in a message
KEY_PIECE = 8  # a piece of the key this long in a server's echo is replaced too
JSON_DEPTH = 64  # nesting of a server's JSON (an answer, a chunk) before it is refused

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                      "\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` with every control character escaped (C0, DEL, C1, the bidirectional
    overrides, lone surrogates): what a server wrote reaches a terminal as text.

    >>> printable("a\\x1b[2Jb\\n")
    'a\\\\x1b[2Jb\\\\n'
    """
    def esc(m):
        c = m.group()
        return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")

    return _CONTROL.sub(esc, text)


class RemoteTargetError(ModelError):
    """The remote Target could not answer: down, slow, refusing, failing. The message
    names the server's URL (never the key) and what to check, on one line (control
    characters escaped). ``kind``: "unreachable" (no answer: refused, timed out),
    "http" (an HTTP error status), "deadline" (past the generation's deadline,
    ``RemoteTarget.deadline_for``), "too_large" (a line or body over its cap) or
    "malformed" (an answer of the wrong shape); :attr:`http_status` is the API's status
    for it (503, 502, 504)."""

    STATUS = {"unreachable": 503, "deadline": 504}

    def __init__(self, message: str, kind: str = "unreachable"):
        super().__init__(printable(str(message)))
        self.kind = kind

    @property
    def http_status(self) -> int:
        return self.STATUS.get(self.kind, 502)


def with_message(exc: Exception, message: str) -> Exception:
    """``exc``'s class again (its ``kind`` kept) with ``message``."""
    if isinstance(exc, RemoteTargetError):
        return RemoteTargetError(message, exc.kind)
    return type(exc)(message)


def redact_key(text: str, key: str | None) -> str:
    """``text`` with ``key``, and every piece of it of :data:`KEY_PIECE` characters or
    more, replaced by ``[the key]``.

    >>> redact_key("a sk-0123456789 b 01234567 c", "sk-0123456789")
    'a [the key] b [the key] c'
    """
    if not key or not text:
        return text
    text = text.replace(key, "[the key]")
    n = min(KEY_PIECE, len(key))
    pieces = {key[i:i + n] for i in range(len(key) - n + 1)}
    hits = [i for i in range(len(text) - n + 1) if text[i:i + n] in pieces]
    if not hits:
        return text
    out, pos, end = [], 0, -1
    for i in hits + [None]:  # runs of overlapping pieces become one [the key]
        if i is not None and i <= end:
            end = i + n
            continue
        if end >= 0:
            out.append("[the key]")
            pos = end
        if i is not None:
            out.append(text[pos:i])
            end = i + n
    return "".join(out) + text[pos:]


def error_detail(body: str, redact=lambda t: t) -> str:
    """The server's own error message, short: ``": message"`` or ``""``; ``redact``
    runs on it before it is cut to :data:`ERROR_CHARS` (a key on the cut would show in
    part), control characters escaped after.

    >>> error_detail('{"error": {"message": "no such model"}}')
    ': no such model'
    """
    try:
        data = jsonlimits.loads(body, JSON_DEPTH)
        msg = data.get("error", data.get("detail", ""))
        msg = msg.get("message", "") if isinstance(msg, dict) else msg
    except (ValueError, AttributeError):
        msg = body
    msg = printable(" ".join(redact(str(msg)).split())[:ERROR_CHARS])
    return f": {msg}" if msg else ""
