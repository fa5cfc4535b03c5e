"""Options and parameter types more than one command shares (the Target's remote-server
flags are in :mod:`assistd.cli.target`)."""

from __future__ import annotations

from pathlib import Path

import click

from assistd.ground.errors import InputError
from assistd.ground.numerics import DEFAULT_NUMERICS, NUMERICS
from assistd.ground.options import DEFAULT_N_CTX, parse_k


class KChoice(click.ParamType):
    """--k: 'auto' or a whole number of tokens in 0..64 (:func:`parse_k`)."""

    name = "auto|0-64"

    def convert(self, value, param, ctx):
        try:
            return parse_k(value, what="--k")
        except InputError as e:
            self.fail(str(e), param, ctx)


def json_option(help: str = "Print one JSON object."):
    """--json, read as ``as_json``: the report as JSON (:func:`assistd.cli.render.emit`)."""
    return click.option("--json", "as_json", is_flag=True, help=help)


db_option = click.option(
    "--db", type=click.Path(dir_okay=False, path_type=Path), envvar="ASSISTD_DB",
    help="History database file. [env: ASSISTD_DB; default: the user data dir]",
)
model_option = click.option(
    "--model", type=click.Path(path_type=Path), default=None,
    help="GGUF file of the Target, or (torch backend) a Hugging Face model directory;"
         " with --backend openai, the served model's GGUF or Hugging Face folder (its tokenizer)."
         " [default: the embedded SmolLM2-135M-Instruct Q4_1]",
)
# Token trees for replay and bench: an arm NAME+tree is a proposer's tree mode; --tree
# both runs each tree-capable proposer both ways in one run, the fairest comparison
# (same tokens, same machine state), with the arms named apart in every table.
tree_option = click.option(
    "--tree", type=click.Choice(["off", "on", "both"]), default="off", show_default=True,
    help="Token-tree drafts for the proposers that have a tree mode (suffix,"
         " peer:suffixdecoding): off, on (their NAME+tree arm instead), or both (each both"
         " ways, to compare). `--proposer suffix+tree` asks for one arm by name.")
nodes_option = click.option(
    "--nodes", type=click.IntRange(1, 256), default=64, show_default=True,
    help="Node budget of a tree round: draft tokens verified in one forward.")

backend_option = click.option(
    "--backend", type=click.Choice(["llama", "torch"]), default="llama", show_default=True,
    help="Target backend: llama.cpp, or torch through transformers (pip install 'assistd[torch]').",
)
# `complete` (and `mcp`) may also send generation to a remote server. Their Target
# flags default to None: unset, ASSISTD_* and then the config file give the value
# (assistd.targets.spec.resolve), as for `assistd serve`.
complete_backend_option = click.option(
    "--backend", type=click.Choice(["llama", "torch", "openai"]), default=None,
    help="Target backend: llama.cpp, torch through transformers (pip install 'assistd[torch]'),"
         " or openai: a remote OpenAI-compatible server (--target-url). [default: llama]",
)

# (assistd.ground.numerics: the modes, the default and their promises)
NUMERICS_HELP = ("llama backend: fast = llama.cpp's default kernels on every thread (greedy"
                 " output is the Target's argmax for the batch it verified); exact ="
                 " batch-invariant kernels, one thread on one-token steps (greedy output is"
                 " plain decoding's, bit for bit; plain steps ~1.9x slower); llama ="
                 " llama.cpp exactly as it ships (the baseline, same promise as fast).")
numerics_option = click.option(
    "--numerics", type=click.Choice(NUMERICS), default=DEFAULT_NUMERICS, show_default=True,
    help=NUMERICS_HELP,
)
target_numerics_option = click.option(
    "--numerics", type=click.Choice(NUMERICS), default=None,
    help=f"{NUMERICS_HELP} [default: {DEFAULT_NUMERICS}]",
)
n_ctx_option = click.option(
    "--n-ctx", type=click.IntRange(64), default=DEFAULT_N_CTX, show_default=True,
    help="Target context window, in tokens.",
)
target_n_ctx_option = click.option(
    "--n-ctx", type=click.IntRange(64), default=None,
    help=f"Target context window, in tokens. [default: {DEFAULT_N_CTX}]",
)
