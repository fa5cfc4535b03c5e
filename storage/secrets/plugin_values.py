"""Reading values out of the detect-secrets plugins' matches on one view of a line.

The plugins' own results need help: a regex group that is only a token's prefix
(:func:`regex_value`), a fixed-length pattern that stops inside a longer token (grown over
the rest of it), a JWT whose lazy pattern stops before the signature (:func:`own_values`),
the name or host a pattern includes (:func:`trim`), unquoted values after a hint word
(:func:`eager_values`), and long lines cut into windows for the slow keyword patterns.
"""

from __future__ import annotations

import re

from .escapes import ESCAPE_SPLIT
from .prefilter import HINT
from .spans import REDACTED

WINDOW_CHARS = 4096  # the keyword plugin runs on windows of long lines ...
WINDOW_OVERLAP_CHARS = 512  # ... overlapping by this much (keyword and value kept whole)
EAGER_REACH_CHARS = 64  # an unquoted value counts when it starts this close after a hint word

# Eager-entropy hint words: the prefilter's HINT, case-insensitively, and spelled out.
_HINT_STR = re.compile(HINT, re.IGNORECASE)
_HINT_WORDS = ("token", "bearer", "auth", "credential", "secret", "passw", "pwd", "apikey",
               "api_key", "api-key", "accesskey", "access_key", "access-key", "privatekey",
               "private_key", "private-key")


def hint_ends(view: str, low: str, folded: bool) -> list[int]:
    """Sorted end offsets of the hint words in ``view`` (``low`` is ``view.lower()``).

    >>> hint_ends("X_API_KEY=1 token", "x_api_key=1 token", False)
    [9, 17]
    """
    if folded:  # str.lower() may change lengths; let the regex fold instead
        return [m.end() for m in _HINT_STR.finditer(view)]
    ends = []
    for word in _HINT_WORDS:
        i = low.find(word)
        while i >= 0:
            ends.append(i + len(word))
            i = low.find(word, i + 1)
    return sorted(ends)


def may_have_keyword(text: str) -> bool:
    """Every KeywordDetector DENYLIST word holds key, pass, pwd, secret or contrase (any case,
    with re.IGNORECASE's folding of long s, dotless i and the Kelvin sign).

    >>> may_have_keyword("DB_PASSWORD=x"), may_have_keyword("user = 'ada'")
    (True, False)
    """
    low = text.lower()
    return ("key" in low or "pass" in low or "pwd" in low or "secret" in low
            or "contrase" in low or "\u017f" in low or "\u0131" in low or "\u0130" in text)


def windows(view: str) -> list[str]:
    """Overlapping windows of a long view for the keyword plugin, whose greedy patterns are
    slow on long lines (the token and entropy plugins see the whole view)."""
    if len(view) <= WINDOW_CHARS:
        return [view]
    step = WINDOW_CHARS - WINDOW_OVERLAP_CHARS
    return [view[i:i + WINDOW_CHARS] for i in range(0, len(view) - WINDOW_OVERLAP_CHARS, step)]


def eager_values(view: str, unquoted: re.Pattern, hint_ends: list[int]) -> list[str]:
    """Unquoted charset runs that start within :data:`EAGER_REACH_CHARS` after a hint word,
    cut at escape sequences and at the first inner ``=`` (``NAME=value`` is one base64 run;
    padding only ends a value).

    >>> rx = re.compile(r"[A-Za-z0-9+/=_-]+")
    >>> eager_values("export API_TOKEN=abc==", rx, [16])
    ['abc==']
    """
    out = []
    done = 0  # the view up to here has been cut into values already
    for h in hint_ends:
        pos = max(h, done)
        while pos <= h + EAGER_REACH_CHARS:
            m = unquoted.search(view, pos, len(view))
            if m is None or m.start() > h + EAGER_REACH_CHARS:
                break
            start = m.start()
            for piece in ESCAPE_SPLIT.split(m.group().rstrip("\\")):
                name, eq, value = piece.partition("=")
                for sub in ([name, value] if eq and value.strip("=") else [piece]):
                    if sub and start >= h:
                        out.append(sub)
                    start += len(sub) + 1
            pos = done = m.end()
    return out


def regex_value(m: re.Match) -> str:
    """The secret in one match of a RegexBasedDetector pattern, grown to the whole token.

    The plugin's own ``analyze_string`` yields the capture groups. For most plugins the group
    is the value (``://user:(pass)@``, ``aws...key...'(40)'``), but GitHub and GitLab capture
    only the prefix (``(ghp|gho|...)_...``): a group that starts the match, or that the match
    continues past with more token characters, is a prefix, and the whole match is taken.
    Fixed-length patterns stop inside longer real tokens (``sk_live_`` + 24, while Stripe keys
    run to ~100 characters; OpenAI ``...T3BlbkFJ`` + 20): a value that ends the match on a token
    character runs on over ``[A-Za-z0-9_-]``.

    >>> import re
    >>> regex_value(re.search(r'(ghp|gho)_[a-z]{4}', 'x ghp_abcd y'))
    'ghp_abcd'
    >>> regex_value(re.search(r'://[^:@]+:([^:@]+)@', 'https://me:pw@host'))
    'pw'
    >>> regex_value(re.search(r'sk_live_[a-z]{4}', 'k=sk_live_abcdefgh z'))
    'sk_live_abcdefgh'
    """
    string = m.string
    groups = [i for i in range(1, (m.re.groups or 0) + 1) if m.group(i)]
    start, end = m.span()
    if groups:
        best = max(groups, key=lambda i: m.end(i) - m.start(i))
        g_start, g_end = m.span(best)
        prefix = (g_start == start and g_end < end) or (g_end < end and _token_char(string[g_end]))
        if not prefix:
            start, end = g_start, g_end
    return string[start:_grow(string, start, end, m.end())]


def _token_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c in "_-")


def _grow(string: str, start: int, end: int, match_end: int) -> int:
    """Extend ``[start, end)`` over following token characters when it ends the match on one."""
    if end == match_end and end > start and _token_char(string[end - 1]):
        while end < len(string) and _token_char(string[end]):
            end += 1
    return end


_JWT_TAIL = re.compile(r"[A-Za-z0-9_\-.+/=]*")


def own_values(plugin, view: str) -> list[str]:
    """Values of a plugin with its own ``analyze_string`` (JwtTokenDetector, whose pattern's
    lazy last part often stops before the signature): each grown over base64url and dots."""
    out = []
    for v in plugin.analyze_string(view):
        idx = view.find(v)
        while idx >= 0:
            out.append(view[idx:_JWT_TAIL.match(view, idx + len(v)).end()])
            idx = view.find(v, idx + 1)
    return out


def trim(value: str) -> str:
    """Drop the delimiters some patterns include (Artifactory: ``(?:\\s|=|:|"|^)AKC...``), and
    the part of the match that is no secret (Azure's ``AccountKey=``, Slack's webhook host):
    it stays on the line.

    >>> trim("https://hooks.slack.com/services/T1/B2/x3"), trim("AccountKey=k==")
    ('T1/B2/x3', 'k==')
    """
    value = value.lstrip(" \t\r\n\f\v=:\"'").rstrip(" \t\r\n\f\v\"'")
    for name in _NOT_SECRET_PREFIXES:
        if value.startswith(name) and len(value) > len(name):
            return value[len(name):]
    return value


_NOT_SECRET_PREFIXES = ("AccountKey=", "https://hooks.slack.com/services/")


def pieces(value: str) -> list[str]:
    """A value that swallowed an earlier ``[REDACTED]`` (mask-and-rescan): the rest of it."""
    if REDACTED not in value:
        return [value]
    return [p.strip() for p in value.split(REDACTED) if p.strip()]


_SEGMENT_DELIMS = ",;{&\n"


def segment(line: str, value: str) -> str:
    """The part of ``line`` from the last ``,;{&`` before ``value`` on (its own assignment)."""
    idx = line.find(value)
    if idx < 0:
        return line
    cut = max(line.rfind(d, 0, idx) for d in _SEGMENT_DELIMS)
    return line[cut + 1:]


_YAML_SYMBOLS = frozenset("-+/=@#%^&*!~$?")
_YAML_KEY = re.compile(r"\s*(?:-\s+)?[\"']?[A-Za-z_][\w.-]*[\"']?\s*:\s+")


def yaml_like(view: str) -> bool:
    """``key: value`` as a whole line, the value one unquoted word that has a digit or a symbol:
    YAML ``password: hunter2``, not Python ``password: str`` or ``password: bytes | None``.

    >>> [yaml_like(v) for v in ("  password: hunter2", "password: str", "password: x,")]
    [True, False, False]
    """
    m = _YAML_KEY.match(view)
    if m is None:
        return False
    value = view[m.end():].rstrip()
    return (
        bool(value)
        and value[0] not in "\"'([{&*|>#!"
        and value[-1] not in ",;([{\\"
        and not any(c.isspace() for c in value)
        and any(c.isdigit() or c in _YAML_SYMBOLS for c in value)
    )
