"""Keep secrets out of the history: ``redact(text)`` replaces secret values with ``[REDACTED]``.

Everything assistd stores (repository files, agent transcripts) passes through :func:`redact`
first. The judge of what is a secret is Yelp's ``detect-secrets`` with its default plugin set
(AWS, GitHub, GitLab, Slack, Stripe, OpenAI, JWT, private keys, basic auth in URLs, the keyword
detector, high-entropy base64/hex strings, ...) and its default heuristic filters
(``is_sequential_string``, ``is_potential_uuid``, ``is_likely_id_string``,
``is_templated_secret``, ``is_prefixed_with_dollar_sign``, ``is_not_alphanumeric_string``,
``is_indirect_reference``). The value is replaced, the line stays::

    >>> r = redact('DB_HOST=db.internal\\nDB_PASSWORD=Wq7-hunter2-Zr\\n')
    >>> r.text
    'DB_HOST=db.internal\\nDB_PASSWORD=[REDACTED]\\n'
    >>> r.count, r.kinds
    (1, {'Secret Keyword': 1})

Pipeline (offsets are UTF-8 byte offsets, ``surrogatepass``, so lone surrogates round-trip):

1. **Prefilter** (:func:`candidate_lines`): C-speed scans (``bytes.translate`` + ``bytes.find``,
   regexes that start with a literal) pick the lines that could hold a secret at all. Each scan
   is a *necessary condition* of one detect-secrets plugin (or of the eager search below),
   written out next to it, so the prefilter is never the reason a secret is missed:
   ``redact(x) == redact(x, prefilter=False)`` (tested on every planted kind, and on ~120k
   fuzzed inputs). On the standard library 0.24 % of the lines pass.
2. **Detection** on each candidate line, and on its JSON-unescaped copy when it holds
   backslash escapes (transcripts store ``\\"password\\": \\"...\\"`` and ``\\n``): every
   default plugin but the private-key one (step 3), then the filters.
3. **Private key blocks**: detect-secrets flags only the ``BEGIN ... PRIVATE KEY`` line; the
   whole body up to the ``END`` line (or, without one, to the end of the base64 run) goes.
4. **Replacement**: every occurrence of a found value on its line, and in the whole text for
   token-like values (:func:`_token_like`), becomes ``[REDACTED]``; overlapping spans merge.
   Rounds repeat until nothing more is found (idempotence). Text without findings is returned
   as the same object: byte-identical, count 0.
5. **Extra rules** (issue 21, after the plugins, same replacement): provider formats known by
   their prefix alone (GitHub ``github_pat_``, OpenAI ``sk-proj-``/``sk-svcacct-``/``sk-``,
   Anthropic, Slack ``xox*-``/``xapp-``, Stripe ``[rs]k_live_``/``whsec_``, Google, Hugging
   Face, npm, PyPI, DigitalOcean, Shopify, Doppler, Vault, Databricks, Postman, Grafana,
   Sentry, Linear, Atlassian, age), passwords on command lines (``mysql -pPW``, ``--password``/
   ``--passwd``/``--token``/... flags, ``curl -u u:PW``, ``sshpass -p``, ``docker login -p``,
   ``htpasswd -b``, ``redis-cli -a``, ``ldapsearch -w``, ``openssl pass:``, ``keytool
   -storepass``, ``kubectl --from-literal``, libpq ``password=``, ``PGPASSWORD=``/
   ``MYSQL_PWD=``), a key or password alone on the line after the one naming it ("AWS secret
   access key:\n<40 characters>"), and configuration in fenced code blocks (```yaml, or an
   untagged block of ``key: value`` lines), read with the keyword plugin's rules for that file
   type. From the second break-it run (:data:`_GATED_RULES`): ``Authorization``/
   ``Proxy-Authorization`` headers (``Basic``, ``Bearer``, ``token``, ... schemes; raw, in
   ``curl -H`` or in a dict) and API-key headers (``X-Api-Key``, ``X-Auth-Token``, ...);
   passwords in prose ("my password for the box is PW", "Password: PW", "the token is PW",
   "passphrase: PW"; the value must look like a token: :func:`_prose_secret`); a value echoed
   or printed into ``--password-stdin``/``--passwd-stdin``/``--with-token``/``passwd --stdin``
   (docker, podman, buildah, helm, gh), or given to them with ``<<<``, and ``echo user:PW |
   chpasswd``; Azure SAS ``sig=`` (with other SAS fields on its line), ``AccountKey=``/
   ``SharedAccessKey=``, AWS/GCS presigned ``X-Amz-Signature``/``X-Goog-Signature``/
   ``X-Amz-Security-Token``; webhook URLs (Discord, Slack workflows/triggers, Teams) and
   Telegram bot API URLs. From a third (issue 34): a URL password with an empty user
   (``redis://:PW@host``); a credential in a URL's query (``?access_token=``,
   ``&private_token=``, ``&api_key=``: the value must look like a token, :func:`_header_secret`);
   Docker ``config.json`` ``"auth"`` (base64 of ``user:password``) and ``"identitytoken"``;
   any base64 run (20+ characters) that decodes to ``user:password`` or to text this filter
   redacts (an encoded provider key); ``.netrc`` entries (``machine H login U password PW``,
   on one line or several) wherever they are; the cells of a Markdown table column headed
   ``password``, ``token``, ``api key``... that look like a token; a key alone on a comment
   line (``#``, ``//``, ``--``, ``;``) after a comment naming it; and a key cut in two adjacent
   string literals (``"AKIA..." + "..."``, implicit concatenation, one line break at most),
   found by scanning the line with the literals joined, before everything else; and the
   provider table of Microsoft's secret masker (``microsoft-security-utilities-secret-masker``,
   its PreciselyClassifiedSecurityKeys: Azure identifiable keys, NuGet, Azure DevOps PATs, ...)
   on the same long runs as the provider rules. References
   and placeholders (``$VAR``, ``<token>``, ``PASSWORD`` metavars) stay.

What detect-secrets alone misses or gets wrong, and what this module does about it:

* ``GitHubTokenDetector``/``GitLabTokenDetector`` capture only the prefix (``ghp``, ``glpat``) in
  their regex group, so the reported value is ``ghp``: the whole match is taken instead.
* Fixed-length patterns stop inside longer real tokens (Stripe ``sk_live_`` + 24 of ~100
  characters, OpenAI ``T3BlbkFJ`` + 20, the JWT pattern's lazy signature): a value that ends
  on a token character is grown over the rest of the token.
* Unquoted ``KEY=value`` (``.env``, ``export``, ``docker -e``) and YAML ``key: value`` are not
  keyword-scanned for unknown file types (quotes required), and JSON-escaped
  ``\\"password\\": \\"x\\"`` never: such lines get the keyword plugin's own config-file
  regexes, and the unescaped copy of the line is scanned.
* ``is_indirect_reference`` drops *every* finding on a line like
  ``client = OpenAI(api_key="sk-...")``; here it applies only to unquoted keyword values, its
  purpose (``password = get_password()``).
* ``is_likely_id_string`` looks at the whole line: one ``"session_id"`` early in a JSON
  transcript line hid every later keyword/entropy secret. It sees the value's own
  ``,``/``;``/``{``/``&``-delimited segment instead.
* The keyword plugin reports the first match per regex and line: found values are masked and
  the line rescanned until nothing new turns up.
* Bearer tokens and unquoted ``TOKEN=...`` values are high-entropy but unquoted: within
  :data:`EAGER_REACH_CHARS` after a hint word (token, bearer, auth, credential, secret, passw,
  pwd, api/access/private key) the entropy plugins also run in detect-secrets' "eager"
  (unquoted) mode, with the plugin's entropy limit (``scan_line`` itself skips the limit).
* ``# pragma: allowlist secret`` is not honoured: a comment in someone's repository does not
  make a value safe to keep in assistd's history.
* ``BEGIN ENCRYPTED PRIVATE KEY`` (PKCS#8) is not in the private-key plugin's list; every
  ``BEGIN ... PRIVATE KEY`` block (and PuTTY key file) is redacted.
* ``AzureStorageKeyDetector`` reports ``AccountKey=<key>`` as the value, ``SlackDetector`` the
  whole webhook URL: the name and the host are cut off, so they stay on the line.
* ``IPPublicDetector`` is not run: the default ``is_not_alphanumeric_string`` filter drops every
  IPv4 value (no letter), so detect-secrets keeps public IPs too.

Still missed (no plugin or no context for them): low-entropy passwords in unquoted lowercase
``password = value`` lines, and YAML ``password: plainword`` values without a digit or symbol
outside a fenced block, of unknown file type (pass ``filename="x.ini"``/``"x.yaml"`` to get
them), ``.pgpass`` lines, a plain lowercase word after a space-separated ``--password``
flag (read as prose: "--password requires --user"), a password in prose that is a plain word or
a CamelCase name ("the password is sunshine", "... is HttpServer"), a header value of one
character class (``Bearer abcdefghijklmnop``) or in a Markdown table (``| pw | sunshine |``), a
key cut in three literals or more, and formats no rule knows. A suggestion the user accepts is
redacted with the line it completes (:func:`storage.suggestions.redact_in_context`).

Throughput (``benchmarks/secrets_throughput.py``, one core of this machine, CPython 3.11;
``--baseline e5ba8f5`` times the filter before issue 21's rules in the same run; the machine is
shared, so compare figures of one run only):

=========================================  =========  =====================================
corpus                                     MB/s       how
=========================================  =========  =====================================
stdlib ``*.py`` (1790 files, 31.5 MB)      31 (39)    ``redact`` (prefilter); (before)
site-packages ``*.py`` (231 MB)            30 (40)    ``redact`` (prefilter); (before)
1.5 MB spread of the stdlib                1.3-2.7    ``redact(prefilter=False)``, same output
same subset                                0.1-0.3    detect-secrets' own line scan, no replace
=========================================  =========  =====================================

Issue 34's rules (the base64, table, concatenation and .netrc scans, and Microsoft's table on
the long runs) halve it: 17.7 -> 8.1-10.9 MB/s on the stdlib (one run, ``redact`` before and
after, alternated), with no new false positive there (lines redacted: 366 before and after).

The header, prose, stdin, signed-URL and webhook rules (``--baseline 207c979``, the commit
before them) cost about a fifth on the stdlib (23.0 MB/s, 29.5 before, one run) and nothing
measurable on site-packages (22.7, 22.0): 14 ``str.find`` gates, ~1.5 ms per MB each.

False positives, all counted in ``count``: 11.74 redactions per MB of stdlib, 11.70 before issue
21's rules (hex digests in hashlib/hmac tests 10.0, base64 test vectors 0.7, keyword 0.7,
``user:pass@`` URLs 0.3, a token alone after a line naming it 0.03: the example in
``secrets.py``'s docstring); 3.58 per MB of site-packages, 3.76 before (a ``--password options``
in pip's docs no longer becomes a value replaced in every ``rev_options``). The header and
prose rules add none on either corpus.

No secret value is ever logged or put in an exception message by this module.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import re
import string
import threading
from dataclasses import dataclass

from assistd.ground.errors import AssistdError

REDACTED = "[REDACTED]"
MIN_GLOBAL_CHARS = 8  # token-like values this long are replaced everywhere in the text
WINDOW_CHARS = 4096  # the keyword plugin runs on windows of long lines ...
WINDOW_OVERLAP_CHARS = 512  # ... overlapping by this much (keyword and value kept whole)
MAX_ROUNDS = 4  # detect-and-replace rounds until the text stands still
MAX_KEYWORD_PASSES = 16  # mask-and-rescan rounds for the keyword detector on one line
EAGER_REACH_CHARS = 64  # an unquoted value counts when it starts this close after a hint word

@dataclass(frozen=True)
class Redaction:
    """The text with every detected secret value replaced by :data:`REDACTED`.

    ``count`` is the number of replaced spans; ``kinds`` maps the detect-secrets plugin
    ``secret_type`` (e.g. ``"AWS Access Key"``, ``"Secret Keyword"``) to its share of ``count``.
    """

    text: str
    count: int
    kinds: dict[str, int]


def redact(text: str, *, filename: str = "", prefilter: bool = True) -> Redaction:
    """Replace every secret value in ``text`` with ``[REDACTED]``.

    ``filename`` is optional: with it, the keyword detector uses detect-secrets' per-file-type
    rules (``.py`` needs quoted values; ``.yaml``/``.ini``/``.toml``/``.env`` take unquoted
    ones). Without it, quoted values everywhere plus unquoted ones on ``NAME=value`` and
    ``key: value`` lines. ``prefilter=False`` runs detect-secrets on every line (same result,
    ~20x slower; for benchmarks and tests of the prefilter).

    >>> redact('token = "ghp_' + 'Zx8Kq2Lm9Pw4Rt6Yu1Io3As5Df7Gh0Jk8Lz2V"').text
    'token = "[REDACTED]"'
    >>> redact("print('hello')\\n").count
    0
    """
    try:
        return _redact(text, filename, prefilter)
    except Exception as exc:  # noqa: BLE001 - the message must not carry the text
        failure = type(exc).__name__
    # Raised outside the handler, so the original exception (whose message or locals could
    # quote the text) is neither chained nor printed.
    size = len(text) if isinstance(text, str) else "?"
    raise AssistdError(
        f"secrets filter failed ({failure}) on a text of {size} characters; the text is "
        "deliberately not shown. Report it as an assistd bug, with the file type"
    )


def _redact(text: str, filename: str, prefilter: bool, nested: bool = False) -> Redaction:
    mode = _keyword_mode(filename)
    count = 0
    kinds: dict[str, int] = {}
    if not nested:  # first, while both parts of a key cut in two literals are still there
        text, count, kinds = _replace_spans(text, _unescaped_spans(_concat_spans, text, '\\"'))
    # A replacement can change what the detectors see next to it (a token that ran into a
    # longer one now ends at "[REDACTED]"), so rounds repeat until the text stands still:
    # that makes redact(redact(x).text).text == redact(x).text.
    for _ in range(MAX_ROUNDS):
        text, n, round_kinds = _redact_rounds(text, mode, prefilter)
        text, m, extra_kinds = _redact_extra(text, prefilter)
        count += n + m
        for found in (round_kinds, extra_kinds):
            for kind, k in found.items():
                kinds[kind] = kinds.get(kind, 0) + k
        if not m:
            break
    return Redaction(text, count, kinds)


def _redact_rounds(text: str, mode, prefilter: bool) -> tuple[str, int, dict[str, int]]:
    """The detect-secrets plugins, round after round until nothing more is found."""
    count = 0
    kinds: dict[str, int] = {}
    for _ in range(MAX_ROUNDS):
        data = text.encode("utf-8", "surrogatepass")
        spans = _find_spans(data, mode, prefilter)
        if not spans:
            break
        text, n, round_kinds = _apply(data, spans)
        count += n
        for kind, k in round_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + k
    return text, count, kinds


# Credential formats and settings that detect-secrets' default plugins do not know (found by
# break-it runs, issue 21: all were stored in full). Each rule is a RegexBasedDetector-style
# pattern whose first group that matched is the value. Speed: a pattern never runs over the
# whole text. Provider patterns run on its long runs of token characters (``_long_runs``),
# the command-line ones on the lines of a gate match (``_DASH_GATE``, ``_EQ_GATE``: regexes
# that start with a literal, re's fast prefix search).
#
# Provider formats, recognised by their prefix alone (as gitleaks and GitHub's secret
# scanning do); the value is the whole token, which must start a word.
_PROVIDER_RULES: tuple[tuple[str, str], ...] = (
    ("GitHub Token", r"(github_pat_[A-Za-z0-9_]{22,})"),
    ("OpenAI Token",
     r"(sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_\-]{20,}|sk-[A-Za-z0-9]{32,}(?![\w-]))"),
    ("Anthropic API Key", r"(sk-ant-[A-Za-z0-9_\-]{20,})"),
    ("Slack Token", r"(xox[a-z](?:\.xox[a-z])?-[A-Za-z0-9-]{20,})"),
    ("Slack Token", r"(xapp-[0-9]-[A-Za-z0-9-]{20,})"),
    ("Stripe Access Key", r"(sk_(?:live|test)_[A-Za-z0-9]{20,})"),
    ("Stripe Access Key", r"(rk_(?:live|test)_[A-Za-z0-9]{20,})"),
    ("Stripe Access Key", r"(whsec_[A-Za-z0-9]{24,})"),
    ("Google API Key", r"(AIza[0-9A-Za-z_\-]{35})"),
    ("Google OAuth Secret", r"(GOCSPX-[A-Za-z0-9_\-]{28})"),
    ("Google OAuth Token", r"(ya29\.[A-Za-z0-9_\-]{30,})"),
    ("Hugging Face Token", r"(hf_[A-Za-z0-9]{30,})"),
    ("Hugging Face Token", r"(api_org_[A-Za-z0-9]{30,})"),
    ("npm Token", r"(npm_[A-Za-z0-9]{36})"),
    ("PyPI Token", r"(pypi-AgE[A-Za-z0-9_\-]{50,})"),
    ("DigitalOcean Token", r"(do[opr]_v1_[a-f0-9]{64})"),
    ("Shopify Token", r"(shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32})"),
    ("Doppler Token", r"(dp\.(?:st|ct|sa|scim|audit)\.[A-Za-z0-9_\-.]{30,})"),
    ("Vault Token", r"(hv[sbr]\.[A-Za-z0-9_\-]{24,})"),
    ("Databricks Token", r"(dapi[a-f0-9]{32}(?:-[0-9])?)"),
    ("Postman API Key", r"(PMAK-[a-f0-9]{24}-[a-f0-9]{34})"),
    ("Grafana Token", r"(glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8})"),
    ("Grafana Token", r"(glc_[A-Za-z0-9+/]{32,}={0,2})"),
    ("Sentry Token", r"(sntr[ysu]_[A-Za-z0-9+/=_]{30,})"),
    ("Linear API Key", r"(lin_api_[A-Za-z0-9]{40})"),
    ("Atlassian API Token", r"(ATATT3[A-Za-z0-9_\-=]{100,})"),
    ("age Secret Key", r"(AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58})"),
)

# A password or token given on a command line or in an environment assignment. The value
# is one shell word, optionally quoted; :func:`_plausible_password` drops references and
# placeholders ($VAR, <token>, PASSWORD metavars, {templates}). Each rule names the gate
# match that must be on its line: a flag (``_DASH_GATE``) or ``=`` after a name (``_EQ_GATE``).
# (A value already redacted matches as itself, so that a later round does not shift the
# match onto the word before it.)
_V = r"""['"]?(\[REDACTED\]|[^\s'"`()\[\]{}<>,;|&]{4,})"""
_CLI_RULES: tuple[tuple[str, str, str], ...] = (
    # Long options of any CLI: --password, --passwd, --pass, --token, --secret, --api-key,
    # --auth-token, --client-secret, wget's --http-password, ... with "=" or a space.
    ("--", "Command Line Password",
     r"--(?<![\w-]--)(?!no-)(?:[a-z0-9]+-)*(?:password|passwd|pass|passphrase|token|secret"
     r"|api-?key|access-key|secret-key|private-key)(?:=|[ \t]+)" + _V),
    # mysql, mysqldump, mysqladmin, mariadb: -pVALUE (glued; "-p db" prompts for one).
    ("-p", "Command Line Password", r"\b(?:mysql|mariadb)[\w-]*\b[^\n|;&]*?[ \t]-p" + _V),
    # sshpass -p PW / -pPW; docker, podman, helm ... login -p PW; mongo* -p PW; 7z -pPW;
    # openssl -pass/-passin/-passout pass:PW.
    ("-p", "Command Line Password", r"\bsshpass\b(?:[ \t]+-[a-oq-zA-Z]\S*)*[ \t]+-p[ \t]*" + _V),
    ("-p", "Command Line Password", r"\blogin\b[^\n|;&]*?[ \t]-p[ \t]+" + _V),
    ("-p", "Command Line Password", r"\bmongo[\w-]*\b[^\n|;&]*?[ \t]-p[ \t]+" + _V),
    ("-p", "Command Line Password", r"\b7z[a-z]?\b[^\n|;&]*?[ \t]-p" + _V),
    ("-p", "Command Line Password", r"[ \t]-pass(?:in|out)?[ \t]+pass:" + _V),
    # keytool -storepass/-keypass/-srcstorepass PW.
    ("-s", "Command Line Password", r"[ \t]-(?:src|dest)?(?:store|key)pass[ \t]+" + _V),
    ("-k", "Command Line Password", r"[ \t]-keypass[ \t]+" + _V),
    ("-d", "Command Line Password", r"[ \t]-dest(?:store|key)pass[ \t]+" + _V),
    # redis-cli -a PW; ldapsearch & co -w PW; sqlcmd, bcp, zip, unzip -P PW.
    ("-a", "Command Line Password", r"\bredis-cli\b[^\n|;&]*?[ \t]-a[ \t]+" + _V),
    ("-w", "Command Line Password", r"\bldap[a-z]+\b[^\n|;&]*?[ \t]-w[ \t]+" + _V),
    ("-P", "Command Line Password", r"\b(?:sqlcmd|bcp|zip|unzip)\b[^\n|;&]*?[ \t]-P[ \t]*" + _V),
    # curl -u user:pw / --user user:pw; httpie -a / --auth user:pw; smbclient -U user%pw.
    ("-u", "Command Line Password", r"[ \t]-u[ \t]*['\"]?[^\s:'\"]+:" + _V),
    ("-a", "Command Line Password", r"[ \t]-a[ \t]*['\"]?[^\s:'\"]+:" + _V),
    ("--", "Command Line Password", r"--(?:user|auth)[=\s]+['\"]?[^\s:'\"]+:" + _V),
    ("-U", "Command Line Password", r"\bsmbclient\b[^\n|;&]*?-U[ \t]*['\"]?[^\s%'\"]+%" + _V),
    # htpasswd -b[c] FILE USER PW (-bn: USER PW).
    ("-b", "Command Line Password",
     r"\bhtpasswd(?:[ \t]+-[a-zA-Z]+)*[ \t]+-[a-zA-Z]*b[a-zA-Z]*(?:[ \t]+-[a-zA-Z]+)*"
     r"(?:[ \t]+[^\s-]\S*){1,2}[ \t]+" + _V),
    # kubectl create secret ... --from-literal=password=PW (any key naming a secret).
    ("--", "Command Line Password",
     r"--from-literal[= ]['\"]?[\w.-]*(?:pass|pwd|token|secret|key)[\w.-]*=" + _V),
    # libpq connection strings: "host=db password=PW" (psql, pg_dump, DSNs).
    ("=", "Command Line Password",
     r"\b(?:host|hostaddr|dbname|user|port|sslmode)=[^\s'\",]+(?:[ \t]+\w+=[^\s'\",]+)*?"
     r"[ \t]+password=" + _V),
    # Env-dump style NAME=value where NAME ends in PASS, PASSWD, PASSWORD, _PWD, TOKEN,
    # SECRET or _KEY (detect-secrets' keyword list lacks ADMIN_PASS and MYSQL_PWD, and takes
    # unquoted values only in some file types); PGPASSWORD=pw psql ... too.
    ("=", "Credential Assignment",
     r"\b[A-Z][A-Z0-9_]*(?:PASS|PASSWD|PASSWORD|_PWD|TOKEN|SECRET|_KEY)="
     r"(?!\[REDACTED\])([^\s\"'`$\\{}()<>;,]{6,})"),
)
_DASH_GATE = re.compile(r"-(?:-(?=[a-z])|[pawPuUbskd])")
_EQ_GATE = re.compile(r"=(?:(?<=PASS=)|(?<=PASSWD=)|(?<=PASSWORD=)|(?<=_PWD=)|(?<=TOKEN=)"
                      r"|(?<=SECRET=)|(?<=_KEY=)|(?<=password=))")

_PROVIDERS = tuple((kind, re.compile(rx)) for kind, rx in _PROVIDER_RULES)
_CLI: dict[str, list[tuple[str, re.Pattern]]] = {}
for _key, _kind, _rx in _CLI_RULES:
    _CLI.setdefault(_key, []).append((_kind, re.compile(_rx)))

# Values that are names of a value, not one: shell and template references, metavars.
_PLACEHOLDER = re.compile(r"[$%{<(\[@/~*&\\-]|.*(?:\$\{|\$\(|\{\{|\}\}|\.\.\.)"
                          r"|[A-Z_]+$|[0-9]+$|\W+$"
                          r"|(?i:x+|your[_-]?\w*|changeme|password|passwd|secret|token|none|null"
                          r"|true|false|stdin|prompt|example\w*)$")


def _plausible_password(value: str) -> bool:
    """A command-line or assignment value that is a literal secret, not a reference.

    >>> [_plausible_password(v) for v in ("Hunter2x", "$DB_PW", "PASSWORD", "<token>", "xxxx")]
    [True, False, False, False, False]
    """
    return REDACTED not in value and _PLACEHOLDER.match(value) is None


_RUN_MIN_CHARS = 24  # no provider token is shorter (sk_live_ + 20, hvs. + 24, ...)
_RUN_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.+/="
_RUN_TABLE = bytes(ord("a") if b in _RUN_CHARS else ord(" ") for b in range(256))


def _long_runs(text: str) -> str:
    """The runs of :data:`_RUN_MIN_CHARS` or more token characters (letters, digits,
    ``_-.+/=``) in ``text``, one per line (``bytes.translate`` and ``find``: C speed).

    >>> _long_runs("x = 'ghp_" + "a1" * 12 + "' # not_a_long_word")
    'ghp_a1a1a1a1a1a1a1a1a1a1a1a1'
    """
    data = text.encode("utf-8", "surrogatepass")
    runs = _runs(data.translate(_RUN_TABLE), _RUN_MIN_CHARS)
    return b"\n".join(data[i:e] for i, e in runs).decode("ascii")


def _runs(marks: bytes, min_len: int):
    """``(start, end)`` byte offsets of the runs of at least ``min_len`` ``a`` in
    ``marks`` (a text translated to ``a`` for run characters, a space for the rest)."""
    needle = b"a" * min_len
    i = marks.find(needle)
    while i >= 0:
        e = marks.find(b" ", i)
        e = len(marks) if e < 0 else e
        yield i, e
        i = marks.find(needle, e)


def _extra_spans(text: str) -> list[tuple[int, int, str, str]]:
    """``(start, end, kind, value)`` of every value the extra rules find in ``text``."""
    out = []
    # Provider tokens are long runs of token characters: the patterns run on those runs only.
    runs = _long_runs(text)
    for kind, rx in _PROVIDERS if runs else ():
        for m in rx.finditer(runs):
            s = m.start()
            if s and (runs[s - 1].isalnum() or runs[s - 1] == "_"):
                continue  # inside a longer word: not a token's start
            value = m.group(1)
            i = text.find(value)
            while i >= 0:
                out.append((i, i + len(value), kind, value))
                i = text.find(value, i + len(value))
    # Microsoft's secret masker's table of precisely classified keys (Azure identifiable
    # keys, NuGet, Azure DevOps PATs, ...): maintained there, run on the same runs (its
    # regexes have no literal prefix: 0.65 MB/s on whole text, nothing measurable on runs).
    long_runs = "\n".join(r for r in runs.split("\n") if len(r) >= _MS_MIN_CHARS) if runs else ""
    if long_runs:
        for det in (d for pattern in _ms_patterns() for d in pattern.get_detections(long_runs)):
            value = long_runs[det.start:det.end]
            if "\n" in value or not value:
                continue
            i = text.find(value)
            while i >= 0:
                out.append((i, i + len(value), "Microsoft " + (det.name or "Key"), value))
                i = text.find(value, i + len(value))
    # Command lines and assignments: the rules of each gate match, on its line only.
    todo: dict[tuple[int, str], int] = {}  # (line start, gate key) -> line end
    for gate in (_DASH_GATE, _EQ_GATE):
        for m in gate.finditer(text):
            key = m.group() if gate is _DASH_GATE else "="
            s = text.rfind("\n", 0, m.start()) + 1
            if (s, key) not in todo:
                e = text.find("\n", m.end())
                todo[(s, key)] = len(text) if e < 0 else e
    seen: set[tuple[int, int]] = set()
    for (s, key), e in todo.items():
        for kind, rx in _CLI[key]:
            for m in rx.finditer(text, s, e):
                g = next(i for i in range(1, rx.groups + 1) if m.group(i) is not None)
                value = m.group(g)
                if key == "--" and value.isalpha() and value.islower() \
                        and text[m.start(g) - 1] in " \t":
                    continue  # prose: "--password requires --user"
                if _plausible_password(value) and m.span(g) not in seen:
                    seen.add(m.span(g))
                    out.append((m.start(g), m.end(g), kind, value))
    out.extend(_gated_spans(text))
    return out


# Secrets in HTTP headers, prose, piped logins, signed URLs and webhook URLs (issue 21, second
# break-it run: all were stored in full). Each rule has gate literals, looked for in the
# ASCII-lowered text (``str.find``: C speed); the rule's regex (case-insensitive) runs on the
# lines that hold a gate only. The value is the rule's first group that matched; ``check``
# decides whether it is a literal secret. Gitleaks' and trufflehog's rules for these formats
# were the reference.
_HDR_V = r"""([A-Za-z0-9+/=._~-]{8,}|\[REDACTED\])"""
_WORD_V = r"""\\*['"`]?([^\s'"`()\[\]{}<>,;|&\\]{4,}|\[REDACTED\])"""


def _header_secret(value: str) -> bool:
    """A header's credentials: letters with digits, or three character classes; not a word,
    a metavar or a name in code (``NotRequired``, ``self.api_key``).

    >>> [_header_secret(v) for v in ("dXNlcjpQdzEyMw==", "NotRequired", "self.api_key")]
    [True, False, False]
    """
    if not _plausible_password(value) or _IDENTIFIER.fullmatch(value) \
            or _CODE_NAME.fullmatch(value):
        return False
    has_alpha = any(c.isalpha() for c in value)
    return (has_alpha and any(c.isdigit() for c in value)) or _classes(value) >= 3


_USER_PASSWORD = re.compile(r"[\w.@+-]{1,64}:[!-~]{3,128}")


def _b64_text(value: str) -> str | None:
    """``value`` base64-decoded (standard or URL-safe, padding optional) when that gives
    printable ASCII, else None.

    >>> _b64_text("dXNlcjpwdw=="), _b64_text("not base64!"), _b64_text("AAEC")
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


def _user_password_blob(value: str) -> bool:
    """Base64 of ``user:password`` (Docker's ``auth``, HTTP Basic credentials).

    >>> [_user_password_blob(v) for v in ("Y2k6UHc0eDlx", "dGVzdA==", "bm9uZQ")]
    [True, False, False]
    """
    text = _b64_text(value)
    return text is not None and _USER_PASSWORD.fullmatch(text) is not None


def _prose_secret(value: str) -> bool:
    """A password written in a sentence: token-looking, not an English word or code.

    A digit with letters, or a symbol other than ``._-`` (``Tr0ub4dor&3``), or camel humps
    of random letters (``StagePwOILYUpNj``, not ``SecretStr``, ``HTTPServer`` or
    ``HttpBasicAuthHandler``); never an identifier (``self._password``, ``snake_case``), a path, a
    reference or a metavar.

    >>> [_prose_secret(v) for v in ("StagePwOILYUpNj", "ColonPwXyz123", "required", "None",
    ...                             "SecretStr", "self._password", "HttpBasicAuthHandler",
    ...                             "HTTPServer")]
    [True, True, False, False, False, False, False, False]
    """
    if (len(value) < 6 or not _plausible_password(value) or value[0] in "/.~#"
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


_CODE_NAME = re.compile(r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+|_\w+|\w+_")  # attr.path, _x
_LOWER_RUN = re.compile(r"[a-z]+")


def _classes(value: str) -> int:
    return (any(c.islower() for c in value) + any(c.isupper() for c in value)
            + any(c.isdigit() for c in value) + any(not c.isalnum() for c in value))


# A word between the key and its "is" ("my password for the staging box is"), not one that
# starts another clause ("token by mistral-common and is encoded").
_PROSE_WORD = r"(?!(?:and|or|but|if|then|which|that|when|while|because|so)\b)[A-Za-z][\w'-]*"
_PROSE_KEY = (r"(?:password|passwd|passphrase|passcode|pass[ \t]+phrase|pwd|token|secret"
              r"|api[ \t]+key)")
_GATED_RULES: tuple[tuple[tuple[str, ...], str, str, object], ...] = (
    # Authorization / Proxy-Authorization headers, raw, in curl -H "...", or in a dict
    # ("Authorization": "Basic ..."): the credentials after the scheme.
    (("authorization",), "HTTP Authorization Header",
     r"\b(?:proxy-)?authorization\\?['\"]?[ \t]*[:=][ \t]*\\?['\"]?[ \t]*"
     r"(?:basic|bearer|token|digest|negotiate|ntlm|apikey|api-key|key|sso-key|otp)[ \t]+"
     + _HDR_V, _header_secret),
    # API-key headers: X-Api-Key, Api-Key, X-Auth-Token, X-Access-Token, X-API-Token, ...
    (("api", "token"), "HTTP API Key Header",
     r"(?<![\w-])(?:x-)?(?:[a-z]+-)?(?:api-?key|api-token|auth-token|access-token)"
     r"\\?['\"]?[ \t]*:[ \t]*\\?['\"]?" + _HDR_V, _header_secret),
    # A password or token in a sentence: "my password for the staging box is PW",
    # "Password: PW", "the token is PW", "passphrase: PW".
    (("pass", "pwd", "token", "secret", "api"),
     "Password In Prose",
     r"(?<![\w./-])" + _PROSE_KEY + r"(?:(?:[ \t]+" + _PROSE_WORD + r"){0,6}?[ \t]+(?:is|was)"
     r"(?:[ \t]+(?:now|still|set[ \t]+to))?[ \t]*:?|[ \t]*:)(?:\*\*)?[ \t]+['\"`]?"
     r"([^\s'\"`()\[\]{}<>,;|&\\]{5,}?[^\s'\"`()\[\]{}<>,;|&\\.:!?/]|\[REDACTED\])[.,!?:]*"
     r"(?=['\"`]|\s|$|\\[nrt\"'])", _prose_secret),
    # A value echoed into a login that reads it from stdin: docker/podman/buildah/helm
    # registry login --password-stdin, gh auth login --with-token, passwd --stdin.
    (("stdin", "token"), "Command Line Password",
     r"\b(?:echo(?:[ \t]+-[neE]+)?|printf(?:[ \t]+\\*['\"]%s(?:\\n)?\\*['\"])?)[ \t]+" + _WORD_V
     + r"\\*['\"`]?[ \t]*\|[ \t]*[^\n|;&]*?(?:--pass(?:word|wd)?-stdin|--with-token|--token-stdin"
     r"|\bpasswd[ \t]+--stdin)\b", _plausible_password),
    (("stdin", "token"), "Command Line Password",
     r"(?:--pass(?:word|wd)?-stdin|--with-token)\b[^\n|;&]*?<<<[ \t]*" + _WORD_V,
     _plausible_password),
    # echo user:PW | chpasswd
    (("pass",), "Command Line Password",
     r"\becho[ \t]+['\"]?[\w.-]+:([^\s'\"`|;&]{4,}|\[REDACTED\])['\"]?[ \t]*\|[ \t]*"
     r"(?:sudo[ \t]+)?chpasswd\b", _plausible_password),
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
     r"\b[a-z][a-z0-9+.-]*://:([^\s/@:'\"`<>{}\\]{4,}|\[REDACTED\])@", _plausible_password),
    # A credential in a URL's query string (?access_token=, &private_token=, &api_key=), of
    # any entropy: the parameter names it.
    (("token=", "key=", "secret=", "password=", "passwd="), "URL Query Credential",
     r"[?&;](?:[a-z]+[_-])?(?:token|api[_-]?key|apikey|secret|password|passwd)"
     r"=([^\s&#'\"`<>{}()\\]{8,}|\[REDACTED\])", _header_secret),
    # Docker's config.json "auth": base64 of user:password; "identitytoken" (a registry's
    # refresh token).
    (("auth",), "Docker Registry Auth",
     r"\\*[\"']auth\\*[\"'][ \t]*:[ \t]*\\*[\"']([A-Za-z0-9+/]{4,}={0,2}|\[REDACTED\])\\*[\"']",
     _user_password_blob),
    (("identitytoken", "registrytoken"), "Docker Registry Auth",
     r"\\*[\"'](?:identity|registry)token\\*[\"'][ \t]*:[ \t]*\\*[\"']([^\s'\"\\]{8,}|\[REDACTED\])",
     _plausible_password),
)
_GATED = tuple((gates, kind, re.compile(rx, re.IGNORECASE), check)
               for gates, kind, rx, check in _GATED_RULES)
_GATE_WORDS = tuple(sorted({gate for gates, *_ in _GATED_RULES for gate in gates}))
# Azure SAS: a sig= is a signature only with the other SAS fields on its line.
_SAS_FIELDS = ("sv=", "sr=", "se=", "sp=", "skn=")


def _gated_spans(text: str) -> list[tuple[int, int, str, str]]:
    """``(start, end, kind, value)`` of what :data:`_GATED_RULES` find in ``text``."""
    low = text.lower()
    if len(low) != len(text):  # a few characters lengthen when lowered: ASCII only then
        low = text.translate(_ASCII_LOWER)
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


# A secret alone on its line, right after the line that names it (prose, a comment, a
# Markdown label): "Here is the AWS secret access key:\n<40 characters>". The hint line
# holds one of :data:`_NEXT_HINTS`; the value line (within the next few lines, blank lines
# and fence markers skipped) is one word, quoted, backquoted or bulleted at most, that
# :func:`_lone_secret` takes for a key or a password.
NEXT_LINE_REACH = 4  # lines looked at below a hint line (blank lines and fences count)
_NEXT_KEYS = ("api key", "api_key", "apikey", "access key", "access_key", "private key",
              "private_key", "ssh key")
_NEXT_FIND = ("secret", "passw", "pwd", "token", "credential", "key")  # "key": _NEXT_KEYS only
_NEXT_HINTS = _NEXT_FIND[:-1] + _NEXT_KEYS
_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
# (A comment marker may start the line: "# the secret access key is\n# <40 characters>".)
_COMMENT_MARK = r"(?:#+|//+|--|;+|/?\*+)"
_LONE_LINE = re.compile(r"\n[ \t]*(?:" + _COMMENT_MARK + r"[ \t]*)?(?:[-*>][ \t]+)?[`'\"]?"
                        r"([^\s`'\"(){}\[\]<>=;,]{8,256})"
                        r"[`'\"]?[ \t.]*(?=\r?\n|$)")
_FENCE_LINE = re.compile(r"[ \t]*(?:`{3,}|~{3,})[^\n]*")
_EMPTY_COMMENT = re.compile(r"[ \t]*" + _COMMENT_MARK + r"[ \t]*")


_IDENTIFIER = re.compile(r"[a-z0-9]+(?:[_.-][a-z0-9]+)+|[A-Z0-9]+(?:_[A-Z0-9]+)+")  # snake, CONST


def _lone_secret(value: str) -> bool:
    """Does a word alone on its line look like a key or a password (not a word, a path, a
    number, an identifier)? 20+ characters: letters and digits mixed, 3.5+ bits of
    entropy per character; 8-19: three character classes, a digit among them.

    >>> [_lone_secret(v) for v in ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "Hunter2!x",
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


def _entropy(value: str) -> float:
    """Shannon entropy of ``value``, bits per character."""
    n = len(value)
    return -sum(k / n * math.log2(k / n) for k in map(value.count, set(value)))


def _next_line_spans(text: str) -> list[tuple[int, int, str, str]]:
    """Values alone on a line after a line naming a secret (see :data:`_NEXT_HINTS`)."""
    if "\\n" in text:  # JSON-escaped lines (a .jsonl transcript): same offsets, real breaks
        text = text.replace("\\n", " \n")
    low = text.lower()
    if len(low) != len(text):  # a few characters lengthen when lowered: ASCII only then
        low = text.translate(_ASCII_LOWER)
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
            if m is not None and _lone_secret(m.group(1)):
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


def _fenced_spans(text: str, prefilter: bool) -> list[tuple[int, int, str, str]]:
    """Values the plugins find in configuration blocks, read by the block's file type."""
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
    for s, e, _, kind in _find_spans(data, _keyword_mode(filename), prefilter):
        cs = start + len(data[:s].decode("utf-8", "surrogatepass"))
        value = data[s:e].decode("utf-8", "surrogatepass")
        out.append((cs, cs + len(value), kind, value))
    return out


# -- issue 34 (a second break-it pass): .netrc lines, Markdown tables, base64 blobs of a
# credential, a secret cut in two string literals.

# .netrc syntax anywhere (a notes file, a transcript): "machine HOST login USER password PW",
# on one line or several; "default" instead of "machine HOST".
_NETRC = re.compile(r"(?<![\w.-])(?:machine[ \t\r\n]+[^\s\\]+|default)"
                    r"(?:[ \t\r\n]+(?:login|account|port)[ \t\r\n]+[^\s\\]+)*"
                    r"[ \t\r\n]+password[ \t\r\n]+([^\s'\"`\\]+)")


def _netrc_spans(text: str) -> list[tuple[int, int, str, str]]:
    """``password`` values of .netrc entries (references and metavars stay)."""
    if "password" not in text or ("machine" not in text and "default" not in text):
        return []
    if "\\n" in text:  # JSON-escaped lines: same offsets, real breaks
        text = text.replace("\\n", " \n")
    # The value must look like a password (6+ characters, letters with digits or three
    # classes): "default password for ..." in prose, "password pass" in netrc's own tests stay.
    return [(m.start(1), m.end(1), "Netrc Password", m.group(1)) for m in _NETRC.finditer(text)
            if len(m.group(1)) >= 6 and _table_password(m.group(1))]


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


def _table_password(value: str) -> bool:
    """A cell under a password header: letters with digits, or three character classes.

    >>> [_table_password(v) for v in ("abc1-def", "required", "none", "Tr0ub&dor")]
    [True, False, False, True]
    """
    if len(value) < 4 or not _plausible_password(value):
        return False
    return (any(c.isalpha() for c in value) and any(c.isdigit() for c in value)) \
        or _classes(value) >= 3


def _table_spans(text: str) -> list[tuple[int, int, str, str]]:
    """Values in the columns of a Markdown table whose header names a password or token;
    a value must look like one (:func:`_header_secret`)."""
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
        check = {k: _table_password if name.startswith("pass") or name == "pwd" else _header_secret
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


# Base64 of a credential, quoted or not: a run of base64 characters that decodes to printable
# text holding ``user:password`` or something the filter redacts (a provider key).
_B64_RUN_MIN = 20
_B64_RUN_TABLE = bytes(ord("a") if b in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                       b"0123456789+/-_" else ord(" ") for b in range(256))


def _base64_spans(text: str) -> list[tuple[int, int, str, str]]:
    """Base64 runs (20+ characters, both letter cases) whose decoded text is a credential."""
    data = text.encode("utf-8", "surrogatepass")
    out = []
    for i, e in _runs(data.translate(_B64_RUN_TABLE), _B64_RUN_MIN):
        end = e
        while end < len(data) and end < e + 2 and data[end:end + 1] == b"=":
            end += 1
        if i and data[i - 1] == 0x5c:  # "\\nc2st...": the run starts with an escape's letter
            i += 1
        run = data[i:end].decode("ascii")
        body = run.rstrip("=")
        if body.lower() != body and body.upper() != body:
            decoded = _b64_text(run)
            if decoded is not None and (_USER_PASSWORD.fullmatch(decoded)
                                        or _redact(decoded, "", True, nested=True).count):
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


def _concat_spans(text: str) -> list[tuple[int, int, str, str]]:
    """The parts of two adjacent string literals that are a secret once joined."""
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
        red = _redact(view, "", True, nested=True)
        if not set(red.kinds) - _ENTROPY_KINDS:
            # Entropy alone is no reason here: two halves of an alphabet, a base64 test vector
            # cut in two lines. A format (AWS, GitHub, ...) or a keyword must name it.
            continue
        p = 0
        while p < min(len(view), len(red.text)) and view[p] == red.text[p]:
            p += 1
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


_UNESCAPE = re.compile(r'\\(["\\/nrt])')
_UNESCAPED = {"n": "\n", "r": "\r", "t": "\t"}


def _unescaped_spans(rule, text: str, needs: str) -> list[tuple[int, int, str, str]]:
    """``rule``'s spans in ``text`` and, when it holds JSON escapes (a tool call's input
    stored as JSON, a .jsonl file) and ``needs``, in its unescaped copy, mapped back onto
    ``text``."""
    out = rule(text)
    if "\\" not in text or needs not in text or not ("\\n" in text or '\\"' in text):
        return out
    parts, starts, pos = [], [], 0  # starts[i]: where the i-th unescaped character came from
    for m in _UNESCAPE.finditer(text):
        parts.append(text[pos:m.start()])
        starts.extend(range(pos, m.start()))
        parts.append(_UNESCAPED.get(m.group(1), m.group(1)))
        starts.append(m.start())
        pos = m.end()
    if not starts:
        return out
    parts.append(text[pos:])
    starts.extend(range(pos, len(text)))
    starts.append(len(text))
    plain = "".join(parts)
    for s, e, kind, value in rule(plain):
        out.append((starts[s], starts[e], kind, text[starts[s]:starts[e]]))
    return out


def _redact_extra(text: str, prefilter: bool) -> tuple[str, int, dict[str, int]]:
    """Replace what the extra rules find; returns (text, count, kinds)."""
    spans = _extra_spans(text)
    if "```" in text or "~~~" in text:
        spans.extend(_fenced_spans(text, prefilter))
    spans.extend(_next_line_spans(text))
    spans.extend(_netrc_spans(text))
    spans.extend(_unescaped_spans(_table_spans, text, "|"))
    spans.extend(_base64_spans(text))
    return _replace_spans(text, spans)


def _replace_spans(text: str, spans) -> tuple[str, int, dict[str, int]]:
    """``spans`` (start, end, kind, value) replaced by :data:`REDACTED`, merged where they
    overlap; a token-like value everywhere it appears. Returns (text, count, kinds)."""
    if not spans:
        return text, 0, {}
    # Token-like values go wherever they appear; short ones only where they were found.
    found = [(s, e, kind) for s, e, kind, _ in spans]
    for value, kind in {v: k for _, _, k, v in spans if _token_like(v)}.items():
        i = text.find(value)
        while i >= 0:
            found.append((i, i + len(value), kind))
            i = text.find(value, i + len(value))
    found.sort()
    out, kinds, pos, count = [], {}, 0, 0
    for s, e, kind in found:
        if s < pos:  # overlaps the span before: merged into it
            if e > pos:
                pos = e
            continue
        out.append(text[pos:s])
        out.append(REDACTED)
        pos = e
        count += 1
        kinds[kind] = kinds.get(kind, 0) + 1
    out.append(text[pos:])
    return "".join(out), count, kinds


def _token_like(value: str) -> bool:
    """Replace this value wherever it appears? Long, no spaces (those are artefacts of greedy
    patterns, "pw rest-of-line"), and two character classes: ``hunter2-x9`` yes, a plain word
    like ``password`` (a keyword false positive) only on its own line.

    >>> [_token_like(v) for v in ("Summer2024-db", "password", "hunter2 and more")]
    [True, False, False]
    """
    if len(value) < MIN_GLOBAL_CHARS or any(c.isspace() for c in value):
        return False
    classes = (any(c.islower() for c in value) + any(c.isupper() for c in value)
               + any(c.isdigit() for c in value) + any(not c.isalnum() for c in value))
    return classes >= 2


def _find_spans(data: bytes, mode, prefilter: bool) -> list[tuple[int, int, int, str]]:
    """One round: the byte spans ``(start, end, rank, kind)`` of every secret value."""
    if not data:
        return []
    low = data.lower()
    det = _detector()
    spans: list[tuple[int, int, int, str]] = []
    spans.extend(_private_key_spans(data, low))
    global_values: dict[str, tuple[int, str, int, int]] = {}  # value -> rank, kind, its line
    for start, end in candidate_lines(data, low) if prefilter else all_lines(data):
        line = data[start:end].decode("utf-8", "surrogatepass")
        found = det.scan_line(line, mode)
        for value, (rank, kind) in found.items():
            if _token_like(value):
                old = global_values.get(value)
                if old is None or rank < old[0]:
                    global_values[value] = (rank, kind, start, end)
                continue
            located = _locate_short(value, data, start, end)
            # Never seen: found values are substrings of the line or of its unescaped copy,
            # which _raw_pattern maps back. Should it fail, the whole line goes.
            for s, e in located or [(start, end)]:
                spans.append((s, e, rank, kind))
    for value, (rank, kind, start, end) in global_values.items():
        for s, e in _locate_all(value, data) or [(start, end)]:
            spans.append((s, e, rank, kind))
    return spans


# ----------------------------------------------------------------------------- prefilter
#
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
_HINT = r"token|bearer|auth|credential|secret|passw|pwd|api[_-]?key|access[_-]?key|private[_-]?key"

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


# ----------------------------------------------------------------------------- detection

_RANK_PRIVATE_KEY = 0  # kind of a merged span: the lowest rank wins
_RANK_SPECIFIC = 1  # token-format plugins (AWS, GitHub, Slack, JWT, basic auth, ...)
_RANK_KEYWORD = 2
_RANK_ENTROPY = 3

# Cheap necessary conditions for the plugins whose patterns have no literal prefix (slow on
# long lines): (view, view.lower()) -> may the plugin match? Skipped when the view holds one of
# the characters re.IGNORECASE folds onto ASCII letters.
_PLUGIN_GATES = {
    "ArtifactoryDetector": lambda v, low: "AKC" in v or "AP" in v,
    "CloudantDetector": lambda v, low: "cl" in low,  # cl|clou|cloudant ..., cloudant.com URLs
    "IbmCloudIamDetector": lambda v, low: "key" in low or "pw" in low or "pass" in low
    or "token" in low,
    "IbmCosHmacDetector": lambda v, low: "secret" in low,
    "SoftlayerDetector": lambda v, low: "sl" in low,  # softlayer|sl ..., api.softlayer.com
    "MailchimpDetector": lambda v, low: "-us" in v,
    "TelegramBotTokenDetector": lambda v, low: ":" in v,
    "SlackDetector": lambda v, low: "xox" in low or "hooks" in low,
    "StripeDetector": lambda v, low: "k_live_" in v,
    "AzureStorageKeyDetector": lambda v, low: "AccountKey=" in v,
    "DiscordBotTokenDetector": lambda v, low: "." in v,
    "NpmDetector": lambda v, low: "_authToken" in v,
}
_FOLDING_CHARS = ("\u0130", "\u0131", "\u017f", "\u212a")

_ESCAPE = re.compile(r"\\([\"'\\/nrt])")
_ESCAPED = {"n": "\n", "r": "\r", "t": "\t"}
_ESCAPE_SPLIT = re.compile(r"\\(?:u[0-9a-fA-F]{4}|[\"'\\/nrtbf])")
_QUOTES = "\"'`"
# Env-style assignment anywhere: upper-case NAME immediately followed by "=" (.env, export,
# docker -e, Makefiles). YAML-style "key: value": see _yaml_like.
_ENV_LINE = re.compile(r"(?:^|[\s;])(?:export\s+)?[A-Z_][A-Z0-9_]*=[^=\s]")
_YAML_SYMBOLS = frozenset("-+/=@#%^&*!~$?")
_YAML_KEY = re.compile(r"\s*(?:-\s+)?[\"']?[A-Za-z_][\w.-]*[\"']?\s*:\s+")
_HINT_STR = re.compile(_HINT, re.IGNORECASE)
_SEGMENT_DELIMS = ",;{&\n"

_MODE_DEFAULT = "default"


def _keyword_mode(filename: str):
    """The keyword regex set(s) for a file name: detect-secrets' mapping, or the default mode."""
    if not filename:
        return _MODE_DEFAULT
    from detect_secrets.plugins import keyword as kw
    from detect_secrets.util.filetype import determine_file_type

    base = os.path.basename(filename)
    if base.startswith(".env") or base.endswith(".env"):
        return (kw.CONFIG_DENYLIST_REGEX_TO_GROUP,)
    regexes = kw.REGEX_BY_FILETYPE.get(determine_file_type(filename))
    return (regexes,) if regexes is not None else _MODE_DEFAULT


class _Detector:
    """The default detect-secrets plugins, instantiated once, and the per-line scan."""

    def __init__(self) -> None:
        from detect_secrets.filters import heuristic
        from detect_secrets.plugins import keyword as kw
        from detect_secrets.plugins.base import RegexBasedDetector
        from detect_secrets.plugins.high_entropy_strings import HighEntropyStringsPlugin
        from detect_secrets.plugins.ip_public import IPPublicDetector
        from detect_secrets.plugins.keyword import KeywordDetector
        from detect_secrets.plugins.private_key import PrivateKeyDetector
        from detect_secrets.settings import default_settings, get_plugins

        with default_settings():
            plugins = list(get_plugins())
        self.h = heuristic
        self.quotes_required = kw.QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP
        self.config = kw.CONFIG_DENYLIST_REGEX_TO_GROUP
        self.keyword = None
        self.entropy: list = []  # (plugin, unquoted regex, min length)
        self.regex: list = []  # (plugin, rank, uses own analyze_string, gate or None)
        for p in plugins:
            if isinstance(p, PrivateKeyDetector):
                continue  # whole blocks: _private_key_spans
            if isinstance(p, KeywordDetector):
                self.keyword = p
            elif isinstance(p, HighEntropyStringsPlugin):
                unquoted = re.compile("[%s]+" % re.escape(p.charset))
                # Shannon entropy <= log2(len): shorter strings cannot pass the limit.
                self.entropy.append((p, unquoted, int(2 ** p.entropy_limit) + 1))
            elif isinstance(p, IPPublicDetector):
                continue  # is_not_alphanumeric_string drops every IPv4 value (no letter)
            elif isinstance(p, RegexBasedDetector):
                own = type(p).analyze_string is not RegexBasedDetector.analyze_string
                gate = _PLUGIN_GATES.get(type(p).__name__)
                self.regex.append((p, _RANK_SPECIFIC, own, gate))
            # Any other plugin kind (none by default) would need its own handling.

    # -- filters (detect-secrets' defaults; see the module docstring for the two changes)
    def _keep(self, value: str, plugin, line: str) -> bool:
        h = self.h
        return not (
            not value.strip()
            or REDACTED in value
            or h.is_sequential_string(value)
            or h.is_potential_uuid(value)
            or h.is_templated_secret(value)
            or h.is_prefixed_with_dollar_sign(value)
            or h.is_not_alphanumeric_string(value)
            or h.is_likely_id_string(value, _segment(line, value), plugin)
        )

    def scan_line(self, line: str, mode) -> dict[str, tuple[int, str]]:
        """Secret values on one raw line -> (rank, secret_type)."""
        found: dict[str, tuple[int, str]] = {}
        for view in _views(line):
            self._scan_view(view, mode, found)
        return found

    def _add(self, found, value: str, rank: int, kind: str) -> None:
        old = found.get(value)
        if old is None or rank < old[0]:
            found[value] = (rank, kind)

    def _scan_view(self, view: str, mode, found) -> None:
        low = view.lower()
        folded = any(c in view for c in _FOLDING_CHARS)
        for plugin, rank, own, gate in self.regex:
            if gate is not None and not folded and not gate(view, low):
                continue
            kind = plugin.secret_type
            if own:
                values = _own_values(plugin, view)
            else:
                values = (_regex_value(m) for rx in plugin.denylist for m in rx.finditer(view))
            for v in values:
                v = _trim(v)
                if v and self._keep(v, plugin, view):
                    self._add(found, v, rank, kind)
        hints = _hint_ends(view, low, folded)
        for plugin, unquoted, min_len in self.entropy:
            kind = plugin.secret_type
            # Quoted values (detect-secrets' own search), cut at escape sequences: in a raw
            # JSON line "a\\nb" is two lines glued together.
            values = [p.rstrip("\\") for v in plugin.analyze_string(view)
                      for p in _ESCAPE_SPLIT.split(v)]
            if hints:
                values.extend(_eager_values(view, unquoted, hints))
            for v in values:
                if (
                    len(v) >= min_len
                    and plugin.calculate_shannon_entropy(v) > plugin.entropy_limit
                    and self._keep(v, plugin, view)
                ):
                    self._add(found, v, _RANK_ENTROPY, kind)
        for window in _windows(view):
            if _may_have_keyword(window):
                self._scan_keyword(window, mode, found)

    def _scan_keyword(self, view: str, mode, found) -> None:
        kwd = self.keyword
        if kwd is None:
            return
        if mode == _MODE_DEFAULT:
            sets = [self.quotes_required]
            if _ENV_LINE.search(view) or _yaml_like(view):
                sets.append(self.config)
        else:
            sets = list(mode)
        kind = kwd.secret_type
        work = view
        seen: set[str] = set()
        # Each regex reports its first match only: mask what it found (kept or filtered out)
        # and ask again, until a pass brings nothing new.
        for _ in range(MAX_KEYWORD_PASSES):
            fresh = []
            for regexes in sets:
                for raw in kwd.analyze_string(work, denylist_regex_to_group=regexes):
                    fresh.extend(v for v in _pieces(raw) if v not in seen)
            if not fresh:
                return
            for v in fresh:
                seen.add(v)
                idx = work.find(v)
                quoted = idx > 0 and work[idx - 1] in _QUOTES
                if idx > 0 and work[idx - 1] == "=" and v.split() and v.split()[0] != v:
                    # An unquoted NAME=value ends at a blank, as in the shell: the config
                    # regex ran on over "PGPASSWORD=pw psql -h db" and took the command too.
                    v = v.split()[0]
                if self._keep(v, kwd, work) and (
                    quoted or not self.h.is_indirect_reference(_segment(work, v))
                ):
                    self._add(found, v, _RANK_KEYWORD, kind)
            for v in sorted(fresh, key=len, reverse=True):
                work = work.replace(v, REDACTED)


def _yaml_like(view: str) -> bool:
    """``key: value`` as a whole line, the value one unquoted word that has a digit or a symbol:
    YAML ``password: hunter2``, not Python ``password: str`` or ``password: bytes | None``.

    >>> [_yaml_like(v) for v in ("  password: hunter2", "password: str", "password: x,")]
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


def _views(line: str) -> list[str]:
    """The line's sub-lines, raw and JSON-unescaped (up to three levels), without duplicates.

    >>> _views('{"content": "A=1\\\\nB=\\\\"2\\\\""}')
    ['{"content": "A=1\\\\nB=\\\\"2\\\\""}', '{"content": "A=1', 'B="2""}']
    """
    parts = line.splitlines() or [line]
    level = line
    for _ in range(3):  # JSON in JSON in JSON at most
        if "\\" not in level:
            break
        nxt = _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), m.group(1)), level)
        if nxt == level:
            break
        parts.extend(nxt.splitlines())
        level = nxt
    out: list[str] = []
    seen: set[str] = set()
    for part in parts:
        part = part.rstrip()
        if part and part not in seen:
            seen.add(part)
            out.append(part)
    return out


_HINT_WORDS = ("token", "bearer", "auth", "credential", "secret", "passw", "pwd", "apikey",
               "api_key", "api-key", "accesskey", "access_key", "access-key", "privatekey",
               "private_key", "private-key")  # _HINT spelled out


def _hint_ends(view: str, low: str, folded: bool) -> list[int]:
    """Sorted end offsets of the hint words in ``view`` (``low`` is ``view.lower()``).

    >>> _hint_ends("X_API_KEY=1 token", "x_api_key=1 token", False)
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


def _may_have_keyword(text: str) -> bool:
    """Every KeywordDetector DENYLIST word holds key, pass, pwd, secret or contrase (any case,
    with re.IGNORECASE's folding of long s, dotless i and the Kelvin sign).

    >>> _may_have_keyword("DB_PASSWORD=x"), _may_have_keyword("user = 'ada'")
    (True, False)
    """
    low = text.lower()
    return ("key" in low or "pass" in low or "pwd" in low or "secret" in low
            or "contrase" in low or "\u017f" in low or "\u0131" in low or "\u0130" in text)


def _windows(view: str) -> list[str]:
    """Overlapping windows of a long view for the keyword plugin, whose greedy patterns are
    slow on long lines (the token and entropy plugins see the whole view)."""
    if len(view) <= WINDOW_CHARS:
        return [view]
    step = WINDOW_CHARS - WINDOW_OVERLAP_CHARS
    return [view[i:i + WINDOW_CHARS] for i in range(0, len(view) - WINDOW_OVERLAP_CHARS, step)]


def _eager_values(view: str, unquoted: re.Pattern, hint_ends: list[int]) -> list[str]:
    """Unquoted charset runs that start within :data:`EAGER_REACH_CHARS` after a hint word,
    cut at escape sequences and at the first inner ``=`` (``NAME=value`` is one base64 run;
    padding only ends a value).

    >>> rx = re.compile(r"[A-Za-z0-9+/=_-]+")
    >>> _eager_values("export API_TOKEN=abc==", rx, [16])
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
            for piece in _ESCAPE_SPLIT.split(m.group().rstrip("\\")):
                name, eq, value = piece.partition("=")
                for sub in ([name, value] if eq and value.strip("=") else [piece]):
                    if sub and start >= h:
                        out.append(sub)
                    start += len(sub) + 1
            pos = done = m.end()
    return out


def _regex_value(m: re.Match) -> str:
    """The secret in one match of a RegexBasedDetector pattern, grown to the whole token.

    The plugin's own ``analyze_string`` yields the capture groups. For most plugins the group
    is the value (``://user:(pass)@``, ``aws...key...'(40)'``), but GitHub and GitLab capture
    only the prefix (``(ghp|gho|...)_...``): a group that starts the match, or that the match
    continues past with more token characters, is a prefix, and the whole match is taken.
    Fixed-length patterns stop inside longer real tokens (``sk_live_`` + 24, while Stripe keys
    run to ~100 characters; OpenAI ``...T3BlbkFJ`` + 20): a value that ends the match on a token
    character runs on over ``[A-Za-z0-9_-]``.

    >>> import re
    >>> _regex_value(re.search(r'(ghp|gho)_[a-z]{4}', 'x ghp_abcd y'))
    'ghp_abcd'
    >>> _regex_value(re.search(r'://[^:@]+:([^:@]+)@', 'https://me:pw@host'))
    'pw'
    >>> _regex_value(re.search(r'sk_live_[a-z]{4}', 'k=sk_live_abcdefgh z'))
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


def _own_values(plugin, view: str) -> list[str]:
    """Values of a plugin with its own ``analyze_string`` (JwtTokenDetector, whose pattern's
    lazy last part often stops before the signature): each grown over base64url and dots."""
    out = []
    for v in plugin.analyze_string(view):
        idx = view.find(v)
        while idx >= 0:
            out.append(view[idx:_JWT_TAIL.match(view, idx + len(v)).end()])
            idx = view.find(v, idx + 1)
    return out


def _trim(value: str) -> str:
    """Drop the delimiters some patterns include (Artifactory: ``(?:\\s|=|:|"|^)AKC...``), and
    the part of the match that is no secret (Azure's ``AccountKey=``, Slack's webhook host):
    it stays on the line.

    >>> _trim("https://hooks.slack.com/services/T1/B2/x3"), _trim("AccountKey=k==")
    ('T1/B2/x3', 'k==')
    """
    value = value.lstrip(" \t\r\n\f\v=:\"'").rstrip(" \t\r\n\f\v\"'")
    for name in _NOT_SECRET_PREFIXES:
        if value.startswith(name) and len(value) > len(name):
            return value[len(name):]
    return value


_NOT_SECRET_PREFIXES = ("AccountKey=", "https://hooks.slack.com/services/")


def _pieces(value: str) -> list[str]:
    """A value that swallowed an earlier ``[REDACTED]`` (mask-and-rescan): the rest of it."""
    if REDACTED not in value:
        return [value]
    return [p.strip() for p in value.split(REDACTED) if p.strip()]


def _segment(line: str, value: str) -> str:
    """The part of ``line`` from the last ``,;{&`` before ``value`` on (its own assignment)."""
    idx = line.find(value)
    if idx < 0:
        return line
    cut = max(line.rfind(d, 0, idx) for d in _SEGMENT_DELIMS)
    return line[cut + 1:]


# ----------------------------------------------------------------------------- locating values


def _raw_pattern(value: str) -> re.Pattern | None:
    """Bytes regex for ``value`` as it may appear JSON-escaped (any backslashes before quotes,
    slashes and backslashes; ``\\t`` for tab); None when the value has none of those."""
    if not any(c in value for c in "\"'\\/\t"):
        return None
    parts = []
    for c in value:
        if c in "\"'\\/":
            parts.append(rb"\\*" + re.escape(c.encode()))
        elif c == "\t":
            parts.append(rb"(?:\t|\\+t)")
        else:
            parts.append(re.escape(c.encode("utf-8", "surrogatepass")))
    return re.compile(b"".join(parts))


def _occurrences(value: str, data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    rx = _raw_pattern(value)
    if rx is not None:
        return [m.span() for m in rx.finditer(data, start, end)]
    needle = value.encode("utf-8", "surrogatepass")
    out = []
    pos = data.find(needle, start, end)
    while pos >= 0:
        out.append((pos, pos + len(needle)))
        pos = data.find(needle, pos + len(needle), end)
    return out


def _locate_all(value: str, data: bytes) -> list[tuple[int, int]]:
    return _occurrences(value, data, 0, len(data))


def _locate_short(value: str, data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """A short value on its own line: the occurrences not inside a longer word, else all."""
    spans = _occurrences(value, data, start, end)

    def alnum(i: int) -> bool:
        return 0 <= i < len(data) and (chr(data[i]).isalnum() if data[i] < 128 else True)

    bounded = [(s, e) for s, e in spans if not alnum(s - 1) and not alnum(e)]
    return bounded or spans


# ----------------------------------------------------------------------------- private keys

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


def _private_key_spans(data: bytes, low: bytes) -> list[tuple[int, int, int, str]]:
    """The bodies of ``BEGIN ... PRIVATE KEY`` blocks (and PuTTY key files).

    With an ``END`` line the body is everything between the two markers; without one, the run
    of base64 lines (and ``Header: value`` lines, and the blank line after headers) that follows,
    separated by real or JSON-escaped newlines.

    >>> pem = (b'x\\n-----BEGIN RSA PRIVATE KEY-----\\nMIIEabc\\ndef=\\n'
    ...        b'-----END RSA PRIVATE KEY-----\\n')
    >>> [pem[s:e] for s, e, _, _ in _private_key_spans(pem, pem.lower())]
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
            out.append((s, e, _RANK_PRIVATE_KEY, "Private Key"))
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


# ----------------------------------------------------------------------------- assembly


def _apply(data: bytes, spans: list[tuple[int, int, int, str]]) -> tuple[str, int, dict]:
    """Replace the merged spans: (text, number of replacements, replacements per kind)."""
    spans.sort()
    merged: list[list] = []  # [start, end, rank, kind]
    for s, e, rank, kind in spans:
        if merged and s < merged[-1][1]:
            last = merged[-1]
            last[1] = max(last[1], e)
            if rank < last[2]:
                last[2], last[3] = rank, kind
        else:
            merged.append([s, e, rank, kind])
    out = []
    kinds: dict[str, int] = {}
    pos = 0
    token = REDACTED.encode()
    for s, e, _, kind in merged:
        out.append(data[pos:s])
        out.append(token)
        pos = e
        kinds[kind] = kinds.get(kind, 0) + 1
    out.append(data[pos:])
    return b"".join(out).decode("utf-8", "surrogatepass"), len(merged), kinds


_DETECTOR: _Detector | None = None
_DETECTOR_LOCK = threading.Lock()
_MS_MASKER = None
_MS_MIN_CHARS = 36  # no key of the Microsoft table is shorter (dapi + 32, NuGet oy2 + 43, ...)


def _ms_patterns() -> list:
    """The ``RegexPattern`` objects of Microsoft's secret masker's PreciselyClassifiedSecurityKeys
    table (loaded once). Used without its ``SecretMasker``, whose read lock warns on every call
    (``notifyAll``) and which holds nothing else this module needs."""
    global _MS_MASKER
    if _MS_MASKER is None:
        with _DETECTOR_LOCK:
            if _MS_MASKER is None:
                from microsoft_security_utilities_secret_masker import (
                    load_regex_patterns_from_json_file,
                )
                _MS_MASKER = sorted(
                    load_regex_patterns_from_json_file("PreciselyClassifiedSecurityKeys.json"),
                    key=lambda p: p.name)
    return _MS_MASKER


def _detector() -> _Detector:
    global _DETECTOR
    if _DETECTOR is None:
        with _DETECTOR_LOCK:
            if _DETECTOR is None:
                _DETECTOR = _Detector()
    return _DETECTOR
