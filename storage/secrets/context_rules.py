"""Rules that read a secret from its context: the line before it, the block, file syntax or
table it sits in.

* :func:`next_line_spans`: a key or password alone on the line after the one naming it ("AWS
  secret access key:\\n<40 characters>"), or on a comment line after a comment naming it.
* :func:`fenced_spans`: configuration in fenced code blocks (```yaml, or an untagged block of
  ``key: value`` lines), read with the keyword plugin's rules for that file type.
* :func:`netrc_spans`: ``.netrc`` entries (``machine H login U password PW``, on one line or
  several) wherever they are.
* :func:`table_spans`: the cells of a Markdown table column headed ``password``, ``token``,
  ``api key``... that look like a token.
* :func:`aws_pair_spans`: an AWS secret access key next to its access key id (same line or
  the next one), with no keyword naming it.
"""

from __future__ import annotations

import re

from .detector import keyword_mode
from .scan import find_spans
from .spans import TextSpan
from .text_scan import lower_same_offsets
from .values import aws_secret_key, header_secret, lone_secret, table_password

# A secret alone on its line, right after the line that names it (prose, a comment, a
# Markdown label): "Here is the AWS secret access key:\n<40 characters>". The hint line
# holds one of :data:`_NEXT_HINTS`; the value line (within the next few lines, blank lines
# and fence markers skipped) is one word, quoted, backquoted or bulleted at most, that
# :func:`lone_secret` takes for a key or a password.
NEXT_LINE_REACH = 4  # lines looked at below a hint line (blank lines and fences count)
_NEXT_KEYS = ("api key", "api_key", "apikey", "access key", "access_key", "private key",
              "private_key", "ssh key")
_NEXT_FIND = ("secret", "passw", "pwd", "token", "credential", "key")  # "key": _NEXT_KEYS only
_NEXT_HINTS = _NEXT_FIND[:-1] + _NEXT_KEYS
# (A comment marker may start the line: "# the secret access key is\n# <40 characters>".)
_COMMENT_MARK = r"(?:#+|//+|--|;+|/?\*+)"
_LONE_LINE = re.compile(r"\n[ \t]*(?:" + _COMMENT_MARK + r"[ \t]*)?(?:[-*>][ \t]+)?[`'\"]?"
                        r"([^\s`'\"(){}\[\]<>=;,]{8,256})"
                        r"[`'\"]?[ \t.]*(?=\r?\n|$)")
_FENCE_LINE = re.compile(r"[ \t]*(?:`{3,}|~{3,})[^\n]*")
_EMPTY_COMMENT = re.compile(r"[ \t]*" + _COMMENT_MARK + r"[ \t]*")


def next_line_spans(text: str) -> list[TextSpan]:
    """Values alone on a line after a line naming a secret (see :data:`_NEXT_HINTS`).

    >>> next_line_spans("AWS secret access key:\\nwJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\\n")
    [(23, 63, 'Secret After Hint', 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY')]
    """
    if "\\n" in text:  # JSON-escaped lines (a .jsonl transcript): same offsets, real breaks
        text = text.replace("\\n", " \n")
    low = lower_same_offsets(text)
    hint_ends: set[int] = set()  # offsets of the newlines that end a hint line
    for word in _NEXT_FIND:
        i = low.find(word)
        while i >= 0:
            e = text.find("\n", i)
            if e < 0:
                break
            if word != "key" or any(p in low[text.rfind("\n", 0, i) + 1:e] for p in _NEXT_KEYS):
                hint_ends.add(e)
            i = low.find(word, e)
    out = []
    for pos in sorted(hint_ends):
        for _ in range(NEXT_LINE_REACH):
            end = text.find("\n", pos + 1)
            end = len(text) if end < 0 else end
            line = text[pos + 1:end]
            m = _LONE_LINE.match(text, pos)
            if m is not None and lone_secret(m.group(1)):
                out.append((m.start(1), m.end(1), "Secret After Hint", m.group(1)))
            elif m is None and line.strip() and not _FENCE_LINE.fullmatch(line) \
                    and not _EMPTY_COMMENT.fullmatch(line):
                break  # prose or code that is not a value: the label is too far up
            if end >= len(text):
                break
            pos = end
    return out


# Fenced code blocks of configuration (Markdown, as agents write them): the keyword plugin
# takes unquoted values there as in a file of that type, so ``password: plainword`` in a
# ```yaml block goes as it would in config.yaml. An untagged block whose lines are mostly
# ``key: value`` is YAML. An opening fence starts a line (or a JSON string); the block ends
# at the next line that starts with the same fence, or with the text.
_FENCE_OPEN = {m: re.compile(re.escape(m) + r"+[ \t]*([\w.+-]*)[^\n]*\n") for m in ("```", "~~~")}
_FENCE_CLOSE = {m: re.compile(r"\n[ \t]*" + re.escape(m)) for m in ("```", "~~~")}
_FENCE_FILES = {"yaml": "x.yaml", "yml": "x.yaml", "ini": "x.ini", "cfg": "x.cfg",
                "conf": "x.conf", "toml": "x.toml", "properties": "x.properties",
                "env": ".env", "dotenv": ".env", "docker-compose": "x.yaml", "k8s": "x.yaml"}
_YAML_PAIR = re.compile(r"[ \t]*(?:-[ \t]+)?[\w.-]+:(?:[ \t]|$)")


def _fence_filename(tag: str, body: str) -> str | None:
    if tag:
        return _FENCE_FILES.get(tag.lower())
    lines = [ln for ln in body.splitlines() if ln.strip()]
    pairs = sum(1 for ln in lines if _YAML_PAIR.match(ln))
    return "x.yaml" if lines and pairs * 2 > len(lines) else None


def fenced_spans(text: str, prefilter: bool) -> list[TextSpan]:
    """Values the plugins find in configuration blocks, read by the block's file type.

    >>> fenced_spans("```yaml\\ndb:\\n  password: plainword\\n```\\n", True)
    [(24, 33, 'Secret Keyword', 'plainword')]
    """
    out = []
    if "\\n" in text:  # JSON-escaped (a tool call's input): same offsets, real breaks
        text = text.replace("\\n", " \n")
    for marker in ("```", "~~~"):
        i = text.find(marker)
        while i >= 0:
            before = text[text.rfind("\n", 0, i) + 1:i]
            opening = _FENCE_OPEN[marker].match(text, i)
            if opening is None or (before.strip() and not before.endswith('"')):
                i = text.find(marker, i + len(marker))
                continue
            closing = _FENCE_CLOSE[marker].search(text, opening.end() - 1)
            body_start = opening.end()
            body_end = len(text) if closing is None else closing.start() + 1
            filename = _fence_filename(opening.group(1), text[body_start:body_end])
            if filename is not None:
                out.extend(_body_spans(text, body_start, body_end, filename, prefilter))
            if closing is None:
                break
            i = text.find(marker, closing.end())
    return out


def _body_spans(text: str, start: int, end: int, filename: str, prefilter: bool):
    """The plugins' spans in ``text[start:end]`` read as ``filename``, as character spans."""
    data = text[start:end].encode("utf-8", "surrogatepass")
    out = []
    for s, e, _, kind in find_spans(data, keyword_mode(filename), prefilter):
        cs = start + len(data[:s].decode("utf-8", "surrogatepass"))
        value = data[s:e].decode("utf-8", "surrogatepass")
        out.append((cs, cs + len(value), kind, value))
    return out


# .netrc syntax anywhere (a notes file, a transcript): "machine HOST login USER password PW",
# on one line or several; "default" instead of "machine HOST".
_NETRC = re.compile(r"(?<![\w.-])(?:machine[ \t\r\n]+[^\s\\]+|default)"
                    r"(?:[ \t\r\n]+(?:login|account|port)[ \t\r\n]+[^\s\\]+)*"
                    r"[ \t\r\n]+password[ \t\r\n]+([^\s'\"`\\]+)")


def netrc_spans(text: str) -> list[TextSpan]:
    """``password`` values of .netrc entries (references and metavars stay).

    >>> netrc_spans("machine db.example.com login ada password Tr0ub4dor3")
    [(42, 52, 'Netrc Password', 'Tr0ub4dor3')]
    """
    if "password" not in text or ("machine" not in text and "default" not in text):
        return []
    if "\\n" in text:  # JSON-escaped lines: same offsets, real breaks
        text = text.replace("\\n", " \n")
    # The value must look like a password (6+ characters, letters with digits or three
    # classes): "default password for ..." in prose, "password pass" in netrc's own tests stay.
    return [(m.start(1), m.end(1), "Netrc Password", m.group(1)) for m in _NETRC.finditer(text)
            if len(m.group(1)) >= 6 and table_password(m.group(1))]


# Markdown tables: the cells under a header that names a secret ("| user | password |").
_TABLE_SEP = re.compile(r"[ \t]*\|?(?:[ \t]*:?-{3,}:?[ \t]*\|)+(?:[ \t]*:?-{3,}:?[ \t]*)?[ \t]*")
_TABLE_HEADS = frozenset({"password", "passwd", "pwd", "pass", "passphrase", "passcode", "secret",
                          "secret key", "client secret", "token", "access token", "api key",
                          "api_key", "apikey", "api token", "auth token", "private key"})


_TABLE_GATE = re.compile(r"---[ \t:]*\|")  # a separator row's cell end (a literal start: fast)


def _cells(line: str, leading: bool) -> list[tuple[int, int]]:
    """Character spans of a table row's cells (stripped), without the outer pipes; with
    ``leading`` (the table's rows start with a pipe) what stands before the first pipe is no
    cell (a JSON string's start: ``{"command": "| user | password |``)."""
    bars = [i for i, c in enumerate(line) if c == "|" and (i == 0 or line[i - 1] != "\\")]
    edges = ([-1] if not leading else []) + bars
    if line.rstrip() and not line.rstrip().endswith("|"):
        edges.append(len(line))
    out = []
    for a, b in zip(edges, edges[1:]):
        s, e = a + 1, b
        while s < e and line[s] in " \t`*":
            s += 1
        while e > s and line[e - 1] in " \t`*":
            e -= 1
        out.append((s, e))
    return out






def table_spans(text: str) -> list[TextSpan]:
    """Values in the columns of a Markdown table whose header names a password or token;
    a value must look like one (:func:`header_secret`).

    >>> table_spans("| user | password |\\n|---|---|\\n| ada | Tr0ub4dor3 |\\n")
    [(38, 48, 'Secret In Table', 'Tr0ub4dor3')]
    """
    if _TABLE_GATE.search(text) is None:
        return []
    out = []
    lines = text.split("\n")
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln) + 1)
    for i in range(1, len(lines)):
        if "-" not in lines[i] or not _TABLE_SEP.fullmatch(lines[i].rstrip("\r")):
            continue
        head = lines[i - 1]
        leading = lines[i].lstrip().startswith("|")
        names = {k: head[s:e].lower().replace("-", " ")
                 for k, (s, e) in enumerate(_cells(head, leading))}
        # A password column takes any value with letters and digits (or three classes),
        # identifier-shaped too; a token or key column a value that looks like a token.
        check = {k: table_password if name.startswith("pass") or name == "pwd" else header_secret
                 for k, name in names.items() if name in _TABLE_HEADS}
        cols = sorted(check)
        if not cols:
            continue
        for j in range(i + 1, len(lines)):
            row = lines[j].rstrip("\r")
            if "|" not in row:
                break
            cells = _cells(row, leading)
            for k in cols:
                if k < len(cells):
                    s, e = cells[k]
                    value = row[s:e]
                    if value and not any(c.isspace() for c in value) and check[k](value):
                        out.append((starts[j] + s, starts[j] + e, "Secret In Table", value))
    return out


# An AWS secret access key next to its key id ("AKIA... / wJalr...", the IAM console's CSV
# "ci,AKIA...,wJalr...", the id on one line and the key on the next): the plugin knows the
# id by its prefix but the secret only after a keyword. As trufflehog's AWS detector pairs
# each id with the 40-character [A-Za-z0-9/+] runs near it, and Watchman's AWS rule gates
# that run on an AKIA/ASIA id, a standalone run of 40 on the id's line or the next one is
# the secret when it looks random (:func:`.values.aws_secret_key`). An id already redacted
# ([REDACTED]: by the plugins earlier in the same round, or in every history written before
# this rule) anchors it too: a random run of 40 beside a secret is one (m009 relies on it).
_AWS_KEY_ID = re.compile(r"A(?:3T[A-Z0-9]|KIA|SIA|BIA|CCA)[A-Z0-9]{16}"  # the plugin's ids
                         r"|\[REDACTED\]")
_AWS_SECRET_RUN = re.compile(r"(?<![A-Za-z0-9/+_-])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=_-])")


def aws_pair_spans(text: str) -> list[TextSpan]:
    """40-character secret keys on the line of an AWS access key id (or of a value
    already redacted), or on the next line.

    >>> aws_pair_spans("AKIAIOSFODNN7EXAMPLE / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    [(23, 63, 'AWS Secret Access Key', 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY')]
    >>> aws_pair_spans("[REDACTED] / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")[0][:2]
    (13, 53)
    """
    m = _AWS_KEY_ID.search(text)
    if m is None:
        return []
    if "\\n" in text:  # JSON-escaped lines (a .jsonl transcript): same offsets, real breaks
        text = text.replace("\\n", " \n")
    out = []
    seen: set[int] = set()
    while m is not None:
        s = text.rfind("\n", 0, m.start()) + 1
        e = text.find("\n", m.end())
        e = len(text) if e < 0 else text.find("\n", e + 1)  # and the next line
        e = len(text) if e < 0 else e
        for r in _AWS_SECRET_RUN.finditer(text, s, e):
            if r.start() not in seen and aws_secret_key(r.group()):
                seen.add(r.start())
                out.append((r.start(), r.end(), "AWS Secret Access Key", r.group()))
        m = _AWS_KEY_ID.search(text, m.end())
    return out
