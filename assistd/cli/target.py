"""The flags that pick a Target, and the one function that turns them into the Target
to open (:func:`target_spec`: a :class:`~assistd.targets.spec.TargetSpec`): the remote
server's flags (``--target-*``, backend openai) and the precedence every front end shares
(a flag, then ``ASSISTD_*``, then the config file ``assistd serve`` reads, then the
default)."""

from __future__ import annotations

from pathlib import Path

import click

from assistd.targets.spec import FIELDS, TargetSpec

def target_spec(flags: dict) -> TargetSpec:
    """The Target a command opens: its Target ``flags`` (a :class:`TargetSpec` field each;
    None: not given) over the ``ASSISTD_*`` environment, over the config file, over the
    defaults. The file is read as ``assistd serve`` reads it
    (:func:`assistd.serving.config.load_config`), so a key that is no setting, or a bad
    daemon value, is refused here too instead of going unread. Raises
    :class:`~assistd.ground.errors.InputError` naming the flag, ``$VARIABLE`` or config
    file key of a bad value (the group prints it as one ``error:`` line, exit 2: no usage
    block around a value that may be 100 kB long).

    >>> target_spec({"n_ctx": 512, "model": Path("/m.gguf"), "db": "ignored"}).n_ctx
    512
    """
    from assistd.serving.config import load_config

    given = {k: str(v) if isinstance(v, Path) else v for k, v in flags.items() if k in FIELDS}
    return load_config(None, given)[0].target


class _FimChoice(click.ParamType):
    """--target-fim: auto, none or a FIM family (checked here, so that the error names
    the flag; the families are read only when a value is given: no httpx at start)."""

    name = "auto|none|FAMILY"

    def convert(self, value, param, ctx):
        from assistd.targets.remote import FIM_SETTINGS

        if value not in FIM_SETTINGS:
            self.fail(f"must be one of {', '.join(FIM_SETTINGS)}, not {value!r}", param, ctx)
        return value


def remote_options(fn):
    """--target-url and its companions (backend openai), for `complete`, `mcp` and `serve`
    (each also read from its ``ASSISTD_*`` variable and the config file, by the spec)."""
    for opt in reversed([
        click.option("--target-url", default=None, metavar="URL",
                     help="backend openai: the server's base URL (e.g. http://127.0.0.1:8080);"
                          " --model may then name the server model's GGUF or Hugging Face folder (its tokenizer)."),
        click.option("--target-key-file", default=None, metavar="FILE",
                     help="backend openai: a 0600 file holding the server's API key (or the"
                          " key itself in $ASSISTD_TARGET_KEY)."),
        click.option("--target-model", default=None, metavar="NAME",
                     help="backend openai: the model name to ask for. [default: the server's first]"),
        click.option("--target-ca-bundle", default=None, metavar="FILE",
                     help="backend openai: PEM CA certificates for https (also honoured:"
                          " SSL_CERT_FILE, REQUESTS_CA_BUNDLE, the proxy variables)."),
        click.option("--target-timeout-ms", type=click.IntRange(1), default=None,
                     help="backend openai: the longest wait for the server's next chunk, ms."
                          " [default: 30000]"),
        click.option("--target-deadline-ms", type=click.IntRange(1), default=None,
                     help="backend openai: the longest one generation may take, ms."
                          " [default: --target-timeout-ms + 1000 ms per token of max_tokens]"),
        click.option("--target-context", type=click.Choice(["all", "file"]), default=None,
                     help="backend openai: what prompts carry to the server besides the"
                          " document: all (also secret-filtered snippets of other open"
                          " files) or file (the document only). [default: all]"),
        click.option("--target-fim", type=_FimChoice(), default=None, metavar="auto|none|FAMILY",
                     help="backend openai: the FIM layout of editors' prompts (the LSP's;"
                          " `complete` sends the text before the cursor): auto (the"
                          " tokenizer's markers), none, or starcoder, qwen, deepseek."
                          " [default: auto]"),
    ]):
        fn = opt(fn)
    return fn
