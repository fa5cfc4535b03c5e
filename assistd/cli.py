"""The ``assistd`` command line: a thin layer over the engine, the history and the Targets."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import click

from assistd import __version__
from assistd.errors import AssistdError


class _Group(click.Group):
    """Translate project errors into one line on stderr and exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AssistdError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(2)
        except sqlite3.OperationalError as e:  # e.g. locked past the 30 s busy timeout
            click.echo(f"error: history database: {e}; retry, or pass --db FILE", err=True)
            ctx.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="assistd")
def cli():
    """assistd: local completions by speculative decoding over a persistent history.

    \b
    Example:
        assistd index .
        assistd complete --file src/app.py --line 10 --column 5
    """


_db_option = click.option(
    "--db", type=click.Path(dir_okay=False, path_type=Path), envvar="ASSISTD_DB",
    help="History database file. [env: ASSISTD_DB; default: the user data dir]",
)
_model_option = click.option(
    "--model", type=click.Path(path_type=Path), default=None,
    help="GGUF file of the Target, or (torch backend) a Hugging Face model directory."
         " [default: the embedded SmolLM2-135M-Instruct Q4_1]",
)
_backend_option = click.option(
    "--backend", type=click.Choice(["llama", "torch"]), default="llama", show_default=True,
    help="Target backend: llama.cpp, or torch through transformers (pip install 'assistd[torch]').",
)
_n_ctx_option = click.option(
    "--n-ctx", type=click.IntRange(64), default=2048, show_default=True,
    help="Target context window, in tokens.",
)


@cli.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path), default=".")
@_db_option
@_model_option
@_backend_option
@click.option("--max-bytes", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Skip files larger than this.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def index(path, db, model, backend, max_bytes, as_json):
    """Tokenize a repository's text files into the history.

    Respects .gitignore (nested too), .git/info/exclude and .assistdignore; skips
    binary and oversized files and counts them. Unchanged files are not
    re-tokenized; deleted files are forgotten.

    \b
    Example:
        assistd index ~/src/myproject --json
    """
    from assistd.session import open_store, open_target
    from storage.indexer import find_repository_root, index_repository

    store = open_store(db)
    target = open_target(model, backend=backend, n_ctx=512)  # for its tokenizer
    root = find_repository_root(path)
    report = index_repository(store, root, target.tokenize, target.fingerprint,
                              max_bytes=max_bytes, recursive=True)
    if as_json:
        click.echo(json.dumps(report.as_dict()))
    else:
        click.echo(
            f"{report.scope}: {report.documents} documents; tokenized {report.tokenized}"
            f" ({report.tokens} tokens), unchanged {report.unchanged}, removed {report.removed};"
            f" skipped {report.skipped_binary} binary, {report.skipped_large} large,"
            f" {report.skipped_unreadable} unreadable;"
            f" {report.decoded_with_replacement} decoded with replacement"
        )


@cli.command()
@click.option("--file", "file_", required=True, type=str,
              help="File to complete in, or '-' to read the prompt text from stdin.")
@click.option("--line", type=click.IntRange(1), default=None,
              help="1-based line of the cursor. [default: end of file]")
@click.option("--column", type=click.IntRange(1), default=None,
              help="1-based column of the cursor, in characters. [default: end of line]")
@click.option("--repo", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, help="Repository whose history drafts. [default: the file's git root]")
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True,
              help="Stop after this many new tokens.")
@click.option("--proposer", type=click.Choice(["ngram", "none"]), default="ngram",
              show_default=True, help="Draft source; 'none' is plain decoding.")
@click.option("--no-speculation", is_flag=True, help="Plain decoding (same as --proposer none).")
@click.option("--k", "k", type=click.IntRange(0, 64), default=8, show_default=True,
              help="Draft length ceiling per round, in tokens.")
@click.option("--max-prompt-tokens", type=click.IntRange(1), default=1024, show_default=True,
              help="Keep at most this many tokens before the cursor.")
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Sampling temperature; 0 is greedy decoding.")
@click.option("--top-k", type=click.IntRange(0), default=0, show_default=True,
              help="Sample among the k most likely tokens (0 = off).")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0,
              show_default=True, help="Nucleus sampling mass (1 = off).")
@click.option("--repeat-penalty", type=click.FloatRange(0, min_open=True), default=1.0,
              show_default=True,
              help="Repetition penalty over the last 64 committed tokens (1 = off).")
@click.option("--seed", type=click.IntRange(0), default=None,
              help="Random seed for sampling. [default: random]")
@click.option("--stop", multiple=True,
              help="Stop string, excluded from the output; repeat the option for several.")
@_n_ctx_option
@_model_option
@_backend_option
@click.option("--device", default="auto", show_default=True,
              help="torch backend: auto, cpu, cuda, cuda:N or mps.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
              default="auto", show_default=True,
              help="torch backend: weight dtype (auto: float32 on CPU, 16-bit on a GPU).")
@click.option("--n-gpu-layers", type=click.IntRange(-1), default=-1, show_default=True,
              help="llama backend: layers to offload to the GPU (-1 = all; ignored by CPU builds).")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="CPU threads for the Target. [default: all usable cores]")
@_db_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def complete(file_, line, column, repo, max_tokens, proposer, no_speculation, k,
             max_prompt_tokens, temperature, top_k, top_p, repeat_penalty, seed, stop,
             n_ctx, model, backend, device, dtype, n_gpu_layers, threads, db, as_json):
    """Complete the text before a cursor with the Target, drafting from the history.

    Indexes the repository first (incrementally), so the second run is served
    from the persisted history. Prints the completion to stdout and a one-line
    ledger to stderr, or everything as one JSON object with --json.

    \b
    Examples:
        assistd complete --file assistd/engine.py --line 40 --column 1
        echo 'def fib(n):' | assistd complete --file - --json
        assistd complete --file app.py --temperature 0.7 --top-p 0.9 --seed 1 --stop $'\\n\\n'
        assistd complete --file app.py --backend torch --device cpu
    """
    from assistd.sampling import SamplingParams
    from assistd.session import complete_at, ledger_line, read_prompt

    try:  # click's float ranges let NaN through; SamplingParams refuses it
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                  repetition_penalty=repeat_penalty, seed=seed)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None

    text, prompt_text, default_repo = read_prompt(file_, line, column)
    if no_speculation:
        proposer = "none"
    result = complete_at(
        prompt_text, repo=repo or default_repo, proposer=proposer, k=k,
        max_tokens=max_tokens, max_prompt_tokens=max_prompt_tokens, n_ctx=n_ctx,
        model=model, db=db, stop=stop, guess_outside_git=repo is None,
        sampling=sampling,
        target_options={"backend": backend, "device": device, "dtype": dtype,
                        "n_gpu_layers": n_gpu_layers, "n_threads": threads},
    )
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        text = result.generation.text
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        click.echo(ledger_line(result), err=True)


def main():
    cli(prog_name="assistd")

