"""Private key blocks: the whole body, not only the ``BEGIN`` line the plugin flags.

Every ``BEGIN ... PRIVATE KEY`` block (``ENCRYPTED`` PKCS#8 too, which detect-secrets' list
lacks) and every PuTTY key file is redacted from the line after its marker up to the ``END``
line, or, without one, to the end of the run of base64 (and header) lines; newlines may be
real or JSON-escaped.
"""

from __future__ import annotations

import re

from .spans import RANK_PRIVATE_KEY, REDACTED

_PK_BEGIN = re.compile(
    rb"-{4,5} ?BEGIN[ \t]+(?:[A-Z0-9]+[ \t]+)*PRIVATE[ \t]+KEY(?:[ \t]+BLOCK)? ?-{4,5}"
    rb"|PuTTY-User-Key-File-[0-9]+:[^\r\n\\]*"
)
_PK_END = re.compile(
    rb"-{4,5} ?END[ \t]+(?:[A-Z0-9]+[ \t]+)*PRIVATE[ \t]+KEY(?:[ \t]+BLOCK)? ?-{4,5}"
)
_PK_MAX_BODY_BYTES = 64 * 1024  # an END further away than this is not this block's
_PK_SEP = re.compile(rb"\r?\n|\\{1,3}r\\{1,3}n|\\{1,3}n")
_PK_B64_LINE = re.compile(rb"[ \t]*[A-Za-z0-9+/=]+(?:[ \t]+[A-Za-z0-9+/=]+)*[ \t]*")
_PK_HEADER_LINE = re.compile(rb"[ \t]*[A-Za-z][A-Za-z0-9-]*:[^\r\n\\]*")
_PK_TRIM = b" \t\r\n\f\v"


def private_key_spans(data: bytes, low: bytes) -> list[tuple[int, int, int, str]]:
    """The bodies of ``BEGIN ... PRIVATE KEY`` blocks (and PuTTY key files).

    With an ``END`` line the body is everything between the two markers; without one, the run
    of base64 lines (and ``Header: value`` lines, and the blank line after headers) that follows,
    separated by real or JSON-escaped newlines.

    >>> pem = (b'x\\n-----BEGIN RSA PRIVATE KEY-----\\nMIIEabc\\ndef=\\n'
    ...        b'-----END RSA PRIVATE KEY-----\\n')
    >>> [pem[s:e] for s, e, _, _ in private_key_spans(pem, pem.lower())]
    [b'MIIEabc\\ndef=']
    """
    if b"private key" not in low and b"putty-user-key-file" not in low:
        return []
    out = []
    pos = 0
    while True:
        m = _PK_BEGIN.search(data, pos)
        if m is None:
            return out
        body_start = m.end()
        end_m = None
        if not m.group(0).startswith(b"PuTTY"):
            end_m = _PK_END.search(data, body_start, body_start + _PK_MAX_BODY_BYTES)
            nxt = _PK_BEGIN.search(data, body_start)
            if end_m is not None and nxt is not None and nxt.start() < end_m.start():
                end_m = None
        body_end = end_m.start() if end_m is not None else _pk_run_end(data, body_start)
        s, e = _pk_trim(data, body_start, body_end)
        if e > s and data[s:e] != REDACTED.encode():
            out.append((s, e, RANK_PRIVATE_KEY, "Private Key"))
        pos = end_m.end() if end_m is not None else max(body_end, body_start + 1)


def _pk_run_end(data: bytes, pos: int) -> int:
    """End of the key body after a BEGIN marker that has no END marker."""
    m = _PK_B64_LINE.match(data, pos)
    end = m.end() if m else pos
    after_header = False
    while True:
        sep = _PK_SEP.match(data, end)
        if sep is None:
            return end
        p = sep.end()
        m = _PK_B64_LINE.match(data, p)
        if m and m.end() > p and _at_line_end(data, m.end()):
            end, after_header = m.end(), False
            continue
        m = _PK_HEADER_LINE.match(data, p)
        if m and _at_line_end(data, m.end()):
            end, after_header = m.end(), True
            continue
        if after_header and _PK_SEP.match(data, p):  # the blank line after RFC 1421 headers
            end, after_header = p, False
            continue
        return end


def _at_line_end(data: bytes, pos: int) -> bool:
    """End of text, a (JSON-escaped) newline, or the closing quote of the string holding it."""
    return (pos >= len(data) or _PK_SEP.match(data, pos) is not None
            or data[pos] in b"\"'" or data.startswith(b'\\"', pos))


def _pk_trim(data: bytes, s: int, e: int) -> tuple[int, int]:
    """Shrink ``[s, e)`` past whitespace and (escaped) newlines at both ends."""
    while True:
        while s < e and data[s] in _PK_TRIM:
            s += 1
        m = _PK_SEP.match(data, s, e)
        if m is None or m.end() == s:
            break
        s = m.end()
    while True:
        while e > s and data[e - 1] in _PK_TRIM:
            e -= 1
        for tail in (b"\\r\\n", b"\\n", b"\\r"):
            if data.endswith(tail, s, e):
                e -= len(tail)
                while e > s and data[e - 1] == ord("\\"):
                    e -= 1
                break
        else:
            break
    return s, e
