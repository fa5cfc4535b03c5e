"""Passwords and tokens given on a command line or in an environment assignment.

``mysql -pPW``, ``--password``/``--passwd``/``--token``/... flags, ``curl -u u:PW``, ``sshpass -p``,
``docker login -p``, ``htpasswd -b``, ``redis-cli -a``, ``ldapsearch -w``, ``openssl pass:``,
``keytool -storepass``, ``kubectl --from-literal``, libpq ``password=``, ``PGPASSWORD=``/
``MYSQL_PWD=``. A rule's regex runs only on the lines of its gate match (``_DASH_GATE``,
``_EQ_GATE``: regexes that start with a literal, re's fast prefix search), never on the whole
text.
"""

from __future__ import annotations

import re

from .spans import TextSpan
from .values import plausible_password

# A password or token given on a command line or in an environment assignment. The value
# is one shell word, optionally quoted; :func:`plausible_password` drops references and
# placeholders ($VAR, <token>, PASSWORD metavars, {templates}). Each rule names the gate
# match that must be on its line: a flag (``_DASH_GATE``) or ``=`` after a name (``_EQ_GATE``).
# (A value already redacted matches as itself, so that a later round does not shift the
# match onto the word before it.)
_V = r"""['"]?(\[REDACTED\]|[^\s'"`()\[\]{}<>,;|&]{4,})"""
CLI_RULES: tuple[tuple[str, str, str], ...] = (
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
_CLI: dict[str, list[tuple[str, re.Pattern]]] = {}
for _key, _kind, _rx in CLI_RULES:
    _CLI.setdefault(_key, []).append((_kind, re.compile(_rx)))


def cli_spans(text: str) -> list[TextSpan]:
    """``(start, end, kind, value)`` of the passwords on command lines and in assignments.

    >>> [v for _, _, _, v in cli_spans("mysql -u root -pHunter2x db\\nPGPASSWORD=$PW psql")]
    ['Hunter2x']
    """
    out = []
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
                if plausible_password(value) and m.span(g) not in seen:
                    seen.add(m.span(g))
                    out.append((m.start(g), m.end(g), kind, value))
    return out
