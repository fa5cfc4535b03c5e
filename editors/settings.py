"""Typed settings of the LSP server, read from ``initializationOptions`` and
``workspace/didChangeConfiguration``, over the Target that the ``ASSISTD_*`` environment
and the config file give (:func:`environment_settings`: the Target ``assistd serve``
would open, :func:`assistd.targets.spec.resolve`).

Both carry ``{"assistd": {...}}`` (a flat object is accepted too). The Target's
settings are :class:`~assistd.targets.spec.TargetSpec`'s fields in camelCase (``nCtx``,
``targetUrl``; the key is never a setting): an editor's value takes a flag's place for
its session. A value of the wrong type or out of range keeps the value it had (the
environment's, the config file's or the default) and yields a warning the server shows
with ``window/showMessage``: a typo in an editor's settings never stops completions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from pydantic import ValidationError

from assistd.ground.errors import InputError
from assistd.ground.options import K_LIMIT, parse_k
from assistd.ground.paths import user_path
from assistd.targets.spec import FIELDS, KEY_FIELD, TargetSpec, layers, named, problems


@dataclass(frozen=True)
class Settings:
    """Server settings (LSP camelCase keys in brackets).

    target:            the Target's settings (:class:`~assistd.targets.spec.TargetSpec`;
                       each field a setting: ``model``, ``backend``, ``nCtx``, ``numerics``,
                       ``threads``, ``device``, ``targetUrl``, ``targetContext``, ...).
                       Through the daemon its Target applies (its configuration), but for
                       ``targetContext``: the stricter of this and the daemon's applies.
    proposer:          "suffix", "ngram" or "none" (plain decoding) (``proposer``).
    k:                 draft ceiling in tokens, or "auto" (the tuner, per language) (``k``).
    max_tokens:        tokens generated per suggestion at most (``maxTokens``).
    max_prompt_tokens: prompt window before the cursor, tokens (``maxPromptTokens``).
    max_suffix_chars:  text after the cursor given to a FIM model, characters (``maxSuffixChars``).
    fim:               "auto" (FIM when the model declares FIM tokens) or "off" (``fim``).
    cross_file_tokens: prompt tokens for snippets of the scope's other open buffers, placed
                       before the document's window and taken from its budget (at most half
                       of it); 0 = off, the default: on real edits the embedded model accepted
                       no more with them (``crossFileTokens``, e.g. 256; :mod:`editors.crossfile`,
                       benchmarks/crossfile_edits.py).
    max_latency_ms:    generation time budget per suggestion, ms; when it runs out the
                       suggestion is what was generated, cut at a word boundary; 0 = none
                       (``maxLatencyMs``; like llama.vim's ``t_max_predict_ms``).
    db:                history SQLite file; None = the default (``db``).
    enabled:           serve suggestions at all (``enabled``).
    telemetry:         store shown/accepted/dismissed events locally (``telemetry``).
    """

    target: TargetSpec = field(default_factory=TargetSpec)
    proposer: str = "suffix"
    k: int | str = "auto"
    max_tokens: int = 64
    max_prompt_tokens: int = 1024
    max_suffix_chars: int = 2000
    fim: str = "auto"
    cross_file_tokens: int = 0
    max_latency_ms: int = 250
    db: str | None = None
    enabled: bool = True
    telemetry: bool = True

    def engine_key(self) -> tuple:
        """The settings whose change needs a new Target or store."""
        return (self.target, self.db)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


_OWN = [f.name for f in fields(Settings) if f.name != "target"]
_TARGET = [f for f in FIELDS if f != KEY_FIELD]
_KEYS = {_camel(n): n for n in _OWN + _TARGET} | {n: n for n in _OWN + _TARGET}


def _check(name: str, value: Any) -> Any:
    """The validated value, or raise ValueError with what is expected."""
    def integer(lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"an integer from {lo} to {hi}")
        return value

    if name == "db":
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ValueError("a file path or null")
        try:
            return str(user_path(value))
        except InputError as e:  # ~nosuchuser: this setting is refused, with the reason
            raise ValueError(str(e)) from None
    if name == "proposer":
        from assistd.runtime.runtime import served_proposers  # the one vocabulary

        if value not in served_proposers():
            raise ValueError(", ".join(map(repr, served_proposers())))
        return value
    if name == "k":
        try:
            return parse_k(value)
        except InputError:
            raise ValueError(f"'auto' or a number of tokens 0..{K_LIMIT}") from None
    if name == "max_tokens":
        return integer(1, 1024)
    if name == "max_prompt_tokens":
        return integer(16, 1 << 20)
    if name == "max_latency_ms":
        return integer(0, 60_000)
    if name == "cross_file_tokens":
        return integer(0, 1 << 20)
    if name == "max_suffix_chars":
        return integer(0, 1 << 20)
    if name == "fim":
        if value not in ("auto", "off"):
            raise ValueError("'auto' or 'off'")
        return value
    if name in ("enabled", "telemetry"):
        if not isinstance(value, bool):
            raise ValueError("true or false")
        return value
    raise AssertionError(name)


def parse_settings(raw: Any, base: Settings | None = None) -> tuple[Settings, list[str]]:
    """``raw`` (the client's JSON) over ``base`` -> ``(settings, warnings)``.

    Unknown keys and bad values produce one warning each and keep the base value. The
    Target's settings go over ``base.target`` as flags go over the environment and the
    config file, checked by :class:`~assistd.targets.spec.TargetSpec`. Never raises.

    >>> s, w = parse_settings({"assistd": {"k": 4, "maxTokens": "many", "colour": 1}})
    >>> s.k, s.max_tokens, len(w)
    (4, 64, 2)
    >>> s, w = parse_settings({"nCtx": 10})
    >>> s.target.n_ctx, w
    (4096, ["assistd setting 'nCtx'=10 is invalid: nCtx must be at least 64, not 10; using 4096"])
    """
    base = base or Settings()
    if raw is None:
        return base, []
    if isinstance(raw, dict) and isinstance(raw.get("assistd"), dict):
        raw = raw["assistd"]
    elif isinstance(raw, dict) and "assistd" in raw and raw["assistd"] is None:
        return base, []
    if not isinstance(raw, dict):
        return base, [f"assistd settings must be an object, not {type(raw).__name__}; using defaults"]
    changes, target, wire, warnings = {}, {}, {}, []
    for key, value in raw.items():
        if key == "token":  # `lsp --tcp`'s credential, checked before the server: not a setting
            continue
        name = _KEYS.get(key)
        if name is None:
            warnings.append(f"unknown assistd setting {key!r} ignored")
            continue
        if name in _TARGET:
            target[name], wire[name] = value, key
            continue
        try:
            changes[name] = _check(name, value)
        except ValueError as e:
            default = getattr(Settings(), name)
            changes[name] = default
            warnings.append(f"assistd setting {key!r}={value!r} is invalid (expected {e});"
                            f" using {default!r}")
    spec, dropped = over(base.target, target)
    for name, text in dropped:
        if name not in target:  # (over()'s own: a server left unused)
            continue
        key = wire[name]
        text = text.replace(name, key, 1)
        if name == "backend" and "target_url" in text:  # the editor's word for it
            warnings.append(f"assistd setting backend {target[name]!r} needs targetUrl (the"
                            " server's base URL, e.g. http://127.0.0.1:8080); using backend"
                            f" {base.target.backend!r}")
        else:
            warnings.append(f"assistd setting {key!r}={target.get(name)!r} is invalid: {text};"
                            f" using {getattr(base.target, name)!r}")
    if spec.n_ctx <= changes.get("max_tokens", base.max_tokens) + 1:
        warnings.append("assistd setting maxTokens does not fit nCtx; using the values before")
        spec, changes["max_tokens"] = base.target, base.max_tokens
    return replace(base, target=spec, **changes), warnings


def over(base: TargetSpec, values: dict[str, Any]) -> tuple[TargetSpec, list[tuple[str, str]]]:
    """``values`` over ``base``, each bad one dropped (``base``'s kept):
    ``(spec, [(field, message)])``; a value that breaks a rule across fields with one of
    ``base`` is dropped too. Never raises."""
    values, dropped = dict(values), []
    if values.get("backend") in ("llama", "torch") and "target_url" not in values:
        values["target_url"] = None  # a local backend over base's server: left unused on purpose
    while values:
        try:
            return TargetSpec(**{**{n: getattr(base, n) for n in FIELDS}, **values}), dropped
        except ValidationError as e:
            found = problems(e)
        bad = {k: t for k, t in found if k in values} or {  # else a rule across fields:
            k: found[0][1] for k in ("backend", "target_url") if k in values}  # drop ours
        for key in bad or list(values):
            dropped.append((key, bad.get(key, found[0][1])))
            del values[key]
    return base, dropped


# The environment variables of the Target's settings: the names `assistd serve` reads.
ENVIRONMENT = {f"ASSISTD_{name.upper()}": name for name in FIELDS}


def environment_settings(environ=None, config_file=None) -> tuple[Settings, list[str]]:
    """The defaults with the Target of the ``ASSISTD_*`` environment and the config file
    over them (what ``assistd serve`` would open) -> ``(settings, warnings)``: what an
    in-process ``assistd lsp`` starts from. An empty variable is unset; a bad value warns,
    naming its variable or file, and keeps the default. Never raises.

    >>> s, w = environment_settings({"ASSISTD_BACKEND": "openai",
    ...                              "ASSISTD_TARGET_URL": "http://127.0.0.1:8080/v1"})
    >>> s.target.backend, s.target.target_url, w
    ('openai', 'http://127.0.0.1:8080', [])
    """
    try:
        values, origins = layers(environ=environ, config_file=config_file)
    except InputError as e:  # an unreadable or malformed file
        return Settings(), [f"{e}; using the default Target"]
    spec, dropped = over(TargetSpec(), values)
    warnings = [f"{named(text, name, origins.get(name))}; using {getattr(spec, name)!r}"
                for name, text in dropped]
    return Settings(target=spec), warnings
