"""Is a found value a literal secret? Checks on one value, shared by the extra rules.

A rule's regex finds where a value sits; these predicates drop references and placeholders
(``$VAR``, ``<token>``, ``PASSWORD`` metavars), English words and names in code, so that
only values that look like a password or a key are redacted.
"""

from __future__ import annotations

import base64
import binascii
import math
import re

from .spans import REDACTED

# Values that are names of a value, not one: shell and template references, metavars.
_PLACEHOLDER = re.compile(r"[$%{<(\[@/~*&\\-]|.*(?:\$\{|\$\(|\{\{|\}\}|\.\.\.)"
                          r"|[A-Z_]+$|[0-9]+$|\W+$"
                          r"|(?i:x+|your[_-]?\w*|changeme|password|passwd|secret|token|none|null"
                          r"|true|false|stdin|prompt|example\w*)$")
_IDENTIFIER = re.compile(r"[a-z0-9]+(?:[_.-][a-z0-9]+)+|[A-Z0-9]+(?:_[A-Z0-9]+)+")  # snake, CONST
_CODE_NAME = re.compile(r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+|_\w+|\w+_")  # attr.path, _x
_LOWER_RUN = re.compile(r"[a-z]+")
# ``user:password`` as Docker's ``auth`` and HTTP Basic credentials encode it.
USER_PASSWORD = re.compile(r"[\w.@+-]{1,64}:[!-~]{3,128}")


def plausible_password(value: str) -> bool:
    """A command-line or assignment value that is a literal secret, not a reference.

    >>> [plausible_password(v) for v in ("Hunter2x", "$DB_PW", "PASSWORD", "<token>", "xxxx")]
    [True, False, False, False, False]
    """
    return REDACTED not in value and _PLACEHOLDER.match(value) is None


def header_secret(value: str) -> bool:
    """A header's credentials: letters with digits, or three character classes; not a word,
    a metavar or a name in code (``NotRequired``, ``self.api_key``).

    >>> [header_secret(v) for v in ("dXNlcjpQdzEyMw==", "NotRequired", "self.api_key")]
    [True, False, False]
    """
    if not plausible_password(value) or _IDENTIFIER.fullmatch(value) \
            or _CODE_NAME.fullmatch(value):
        return False
    has_alpha = any(c.isalpha() for c in value)
    return (has_alpha and any(c.isdigit() for c in value)) or _classes(value) >= 3


def b64_text(value: str) -> str | None:
    """``value`` base64-decoded (standard or URL-safe, padding optional) when that gives
    printable ASCII, else None.

    >>> b64_text("dXNlcjpwdw=="), b64_text("not base64!"), b64_text("AAEC")
    ('user:pw', None, None)
    """
    body = value.rstrip("=")
    if len(body) % 4 == 1 or not body:
        return None
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4),
                               altchars=b"-_" if ("-" in body or "_" in body) else None,
                               validate=True)
    except (binascii.Error, ValueError):
        return None
    if not raw or any(b < 0x20 or b > 0x7e for b in raw):
        return None
    return raw.decode("ascii")


def user_password_blob(value: str) -> bool:
    """Base64 of ``user:password`` (Docker's ``auth``, HTTP Basic credentials).

    >>> [user_password_blob(v) for v in ("Y2k6UHc0eDlx", "dGVzdA==", "bm9uZQ")]
    [True, False, False]
    """
    text = b64_text(value)
    return text is not None and USER_PASSWORD.fullmatch(text) is not None


def prose_secret(value: str) -> bool:
    """A password written in a sentence: token-looking, not an English word or code.

    A digit with letters, or a symbol other than ``._-`` (``Tr0ub4dor&3``), or camel humps
    of random letters (``StagePwOILYUpNj``, not ``SecretStr``, ``HTTPServer`` or
    ``HttpBasicAuthHandler``); never an identifier (``self._password``, ``snake_case``), a path, a
    reference or a metavar.

    >>> [prose_secret(v) for v in ("StagePwOILYUpNj", "ColonPwXyz123", "required", "None",
    ...                             "SecretStr", "self._password", "HttpBasicAuthHandler",
    ...                             "HTTPServer")]
    [True, True, False, False, False, False, False, False]
    """
    if (len(value) < 6 or not plausible_password(value) or value[0] in "/.~#"
            or "://" in value or _IDENTIFIER.fullmatch(value) or _CODE_NAME.fullmatch(value)):
        return False
    has_alpha = any(c.isalpha() for c in value)
    if has_alpha and any(c.isdigit() for c in value):
        return True
    if any(not c.isalnum() and c not in "._-/" for c in value[1:-1]):
        return any(c.isupper() for c in value)  # "Tr0ub&dor" yes, "and/or" or "a+b" no
    # Random letters change case often and never spell long lowercase runs; CamelCase names
    # (HttpBasicAuthHandler, HTTPServer) have few humps for their length, or long runs.
    humps = sum(1 for c in value[1:] if c.isupper())
    return (humps >= 3 and humps * 4 >= len(value)
            and max(map(len, _LOWER_RUN.findall(value)), default=0) <= 4)


_CODE_OP = re.compile(r"==|!=|<=|>=|->|=>")


def note_password(value: str) -> bool:
    """A short-form password in notes ("pw=PW", "(pass: PW)", "login: user / PW"): as in
    prose (:func:`prose_secret`), and no comparison or arrow of code ("First pass:
    decided_mask==0").

    >>> [note_password(v) for v in ("Rt5!kd93Lq", "decided_mask==0", "None", "staging")]
    [True, False, False, False]
    """
    return prose_secret(value) and _CODE_OP.search(value) is None


def _classes(value: str) -> int:
    return (any(c.islower() for c in value) + any(c.isupper() for c in value)
            + any(c.isdigit() for c in value) + any(not c.isalnum() for c in value))


def lone_secret(value: str) -> bool:
    """Does a word alone on its line look like a key or a password (not a word, a path, a
    number, an identifier)? 20+ characters: letters and digits mixed, 3.5+ bits of
    entropy per character; 8-19: three character classes, a digit among them.

    >>> [lone_secret(v) for v in ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "Hunter2!x",
    ...                            "configuration", "/usr/lib/python3.11", "snake_case_name")]
    [True, True, False, False, False]
    """
    if (REDACTED in value or value[0] in "/.~$%{<@#" or "://" in value
            or _IDENTIFIER.fullmatch(value)):
        return False
    has_digit = any(c.isdigit() for c in value)
    has_alpha = any(c.isalpha() for c in value)
    if not (has_digit and has_alpha):
        return False
    if len(value) >= 20:
        return _entropy(value) >= 3.5
    classes = (any(c.islower() for c in value) + any(c.isupper() for c in value)
               + has_digit + any(not c.isalnum() for c in value))
    return classes >= 3


def aws_secret_key(value: str) -> bool:
    """Does a 40-character run next to an AWS key id look like its secret key (random base64:
    letters and digits, 4+ bits of entropy per character), not a hex digest or a long name?

    >>> [aws_secret_key(v) for v in ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ...                               "0123456789abcdef0123456789abcdef01234567",
    ...                               "ThisIsAVeryLongCamelCaseIdentifierNameXy")]
    [True, False, False]
    """
    return (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
            and not all(c in "0123456789abcdefABCDEF" for c in value) and _entropy(value) >= 4.0)


def _entropy(value: str) -> float:
    """Shannon entropy of ``value``, bits per character."""
    n = len(value)
    return -sum(k / n * math.log2(k / n) for k in map(value.count, set(value)))


def table_password(value: str) -> bool:
    """A cell under a password header: letters with digits, or three character classes.

    >>> [table_password(v) for v in ("abc1-def", "required", "none", "Tr0ub&dor")]
    [True, False, False, True]
    """
    if len(value) < 4 or not plausible_password(value):
        return False
    return (any(c.isalpha() for c in value) and any(c.isdigit() for c in value)) \
        or _classes(value) >= 3
