"""The daemon's configuration: defaults < TOML file < ``ASSISTD_*`` environment < flags.

The file is ``<user config dir>/assistd/config.toml`` (platformdirs; ``$ASSISTD_CONFIG``
or ``--config`` name another). Every key is a field of :class:`Config` or of the
Target's :class:`~assistd.targets.spec.TargetSpec` (``n_ctx``, ``backend``, ...: read by
:func:`assistd.targets.spec.resolve`, the one precedence every front end shares); the
environment variable of ``max_history_mb`` is ``ASSISTD_MAX_HISTORY_MB``. Lists
(``repos``, ``transcripts``) are separated by ``os.pathsep`` in the environment.
``assistd serve --print-config`` prints the effective result as TOML.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import platformdirs

from assistd.ground.errors import InputError
from assistd.ground.options import parse_k
from assistd.targets.spec import (APP, FIELDS, KEY_FIELD, TargetSpec, config_dir,  # noqa: F401
                                  read_config_file, resolve)
from assistd.targets.spec import default_config_file as _default_config_file


def runtime_dir() -> Path:
    """Where the socket lives: ``$XDG_RUNTIME_DIR/assistd`` when there is one, else
    the user cache dir (platformdirs)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and Path(base).is_dir():
        return Path(base) / APP
    return Path(platformdirs.user_cache_dir(APP, appauthor=False)) / "run"


def default_config_file() -> Path:
    return _default_config_file()


@dataclass
class Config:
    """Effective daemon settings (units in the field names: _ms, _mb, _bytes).

    ``target``: the Target's settings (its keys are the file's too, and read through:
    ``config.n_ctx`` is ``config.target.n_ctx``)."""

    target: TargetSpec = field(default_factory=TargetSpec)
    sequences: str = "auto"  # KV sequences kept warm: "auto" or a number (1 = one for all)
    model_name: str | None = None  # the id in /v1/models; None = the model file's stem
    # speculation
    proposer: str = "suffix"
    k: str = "auto"  # "auto" (the tuner) or a number of tokens 0..64
    # history
    db: str | None = None
    repos: list[str] = field(default_factory=list)
    transcripts: list[str] = field(default_factory=list)
    agent_transcripts: bool = True  # also ~/.claude/projects, ~/.codex/sessions, ~/.gemini/tmp
    max_bytes: int = 1_000_000
    max_history_mb: int = 2048
    # API
    socket: str | None = None  # None = <runtime dir>/assistd.sock
    tcp: str | None = None  # "127.0.0.1:8765" to also listen on loopback TCP
    allow_remote: bool = False
    token_file: str | None = None  # None = <config dir>/token
    max_request_bytes: int = 8_000_000
    max_tokens_limit: int = 4096  # the most tokens one API request may ask for
    # a connection must send a whole request within this of connecting or of its last
    # response, else it is closed (slow or idle clients must not hold descriptors)
    header_timeout_ms: int = 10_000
    max_connections: int = 1024  # per transport (Unix socket, TCP); see daemon.py
    # the editor socket (lsp_host.py): a connection must send LSP initialize within
    # this, else it is closed (after it, none: editors stay connected idle for hours)
    editor_initialize_timeout_ms: int = 30_000
    max_editor_sessions: int = 64  # editor connections at once, initialized or not
    # logs
    log_file: str | None = None  # None = <user log dir>/assistd.log
    log_level: str = "info"
    log_repeat_window_ms: int = 60_000  # a message repeated within this is counted, not logged

    def __getattr__(self, name: str):
        if name in FIELDS and name != KEY_FIELD:  # (not for dataclass machinery's names)
            return getattr(self.__dict__["target"], name)
        raise AttributeError(name)

    def socket_path(self) -> Path:
        return Path(self.socket).expanduser() if self.socket else runtime_dir() / "assistd.sock"

    def token_path(self) -> Path:
        return Path(self.token_file).expanduser() if self.token_file else config_dir() / "token"

    def log_path(self) -> Path:
        if self.log_file:
            return Path(self.log_file).expanduser()
        return Path(platformdirs.user_log_dir(APP, appauthor=False)) / "assistd.log"

    def tcp_address(self) -> tuple[str, int] | None:
        if not self.tcp:
            return None
        host, sep, port = self.tcp.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InputError(f"tcp = {self.tcp!r} is not HOST:PORT (e.g. 127.0.0.1:8765)")
        return host, int(port)

    def as_dict(self) -> dict:
        """Every setting, flat as the file writes it (the Target's first; never its key)."""
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "target"}
        return {**self.target.settings(), **rest}

    def to_toml(self) -> str:
        """TOML text of every setting (unset ones as comments), each set one followed
        by where it came from when not the default."""
        origins = getattr(self, "origins", {})
        lines = []
        for name, v in self.as_dict().items():
            if v is None:
                lines.append(f"# {name} = (unset)")
            else:  # JSON strings, numbers, booleans and arrays are valid TOML values
                where = f"  # {origins[name]}" if name in origins else ""
                lines.append(f"{name} = {json.dumps(v)}{where}")
        return "\n".join(lines) + "\n"


_BOOL = {"1": True, "true": True, "yes": True, "on": True,
         "0": False, "false": False, "no": False, "off": False}


def _coerce(name: str, value, where: str):
    """A raw value (TOML, env text or flag) -> the field's type, or InputError."""
    f = {x.name: x for x in fields(Config)}[name]
    kind = str(f.type)
    text = isinstance(value, str) and where.startswith("$")
    try:
        if name in ("k", "sequences") and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # k = 8 in TOML means the same as k = "8"
        if "list" in kind:
            if text:
                return [p for p in value.split(os.pathsep) if p]
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                raise ValueError("a list of strings")
            return value
        if kind.startswith("bool"):
            if isinstance(value, bool):
                return value
            if text and value.lower() in _BOOL:
                return _BOOL[value.lower()]
            raise ValueError("true or false")
        if kind.startswith("int"):
            if isinstance(value, bool):
                raise ValueError("an integer")
            if isinstance(value, int) or (text and value.strip().lstrip("-").isdigit()):
                return int(value)
            raise ValueError("an integer")
        if text and value == "" and "None" in kind:
            return None
        if not isinstance(value, str):
            raise ValueError("a string")
        return value
    except ValueError as e:
        raise InputError(f"{where}: {name} must be {e}, not {value!r}") from None


def _named(message: str, key: str, origins: dict[str, str]) -> str:
    """``message`` (an error about setting ``key``) naming where the value came from: the
    flag itself when a flag gave it (``--target-fim must be ...``), else the config file
    or variable before the key (``config file F: target_fim must be ...``)."""
    where = origins.get(key)
    flag = "--" + key.replace("_", "-")
    if where is None:
        return message
    if where.startswith("--"):
        message = message.replace(f"{key} = ", f"{key} ")  # "tcp = 'x' is not ..."
        if re.search(rf"(?<![\w-]){key}\b", message):
            return re.sub(rf"(?<![\w-]){key}\b", where, message, count=1)
        return message if flag in message else f"{where}: {message}"
    message = message.replace(flag, key)  # (helpers name the flag: it did not come from one)
    return f"{'' if where.startswith('$') else 'config file '}{where}: {message}"


def _validate(c: Config, origins: dict[str, str] | None = None) -> Config:
    """``c`` checked (the Target's settings were, by :func:`resolve`); each error names
    the setting as the user gave it (``origins``: setting -> the file, ``$VARIABLE`` or
    ``--flag`` it came from). Raises InputError."""
    origins = origins or {}

    @contextlib.contextmanager
    def about(key: str):
        try:
            yield
        except InputError as e:
            raise InputError(_named(str(e), key, origins)) from None

    with about("k"):
        parse_k(c.k)
    with about("sequences"):
        if c.sequences != "auto" and not (c.sequences.isdigit() and 1 <= int(c.sequences) <= 64):
            raise InputError(f"sequences must be 'auto' or a number 1..64, not {c.sequences!r}")
    from assistd.runtime.runtime import check_proposer

    with about("proposer"):
        check_proposer(c.proposer)
    for name in ("max_bytes", "max_history_mb", "max_request_bytes", "max_tokens_limit",
                 "header_timeout_ms", "max_connections", "editor_initialize_timeout_ms",
                 "max_editor_sessions", "log_repeat_window_ms"):
        with about(name):
            if getattr(c, name) < 1:
                raise InputError(f"{name} must be at least 1, not {getattr(c, name)}")
    with about("log_level"):
        if c.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise InputError(f"log_level must be debug, info, warning or error, not"
                             f" {c.log_level!r}")
    with about("tcp"):
        c.tcp_address()
    return c


def load_config(path: Path | None = None, overrides: dict | None = None,
                environ: dict | None = None) -> tuple[Config, list[str]]:
    """Defaults < ``path`` (TOML; a missing default file is fine) < ``ASSISTD_*`` <
    ``overrides`` (flags; None values are ignored); the Target's keys by
    :func:`assistd.targets.spec.resolve`, the same order.

    Returns ``(config, sources)``: ``sources`` names what was read, for
    ``--print-config``. Raises :class:`InputError` for an unreadable or malformed
    file, an unknown key, or a value of the wrong type."""
    environ = os.environ if environ is None else environ
    names = [f.name for f in fields(Config) if f.name != "target"]
    known = [n for n in FIELDS if n != KEY_FIELD] + names
    values: dict = {}
    origins: dict[str, str] = {}
    sources = ["defaults"]
    explicit = path is not None or "ASSISTD_CONFIG" in environ
    path = path if path is not None else default_config_file()
    data: dict = {}
    if path.exists() or explicit:
        data = read_config_file(path)
        # [vllm]: the settings of assistd's proposer inside vLLM (assistd.fleet), read there
        unknown = sorted(set(data) - set(known) - {"vllm"})
        if unknown:
            raise InputError(f"config file {path}: unknown key(s) {', '.join(unknown)};"
                             f" known: {', '.join(known)}")
        for k, v in data.items():
            if k in names:
                values[k] = _coerce(k, v, str(path))
                origins[k] = str(path)
        sources.append(str(path))
    overrides = overrides or {}
    spec, target_origins = resolve({k: v for k, v in overrides.items() if k in FIELDS},
                                   config_file=path, file_values=data, environ=environ)
    target_origins.pop(KEY_FIELD, None)  # (--print-config says whether it is set)
    for name in known:
        env = f"ASSISTD_{name.upper()}"
        if env in environ:
            sources.append(f"${env}")
            if name in names:
                values[name] = _coerce(name, environ[env], f"${env}")
                origins[name] = f"${env}"
    for name, v in overrides.items():
        if v is not None and v != () and v != []:
            flag = f"--{name.replace('_', '-')}"
            sources.append(flag)
            if name not in FIELDS:
                values[name] = _coerce(name, list(v) if isinstance(v, tuple) else v, flag)
                origins[name] = flag
    config = _validate(Config(target=spec, **values), origins)
    config.origins = {**target_origins, **origins}  # for to_toml: where each setting came from
    return config, sources
