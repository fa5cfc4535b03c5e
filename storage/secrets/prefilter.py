"""The prefilter: the lines of a text that could hold a secret at all.

:func:`candidate_lines` runs C-speed scans (``bytes.translate`` + ``bytes.find``, regexes that
start with a literal) over the UTF-8 bytes. Each scan is a *necessary condition* of one
detect-secrets plugin (or of the eager entropy search), written out next to it, so the
prefilter is never the reason a secret is missed: ``redact(x) == redact(x, prefilter=False)``.
On the standard library 0.24 % of the lines pass.
"""

from __future__ import annotations

import re

# Necessary conditions, one per default detect-secrets plugin (or group of plugins), each noted
# next to its scan. They run on the UTF-8 bytes; ``low`` is the ASCII-lowercased copy for the
# case-insensitive plugins. Python's re.IGNORECASE also folds four non-ASCII characters onto
# ASCII letters (U+0130, U+0131, U+017F long s, U+212A Kelvin); a line holding one of them is
# always a candidate. Speed comes from scans that C does alone: every regex starts with a
# literal (re's fast prefix search; alternations with different first characters are ~20x
# slower), and the quoted-run scans use ``bytes.translate`` + ``bytes.find``. Each scan costs
# about 1 ms per MB.

_B64_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/\\=_-"
_HEX_CHARS = b"0123456789abcdefABCDEF"


def _class_table(members: bytes, mark: bytes) -> bytes:
    table = bytearray(b" " * 256)
    for b in members:
        table[b] = mark[0]
    table[ord("'")] = table[ord('"')] = ord('"')
    return bytes(table)


# The entropy plugins. Base64HighEntropyString's charset is letters, digits and ``+/\-_=`` (sic,
# the backslash is in it), HexHighEntropyString's is ``0-9a-fA-F``. Shannon entropy is at most
# log2(number of distinct characters), so a value above the 4.5 (3.0) bit limit has at least 23
# (9) distinct characters; quoted values sit in a maximal run right after a quote. The eager
# (unquoted) search needs such a run anywhere on a line that has a hint word.
_B64_TABLE = _class_table(_B64_CHARS, b"a")
_HEX_TABLE = _class_table(_HEX_CHARS, b"h")
_B64_MIN_DISTINCT = 23
_HEX_MIN_DISTINCT = 9
_B64_RUN_RX = re.compile(rb"[A-Za-z0-9+/\\=_-]{23,}")
_HEX_RUN_RX = re.compile(rb"[0-9a-fA-F]{9,}")

# Eager-entropy hint words (the detection side uses the same words, case-insensitively).
HINT = r"token|bearer|auth|credential|secret|passw|pwd|api[_-]?key|access[_-]?key|private[_-]?key"

# The assignment of a long value, as built by RegexBasedDetector.build_assignment_regex
# (Cloudant, IBM Cloud IAM, SoftLayer): keyword, optional quote/bracket, ``=|:|:=|=>| +|::``,
# optional quote, a value of 24+ characters. Backslashes allowed for JSON-escaped quotes.
_ASSIGN_LONG = rb"""(?=[\\"'\]]{0,6}[ =:>]+[\\"']{0,6}[a-z0-9_-]{24})"""
_KEY_WORDS = (b"api", b"auth", b"service", b"account", b"db", b"database", b"priv", b"private",
              b"client")

_HINT_KEY = (b"(?P<hint>(?<=api-key)|(?<=access_key)|(?<=accesskey)|(?<=access-key)"
             b"|(?<=private-key))")
# (regex starting with a literal, runs on the lowered copy?, needs a run?). A line matched only
# through a "needs a run" scan or a ``(?P<hint>...)`` group matters only to the eager entropy
# search: it is a candidate when it also holds a run with enough distinct characters.
_SCANS: tuple[tuple[re.Pattern, bool, bool], ...] = (
    # KeywordDetector DENYLIST api_?key ... client_?key; AzureStorageKeyDetector "AccountKey=";
    # PrivateKeyDetector "BEGIN ... PRIVATE KEY", "PuTTY-User-Key-File-2"; long assignments;
    # hint words api-key, access_key, private-key; StripeDetector [rs]k_live_.
    (re.compile(
        b"k(?:ey(?:"
        + b"|".join(b"(?<=%skey)|(?<=%s_key)" % (w, w) for w in _KEY_WORDS)
        + b"|(?<=private key)|(?<=putty-user-key)|" + _ASSIGN_LONG + b"|" + _HINT_KEY + b")"
        + b"|_live_)"), True, False),
    # DENYLIST db_?pass, database_?pass, key_?pass, password, passwd, pwd; long assignments.
    (re.compile(
        b"p(?:ass(?:w|(?<=dbpass)|(?<=db_pass)|(?<=basepass)|(?<=base_pass)|(?<=keypass)"
        b"|(?<=key_pass)|" + _ASSIGN_LONG + b")|w(?:d|" + _ASSIGN_LONG + b"))"), True, False),
    # DENYLIST secret (IbmCosHmacDetector secret_access_key too); SquareOAuthDetector sq0csp-.
    (re.compile(b"s(?:ecret|q0csp-)"), True, False),
    # DENYLIST contraseña / contrasena; hint word credential.
    (re.compile(b"c(?:ontrase|(?P<hint>redential))"), True, False),
    (re.compile(b"xox"), True, False),  # SlackDetector token (case-insensitive)
    # BasicAuthDetector and Cloudant URLs ://user:pass@ (JSON may write :\/\/); NpmDetector
    # "/:_authToken"; SlackDetector webhook; SoftlayerDetector "://api.softlayer.com" (its
    # dots are any character).
    (re.compile(rb"/(?:[^\s/@]+@|:_authtoken|hooks\.slack\.com|api.softlayer.com)"), True, False),
    # Hint words; "token" also covers the Cloudant/IBM/SoftLayer "token" assignments (their
    # 24+ character value is a long run).
    (re.compile(b"token"), True, True),
    (re.compile(b"bearer"), True, True),
    (re.compile(b"auth"), True, True),
    # Case-sensitive token formats, on the original bytes. AWSKeyDetector (A3T./ABIA/ACCA/AKIA/
    # ASIA + 16), ArtifactoryDetector (AKC + 10, AP[\dA-F] + 8, \d may be a non-ASCII digit),
    # TwilioKeyDetector AC + 32, PypiTokenDetector "pypi-AgE".
    (re.compile(
        rb"A(?:(?:3T[A-Z0-9]|BIA|CCA|KIA|SIA)[0-9A-Z]{16}|KC[a-zA-Z0-9]{10}"
        rb"|P(?:[0-9A-F]|[\x80-\xff]{2,4})[a-zA-Z0-9]{8}|C[a-z0-9]{32}|gE(?<=pypi-AgE))"),
     False, False),
    (re.compile(rb"S(?:K[a-z0-9]{32}|G\.)"), False, False),  # TwilioKeyDetector, SendGridDetector
    # JwtTokenDetector "eyJ"; OpenAIDetector "T3BlbkFJ" (in every key).
    (re.compile(rb"J(?:(?<=eyJ)|(?<=T3BlbkFJ))"), False, False),
    (re.compile(b"GR1348941"), False, False),  # GitLabTokenDetector runner token
    # GitHubTokenDetector gh[pousr]_, GitLabTokenDetector gl...-.
    (re.compile(rb"g(?:h[pousr]_|l(?:pat|dt|ft|soat|rt|cbt|imt|ptt|agent|oas)-)"), False, False),
    (re.compile(rb"-us[0-9]"), False, False),  # MailchimpDetector
    (re.compile(rb":[0-9A-Za-z_-]{35}"), False, False),  # TelegramBotTokenDetector \d{8,10}:
    # DiscordBotTokenDetector [MNO]x{23,25}.x{6}.x{27} with x = [A-Za-z\d_-] (\d: any digit).
    (re.compile(rb"\.[a-zA-Z0-9_\x80-\xff-]{6,24}\.[a-zA-Z0-9_\x80-\xff-]{27}"), False, False),
    # IPPublicDetector has no scan: is_not_alphanumeric_string drops all its values (no letter).
)
_FOLDING_BYTES = tuple(c.encode() for c in ("\u0130", "\u0131", "\u017f", "\u212a"))  # İ ı ſ K


def candidate_lines(data: bytes, low: bytes | None = None) -> list[tuple[int, int]]:
    """Byte ranges ``[start, end)`` of the lines (without ``\\n``) that may hold a secret.

    >>> candidate_lines(b'x = 1\\napi_key = "abc"\\ny = 2\\n')
    [(6, 21)]
    """
    if low is None:
        low = data.lower()
    starts: set[int] = set()
    _mark_quoted_runs(data.translate(_B64_TABLE), b"a", _B64_MIN_DISTINCT, data, starts)
    _mark_quoted_runs(data.translate(_HEX_TABLE), b"h", _HEX_MIN_DISTINCT, data, starts)
    for rx, lowered, needs_run in _SCANS:
        _mark_regex(rx, low if lowered else data, data, starts, needs_run)
    for needle in _FOLDING_BYTES:
        if needle in data:
            _mark_regex(re.compile(re.escape(needle)), data, data, starts, False)
    out = []
    for s in sorted(starts):
        e = data.find(b"\n", s)
        out.append((s, len(data) if e < 0 else e))
    return out


def all_lines(data: bytes) -> list[tuple[int, int]]:
    """Byte ranges of every line (no prefilter).

    >>> all_lines(b"a\\nbc\\n")
    [(0, 1), (2, 4), (5, 5)]
    """
    out = []
    start = 0
    while True:
        nl = data.find(b"\n", start)
        if nl < 0:
            out.append((start, len(data)))
            return out
        out.append((start, nl))
        start = nl + 1


def _line_of(data: bytes, pos: int) -> tuple[int, int]:
    s = data.rfind(b"\n", 0, pos) + 1
    e = data.find(b"\n", pos)
    return s, len(data) if e < 0 else e


def _mark_regex(rx: re.Pattern, buf: bytes, data: bytes, starts: set[int], needs_run: bool) -> None:
    hinted = "hint" in rx.groupindex
    no_run_line = -1  # start of the last line found to have no long run
    m = rx.search(buf)
    while m is not None:
        s, e = _line_of(data, m.start())
        weak = needs_run or (hinted and m.group("hint") is not None)
        if s not in starts and weak:
            if s != no_run_line and _has_long_run(data[s:e]):
                starts.add(s)
            else:
                no_run_line = s  # a strong match later on this line still counts
                m = rx.search(buf, m.end())
                continue
        starts.add(s)
        if e >= len(data):
            return
        m = rx.search(buf, e + 1)


def _has_long_run(line: bytes) -> bool:
    """A run that the eager entropy search could flag (enough distinct characters)."""
    for rx, min_distinct in ((_B64_RUN_RX, _B64_MIN_DISTINCT), (_HEX_RUN_RX, _HEX_MIN_DISTINCT)):
        for m in rx.finditer(line):
            if len(set(m.group())) >= min_distinct:
                return True
    return False


def _mark_quoted_runs(buf: bytes, mark: bytes, min_distinct: int, data: bytes,
                      starts: set[int]) -> None:
    """Lines with a quote followed by a run of ``min_distinct`` distinct charset characters.

    ``buf`` is ``data`` translated: charset bytes -> ``mark``, quotes -> ``"``, others -> space.
    """
    needle = b'"' + mark * min_distinct
    run = re.compile(re.escape(mark) + b"*")
    pos = buf.find(needle)
    while pos >= 0:
        end = run.match(buf, pos + 1).end()
        if len(set(data[pos + 1:end])) >= min_distinct:
            s, e = _line_of(data, pos)
            starts.add(s)
            if e >= len(data):
                return
            pos = buf.find(needle, e + 1)
        else:
            pos = buf.find(needle, end)
