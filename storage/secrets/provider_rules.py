"""Provider token formats that detect-secrets' plugins do not know, recognised by their prefix.

Two tables: :data:`PROVIDER_RULES` (GitHub ``github_pat_``, OpenAI, Anthropic, Slack, Stripe,
Google, Hugging Face, npm, PyPI, DigitalOcean, Shopify, Doppler, Vault, Databricks, Postman,
Grafana, Sentry, Linear, Atlassian, age), and the PreciselyClassifiedSecurityKeys table of
Microsoft's secret masker (Azure identifiable keys, NuGet, Azure DevOps PATs, ...). Both run on
the long runs of token characters only (:func:`.text_scan.long_runs`), never on the whole text.
"""

from __future__ import annotations

import re
import threading

from .spans import TextSpan
from .text_scan import long_runs

# Provider formats, recognised by their prefix alone (as gitleaks and GitHub's secret
# scanning do); the value is the whole token, which must start a word.
PROVIDER_RULES: tuple[tuple[str, str], ...] = (
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


_PROVIDERS = tuple((kind, re.compile(rx)) for kind, rx in PROVIDER_RULES)
_MS_PATTERNS = None
_MS_LOCK = threading.Lock()
_MS_MIN_CHARS = 36  # no key of the Microsoft table is shorter (dapi + 32, NuGet oy2 + 43, ...)


def provider_spans(text: str) -> list[TextSpan]:
    """``(start, end, kind, value)`` of every token of a known provider format in ``text``:
    each occurrence of each token found.

    >>> [(s, e, kind) for s, e, kind, _ in provider_spans("k = 'hf_" + "Ab1" * 11 + "'")]
    [(5, 41, 'Hugging Face Token')]
    """
    out = []
    # Provider tokens are long runs of token characters: the patterns run on those runs only.
    runs = long_runs(text)
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
    ms_runs = "\n".join(r for r in runs.split("\n") if len(r) >= _MS_MIN_CHARS) if runs else ""
    if ms_runs:
        for det in (d for pattern in _ms_patterns() for d in pattern.get_detections(ms_runs)):
            value = ms_runs[det.start:det.end]
            if "\n" in value or not value:
                continue
            i = text.find(value)
            while i >= 0:
                out.append((i, i + len(value), "Microsoft " + (det.name or "Key"), value))
                i = text.find(value, i + len(value))
    return out


def _ms_patterns() -> list:
    """The ``RegexPattern`` objects of Microsoft's secret masker's PreciselyClassifiedSecurityKeys
    table (loaded once). Used without its ``SecretMasker``, whose read lock warns on every call
    (``notifyAll``) and which holds nothing else this filter needs."""
    global _MS_PATTERNS
    if _MS_PATTERNS is None:
        with _MS_LOCK:
            if _MS_PATTERNS is None:
                from microsoft_security_utilities_secret_masker import (
                    load_regex_patterns_from_json_file,
                )
                _MS_PATTERNS = sorted(
                    load_regex_patterns_from_json_file("PreciselyClassifiedSecurityKeys.json"),
                    key=lambda p: p.name)
    return _MS_PATTERNS
