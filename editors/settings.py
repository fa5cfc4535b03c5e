"""Typed settings of the LSP server, read from ``initializationOptions`` and
``workspace/didChangeConfiguration``, over the defaults the ``ASSISTD_*`` environment
gives the Target (:func:`environment_settings`: ``ASSISTD_BACKEND``, ``ASSISTD_NUMERICS``,
``ASSISTD_TARGET_URL`` and the other remote Target keys, named as in ``assistd serve``'s
configuration).

Both carry ``{"assistd": {...}}`` (a flat object is accepted too). A value of the wrong
type or out of range falls back to its default and yields a warning the server shows
with ``window/showMessage``: a typo in an editor's settings never stops completions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

from assistd.ground.errors import InputError
from assistd.ground.numerics import DEFAULT_NUMERICS, NUMERICS
from assistd.ground.options import K_LIMIT, parse_k
from assistd.ground.paths import user_path
from assistd.targets.open import BACKENDS
from assistd.targets.remote import base_url


@dataclass(frozen=True)
class Settings:
    """Server settings (LSP camelCase keys in brackets).

    model:             GGUF path of the Target; None = the embedded default (``model``).
    backend:           "llama", "torch" or "openai": a remote OpenAI-compatible server, which
                       then needs ``target_url`` (``backend``).
    target_url:        backend openai: the server's base URL, e.g. http://127.0.0.1:8080
                       (``targetUrl``); ``model`` may then name a GGUF with the server
                       model's tokenizer.
    target_model:      backend openai: the model name sent; None = the server's first
                       (``targetModel``).
    target_key_file:   backend openai: a 0600 file holding the server's API key; None = the
                       key in ``$ASSISTD_TARGET_KEY``, if any (``targetKeyFile``). The key
                       itself is never a setting, so never logged with them.
    target_ca_bundle:  backend openai: PEM CA certificates for https (``targetCaBundle``).
    target_timeout_ms: backend openai: the longest wait for the server's next chunk, ms
                       (``targetTimeoutMs``).
    target_context:    with a remote Target (this one or the daemon's): "all" (prompts also
                       carry secret-filtered cross-file snippets) or "file" (only the
                       document's own text leaves the machine) (``targetContext``); the
                       stricter of this and the Target's ``target_context`` applies.
    n_ctx:             context window, tokens (``nCtx``).
    numerics:          backend llama: "fast", "exact" or "llama", the kernels of this
                       server's own Target and what its speculative output promises
                       (:mod:`assistd.ground.numerics`; ``numerics``). Through the daemon
                       its Target's numerics apply (``numerics`` in its configuration).
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

    model: str | None = None
    backend: str = "llama"
    target_url: str | None = None
    target_model: str | None = None
    target_key_file: str | None = None
    target_ca_bundle: str | None = None
    target_timeout_ms: int = 30_000
    target_context: str = "all"
    n_ctx: int = 2048
    numerics: str = DEFAULT_NUMERICS
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
        return (self.model, self.backend, self.n_ctx, self.db, self.target_url,
                self.target_model, self.target_key_file, self.target_ca_bundle,
                self.target_timeout_ms, self.numerics)

    def target_options(self) -> dict:
        """The keyword arguments of :func:`assistd.targets.open.open_target` but ``model``
        and ``n_ctx`` (the remote ones only for backend openai, numerics for llama)."""
        if self.backend == "llama":
            return {"backend": "llama", "numerics": self.numerics}
        if self.backend != "openai":
            return {"backend": self.backend}
        return {"backend": "openai", "target_url": self.target_url,
                "target_model": self.target_model, "target_key_file": self.target_key_file,
                "target_ca_bundle": self.target_ca_bundle,
                "target_timeout_s": self.target_timeout_ms / 1000}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


_KEYS = {_camel(f.name): f.name for f in fields(Settings)} | {f.name: f.name for f in fields(Settings)}
_KEYS["nCtx"] = "n_ctx"


def _check(name: str, value: Any) -> Any:
    """The validated value, or raise ValueError with what is expected."""
    def integer(lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"an integer from {lo} to {hi}")
        return value

    if name in ("model", "db", "target_key_file", "target_ca_bundle"):
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ValueError("a file path or null")
        try:
            return str(user_path(value))
        except InputError as e:  # ~nosuchuser: this setting is refused, with the reason
            raise ValueError(str(e)) from None
    if name == "backend":
        if value not in BACKENDS:
            raise ValueError(" or ".join(map(repr, BACKENDS)))
        return value
    if name == "target_url":
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError("an http(s)://HOST[:PORT] URL or null")
        try:
            return base_url(value)
        except InputError as e:
            raise ValueError(str(e).replace("--target-url", "the server's URL")) from None
    if name == "target_model":
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip() or len(value) > 256:
            raise ValueError("a model name or null")
        return value
    if name == "target_timeout_ms":
        return integer(1, 3_600_000)
    if name == "target_context":
        if value not in ("all", "file"):
            raise ValueError("'all' or 'file'")
        return value
    if name == "numerics":
        if value not in NUMERICS:  # (the warning names the setting and the value)
            raise ValueError(f"{', '.join(map(repr, NUMERICS[:-1]))} or {NUMERICS[-1]!r}")
        return value
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
    if name == "n_ctx":
        return integer(128, 1 << 20)
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

    Unknown keys and bad values produce one warning each and keep the base value
    (the default for a bad value on a first read). Never raises.

    >>> s, w = parse_settings({"assistd": {"k": 4, "maxTokens": "many", "colour": 1}})
    >>> s.k, s.max_tokens, len(w)
    (4, 64, 2)
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
    changes, warnings = {}, []
    for key, value in raw.items():
        if key == "token":  # `lsp --tcp`'s credential, checked before the server: not a setting
            continue
        name = _KEYS.get(key)
        if name is None:
            warnings.append(f"unknown assistd setting {key!r} ignored")
            continue
        try:
            changes[name] = _check(name, value)
        except ValueError as e:
            default = getattr(Settings(), name)
            changes[name] = default
            warnings.append(f"assistd setting {key!r}={value!r} is invalid (expected {e});"
                            f" using {default!r}")
    if changes.get("n_ctx", base.n_ctx) <= changes.get("max_tokens", base.max_tokens) + 1:
        warnings.append("assistd setting maxTokens does not fit nCtx; using the defaults for both")
        changes["n_ctx"], changes["max_tokens"] = Settings.n_ctx, Settings.max_tokens
    if changes.get("backend", base.backend) == "openai" and not changes.get("target_url", base.target_url):
        # a local model in its place would answer without a word of the server
        warnings.append("assistd setting backend 'openai' needs targetUrl (the server's base"
                        f" URL, e.g. http://127.0.0.1:8080); using backend {Settings.backend!r}")
        changes["backend"] = Settings.backend
    return replace(base, **changes), warnings


# The environment variables of the Target's settings: the names `assistd serve` reads.
ENVIRONMENT = {f"ASSISTD_{name.upper()}": name for name in (
    "backend", "numerics", "target_url", "target_model", "target_key_file",
    "target_ca_bundle", "target_timeout_ms", "target_context")}


def environment_settings(environ=None) -> tuple[Settings, list[str]]:
    """The defaults with the Target's ``ASSISTD_*`` variables (:data:`ENVIRONMENT`) over
    them -> ``(settings, warnings)``: what an in-process ``assistd lsp`` starts from, so
    that ``ASSISTD_BACKEND=openai ASSISTD_TARGET_URL=...`` serves it as it serves the
    daemon. An empty variable is unset; a bad one warns and keeps the default. Never raises.

    >>> s, w = environment_settings({"ASSISTD_BACKEND": "openai",
    ...                              "ASSISTD_TARGET_URL": "http://127.0.0.1:8080/v1"})
    >>> s.backend, s.target_url, w
    ('openai', 'http://127.0.0.1:8080', [])
    """
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    for var, name in ENVIRONMENT.items():
        value = environ.get(var, "").strip()
        if value:
            raw[name] = int(value) if name == "target_timeout_ms" and value.isdigit() else value
    settings, warnings = parse_settings(raw)
    for var, name in ENVIRONMENT.items():  # name the variable, not a client setting
        warnings = [w.replace(f"setting {name!r}", f"${var}") for w in warnings]
    warnings = [w.replace("needs targetUrl", "needs $ASSISTD_TARGET_URL") for w in warnings]
    return settings, warnings
