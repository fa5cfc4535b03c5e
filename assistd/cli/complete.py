"""``assistd complete``: one completion at a cursor, on the daemon or in this process."""

from __future__ import annotations

import re
from pathlib import Path

import click

from assistd.cli.app import cli
from assistd.cli.options import (KChoice, complete_backend_option, db_option, json_option,
                                 model_option, target_n_ctx_option, target_numerics_option)
from assistd.cli.render import emit, write_text
from assistd.cli.target import remote_options, target_spec
from assistd.ground.errors import InputError

# Options that pick another Target or history than the daemon's: their presence means
# the user wants this process to run the completion.
_IN_PROCESS_OPTIONS = ("model", "backend", "n_ctx", "device", "dtype", "n_gpu_layers",
                       "numerics", "threads", "db", "draft_model", "target_url")


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
@click.option("--proposer", type=click.Choice(["suffix", "ngram", "draft_model", "none"]),
              default="suffix", show_default=True,
              help="Draft source: suffix (frequency-scored history and context), ngram"
                   " (prompt lookup), draft_model (needs --draft-model); 'none' is plain"
                   " decoding.")
@click.option("--draft-model", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="GGUF of a small model with the Target's tokenizer to draft"
                                 " with (implies --proposer draft_model).")
@click.option("--no-speculation", is_flag=True, help="Plain decoding (same as --proposer none).")
@click.option("--k", "k", type=KChoice(), default="auto", show_default=True,
              help="Draft length ceiling per round, in tokens (0-64), or 'auto': the tuner"
                   " picks it per file type from measured acceptance (`assistd stats`).")
@click.option("--language", default=None, metavar="ID",
              help="LSP language id of the text (python, markdown, json, ...); the tuner"
                   " keeps one k per language. [default: from the file name; plaintext for"
                   " stdin]")
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
@target_n_ctx_option
@model_option
@complete_backend_option
@click.option("--device", default=None,
              help="torch backend: auto, cpu, cuda, cuda:N or mps. [default: auto]")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
              default=None, help="torch backend: weight dtype (auto: float32 on CPU, 16-bit"
                                 " on a GPU). [default: auto]")
@click.option("--n-gpu-layers", type=click.IntRange(-1), default=None,
              help="llama backend: layers to offload to the GPU (-1 = all; ignored by CPU"
                   " builds). [default: -1]")
@target_numerics_option
@click.option("--threads", type=click.IntRange(1), default=None,
              help="CPU threads for the Target. [default: all usable cores]")
@remote_options
@db_option
@click.option("--daemon/--no-daemon", "use_daemon", default=None,
              help="Run on the daemon (`assistd serve`), or in this process. [default: the"
                   " daemon when one answers and no Target or --db option is given]")
@json_option()
def complete(file_, line, column, repo, max_tokens, proposer, draft_model, no_speculation, k,
             language, max_prompt_tokens, temperature, top_k, top_p, repeat_penalty, seed, stop,
             n_ctx, db, use_daemon, as_json, **target):
    """Complete the text before a cursor with the Target, drafting from the history.

    Indexes the repository first (incrementally), so the second run is served
    from the persisted history. Prints the completion to stdout and a one-line
    ledger to stderr, or everything as one JSON object with --json.

    \b
    Examples:
        assistd complete --file assistd/decoding/engine.py --line 40 --column 1
        echo 'def fib(n):' | assistd complete --file - --json
        assistd complete --file app.py --temperature 0.7 --top-p 0.9 --seed 1 --stop $'\\n\\n'
        assistd complete --file app.py --backend torch --device cpu

    In this process, unset Target options come from ASSISTD_* variables, then the
    config file `assistd serve` reads (--n-ctx, --numerics, --threads ... included),
    so both open the same Target.
    """
    from assistd.ground.languages import language_id
    from assistd.ground.sampling import SamplingParams
    from assistd.runtime.session import complete_at, ledger_line, read_prompt

    try:  # click's float ranges let NaN through; SamplingParams refuses it
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                  repetition_penalty=repeat_penalty, seed=seed)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None

    if language is not None and not re.fullmatch(r"[A-Za-z0-9_.+#-]{1,64}", language):
        raise click.BadParameter(
            f"{language!r} is not a language id; use an LSP id such as python, markdown,"
            " json (letters, digits and _ . + # -, at most 64)", param_hint="'--language'")
    # In this process: the flags, then ASSISTD_*, then the daemon's config file.
    spec = target_spec({**target, "n_ctx": n_ctx})
    if spec.remote and (draft_model is not None or proposer == "draft_model"):
        # the plan would drop it without a word: the server decodes, nothing verifies here
        raise click.UsageError(
            f"{'--draft-model' if draft_model is not None else '--proposer draft_model'} does"
            " not work with --backend openai: a remote Target decodes on its server and"
            " assistd verifies no drafts against it; drop the draft model, or use a local"
            " --backend (llama, torch)")
    text, prompt_text, default_repo = read_prompt(file_, line, column)
    source = click.get_current_context().get_parameter_source("proposer")
    if draft_model is not None and source is click.core.ParameterSource.DEFAULT:
        proposer = "draft_model"  # --draft-model alone means: draft with it
    if no_speculation:
        proposer = "none"
    language = language or (language_id(file_) if file_ != "-" else "plaintext")
    client = _complete_daemon(use_daemon)
    if client is not None:
        from assistd.runtime.runtime import prompt_tail
        from assistd.targets.remote.tokenizer import CHARS_PER_TOKEN

        # Only the tail the daemon reads (its Target's ids may be characters): a file of
        # 50 MB before the cursor went over its request limit (max_request_bytes).
        sent = prompt_tail(prompt_text, max_prompt_tokens * CHARS_PER_TOKEN)
        out = client.post("/v1/assistd/complete", {
            "prompt_text": sent, "repo": str(repo or default_repo or "") or None,
            "proposer": proposer, "k": k, "max_tokens": max_tokens,
            "max_prompt_tokens": max_prompt_tokens, "stop": list(stop),
            "guess_outside_git": repo is None, "language": language,
            "sampling": sampling.as_dict()})
        emit(out, as_json, _print_daemon_completion)
        return
    result = complete_at(
        prompt_text, repo=repo or default_repo, proposer=proposer, k=k,
        max_tokens=max_tokens, max_prompt_tokens=max_prompt_tokens, spec=spec, db=db,
        stop=stop, guess_outside_git=repo is None, sampling=sampling,
        draft_model=draft_model, language=language)

    def show(_):
        write_text(result.generation.text)
        click.echo(ledger_line(result), err=True)

    emit(result.as_dict(), as_json, show)


def _complete_daemon(use_daemon):
    """The daemon client ``complete`` should use, or None to run in-process."""
    from assistd.serving.client import find_daemon, socket_path

    if use_daemon is False:
        return None
    ctx = click.get_current_context()
    explicit = [n for n in _IN_PROCESS_OPTIONS
                if ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE]
    if use_daemon and explicit:
        raise click.UsageError(f"--daemon runs on the daemon's Target and history;"
                               f" drop --{explicit[0].replace('_', '-')}")
    if explicit:
        return None
    client = find_daemon()
    if client is None and use_daemon:
        raise InputError(f"no daemon answers on {socket_path()}; start `assistd serve`")
    return client


def _print_daemon_completion(out: dict) -> None:
    """A daemon's ``Completion.as_dict()`` as ``complete`` prints its own."""
    from assistd.runtime.session import summary_line

    write_text(out["completion"])
    click.echo(summary_line(out), err=True)
