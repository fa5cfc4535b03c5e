"""The flags that pick a Target, and the one function that turns them into
:func:`assistd.targets.open.open_target`'s options: the remote server's flags
(``--target-*``, backend openai), the check that they are not given in vain, and
``complete``'s fallback to the daemon's config file."""

from __future__ import annotations

from pathlib import Path

import click

from assistd.ground.errors import InputError

# The Target flags the daemon's config file fills in for an in-process `complete`: a
# Config field each (device, dtype, layers and threads stay this command's own).
CONFIG_KEYS = ("model", "backend", "numerics", "target_url", "target_key_file",
               "target_model", "target_ca_bundle", "target_timeout_ms", "target_deadline_ms",
               "target_context", "target_fim")


def target_options(flags: dict) -> dict:
    """``open_target``'s keyword options (model and n_ctx excepted) from a command's
    Target flags: ``backend``, ``numerics``, and where the command has them ``device``,
    ``dtype``, ``n_gpu_layers``, ``threads`` and the ``target_*`` flags (milliseconds
    here, seconds there). A flag the command lacks, or leaves unset, takes its default.

    >>> o = target_options({"backend": "openai", "numerics": "fast", "target_url": "http://h",
    ...                     "target_timeout_ms": 2500})
    >>> o["target_timeout_s"], o["target_deadline_s"], o["target_fim"], o["n_threads"]
    (2.5, None, 'auto', None)
    """
    f = flags.get
    return {"backend": f("backend"), "device": f("device") or "auto",
            "dtype": f("dtype") or "auto", "n_gpu_layers": f("n_gpu_layers", -1),
            "n_threads": f("threads"), "numerics": f("numerics"),
            "target_url": f("target_url"), "target_key_file": f("target_key_file"),
            "target_model": f("target_model"), "target_ca_bundle": f("target_ca_bundle"),
            "target_timeout_s": (f("target_timeout_ms") or 30_000) / 1000,
            "target_deadline_s": f("target_deadline_ms") and f("target_deadline_ms") / 1000,
            "target_context": f("target_context") or "all",
            "target_fim": f("target_fim") or "auto"}


def check_target_url(backend: str, target_url: str | None, *, required: bool = False) -> None:
    """--target-url only with --backend openai (it would silently go unused), and with
    ``required`` never without it. Raises :class:`click.BadParameter`."""
    if backend != "openai" and target_url:
        raise click.BadParameter(f"needs --backend openai (the backend is {backend})",
                                 param_hint="'--target-url'")
    if required and backend == "openai" and not target_url:
        raise click.BadParameter("--backend openai needs --target-url URL (the server's base"
                                 " URL, e.g. http://127.0.0.1:8080)", param_hint="'--target-url'")


def config_target(flags: dict) -> dict:
    """``complete`` in this process: ``flags`` with each of :data:`CONFIG_KEYS` that
    neither a flag nor an ``ASSISTD_*`` variable set taken from the config file the
    daemon reads (``assistd serve``), so that both meet the same Target; none when the
    backend given is not the file's. A bad file: the error ``serve`` gives (exit 2)."""
    from assistd.serving.config import Config, load_config

    ctx = click.get_current_context()
    defaults = Config()
    try:
        config, _ = load_config()
    except InputError as e:
        raise click.UsageError(str(e)) from None
    if (ctx.get_parameter_source("backend") is not click.core.ParameterSource.DEFAULT
            and flags["backend"] != config.backend):  # another backend than the file's
        return dict(flags)
    out = dict(flags)
    for name in CONFIG_KEYS:
        from_file = getattr(config, name)
        if (ctx.get_parameter_source(name) is click.core.ParameterSource.DEFAULT
                and from_file != getattr(defaults, name)):
            out[name] = Path(from_file).expanduser() if name == "model" else from_file
    return out


class _FimChoice(click.ParamType):
    """--target-fim: auto, none or a FIM family (checked here, so that the error names
    the flag; the families are read only when a value is given: no httpx at start)."""

    name = "auto|none|FAMILY"

    def convert(self, value, param, ctx):
        from assistd.targets.remote import FIM_SETTINGS

        if value not in FIM_SETTINGS:
            self.fail(f"must be one of {', '.join(FIM_SETTINGS)}, not {value!r}", param, ctx)
        return value


def remote_options(fn=None, *, env: bool = False):
    """--target-url and its companions (backend openai), for `complete`, `mcp` and `serve`;
    ``env``: each also read from its ``ASSISTD_*`` variable (serve's config reads those)."""
    if fn is None:
        return lambda f: remote_options(f, env=env)

    def envvar(name):
        return {"envvar": f"ASSISTD_{name}", "show_envvar": True} if env else {}

    for opt in reversed([
        click.option("--target-url", default=None, metavar="URL", **envvar("TARGET_URL"),
                     help="backend openai: the server's base URL (e.g. http://127.0.0.1:8080);"
                          " --model may then name a GGUF with the server model's tokenizer."),
        click.option("--target-key-file", default=None, metavar="FILE",
                     **envvar("TARGET_KEY_FILE"),
                     help="backend openai: a 0600 file holding the server's API key (or the"
                          " key itself in $ASSISTD_TARGET_KEY)."),
        click.option("--target-model", default=None, metavar="NAME", **envvar("TARGET_MODEL"),
                     help="backend openai: the model name to ask for. [default: the server's first]"),
        click.option("--target-ca-bundle", default=None, metavar="FILE",
                     **envvar("TARGET_CA_BUNDLE"), help="backend openai: PEM CA certificates for https (also honoured:"
                          " SSL_CERT_FILE, REQUESTS_CA_BUNDLE, the proxy variables)."),
        click.option("--target-timeout-ms", type=click.IntRange(1), default=None,
                     **envvar("TARGET_TIMEOUT_MS"), help="backend openai: the longest wait for the server's next chunk, ms."
                          " [default: 30000]"),
        click.option("--target-deadline-ms", type=click.IntRange(1), default=None,
                     **envvar("TARGET_DEADLINE_MS"),
                     help="backend openai: the longest one generation may take, ms."
                          " [default: --target-timeout-ms + 1000 ms per token of max_tokens]"),
        click.option("--target-context", type=click.Choice(["all", "file"]), default=None,
                     **envvar("TARGET_CONTEXT"),
                     help="backend openai: what prompts carry to the server besides the"
                          " document: all (also secret-filtered snippets of other open"
                          " files) or file (the document only). [default: all]"),
        click.option("--target-fim", type=_FimChoice(), default=None, metavar="auto|none|FAMILY",
                     **envvar("TARGET_FIM"),
                     help="backend openai: the FIM layout of editors' prompts (the LSP's;"
                          " `complete` sends the text before the cursor): auto (the"
                          " tokenizer's markers), none, or starcoder, qwen, deepseek."
                          " [default: auto]"),
    ]):
        fn = opt(fn)
    return fn
