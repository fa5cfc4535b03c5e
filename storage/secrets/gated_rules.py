"""Secrets in HTTP headers, prose, piped logins, signed URLs, webhook URLs, URL queries,
Docker's ``config.json`` and environment lookups' defaults: the rules gated by literal words.

Each rule of :data:`GATED_RULES` names gate words, looked for in the ASCII-lowered text
(``str.find``: C speed, ~1 ms per MB each); its regex (case-insensitive) runs only on the lines
that hold a gate. The value is the rule's first group that matched; the rule's check
(:mod:`.values`) decides whether it is a literal secret.
"""

from __future__ import annotations

import re

from .spans import REDACTED, TextSpan
from .text_scan import lower_same_offsets
from .values import (header_secret, note_password, plausible_password, prose_secret,
                     user_password_blob)

# Secrets in HTTP headers, prose, piped logins, signed URLs and webhook URLs (issue 21, second
# break-it run: all were stored in full). Each rule has gate literals, looked for in the
# ASCII-lowered text (``str.find``: C speed); the rule's regex (case-insensitive) runs on the
# lines that hold a gate only. The value is the rule's first group that matched; ``check``
# decides whether it is a literal secret. Gitleaks' and trufflehog's rules for these formats
# were the reference.
_HDR_V = r"""([A-Za-z0-9+/=._~-]{8,}|\[REDACTED\])"""
_WORD_V = r"""\\*['"`]?([^\s'"`()\[\]{}<>,;|&\\]{4,}|\[REDACTED\])"""
# A word between the key and its "is" ("my password for the staging box is"), not one that
# starts another clause ("token by mistral-common and is encoded").
_PROSE_WORD = r"(?!(?:and|or|but|if|then|which|that|when|while|because|so)\b)[A-Za-z][\w'-]*"
_PROSE_KEY = (r"(?:password|passwd|passphrase|passcode|pass[ \t]+phrase|pwd|token|secret"
              r"|api[ \t]+key)")
# One character of a value in prose: not a space, quote, bracket or separator; "&" only
# alone ("Bv83&rtLmQ" is a password, "PW && make" ends at the "&&").
_VC = r"""(?:[^\s'"`()\[\]{}<>,;|&\\]|&(?![&\s]))"""
# A short-form password in notes (fourth break-it run): the value as in prose, which may also
# end at a closing parenthesis or a comma ("(pass: PW)", "user u, pass PW, then ...").
_NOTE_V = (r"\\*['\"`]?(" + _VC + r"{5,}?[^\s'\"`()\[\]{}<>,;|&\\.:!?/]"
           r"|\[REDACTED\])[.,!?:]*(?=['\"`),;]|\s|$|\\[nrt\"'])")
# Environment lookups with a default: Python's os.environ.get / os.getenv, Ruby's ENV.fetch
# (name, default), JavaScript's process.env.NAME || default. A name that names a secret
# ends in one of these words (DB_PASSWORD, GITHUB_TOKEN, API_SECRET_KEY; not TOKEN_DTYPE).
_SECRET_NAME = (r"[\w-]*?(?:pass(?:word|wd)|secret|token|credentials?"
                r"|(?<![a-z0-9])(?:pass|pwd|pw)"
                r"|(?:api|access|secret|private|signing|encryption|auth|master|client)[_-]?key)")
_ENV_DEFAULT = (r"(?:(?:(?:os\.)?(?:environ\.get|getenv)|ENV\.fetch)"
                r"\([ \t]*\\*['\"](?:{name})\\*['\"][ \t]*,[ \t]*(?:default[ \t]*=[ \t]*)?"
                r"|process\.env\.(?:{name})[ \t]*(?:\|\||\?\?)[ \t]*)"
                r"\\*['\"`]([^\s'\"`\\]{{6,}}|\[REDACTED\])\\*['\"`]")
GATED_RULES: tuple[tuple[tuple[str, ...], str, str, object], ...] = (
    # Authorization / Proxy-Authorization headers, raw, in curl -H "...", or in a dict
    # ("Authorization": "Basic ..."): the credentials after the scheme.
    (("authorization",), "HTTP Authorization Header",
     r"\b(?:proxy-)?authorization\\?['\"]?[ \t]*[:=][ \t]*\\?['\"]?[ \t]*"
     r"(?:basic|bearer|token|digest|negotiate|ntlm|apikey|api-key|key|sso-key|otp)[ \t]+"
     + _HDR_V, header_secret),
    # API-key headers: X-Api-Key, Api-Key, X-Auth-Token, X-Access-Token, X-API-Token, ...
    (("api", "token"), "HTTP API Key Header",
     r"(?<![\w-])(?:x-)?(?:[a-z]+-)?(?:api-?key|api-token|auth-token|access-token)"
     r"\\?['\"]?[ \t]*:[ \t]*\\?['\"]?" + _HDR_V, header_secret),
    # A password or token in a sentence: "my password for the staging box is PW",
    # "Password: PW", "the token is PW", "passphrase: PW".
    (("pass", "pwd", "token", "secret", "api"),
     "Password In Prose",
     r"(?<![\w./-])" + _PROSE_KEY + r"(?:(?:[ \t]+" + _PROSE_WORD + r"){0,6}?(?:[ \t]+(?:is|was)"
     r"(?:[ \t]+(?:now|still|set[ \t]+to))?[ \t]*:?|[ \t]*:)|[ \t]*:)(?:\*\*)?[ \t]+['\"`]?"
     r"(" + _VC + r"{5,}?[^\s'\"`()\[\]{}<>,;|&\\.:!?/]|\[REDACTED\])[.,!?:]*"
     r"(?=['\"`]|\s|$|\\[nrt\"'])", prose_secret),
    # Fourth break-it run: short forms in notes and chat: "pw=PW", "pw: PW", "(pass: PW)".
    (("pw", "pass"), "Password In Prose",
     r"(?<![\w./@:-])(?:pw|pass)[ \t]*[:=][ \t]*" + _NOTE_V, note_password),
    # A login as "user / password": "staging login: deploy / PW".
    (("login",), "Password In Prose",
     r"\blog-?in\b[^\n:]{0,40}:[ \t]*[\w.@+-]{1,64}[ \t]+/[ \t]+" + _NOTE_V, note_password),
    # A user named, then the password: "user deploy, pass PW", "username admin password PW".
    (("user", "login"), "Password In Prose",
     r"\b(?:user(?:name)?|login)(?:[ \t]*[:=][ \t]*|[ \t]+)[\w.@+-]{1,64}[ \t]*[,;/]?[ \t]*"
     r"(?:and[ \t]+)?(?:pass(?:word|wd)?|pwd|pw)(?:[ \t]*[:=][ \t]*|[ \t]+)" + _NOTE_V,
     note_password),
    # The default of an environment lookup, when the variable names a secret
    # (os.getenv("DB_PASSWORD", "PW")) or the lookup is assigned or passed to one
    # (password=os.environ.get("X", "PW"), "token": process.env.T || "PW").
    (("environ", "getenv", "env.fetch", "process.env"), "Environment Default Secret",
     _ENV_DEFAULT.format(name=_SECRET_NAME), prose_secret),
    (("environ", "getenv", "env.fetch", "process.env"), "Environment Default Secret",
     r"(?<![\w.-])" + _SECRET_NAME + r"\\*['\"]?[ \t]*[=:][ \t]*"
     + _ENV_DEFAULT.format(name=r"[\w.-]*"), prose_secret),
    # A value echoed into a login that reads it from stdin: docker/podman/buildah/helm
    # registry login --password-stdin, gh auth login --with-token, passwd --stdin.
    (("stdin", "token"), "Command Line Password",
     r"\b(?:echo(?:[ \t]+-[neE]+)?|printf(?:[ \t]+\\*['\"]%s(?:\\n)?\\*['\"])?)[ \t]+" + _WORD_V
     + r"\\*['\"`]?[ \t]*\|[ \t]*[^\n|;&]*?(?:--pass(?:word|wd)?-stdin|--with-token|--token-stdin"
     r"|\bpasswd[ \t]+--stdin)\b", plausible_password),
    (("stdin", "token"), "Command Line Password",
     r"(?:--pass(?:word|wd)?-stdin|--with-token)\b[^\n|;&]*?<<<[ \t]*" + _WORD_V,
     plausible_password),
    # echo user:PW | chpasswd
    (("pass",), "Command Line Password",
     r"\becho[ \t]+['\"]?[\w.-]+:([^\s'\"`|;&]{4,}|\[REDACTED\])['\"]?[ \t]*\|[ \t]*"
     r"(?:sudo[ \t]+)?chpasswd\b", plausible_password),
    # Signed URLs: Azure SAS (sv=...&sig=...), AWS and GCS presigned URLs, and the keys of
    # Azure connection strings (AccountKey=, SharedAccessKey=).
    (("sig=",), "Azure SAS Signature",
     r"[?&;]sig=([A-Za-z0-9%+/=_-]{16,}|\[REDACTED\])", None),
    (("signature=",), "Presigned URL Signature",
     r"[?&]x-(?:amz|goog)-signature=([0-9a-f]{32,}|\[REDACTED\])", None),
    (("token",), "Presigned URL Signature",
     r"[?&]x-amz-security-token=([A-Za-z0-9%+/=_-]{16,}|\[REDACTED\])", None),
    (("accountkey", "sharedaccess"), "Azure Connection String",
     r"\b(?:AccountKey|SharedAccessKey)[ \t]*=[ \t]*([A-Za-z0-9+/]{16,}={0,2}|\[REDACTED\])",
     None),
    # Webhook URLs, whose path is the credential: Discord, Slack workflows and triggers (the
    # plugin has services/), Microsoft Teams incoming webhooks.
    (("hook",), "Webhook URL",
     r"discord(?:app)?\.com/api/(?:v\d+/)?webhooks/\d+/([A-Za-z0-9_-]{30,}|\[REDACTED\])", None),
    (("hook",), "Webhook URL",
     r"hooks\.slack\.com/(?:workflows|triggers|services)/([A-Za-z0-9_/-]{20,}|\[REDACTED\])",
     None),
    (("hook",), "Webhook URL",
     r"\.(?:webhook\.office|outlook\.office)\.com/webhook(?:b2)?/([^\s'\"`<>]{20,}|\[REDACTED\])",
     None),
    # Telegram bot tokens inside a bot API URL (the plugin wants the token alone).
    (("telegram",), "Telegram Bot Token",
     r"api\.telegram\.org/(?:file/)?bot(\d{8,10}:[A-Za-z0-9_-]{35}|\[REDACTED\])", None),
    # Issue 34 (a second break-it pass). A URL's password with an empty user name
    # (redis://:PW@host; the plugin's pattern wants a user).
    (("://:",), "Basic Auth Credentials",
     r"\b[a-z][a-z0-9+.-]*://:([^\s/@:'\"`<>{}\\]{4,}|\[REDACTED\])@", plausible_password),
    # A credential in a URL's query string (?access_token=, &private_token=, &api_key=), of
    # any entropy: the parameter names it.
    (("token=", "key=", "secret=", "password=", "passwd="), "URL Query Credential",
     r"[?&;](?:[a-z]+[_-])?(?:token|api[_-]?key|apikey|secret|password|passwd)"
     r"=([^\s&#'\"`<>{}()\\]{8,}|\[REDACTED\])", header_secret),
    # Docker's config.json "auth": base64 of user:password; "identitytoken" (a registry's
    # refresh token).
    (("auth",), "Docker Registry Auth",
     r"\\*[\"']auth\\*[\"'][ \t]*:[ \t]*\\*[\"']([A-Za-z0-9+/]{4,}={0,2}|\[REDACTED\])\\*[\"']",
     user_password_blob),
    (("identitytoken", "registrytoken"), "Docker Registry Auth",
     r"\\*[\"'](?:identity|registry)token\\*[\"'][ \t]*:[ \t]*\\*[\"']([^\s'\"\\]{8,}|\[REDACTED\])",
     plausible_password),
)
_GATED = tuple((gates, kind, re.compile(rx, re.IGNORECASE), check)
               for gates, kind, rx, check in GATED_RULES)
_GATE_WORDS = tuple(sorted({gate for gates, *_ in GATED_RULES for gate in gates}))
# Azure SAS: a sig= is a signature only with the other SAS fields on its line.
_SAS_FIELDS = ("sv=", "sr=", "se=", "sp=", "skn=")


def gated_spans(text: str) -> list[TextSpan]:
    """``(start, end, kind, value)`` of what :data:`GATED_RULES` find in ``text``.

    >>> gated_spans('curl -H "Authorization: Bearer dXNlcjpQdzEyMw=="')
    [(31, 47, 'HTTP Authorization Header', 'dXNlcjpQdzEyMw==')]
    """
    low = lower_same_offsets(text)
    gate_lines: dict[str, dict[int, int]] = {}  # gate -> {line start: line end}
    for gate in _GATE_WORDS:  # each gate looked for once: ~1 ms per MB each
        found = gate_lines[gate] = {}
        i = low.find(gate)
        while i >= 0:
            s = low.rfind("\n", 0, i) + 1
            e = low.find("\n", i)
            e = len(low) if e < 0 else e
            found[s] = e
            i = low.find(gate, e)
    out = []
    seen: set[tuple[int, int]] = set()
    for gates, kind, rx, check in _GATED:
        lines = {s: e for gate in gates for s, e in gate_lines[gate].items()}
        for s, e in sorted(lines.items()):
            if kind == "Azure SAS Signature" and not any(f in low[s:e] for f in _SAS_FIELDS):
                continue
            for m in rx.finditer(text, s, e):
                g = next(i for i in range(1, rx.groups + 1) if m.group(i) is not None)
                value = m.group(g)
                if value == REDACTED or m.span(g) in seen:
                    continue
                if check is None or check(value):
                    seen.add(m.span(g))
                    out.append((m.start(g), m.end(g), kind, value))
    return out
