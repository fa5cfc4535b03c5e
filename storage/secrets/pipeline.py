"""The filter's pipeline: :func:`redact` puts every rule's spans together, round after round.

Order: a key cut in two string literals first (while both parts are still there), then rounds
of the detect-secrets plugins (:func:`.scan.find_spans`, replaced on bytes) and of the extra
rules (providers, command lines, gated rules, fenced blocks, next-line values, ``.netrc``,
Markdown tables, base64), until a round of extra rules finds nothing.
"""

from __future__ import annotations

from assistd.ground.errors import AssistdError

from .cli_rules import cli_spans
from .context_rules import (aws_pair_spans, fenced_spans, netrc_spans, next_line_spans,
                            table_spans)
from .detector import keyword_mode
from .escapes import unescaped_spans
from .gated_rules import gated_spans
from .provider_rules import provider_spans
from .rescan_rules import base64_spans, concat_spans
from .scan import find_spans
from .spans import Redaction, replace_byte_spans, replace_text_spans

MAX_ROUNDS = 4  # detect-and-replace rounds until the text stands still


def redact(text: str, *, filename: str = "", prefilter: bool = True) -> Redaction:
    """Replace every secret value in ``text`` with ``[REDACTED]``.

    ``filename`` is optional: with it, the keyword detector uses detect-secrets' per-file-type
    rules (``.py`` needs quoted values; ``.yaml``/``.ini``/``.toml``/``.env`` take unquoted
    ones). Without it, quoted values everywhere plus unquoted ones on ``NAME=value`` and
    ``key: value`` lines. ``prefilter=False`` runs detect-secrets on every line (same result,
    ~20x slower; for benchmarks and tests of the prefilter). Raises AssistdError (its message
    never quotes the text) when the filter itself fails.

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


def rescan(text: str) -> Redaction:
    """The filter on a decoded or joined value (:mod:`.rescan_rules`): no filename, prefilter
    on, and no split-literal pass of its own."""
    return _redact(text, "", True, nested=True)


def _redact(text: str, filename: str, prefilter: bool, nested: bool = False) -> Redaction:
    mode = keyword_mode(filename)
    count = 0
    kinds: dict[str, int] = {}
    if not nested:  # first, while both parts of a key cut in two literals are still there
        split = unescaped_spans(lambda t: concat_spans(t, rescan), text, '\\"')
        text, count, kinds = replace_text_spans(text, split)
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
        spans = find_spans(data, mode, prefilter)
        if not spans:
            break
        text, n, round_kinds = replace_byte_spans(data, spans)
        count += n
        for kind, k in round_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + k
    return text, count, kinds


def _redact_extra(text: str, prefilter: bool) -> tuple[str, int, dict[str, int]]:
    """Replace what the extra rules find; returns (text, count, kinds)."""
    spans = provider_spans(text) + cli_spans(text) + gated_spans(text)
    if "```" in text or "~~~" in text:
        spans.extend(fenced_spans(text, prefilter))
    spans.extend(next_line_spans(text))
    spans.extend(netrc_spans(text))
    # beside its key id, or beside the [REDACTED] a plugin made of it this round
    spans.extend(aws_pair_spans(text))
    spans.extend(unescaped_spans(table_spans, text, "|"))
    spans.extend(base64_spans(text, rescan))
    return replace_text_spans(text, spans)
