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
   token-like values (:func:`.spans.token_like`), becomes ``[REDACTED]``; overlapping spans merge
   (:func:`.spans.merge_spans`, the one merge every step uses).
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
   type. From the second break-it run (:data:`.gated_rules.GATED_RULES`): ``Authorization``/
   ``Proxy-Authorization`` headers (``Basic``, ``Bearer``, ``token``, ... schemes; raw, in
   ``curl -H`` or in a dict) and API-key headers (``X-Api-Key``, ``X-Auth-Token``, ...);
   passwords in prose ("my password for the box is PW", "Password: PW", "the token is PW",
   "passphrase: PW"; the value must look like a token: :func:`.values.prose_secret`); a value echoed
   or printed into ``--password-stdin``/``--passwd-stdin``/``--with-token``/``passwd --stdin``
   (docker, podman, buildah, helm, gh), or given to them with ``<<<``, and ``echo user:PW |
   chpasswd``; Azure SAS ``sig=`` (with other SAS fields on its line), ``AccountKey=``/
   ``SharedAccessKey=``, AWS/GCS presigned ``X-Amz-Signature``/``X-Goog-Signature``/
   ``X-Amz-Security-Token``; webhook URLs (Discord, Slack workflows/triggers, Teams) and
   Telegram bot API URLs. From a third (issue 34): a URL password with an empty user
   (``redis://:PW@host``); a credential in a URL's query (``?access_token=``,
   ``&private_token=``, ``&api_key=``: the value must look like a token,
   :func:`.values.header_secret`);
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
   on the same long runs as the provider rules. From a fourth break-it run: an AWS secret
   access key next to its key id (a standalone 40-character ``[A-Za-z0-9/+]`` run with letters
   and digits on the id's line or the next one, or beside the ``[REDACTED]`` the plugins made
   of the id, as trufflehog pairs them: :func:`.context_rules.aws_pair_spans`); short password forms in notes
   (``pw=PW``, ``pw: PW``, ``(pass: PW)``, ``login: user / PW``, ``user U, pass PW``; the
   value must look like a token, :func:`.values.note_password`); the default of an environment
   lookup (``os.environ.get``/``os.getenv``/``ENV.fetch``/``process.env.X ||``) whose
   variable names a secret or that is assigned or passed to one
   (``password=os.environ.get("X", "PW")``); and a key cut in two literals whose only finding
   is high entropy, when a keyword inside the first literal names it
   (``"aws_secret_access_key = wJalr"\\n    "XUtn..."``). References
   and placeholders (``$VAR``, ``<token>``, ``PASSWORD`` metavars) stay.

What detect-secrets alone misses or gets wrong, and what this package does about it:

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
  :data:`.plugin_values.EAGER_REACH_CHARS` after a hint word (token, bearer, auth, credential,
  secret, passw, pwd, api/access/private key) the entropy plugins also run in detect-secrets'
  "eager" (unquoted) mode, with the plugin's entropy limit (``scan_line`` itself skips the
  limit).
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
key cut in three literals or more, an AWS secret key two lines or more from its key id (or
above it) with no keyword naming it, and formats no rule knows. A suggestion the user accepts is
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

No secret value is ever logged or put in an exception message by this package.

Modules, one job each (the pipeline's steps above, in order of use):

======================  ===================================================================
``pipeline``            :func:`redact`: the rounds, the order of the rules
``prefilter``           step 1: :func:`candidate_lines`, the necessary conditions
``scan``                step 2: one round of the plugins over a text, values located as spans
``detector``            the detect-secrets plugins and filters, run on one line
``plugin_values``       values out of the plugins' matches (grown, trimmed, eager, windows)
``escapes``             JSON-escaped text: a line's unescaped views, spans mapped back
``private_keys``        step 3: whole private key blocks
``spans``               step 4: :data:`REDACTED`, :class:`Redaction`, merging and replacing
``provider_rules``      step 5: provider formats and Microsoft's table, on long runs
``cli_rules``           step 5: command lines and ``NAME=value`` assignments
``gated_rules``         step 5: headers, prose, stdin logins, signed and webhook URLs,
                        environment defaults, ...
``context_rules``       step 5: next-line values, fenced blocks, ``.netrc``, Markdown tables,
                        an AWS secret key next to its key id
``rescan_rules``        step 5: base64 of a credential, a key cut in two literals
``values``              step 5: is a found value a literal secret (not a reference, a word)?
``text_scan``           C-speed runs of token characters; a lowered copy with equal offsets
======================  ===================================================================
"""

from .context_rules import NEXT_LINE_REACH
from .detector import MAX_KEYWORD_PASSES
from .pipeline import MAX_ROUNDS, redact
from .plugin_values import EAGER_REACH_CHARS, WINDOW_CHARS, WINDOW_OVERLAP_CHARS
from .prefilter import all_lines, candidate_lines
from .spans import MIN_GLOBAL_CHARS, REDACTED, Redaction

__all__ = [
    "EAGER_REACH_CHARS",
    "MAX_KEYWORD_PASSES",
    "MAX_ROUNDS",
    "MIN_GLOBAL_CHARS",
    "NEXT_LINE_REACH",
    "REDACTED",
    "WINDOW_CHARS",
    "WINDOW_OVERLAP_CHARS",
    "Redaction",
    "all_lines",
    "candidate_lines",
    "redact",
]
