"""The Target's settings, typed once: :class:`TargetSpec`.

Which model on which backend, with which context window, kernels, threads and device,
or which remote server: every front end (``assistd complete``, ``serve``, ``lsp``,
``mcp``) builds one TargetSpec, and :func:`assistd.targets.open.open_target` opens it.

One precedence (:func:`resolve`): a flag (for one editor's session, its LSP setting in
the flag's place), then the ``ASSISTD_*`` environment (``ASSISTD_N_CTX``), then the
config file (``<user config dir>/assistd/config.toml`` or ``$ASSISTD_CONFIG``: the
daemon's file, flat keys named as the fields), then the field's default. One validation:
the fields' types and ranges, and the rule that backend openai and a server URL go
together. A bad value is an :class:`InputError` that names where it came from:
``--n-ctx``, ``$ASSISTD_N_CTX``, ``config file PATH: n_ctx``, or (LSP) the setting
``nCtx`` (:func:`problems` gives the pieces).

Constructing one reads nothing: ``TargetSpec(n_ctx=512)`` is that value over the
defaults; only :func:`resolve` reads the environment and the file.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import (Field, SecretStr, ValidationError, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError
from pydantic_settings import (BaseSettings, EnvSettingsSource, InitSettingsSource,
                               SettingsConfigDict)
from pydantic_settings.sources.utils import parse_env_vars

from assistd.ground.errors import InputError
from assistd.ground.numerics import DEFAULT_NUMERICS
from assistd.ground.options import DEFAULT_N_CTX
from assistd.ground.paths import user_path

APP = "assistd"
ENV_PREFIX = "ASSISTD_"
MAX_N_CTX = 1 << 20
BACKENDS = ("llama", "torch", "openai")
KEY_FIELD = "target_key"  # from $ASSISTD_TARGET_KEY only: never a file key, flag or setting


def config_dir() -> Path:
    return Path(platformdirs.user_config_dir(APP, appauthor=False))


def default_config_file(environ: Mapping[str, str] | None = None) -> Path:
    """``$ASSISTD_CONFIG``, else ``<user config dir>/assistd/config.toml`` (platformdirs)."""
    env = (os.environ if environ is None else environ).get("ASSISTD_CONFIG")
    return Path(env).expanduser() if env else config_dir() / "config.toml"


class TargetSpec(BaseSettings):
    """The Target to open (frozen; equal specs open equal Targets). Field names are the
    config file's keys; ``ASSISTD_`` + the name in capitals is the variable; ``--`` +
    the name with dashes is the flag. ``target_*``: backend openai's remote server."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True,
                                      extra="forbid", frozen=True)

    backend: Literal["llama", "torch", "openai"] = Field(
        "llama", description="llama (llama.cpp, GGUF), torch (transformers) or openai (a"
                             " remote OpenAI-compatible server at target_url).")
    model: str | None = Field(
        None, description="The Target's GGUF file (torch: also a Hugging Face model"
                          " directory); backend openai: the server model's tokenizer, its"
                          " GGUF or its Hugging Face folder (tokenizer.json). Unset: the"
                          " embedded default model.")
    n_ctx: int = Field(DEFAULT_N_CTX, ge=64, le=MAX_N_CTX,
                       description="Context window of each KV sequence, tokens.")
    threads: int | None = Field(None, ge=1, description="CPU threads for the Target."
                                                         " Unset: all usable cores.")
    n_gpu_layers: int = Field(-1, ge=-1, description="llama: layers offloaded to the GPU"
                                                     " (-1: all; ignored by CPU builds).")
    device: str = Field("auto", pattern=r"^(auto|cpu|mps|cuda(:\d{1,3})?)$",
                        description="torch: auto, cpu, cuda, cuda:N or mps.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="torch: weight dtype (auto: float32 on a CPU, 16-bit on a GPU).")
    numerics: Literal["fast", "exact", "llama"] = Field(
        DEFAULT_NUMERICS, description="llama: the kernels and what speculative output"
                                      " promises: fast, exact or llama"
                                      " (assistd.ground.numerics).")
    target_url: str | None = Field(
        None, description="openai: the server's base URL, e.g. http://127.0.0.1:8080 (a"
                          " trailing /v1 is dropped).")
    target_key: SecretStr | None = Field(
        None, description="openai: the server's API key, from $ASSISTD_TARGET_KEY only"
                          " (never a config key or setting; never logged or printed).")
    target_key_file: str | None = Field(
        None, description="openai: a 0600 file holding the key; read instead of"
                          " $ASSISTD_TARGET_KEY, and again when it changes.")
    target_model: str | None = Field(
        None, max_length=256, description="openai: the model name sent. Unset: the"
                                          " server's first in /v1/models.")
    target_ca_bundle: str | None = Field(
        None, description="openai: PEM CA certificates for https.")
    target_timeout_ms: int = Field(30_000, ge=1, le=3_600_000,
                                   description="openai: the longest wait for the server's"
                                               " next chunk, ms.")
    target_deadline_ms: int | None = Field(
        None, ge=1, description="openai: the longest one generation may take, ms. Unset:"
                                " target_timeout_ms + 1000 ms per token of max_tokens.")
    target_context: str = Field(
        "all", description="openai: what a prompt carries to the server besides the"
                           " document: all (also secret-filtered snippets of other open"
                           " files) or file (the document only).")
    target_fim: str = Field(
        "auto", description="openai: the FIM layout of editors' prompts: auto (the"
                            " tokenizer's markers), none, or a family (starcoder, qwen,"
                            " deepseek).")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings,
                                   dotenv_settings, file_secret_settings):
        return (init_settings,)  # pure construction; resolve() layers the sources

    @field_validator("model", "target_key_file", "target_ca_bundle")
    @classmethod
    def _a_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            if not value.strip():
                what = "a file or folder path" if info.field_name == "model" else "a file path"
                raise ValueError(f"{info.field_name} must be {what}, not empty")
            try:
                user_path(value)
            except InputError as e:  # ~nosuchuser, a NUL byte
                raise ValueError(str(e)) from None
        return value

    @field_validator("target_model")
    @classmethod
    def _a_name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("target_model must be a model name, not empty")
        return value

    @field_validator("target_url")
    @classmethod
    def _a_url(cls, value: str | None) -> str | None:
        from assistd.targets.remote import base_url

        try:
            return None if value is None else base_url(value)
        except InputError as e:
            raise ValueError(str(e)) from None

    @field_validator("target_context")
    @classmethod
    def _a_context(cls, value: str) -> str:
        from assistd.targets.remote import CONTEXT_SETTINGS

        if value not in CONTEXT_SETTINGS:
            raise ValueError(f"target_context must be {' or '.join(CONTEXT_SETTINGS)},"
                             f" not {value!r}")
        return value

    @field_validator("target_fim")
    @classmethod
    def _a_fim(cls, value: str) -> str:
        from assistd.targets.remote import FIM_SETTINGS

        if value not in FIM_SETTINGS:
            raise ValueError(f"target_fim must be one of {', '.join(FIM_SETTINGS)},"
                             f" not {value!r}")
        return value

    @model_validator(mode="after")
    def _url_with_openai(self) -> TargetSpec:
        """The one rule across fields: backend openai needs a URL (a local model would
        answer in the server's place), and a URL needs backend openai (it would go
        unused without a word)."""
        if self.backend == "openai" and not self.target_url:
            raise PydanticCustomError(
                "target_pair", "{text}", {"key": "backend", "text": (
                    "backend openai needs target_url (the server's base URL, e.g."
                    " http://127.0.0.1:8080)")})
        if self.backend != "openai" and self.target_url:
            raise PydanticCustomError(
                "target_pair", "{text}", {"key": "target_url", "text": (
                    f"target_url is set but backend is {self.backend!r}: set backend"
                    " openai to use the remote server, or drop target_url")})
        return self

    # -- what the backends read ---------------------------------------------------

    @property
    def model_path(self) -> Path | None:
        """``model`` with ``~`` expanded, or None (the embedded default)."""
        return user_path(self.model) if self.model else None

    @property
    def remote(self) -> bool:
        return self.backend == "openai"

    def key(self) -> str | None:
        """The server's API key: ``target_key_file``'s, else ``target_key``, else None
        (:func:`assistd.targets.remote.read_key`: InputError for a bad file)."""
        from assistd.targets.remote import KEY_ENV, read_key

        env = {KEY_ENV: self.target_key.get_secret_value()} if self.target_key else {}
        return read_key(self.target_key_file, environ=env)

    def settings(self) -> dict[str, Any]:
        """Every field but the key, as the config file writes them (for ``--print-config``
        and logs)."""
        return {name: getattr(self, name) for name in TargetSpec.model_fields if name != KEY_FIELD}

    def __str__(self) -> str:
        """A few words for logs (never the key): ``the model of the remote Target URL
        (...)``, ``the model PATH (backend llama, fast numerics, n_ctx 4096)``."""
        if self.remote:
            return (f"the model of the remote Target {self.target_url}"
                    f" ({self.target_model or 'the server first lists'}, n_ctx {self.n_ctx})")
        numerics = f", {self.numerics} numerics" if self.backend == "llama" else ""
        return (f"{f'the model {self.model}' if self.model else 'the embedded default model'}"
                f" (backend {self.backend}{numerics}, n_ctx {self.n_ctx})")


FIELDS = tuple(TargetSpec.model_fields)


# -- naming a value's source ---------------------------------------------------


def flag_name(key: str) -> str:
    """``n_ctx`` -> ``--n-ctx``."""
    return "--" + key.replace("_", "-")


def env_name(key: str) -> str:
    """``n_ctx`` -> ``ASSISTD_N_CTX``."""
    return ENV_PREFIX + key.upper()


def problems(error: ValidationError) -> list[tuple[str, str]]:
    """``[(field, message)]`` of a failed TargetSpec: the message names the field
    (``n_ctx must be at least 64, not 10``); a rule across fields is filed under the
    field it names first.

    >>> try:
    ...     TargetSpec(n_ctx="many", numerics="fastest")
    ... except ValidationError as e:
    ...     problems(e)
    [('n_ctx', "n_ctx must be an integer, not 'many'"), ('numerics', "numerics must be 'fast', 'exact' or 'llama', not 'fastest'")]
    """
    out = []
    for err in error.errors(include_url=False):
        ctx = err.get("ctx") or {}
        if err["type"] == "target_pair":
            out.append((ctx["key"], ctx["text"]))
            continue
        key = str(err["loc"][0]) if err["loc"] else ""
        value = err.get("input")
        kind = err["type"]
        if kind == "value_error":  # a validator's own text; the flags it names as keys
            text = re.sub(r"--([a-z][a-z-]*)", lambda m: m[1].replace("-", "_"),
                          str(ctx.get("error", err["msg"])))
            out.append((key, text if re.search(rf"\b{key}\b", text) else f"{key}: {text}"))
            continue
        what = {"int_parsing": "an integer", "int_type": "an integer",
                "int_from_float": "an integer", "string_type": "a string",
                "greater_than_equal": f"at least {ctx.get('ge')}",
                "less_than_equal": f"at most {ctx.get('le')}",
                "literal_error": str(ctx.get("expected")),
                "string_pattern_mismatch": "auto, cpu, cuda, cuda:N or mps",
                "string_too_long": f"at most {ctx.get('max_length')} characters",
                "extra_forbidden": "a known setting"}.get(kind, err["msg"])
        shown = value[:100] if isinstance(value, str) else value
        shown = "(the key)" if key == KEY_FIELD else shown
        out.append((key, f"{key} must be {what}, not {shown!r}"))
    return out


class _Environment(EnvSettingsSource):
    """pydantic-settings' ``ASSISTD_*`` source over a given mapping (tests pass one)."""

    def __init__(self, settings_cls, environ: Mapping[str, str]):
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self):
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty,
                              self.env_parse_none_str)


def read_config_file(path: Path) -> dict[str, Any]:
    """The TOML file's keys. Raises :class:`InputError` for a file that is missing,
    unreadable or not TOML."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read config file {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"config file {path} is not valid TOML: {e}") from None


def layers(flags: Mapping[str, Any] | None = None, *, config_file: Path | None = None,
           file_values: Mapping[str, Any] | None = None,
           environ: Mapping[str, str] | None = None,
           flag_source: Callable[[str], str] = flag_name) -> tuple[dict, dict[str, str]]:
    """The Target's values from each source, merged: ``(values, origins)``; ``origins``
    maps each field given to where: ``flag_source(field)`` (``--n-ctx``), ``$VARIABLE``
    or the config file's path. ``flags`` with None values are not given; the file is
    ``config_file``, else ``$ASSISTD_CONFIG`` (it must exist), else the default file
    when it exists; ``file_values``: its keys already read (the daemon's). Keys of the
    file that are not Target fields are left to their reader. A local backend given above
    the source of ``target_url`` drops it (``complete --backend llama`` beside a config
    file's server). Raises :class:`InputError`."""
    environ = os.environ if environ is None else environ
    if file_values is None:
        explicit = config_file is not None or "ASSISTD_CONFIG" in environ
        config_file = config_file or default_config_file(environ)
        file_values = read_config_file(config_file) if explicit or config_file.exists() else {}
    if KEY_FIELD in file_values:
        raise InputError(f"config file {config_file}: {KEY_FIELD} is never read from a file;"
                         " put the key in a 0600 file named by target_key_file, or in"
                         f" ${env_name(KEY_FIELD)}")
    given = {k: v for k, v in (flags or {}).items() if v is not None and v not in ((), [])}
    if KEY_FIELD in given:
        raise InputError(f"the API key is not a flag or setting; use target_key_file or"
                         f" ${env_name(KEY_FIELD)}")
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    rank: dict[str, int] = {}
    for level, (source, where) in enumerate((
            ({k: v for k, v in file_values.items() if k in FIELDS}, lambda k: str(config_file)),
            (_Environment(TargetSpec, environ)(), lambda k: "$" + env_name(k)),
            (InitSettingsSource(TargetSpec, given)(), flag_source))):
        for key, value in source.items():
            values[key], origins[key], rank[key] = value, where(key), level
    if (values.get("backend", "openai") != "openai"
            and rank.get("backend", -1) > rank.get("target_url", 3)):
        # a local backend named above the file's (or environment's) server: that server
        # is left unused on purpose, not by mistake
        del values["target_url"], origins["target_url"]
    return values, origins


def build(values: Mapping[str, Any], origins: Mapping[str, str] | None = None) -> TargetSpec:
    """``TargetSpec(**values)``, or an :class:`InputError` whose every line names where
    the bad value came from (``origins``, see :func:`layers`): a flag in the message's
    place (``--n-ctx must be at least 64, not 10``), else before it (``$ASSISTD_N_CTX:
    n_ctx must be ...``, ``config file F: n_ctx must be ...``).

    >>> build({"n_ctx": 10}, {"n_ctx": "--n-ctx"})
    Traceback (most recent call last):
    assistd.ground.errors.InputError: --n-ctx must be at least 64, not 10
    """
    try:
        return TargetSpec(**values)
    except ValidationError as e:
        raise InputError("; ".join(named(text, key, (origins or {}).get(key))
                                   for key, text in problems(e))) from None


def named(message: str, key: str, where: str | None) -> str:
    """``message`` about ``key`` naming where the value came from: a flag (``--...``)
    takes the key's place, anything else goes before it."""
    if where is None:
        return message
    if where.startswith("--"):  # the other fields it names as flags too
        flagged = re.sub(rf"(?<![\w-]){key}\b", where, message, count=1)
        if flagged == message:
            return f"{where}: {message}"
        others = "|".join(f for f in FIELDS if f != key)
        return re.sub(rf"(?<![\w$-])({others})\b", lambda m: flag_name(m[1]), flagged)
    return f"{where if where.startswith('$') else f'config file {where}'}: {message}"


def resolve(flags: Mapping[str, Any] | None = None, **sources) -> tuple[TargetSpec, dict[str, str]]:
    """Flag, then ``ASSISTD_*``, then the config file, then the default:
    ``(spec, origins)`` (``sources``: those of :func:`layers`). Raises
    :class:`InputError` naming the source of a bad value."""
    values, origins = layers(flags, **sources)
    return build(values, origins), origins


def load(flags: Mapping[str, Any] | None = None, **sources) -> TargetSpec:
    """:func:`resolve`'s spec."""
    return resolve(flags, **sources)[0]


def from_options(model: Path | str | None = None, *, n_ctx: int = DEFAULT_N_CTX,
                 n_threads: int | None = None, target_timeout_s: float | None = None,
                 target_deadline_s: float | None = None, target_key_file=None,
                 target_ca_bundle=None, **options) -> TargetSpec:
    """A spec from :func:`assistd.targets.open.open_target`'s old keywords (seconds,
    ``n_threads``), for callers not yet moved; the key from ``$ASSISTD_TARGET_KEY`` as
    the old path read it. Raises :class:`InputError`."""
    values = {**options, "model": str(model) if model is not None else None, "n_ctx": n_ctx,
              "threads": n_threads,
              "target_key_file": str(target_key_file) if target_key_file else None,
              "target_ca_bundle": str(target_ca_bundle) if target_ca_bundle else None,
              "target_key": os.environ.get(env_name(KEY_FIELD)) or None}
    if target_timeout_s is not None:
        values["target_timeout_ms"] = max(1, round(target_timeout_s * 1000))
    if target_deadline_s is not None:
        values["target_deadline_ms"] = max(1, round(target_deadline_s * 1000))
    return build({k: v for k, v in values.items() if v is not None})
