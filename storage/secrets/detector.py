"""The detect-secrets plugins: loaded once, run on one line at a time.

:class:`Detector` holds the default plugin set (all but the private-key plugin, whose whole
blocks :mod:`.private_keys` handles) and applies the default heuristic filters, with two
changes: ``is_likely_id_string`` sees the value's own ``,;{&``-delimited segment, not the whole
line, and ``is_indirect_reference`` applies only to unquoted keyword values. The keyword
plugin reports one match per regex and line, so found values are masked and the line
rescanned until nothing new turns up.
"""

from __future__ import annotations

import os
import re
import threading

from .escapes import ESCAPE_SPLIT, views
from .plugin_values import (
    eager_values,
    hint_ends,
    may_have_keyword,
    own_values,
    pieces,
    regex_value,
    segment,
    trim,
    windows,
    yaml_like,
)
from .spans import RANK_ENTROPY, RANK_KEYWORD, RANK_SPECIFIC, REDACTED

MAX_KEYWORD_PASSES = 16  # mask-and-rescan rounds for the keyword detector on one line

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

_QUOTES = "\"'`"
# Env-style assignment anywhere: upper-case NAME immediately followed by "=" (.env, export,
# docker -e, Makefiles). YAML-style "key: value": see yaml_like.
_ENV_LINE = re.compile(r"(?:^|[\s;])(?:export\s+)?[A-Z_][A-Z0-9_]*=[^=\s]")

MODE_DEFAULT = "default"


def keyword_mode(filename: str):
    """The keyword regex set(s) for a file name: detect-secrets' mapping, or the default mode."""
    if not filename:
        return MODE_DEFAULT
    from detect_secrets.plugins import keyword as kw
    from detect_secrets.util.filetype import determine_file_type

    base = os.path.basename(filename)
    if base.startswith(".env") or base.endswith(".env"):
        return (kw.CONFIG_DENYLIST_REGEX_TO_GROUP,)
    regexes = kw.REGEX_BY_FILETYPE.get(determine_file_type(filename))
    return (regexes,) if regexes is not None else MODE_DEFAULT


class Detector:
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
                continue  # whole blocks: private_key_spans
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
                self.regex.append((p, RANK_SPECIFIC, own, gate))
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
            or h.is_likely_id_string(value, segment(line, value), plugin)
        )

    def scan_line(self, line: str, mode) -> dict[str, tuple[int, str]]:
        """Secret values on one raw line -> (rank, secret_type)."""
        found: dict[str, tuple[int, str]] = {}
        for view in views(line):
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
                values = own_values(plugin, view)
            else:
                values = (regex_value(m) for rx in plugin.denylist for m in rx.finditer(view))
            for v in values:
                v = trim(v)
                if v and self._keep(v, plugin, view):
                    self._add(found, v, rank, kind)
        hints = hint_ends(view, low, folded)
        for plugin, unquoted, min_len in self.entropy:
            kind = plugin.secret_type
            # Quoted values (detect-secrets' own search), cut at escape sequences: in a raw
            # JSON line "a\\nb" is two lines glued together.
            values = [p.rstrip("\\") for v in plugin.analyze_string(view)
                      for p in ESCAPE_SPLIT.split(v)]
            if hints:
                values.extend(eager_values(view, unquoted, hints))
            for v in values:
                if (
                    len(v) >= min_len
                    and plugin.calculate_shannon_entropy(v) > plugin.entropy_limit
                    and self._keep(v, plugin, view)
                ):
                    self._add(found, v, RANK_ENTROPY, kind)
        for window in windows(view):
            if may_have_keyword(window):
                self._scan_keyword(window, mode, found)

    def _scan_keyword(self, view: str, mode, found) -> None:
        kwd = self.keyword
        if kwd is None:
            return
        if mode == MODE_DEFAULT:
            sets = [self.quotes_required]
            if _ENV_LINE.search(view) or yaml_like(view):
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
                    fresh.extend(v for v in pieces(raw) if v not in seen)
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
                    quoted or not self.h.is_indirect_reference(segment(work, v))
                ):
                    self._add(found, v, RANK_KEYWORD, kind)
            for v in sorted(fresh, key=len, reverse=True):
                work = work.replace(v, REDACTED)


_DETECTOR: Detector | None = None
_DETECTOR_LOCK = threading.Lock()


def detector() -> Detector:
    """The process's one :class:`Detector` (the plugins load on the first call)."""
    global _DETECTOR
    if _DETECTOR is None:
        with _DETECTOR_LOCK:
            if _DETECTOR is None:
                _DETECTOR = Detector()
    return _DETECTOR
