"""Rules that run the whole filter again on a transformed copy of a value.

* :func:`base64_spans`: any base64 run (20+ characters) that decodes to ``user:password`` or
  to text this filter redacts (an encoded provider key).
* :func:`concat_spans`: a key cut in two adjacent string literals (``"AKIA..." + "..."``,
  implicit concatenation, one line break at most), found by scanning the line with the
  literals joined; a high-entropy value counts when a format or a keyword names it, also a
  keyword inside the first literal (``"aws_secret_access_key = wJalr"\\n    "XUtn..."``).

``rescan`` is the filter itself (:func:`.pipeline.rescan`), passed in by the caller so that
this module does not import the pipeline that imports it.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable

from .prefilter import HINT
from .spans import Redaction, TextSpan
from .text_scan import char_runs
from .values import USER_PASSWORD, b64_text

Rescan = Callable[[str], Redaction]  # the filter on a text: redact(text) without a filename

# Base64 of a credential, quoted or not: a run of base64 characters that decodes to printable
# text holding ``user:password`` or something the filter redacts (a provider key).
_B64_RUN_MIN = 20
_B64_RUN_TABLE = bytes(ord("a") if b in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                       b"0123456789+/-_" else ord(" ") for b in range(256))


def base64_spans(text: str, rescan: Rescan) -> list[TextSpan]:
    """Base64 runs (20+ characters, both letter cases) whose decoded text is a credential.

    >>> from storage.secrets.pipeline import rescan
    >>> base64_spans("auth = YWRhOlRyMHViNGRvciYz", rescan)  # ada:Tr0ub4dor&3
    [(7, 27, 'Base64 Encoded Secret', 'YWRhOlRyMHViNGRvciYz')]
    """
    data = text.encode("utf-8", "surrogatepass")
    out = []
    for i, e in char_runs(data.translate(_B64_RUN_TABLE), _B64_RUN_MIN):
        end = e
        while end < len(data) and end < e + 2 and data[end:end + 1] == b"=":
            end += 1
        if i and data[i - 1] == 0x5c:  # "\\nc2st...": the run starts with an escape's letter
            i += 1
        run = data[i:end].decode("ascii")
        body = run.rstrip("=")
        if body.lower() != body and body.upper() != body:
            decoded = b64_text(run)
            if decoded is not None and (USER_PASSWORD.fullmatch(decoded)
                                        or rescan(decoded).count):
                out.append((i, end, "Base64 Encoded Secret", run))
    # bytes offsets -> character offsets (text is ASCII around the runs only by chance)
    if out and len(data) != len(text):
        out = [(len(data[:s].decode("utf-8", "surrogatepass")),
                len(data[:e].decode("utf-8", "surrogatepass")), k, v) for s, e, k, v in out]
    return out


# A key cut in two string literals: "AKIAIOSF" + "ODNN7EXAMPLE", ("ghp_..."\n "...").
# Found on a translated copy (token characters -> "a", quotes -> '"'), so that the regex
# starts with a literal ("aaaa\""): re's fast prefix search, ~10x the speed of a class.
_JUNCTION_TABLE = bytes(
    ord("a") if chr(b) in string.ascii_letters + string.digits + "+/=_-"
    else ord('"') if chr(b) in "'\""
    else b if chr(b) in " \t\r\n.&|\\" else ord("#") for b in range(256))
_JUNCTION = re.compile(rb'aaaa("[ \t]*(?:a|[.&]|\|\|)?[ \t]*(?:\\?\r?\n[ \t]*)?")aaaa')


def _junctions(text: str) -> list[tuple[int, int]]:
    """(closing quote, opening quote) offsets of adjacent literals that both touch 4+
    token characters: ``"...AKIA" + "1234..."``, ``"ab12"\\n    "cd34"``."""
    data = text.encode("utf-8", "surrogatepass")
    marks = data.translate(_JUNCTION_TABLE)
    out = []
    pos = 0
    while (m := _JUNCTION.search(marks, pos)) is not None:
        out.append((m.start(1), m.end(1) - 1))
        pos = m.end(1) - 1  # the opening quote may close the next junction's literal
    if out and len(data) != len(text):
        out = [(len(data[:a].decode("utf-8", "surrogatepass")),
                len(data[:b].decode("utf-8", "surrogatepass"))) for a, b in out]
    return out
_SPLIT_RUN_MIN = 16  # token characters across the cut, 4+ on each side
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "+/=_-")


_ENTROPY_KINDS = frozenset({"Base64 High Entropy String", "Hex High Entropy String"})
# A hint word assigned the value right before it, inside the literal: the keyword plugin
# wants the value quoted on its own ("aws_secret_access_key = wJalr..." in one string is
# found by the eager entropy search alone), but the name says what the value is.
_NAMED_BEFORE = re.compile(r"(?i)(?:" + HINT + r")[\w.-]*['\"]?[ \t]*(?:=|:=?)[ \t]*['\"]?$")


def concat_spans(text: str, rescan: Rescan) -> list[TextSpan]:
    """The parts of two adjacent string literals that are a secret once joined.

    >>> from storage.secrets.pipeline import rescan
    >>> [v for _, _, _, v in concat_spans('key = "AKIAIOSFOD" + "NN7EXAMPLE"', rescan)]
    ['AKIAIOSFOD', 'NN7EXAMPLE']
    """
    out = []
    for j0, j1 in _junctions(text):  # the closing and the opening quote
        q1, q2 = text[j0], text[j1]
        ls = text.rfind(q1, text.rfind("\n", 0, j0) + 1, j0)
        re_ = text.find(q2, j1 + 1)
        nl = text.find("\n", j1 + 1)
        if ls < 0 or re_ < 0 or (0 <= nl < re_):
            continue
        left, right = text[ls + 1:j0], text[j1 + 1:re_]
        a = len(left) - len(left.rstrip("".join(_TOKEN_CHARS)))
        b = len(right) - len(right.lstrip("".join(_TOKEN_CHARS)))
        if a < 4 or b < 4 or a + b < _SPLIT_RUN_MIN:
            continue
        line_start = text.rfind("\n", 0, ls) + 1
        line_end = text.find("\n", re_)
        line_end = len(text) if line_end < 0 else line_end
        head = text[line_start:ls + 1]
        view = head + left + right + text[re_:line_end]
        red = rescan(view)
        if not red.count:
            continue
        p = 0
        while p < min(len(view), len(red.text)) and view[p] == red.text[p]:
            p += 1
        if not set(red.kinds) - _ENTROPY_KINDS and not _NAMED_BEFORE.search(view, 0, p):
            # Entropy alone is no reason here: two halves of an alphabet, a base64 test vector
            # cut in two lines. A format (AWS, GitHub, ...) or a keyword must name it.
            continue
        q = 0
        while q < min(len(view), len(red.text)) - p and view[-1 - q] == red.text[-1 - q]:
            q += 1
        changed = (p, len(view) - q)  # in view coordinates
        kind = next(iter(red.kinds), "Split Secret")
        for lit_start, piece, orig in ((len(head), left, ls + 1), (len(head) + len(left), right,
                                                                    j1 + 1)):
            s = max(changed[0], lit_start)
            e = min(changed[1], lit_start + len(piece))
            if e > s:
                value = text[orig + s - lit_start:orig + e - lit_start]
                out.append((orig + s - lit_start, orig + e - lit_start, kind, value))
    return out
