"""The ``assistd`` command line: a thin layer over the engine, the history and the Targets."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import time
from pathlib import Path

import click

from assistd import __version__
from assistd.ground.errors import AssistdError, InputError
from assistd.ground.numerics import DEFAULT_NUMERICS, NUMERICS
from assistd.ground.options import parse_k


def _printable(text: str) -> str:
    """``text`` with control characters escaped, newlines and tabs kept (a message may
    quote a server: assistd.targets.remote.printable)."""
    from assistd.targets.remote import printable

    return "\n".join("\t".join(map(printable, line.split("\t"))) for line in text.split("\n"))


class _Group(click.Group):
    """Translate project errors into one line on stderr and exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AssistdError as e:  # (control characters escaped: it may quote a server)
            click.echo(f"error: {_printable(str(e))}", err=True)
            ctx.exit(2)
        except sqlite3.OperationalError as e:  # e.g. locked past the 30 s busy timeout
            click.echo(f"error: history database: {e}; retry, or pass --db FILE", err=True)
            ctx.exit(2)


class _KChoice(click.ParamType):
    """--k: 'auto' or a whole number of tokens in 0..64 (:func:`parse_k`)."""

    name = "auto|0-64"

    def convert(self, value, param, ctx):
        try:
            return parse_k(value, what="--k")
        except InputError as e:
            self.fail(str(e), param, ctx)


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
# Token trees for replay and bench: an arm NAME+tree is a proposer's tree mode; --tree
# both runs each tree-capable proposer both ways in one run, the fairest comparison
# (same tokens, same machine state), with the arms named apart in every table.
_tree_option = click.option(
    "--tree", type=click.Choice(["off", "on", "both"]), default="off", show_default=True,
    help="Token-tree drafts for the proposers that have a tree mode (suffix,"
         " peer:suffixdecoding): off, on (their NAME+tree arm instead), or both (each both"
         " ways, to compare). `--proposer suffix+tree` asks for one arm by name.")
_nodes_option = click.option(
    "--nodes", type=click.IntRange(1, 256), default=64, show_default=True,
    help="Node budget of a tree round: draft tokens verified in one forward.")


_backend_option = click.option(
    "--backend", type=click.Choice(["llama", "torch"]), default="llama", show_default=True,
    help="Target backend: llama.cpp, or torch through transformers (pip install 'assistd[torch]').",
)
# `complete` (and `serve`) may also send generation to a remote server.
_complete_backend_option = click.option(
    "--backend", type=click.Choice(["llama", "torch", "openai"]), default="llama",
    show_default=True, envvar="ASSISTD_BACKEND", show_envvar=True,
    help="Target backend: llama.cpp, torch through transformers (pip install 'assistd[torch]'),"
         " or openai: a remote OpenAI-compatible server (--target-url).",
)


class _FimChoice(click.ParamType):
    """--target-fim: auto, none or a FIM family (checked here, so that the error names
    the flag; the families are read only when a value is given: no httpx at start)."""

    name = "auto|none|FAMILY"

    def convert(self, value, param, ctx):
        from assistd.targets.remote import FIM_SETTINGS

        if value not in FIM_SETTINGS:
            self.fail(f"must be one of {', '.join(FIM_SETTINGS)}, not {value!r}", param, ctx)
        return value


def _remote_options(fn=None, *, env: bool = False):
    """--target-url and its companions (backend openai), for `complete`, `mcp` and `serve`;
    ``env``: each also read from its ``ASSISTD_*`` variable (serve's config reads those)."""
    if fn is None:
        return lambda f: _remote_options(f, env=env)

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


# (assistd.ground.numerics: the modes, the default and their promises)
_NUMERICS_HELP = ("llama backend: fast = llama.cpp's default kernels on every thread (greedy"
                  " output is the Target's argmax for the batch it verified); exact ="
                  " batch-invariant kernels, one thread on one-token steps (greedy output is"
                  " plain decoding's, bit for bit; plain steps ~1.9x slower); llama ="
                  " llama.cpp exactly as it ships (the baseline, same promise as fast).")
_numerics_option = click.option(
    "--numerics", type=click.Choice(NUMERICS), default=DEFAULT_NUMERICS, show_default=True,
    help=_NUMERICS_HELP,
)
_n_ctx_option = click.option(
    "--n-ctx", type=click.IntRange(64), default=2048, show_default=True,
    help="Target context window, in tokens.",
)


def _progress(label: str):
    """A rich progress bar on stderr when it is a terminal, else nothing.

    Returns ``(callback(done, total), close())``."""
    if not sys.stderr.isatty():
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    bar.start()
    task = bar.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return update, bar.stop


def _repo_line(report) -> str:
    return (
        f"{report.scope}: {report.documents} document{'' if report.documents == 1 else 's'};"
        f" tokenized {report.tokenized}"
        f" ({report.tokens} tokens), unchanged {report.unchanged}, removed {report.removed};"
        f" skipped {report.skipped_binary} binary, {report.skipped_large} large,"
        f" {report.skipped_unreadable} unreadable;"
        f" {report.decoded_with_replacement} decoded with replacement;"
        f" {report.redactions} secrets redacted"
    ) + _refused_lines(report.scope, report.refused)


def _refused_lines(what: str, refused: dict[str, int]) -> str:
    """One line per reason a file was not read (a FIFO, a link out of the repository...)."""
    return "".join(f"\n{what}: {n} not read: {reason}" for reason, n in sorted(refused.items()))


def _transcript_line(t) -> str:
    formats = ", ".join(f"{n} {f}" for f, n in sorted(t.formats.items())) or "none"
    return (
        f"transcripts: {t.files} files read ({formats}), {t.unchanged} unchanged,"
        f" {t.unknown_format} unknown format, {t.rewritten} rewritten; records"
        f" {t.records_put} stored ({t.tokens} tokens), {t.records_removed} removed;"
        f" skipped {t.skipped_malformed} malformed lines,"
        f" {t.skipped_too_deep} nested too deep, {t.skipped_unknown} unknown records,"
        f" {t.skipped_duplicate} duplicates; {t.unparseable} files unparseable;"
        f" {t.dropped_blobs} blobs dropped; {t.skipped_large} too large;"
        f" {t.decoded_with_replacement} decoded with replacement; {t.redactions} secrets redacted"
    ) + _refused_lines("transcripts", t.refused) + "".join(
        f"\ntranscripts: {n} read only in part: {reason}"
        for reason, n in sorted(t.truncated.items()))


@cli.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path),
                required=False)
@click.option("--transcripts", "transcripts", multiple=True,
              type=click.Path(exists=True, path_type=Path),
              help="Agent transcript file or folder (any supported format, detected from the"
                   " content); repeat for several.")
@click.option("--agent-transcripts/--no-agent-transcripts", default=None,
              help="Also take the default transcript folders that exist (~/.claude/projects,"
                   " $CODEX_HOME/sessions or ~/.codex/sessions, ~/.gemini/tmp)."
                   " [default: on with --watch]")
@click.option("--watch", is_flag=True,
              help="Keep running and follow changes live; Ctrl-C exits cleanly.")
@_db_option
@_model_option
@_backend_option
@click.option("--max-bytes", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Skip files, and transcript records, larger than this many bytes.")
@click.option("--max-history-mb", type=click.IntRange(1), default=None, envvar="ASSISTD_MAX_HISTORY_MB",
              help="History size budget (text + tokens, MiB); least recently used scopes are"
                   " evicted first. [env: ASSISTD_MAX_HISTORY_MB; default: 2048]")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as one JSON object (with --watch: one per batch).")
def index(path, transcripts, agent_transcripts, watch, db, model, backend, max_bytes,
          max_history_mb, as_json):
    """Tokenize a repository's text files and agent transcripts into the history.

    Respects .gitignore (nested too), .git/info/exclude, the global git excludes
    file and .assistdignore; skips binary and oversized files and counts them;
    secrets are redacted before anything is stored. Unchanged files are not
    re-tokenized; deleted files are forgotten. Transcript records are attached
    to the project they were recorded in. PATH defaults to the current
    directory unless only --transcripts are given.

    \b
    Examples:
        assistd index ~/src/myproject --json
        assistd index . --transcripts ~/.claude/projects --transcripts run.traj
        assistd index . --watch
    """
    from assistd.targets.open import open_target
    from assistd.runtime.runtime import open_store
    from storage.indexer import find_repository_root
    from storage.retention import DEFAULT_MAX_BYTES, enforce_budget
    from storage.watcher import HistoryWatcher, default_transcript_locations

    if path is None and not transcripts and not agent_transcripts:
        path = Path(".")
    if agent_transcripts is None:
        agent_transcripts = watch
    locations = list(transcripts) + (default_transcript_locations() if agent_transcripts else [])
    store = open_store(db)
    target = open_target(model, backend=backend, n_ctx=512)  # for its tokenizer
    repos = [find_repository_root(path)] if path is not None else []
    budget = max_history_mb * (1 << 20) if max_history_mb else DEFAULT_MAX_BYTES

    def show(repo_reports, t_report, eviction):
        if as_json:
            out = {"repositories": [r.as_dict() for r in repo_reports],
                   "transcripts": t_report.as_dict(), "eviction": eviction.as_dict()}
            if len(repo_reports) == 1:  # the one-repository shape earlier releases printed
                out = {**repo_reports[0].as_dict(), **out}
            click.echo(json.dumps(out))
        else:
            for r in repo_reports:
                click.echo(_repo_line(r))
            if locations or t_report.files or t_report.records_put:
                click.echo(_transcript_line(t_report))
            if eviction.documents_evicted or eviction.over_budget:
                click.echo(f"history: {eviction.size_after} bytes after evicting "
                           f"{eviction.documents_evicted} documents (budget {budget});"
                           + (" still over budget" if eviction.over_budget else ""))

    watcher = HistoryWatcher(store, target.tokenize, target.fingerprint, repos=repos,
                             transcripts=locations, max_bytes=max_bytes)
    protect = [str(r.resolve()) for r in repos]
    started_utc = time.time()  # what this run stores is never evicted by this run
    if watch:
        watcher.start()  # before the scan: a change made during the scan is not missed
    update, close = _progress("indexing")
    try:
        repo_reports, t_report = watcher.scan(update)
    finally:
        close()
    show(repo_reports, t_report, enforce_budget(store, budget, protect, started_utc))
    if not watch:
        return
    click.echo(f"watching {len(repos)} repositories and {len(locations)} transcript"
               " locations; Ctrl-C to stop", err=True)

    def on_batch(batch):
        if batch.tokenized or batch.transcripts.records_removed or any(
                r.removed for r in batch.repos):
            show(batch.repos, batch.transcripts,
                 enforce_budget(store, budget, protect, batch.started_utc))

    try:  # SIGTERM or Ctrl-C: the batch in hand is committed, the observer joined
        watcher.run_until_stopped(on_batch)
    finally:
        store.close()
    click.echo("stopped", err=True)


@cli.group()
def history():
    """Inspect and prune the history: stats, sources, forget, vacuum.

    \b
    Examples:
        assistd history stats
        assistd history sources --json
        assistd history forget ~/src/oldproject
        assistd history vacuum
    """


def _history_store(db):
    from assistd.runtime.runtime import open_store

    return open_store(db, create=False)


@history.command("stats")
@_db_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def history_stats(db, as_json):
    """Totals per source kind (documents, bytes, tokens, secrets redacted) and file size.

    \b
    Example:
        assistd history stats --json
    """
    from storage.migrations import secret_rescans
    from storage.retention import stats

    store = _history_store(db)
    s = stats(store)
    # Values the rescans of stored text redacted (already in the per-kind totals), by rule.
    s["secret_rescans"] = secret_rescans(store.db)
    if as_json:
        click.echo(json.dumps(s))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"history {s['db']} ({s['db_bytes']:,} bytes on disk)")
    for col in ("kind", "documents", "tokens", "text bytes", "secrets redacted"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for kind, k in s["kinds"].items():
        table.add_row(kind, f"{k['documents']:,}", f"{k.get('tokens', 0):,}",
                      f"{k['bytes']:,}", f"{k['redactions']:,}")
    Console().print(table)
    click.echo(f"{s['scopes']} scopes; {s['transcript_files']} transcript files"
               f" ({s['transcript_lines_malformed']} malformed lines,"
               f" {s['transcript_records_unknown']} unknown records skipped)")
    for r in s["secret_rescans"]:
        if not r["redactions"] and not r["failed"]:
            continue  # a rescan that found nothing (every new database's) is no news
        rules = ", ".join(f"{k} {n}" for k, n in sorted(r["kinds"].items(), key=lambda kv: -kv[1]))
        click.echo(f"secrets rescan ({r['name']}): {r['redactions']} values redacted in"
                   f" {r['changed']} of {r['documents']} stored documents"
                   + (f" ({rules})" if rules else "")
                   + (f"; filter failed on {r['failed']}" if r["failed"] else ""))


@history.command("sources")
@_db_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def history_sources(db, as_json):
    """Every scope (repository) and transcript file in the history.

    \b
    Example:
        assistd history sources
    """
    from storage.retention import sources

    rows = sources(_history_store(db))
    if as_json:
        click.echo(json.dumps(rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for col in ("type", "source", "kind", "documents", "tokens"):
        table.add_column(col, justify="right" if col in ("documents", "tokens") else "left",
                         overflow="fold")
    for r in rows:
        table.add_row(r["type"], r["source"], r["kind"] or "", f"{r['documents']:,}",
                      f"{r.get('tokens', ''):,}" if "tokens" in r else "")
    Console().print(table)


@history.command("forget")
@click.argument("source")
@_db_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def history_forget(source, db, as_json):
    """Delete a scope, a transcript file, or a file or folder of a scope from the history.

    The text and tokens are overwritten in the database file (secure delete).
    A repository indexed again, or a transcript rewritten, comes back.

    \b
    Example:
        assistd history forget ~/src/oldproject
    """
    from storage.retention import forget

    out = forget(_history_store(db), source)
    if out["documents"] == 0 and not out["ledger_rows"] and not out["suggestions"]:
        raise InputError(f"nothing in the history matches {source!r};"
                         " see `assistd history sources`")
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(f"forgot {out['documents']} documents from {source}"
                   + (f", {out['ledger_rows']} tuner ledger rows" if out["ledger_rows"] else "")
                   + (f", {out['suggestions']} suggestion events" if out["suggestions"] else ""))


@history.command("vacuum")
@_db_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def history_vacuum(db, as_json):
    """Compact the database file (after forgetting or evicting a lot).

    \b
    Example:
        assistd history vacuum
    """
    from storage.retention import vacuum

    out = vacuum(_history_store(db))
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(f"{out['db']}: {out['bytes_before']:,} -> {out['bytes_after']:,} bytes")


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
@click.option("--k", "k", type=_KChoice(), default="auto", show_default=True,
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
@_n_ctx_option
@_model_option
@_complete_backend_option
@click.option("--device", default="auto", show_default=True,
              help="torch backend: auto, cpu, cuda, cuda:N or mps.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
              default="auto", show_default=True,
              help="torch backend: weight dtype (auto: float32 on CPU, 16-bit on a GPU).")
@click.option("--n-gpu-layers", type=click.IntRange(-1), default=-1, show_default=True,
              help="llama backend: layers to offload to the GPU (-1 = all; ignored by CPU builds).")
@_numerics_option
@click.option("--threads", type=click.IntRange(1), default=None,
              help="CPU threads for the Target. [default: all usable cores]")
@_remote_options(env=True)
@_db_option
@click.option("--daemon/--no-daemon", "use_daemon", default=None,
              help="Run on the daemon (`assistd serve`), or in this process. [default: the"
                   " daemon when one answers and no Target or --db option is given]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def complete(file_, line, column, repo, max_tokens, proposer, draft_model, no_speculation, k,
             language, max_prompt_tokens, temperature, top_k, top_p, repeat_penalty, seed, stop,
             n_ctx, model, backend, device, dtype, n_gpu_layers, numerics, threads, target_url,
             target_key_file, target_model, target_ca_bundle, target_timeout_ms,
             target_deadline_ms, target_context, target_fim, db, use_daemon, as_json):
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
    # In this process, the Target of the daemon's config file where no option names one.
    (model, backend, numerics, target_url, target_key_file, target_model, target_ca_bundle,
     target_timeout_ms, target_deadline_ms, target_context, target_fim) = _config_target(
        model=model, backend=backend, numerics=numerics, target_url=target_url,
        target_key_file=target_key_file, target_model=target_model,
        target_ca_bundle=target_ca_bundle, target_timeout_ms=target_timeout_ms,
        target_deadline_ms=target_deadline_ms,
        target_context=target_context, target_fim=target_fim).values()
    if backend != "openai" and target_url:  # would silently go unused
        raise click.BadParameter(f"needs --backend openai (the backend is {backend})",
                                 param_hint="'--target-url'")
    if backend == "openai" and (draft_model is not None or proposer == "draft_model"):
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
        out = client.post("/v1/assistd/complete", {
            "prompt_text": prompt_text, "repo": str(repo or default_repo or "") or None,
            "proposer": proposer, "k": k, "max_tokens": max_tokens,
            "max_prompt_tokens": max_prompt_tokens, "stop": list(stop),
            "guess_outside_git": repo is None, "language": language,
            "sampling": sampling.as_dict()})
        _print_completion(out, as_json)
        return
    result = complete_at(
        prompt_text, repo=repo or default_repo, proposer=proposer, k=k,
        max_tokens=max_tokens, max_prompt_tokens=max_prompt_tokens, n_ctx=n_ctx,
        model=model, db=db, stop=stop, guess_outside_git=repo is None,
        sampling=sampling, draft_model=draft_model,
        language=language,
        target_options={"backend": backend, "device": device, "dtype": dtype,
                        "n_gpu_layers": n_gpu_layers, "n_threads": threads,
                        "numerics": numerics, "target_url": target_url,
                        "target_key_file": target_key_file, "target_model": target_model,
                        "target_ca_bundle": target_ca_bundle,
                        "target_timeout_s": (target_timeout_ms or 30_000) / 1000,
                        "target_deadline_s": target_deadline_ms and target_deadline_ms / 1000,
                        "target_context": target_context or "all",
                        "target_fim": target_fim or "auto"},
    )
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        text = result.generation.text
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        click.echo(ledger_line(result), err=True)


# Options that pick another Target or history than the daemon's: their presence means
# the user wants this process to run the completion.
_IN_PROCESS_OPTIONS = ("model", "backend", "n_ctx", "device", "dtype", "n_gpu_layers",
                       "numerics", "threads", "db", "draft_model", "target_url")


def _config_target(**given) -> dict:
    """``complete`` in this process: the Target keys (``given``, in order) that neither a
    flag nor an ``ASSISTD_*`` variable set, taken from the config file the daemon reads
    (``assistd serve``), so that both meet the same Target; none when the backend given
    is not the file's. A bad file: the error ``serve`` gives (exit 2)."""
    from assistd.serving.config import Config, load_config

    ctx = click.get_current_context()
    defaults = Config()
    try:
        config, _ = load_config()
    except InputError as e:
        raise click.UsageError(str(e)) from None
    if (ctx.get_parameter_source("backend") is not click.core.ParameterSource.DEFAULT
            and given["backend"] != config.backend):  # another backend than the file's
        return given
    out = {}
    for name, value in given.items():
        source = ctx.get_parameter_source(name)
        from_file = getattr(config, name)
        if source is click.core.ParameterSource.DEFAULT and from_file != getattr(defaults, name):
            value = Path(from_file).expanduser() if name == "model" else from_file
        out[name] = value
    return out


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


def _print_completion(out: dict, as_json: bool) -> None:
    """Print a daemon's ``Completion.as_dict()`` as ``complete`` prints its own."""
    from assistd.runtime.session import summary_line

    if as_json:
        click.echo(json.dumps(out))
        return
    text = out["completion"]
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    click.echo(summary_line(out), err=True)


@cli.group()
def peers():
    """Optional peers for `replay` and `bench`, built into the user cache on request.

    \b
    Example:
        assistd peers build arctic
    """


@peers.command("build")
@click.argument("name", type=click.Choice(["arctic"]))
@click.option("--sdist", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A local arctic_inference-0.3.0.tar.gz instead of pip's download from PyPI.")
def peers_build(name, sdist):
    """Build Arctic Inference 0.3.0's SuffixDecoding (peer:arctic, peer:arctic-tree).

    Downloads the sdist with pip, builds its csrc/suffix_decoding with CMake and nanobind
    (a C++20 compiler is needed; about 30 s) and keeps the module in the user cache;
    a second call reuses it.

    \b
    Example:
        assistd peers build arctic
        assistd replay session.jsonl --proposer peer:arctic --proposer peer:arctic-tree
    """
    from assistd.measure.arctic import build
    from proposers.arctic import built_module, load

    reused = built_module() is not None
    path = build(sdist, log=lambda m: click.echo(m, err=True))
    load()  # a module that is there but does not load: InputError, with the fix
    click.echo(f"{'already built' if reused else 'built'}: {path}")


@cli.command()
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--git", "git_repo", type=click.Path(path_type=Path), default=None,
              help="Also replay a repository's history: each text file a commit adds or"
                   " changes is a model turn, its older versions are in the history.")
@click.option("--git-commits", type=click.IntRange(1), default=20, show_default=True,
              help="With --git: how many of the last (first-parent) commits, oldest first.")
@click.option("--proposer", "proposers", multiple=True, metavar="NAME",
              help="Proposer to replay; repeat for several. [default: every registered one"
                   " except draft_model and peer:arctic(-tree), other peers included;"
                   " those need `assistd peers build arctic`]")
@click.option("--k", "k", type=click.IntRange(1, 64), default=16, show_default=True,
              help="Draft length ceiling per round.")
@click.option("--cost-model", default="calibrate", show_default=True,
              metavar="reference|flat|calibrate|FILE",
              help="The Target's forward time t(n): the reference 2-core CPU's figures"
                   " (docs/design.md; 'brief' is the old name), flat (any round costs one"
                   " forward, as on a GPU), measured on the Target now (~2 s), or a JSON"
                   " file {\"points\": {\"1\": 11.0, ...}}.")
@_tree_option
@_nodes_option
@click.option("--model", type=click.Path(path_type=Path), default=None,
              help="GGUF file of the Target: its tokenizer, and its speed with --cost-model"
                   " calibrate. [default: the embedded SmolLM2-135M-Instruct Q4_1]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def replay(files, git_repo, git_commits, proposers, k, cost_model, tree, nodes, model, as_json):
    """Replay recorded outputs through each proposer, offline, as the decoder would.

    The recorded model turns stand in for the Target's output (an oracle): at each
    position the proposer drafts from everything before it, the draft's common
    prefix with the recording is accepted, and the round commits that plus one
    token; non-model turns (prompts, tool results) join the context without
    drafting. Each replayed turn then joins the history, so later sessions draft
    from earlier ones. FILES are transcripts of any supported format (or folders
    of them), replayed in the order given. Reports per proposer D, C, R, plain
    steps, acceptance rate, mean acceptance length, coverage, tokens per call,
    modeled speedup on the cost model t(n), per-position acceptance and
    propose() latency. The peers `peer:llama-cpp-python-pld` and
    `peer:transformers-pld` run in the same pass on the same tokens.

    \b
    Examples:
        assistd replay ~/.claude/projects/myproj/*.jsonl --cost-model reference
        assistd replay run.traj --proposer suffix --proposer peer:llama-cpp-python-pld --json
        assistd replay --git . --git-commits 50 --k 8
        assistd replay transcripts/ --proposer suffix --proposer peer:suffixdecoding \\
            --tree both --nodes 64 --cost-model flat
    """
    from assistd.measure.replay import replay_report

    if cost_model == "brief":  # the old name: still accepted, said once, plainly
        click.echo("warning: --cost-model brief is now called --cost-model reference", err=True)
        cost_model = "reference"
    update, close = (None, lambda: None) if as_json else _progress("replay")
    try:
        report = replay_report(files, git_repo=git_repo, git_commits=git_commits,
                               names=proposers, k=k, cost_model=cost_model, model=model,
                               progress=update, tree=tree, max_nodes=nodes)
    finally:
        close()
    if as_json:
        click.echo(json.dumps(report))
        return
    _print_replay(report)


class _BenchK(_KChoice):
    """--k for bench: 'auto' or 1..64 (plain decoding is always in the run)."""

    name = "auto|1-64"

    def convert(self, value, param, ctx):
        try:
            v = parse_k(value, what="--k")
        except InputError:  # parse_k names 0..64; bench takes 1..64
            v = None
        if v is None:
            self.fail(f"--k must be 'auto' or a number of tokens 1..64, not {value!r}", param,
                      ctx)
        if v == 0:
            self.fail("0 is plain decoding, which every bench runs anyway; pick 1-64 or auto",
                      param, ctx)
        return v


@cli.command()
@click.option("--workload", "workloads", multiple=True, metavar="NAME|NAME=PATH|PATH",
              help="agent (transcripts), edit (a git history), stdlib (a library of .py"
                   " files), novel (prose requests, code history); NAME=PATH picks the"
                   " source, a bare PATH is guessed (git repo: edit, .py folder: stdlib,"
                   " else transcripts). Repeat for several. [default: all four]")
@click.option("--proposer", "proposers", multiple=True, metavar="NAME",
              help="Proposer arm; repeat for several. [default: ngram, suffix and the peers'"
                   " rules peer:suffixdecoding, peer:llama-cpp-python-pld, peer:transformers-pld]")
@_backend_option
@_model_option
@click.option("--draft-model", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Add a draft_model arm with this GGUF (same tokenizer).")
@click.option("--k", "k", type=_BenchK(), default="auto", show_default=True,
              help="Draft ceiling of our proposers, or 'auto' (a fresh tuner per workload).")
@click.option("--cases", type=click.IntRange(1), default=6, show_default=True,
              help="Prompts per workload.")
@click.option("--max-tokens", type=click.IntRange(1, 1024), default=96, show_default=True,
              help="Tokens generated per prompt.")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True,
              help="Times each arm runs each prompt (the speedup's spread).")
@click.option("--max-prompt-tokens", type=click.IntRange(16), default=1536, show_default=True,
              help="Prompt window, in tokens.")
@_n_ctx_option
@click.option("--threads", type=click.IntRange(1), default=None,
              help="CPU threads of the Target and the library peer. [default: all usable]")
@click.option("--no-library-peer", is_flag=True,
              help="Skip llama-cpp-python's own prompt-lookup decoding (a second model instance).")
@_numerics_option
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
              help="Which stdlib files and cursors; the tuner's exploration draws.")
@_tree_option
@_nodes_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--report", "report_dir", type=click.Path(path_type=Path), default=None,
              help="Write ledger.md, ledger.json, speedup.png and acceptance.png here.")
def bench(workloads, proposers, backend, model, draft_model, k, cases, max_tokens, repeats,
          max_prompt_tokens, n_ctx, threads, no_library_peer, numerics, seed, tree, nodes,
          as_json, report_dir):
    """Measure plain decoding, every proposer and the in-stack peers on one ledger.

    One Target per numerics mode, the same prompts, the arms interleaved: every arm
    under --numerics here, plain decoding under llama.cpp's defaults (plain:llama, the
    baseline of every speedup) and exact numerics (plain:exact) each in a process of
    its own. Prints per workload and arm: tokens/s, speedup over the baseline (min-max
    over repeats), the ceiling this run's t(n) and acceptance allow, acceptance rate,
    mean acceptance length, coverage, per-position acceptance, draft and verify ms per
    token, extra memory, and whether greedy output matched plain decoding.

    \b
    Examples:
        assistd bench
        assistd bench --workload agent=~/.claude/projects/myproj --workload edit=. --report out/
        assistd bench --workload novel --proposer suffix --k 8 --json
        assistd bench --workload agent --proposer suffix --tree both --nodes 64
    """
    import shlex

    from assistd.measure import bench as bench_mod
    from assistd.measure.bench_report import print_ledger, write_report

    specs = list(workloads) or ["agent", "edit", "stdlib", "novel"]
    optional = ()
    if not workloads:
        # The defaults run what this machine has: agent needs transcripts, edit a git
        # repository here; either is left out with a note when missing.
        optional = ("agent", "edit")
    if report_dir is not None:
        _check_writable(report_dir)
    command = "assistd bench " + shlex.join(sys.argv[2:]) if len(sys.argv) > 1 else "assistd bench"
    progress, close = _bench_progress()

    def skip(spec: str, reason: str) -> None:
        click.echo(f"note: {spec} left out: {reason}", err=True)

    try:
        report = bench_mod.run(
            specs, proposers=list(proposers) or bench_mod.DEFAULT_PROPOSERS, backend=backend,
            model=model, draft_model=draft_model, k=k, cases=cases, max_tokens=max_tokens,
            repeats=repeats, max_prompt_tokens=max_prompt_tokens, n_ctx=n_ctx,
            n_threads=threads, library_peer=not no_library_peer, numerics=numerics,
            seed=seed, command=command, progress=progress, optional=optional, on_skip=skip,
            tree=tree, max_nodes=nodes)
    finally:
        close()
    for warning in report["warnings"]:
        click.echo(f"warning: {warning}", err=True)
    # The report reaches stdout before the files: a folder that fails now loses nothing.
    if as_json:
        click.echo(json.dumps(report))
    else:
        print_ledger(report)
    if report_dir is not None:
        for path in write_report(report, report_dir):
            click.echo(f"wrote {path}", err=True)


def _check_writable(directory: Path) -> None:
    """Create ``directory`` and write a probe file there before any work, so that a bad
    --report fails in a second, not after the run. Raises :class:`InputError`."""
    import tempfile

    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".assistd-probe-"):
            pass
    except OSError as e:
        raise InputError(f"--report {directory}: cannot write there ({e.strerror or e});"
                         " pass another output folder") from None


def _bench_progress():
    """``(progress(total) -> step(description, n), close())``: a rich bar on stderr when
    it is a terminal, else a line at every 5% of the generations."""
    if not sys.stderr.isatty():
        def progress_lines(total: int):
            done, every, t0 = 0, max(1, total // 20), time.monotonic()

            def step(description: str, n: int) -> None:
                nonlocal done
                done += n
                if done % every == 0 or done == total:
                    click.echo(f"bench: {done}/{total} generations, {time.monotonic() - t0:.0f} s"
                               f" ({description})", err=True)

            return step

        return progress_lines, lambda: None
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn,
                               TimeRemainingColumn)

    bar = Progress("[progress.description]{task.description}", BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                   console=Console(stderr=True), transient=True)
    bar.start()
    task = bar.add_task("loading", total=None)

    def progress(total: int):
        bar.update(task, total=total, description="bench")

        def step(description: str, n: int) -> None:
            bar.update(task, advance=n, description=description)

        return step

    return progress, bar.stop


def _print_replay(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(x, fmt=".2f"):
        return "n/a" if x is None else format(x, fmt)

    inputs = report["inputs"]
    console = Console() if sys.stdout.isatty() else Console(width=160)
    table = Table(title=f"replay: {inputs['sessions']} sessions, {inputs['model_tokens']:,} of"
                        f" {inputs['tokens']:,} tokens to complete; k ≤ {report['k']};"
                        f" cost model {report['cost_model']['source']}",
                  caption="speedup: committed·t(1) / (Σ rounds t(draft length) + plain·t(1));"
                          " t(L+1): a round costing t(draft length + 1)")
    # Tree columns only where a tree round ran (D then counts nodes verified).
    trees = any(m.get("tree_rounds") for m in report["proposers"].values())
    cols = ["proposer", "D", "C", "R", "plain", "accept", "mean len", "coverage",
            "tok/call", "speedup", "t(L+1)", "p50 ms", "p99 ms"]
    if trees:
        cols[5:5] = ["tree rounds", "nodes/round"]
    for col in cols:
        table.add_column(col, justify="left" if col == "proposer" else "right",
                         overflow="fold")
    for name, m in report["proposers"].items():
        cells = [name, f"{m['draft_tokens']:,}", f"{m['accepted_tokens']:,}",
                 f"{m['rounds']:,}", f"{m['plain_steps']:,}", f(m["acceptance_rate"]),
                 f(m["mean_acceptance_length"]), f(m["coverage"]), f(m["tokens_per_call"]),
                 f(m["modeled_speedup"]), f(m["modeled_speedup_physical"]),
                 f(m["propose_ms_p50"], ".3f"), f(m["propose_ms_p99"], ".3f")]
        if trees:
            cells[5:5] = [f"{m.get('tree_rounds', 0):,}", f(m.get("nodes_per_round"))]
        table.add_row(*cells)
    console.print(table)
    depth = min(8, max((len(m["reached_per_position"]) for m in report["proposers"].values()),
                       default=0))
    if depth:
        pos = Table(title="per-position acceptance: conditional a_i, cumulative A_i")
        pos.add_column("proposer", overflow="fold")
        pos.add_column("")
        for i in range(1, depth + 1):
            pos.add_column(f"i={i}", justify="right")
        for name, m in report["proposers"].items():
            for label, key in (("a_i", "conditional_acceptance"), ("A_i", "cumulative_acceptance")):
                cells = [f(x) for x in m[key][:depth]]
                pos.add_row(name if label == "a_i" else "", label, *cells,
                            *[""] * (depth - len(cells)))
        console.print(pos)


@cli.command()
@click.option("--scope", default=None, metavar="S",
              help="Only this scope's ledger (a repository root as `assistd history sources`"
                   " lists it, or a path to one). [default: all scopes]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE.png",
              help="Also draw the cumulative acceptance A_i per language and the expected"
                   " speedup by draft ceiling k (chosen k marked) into a PNG file.")
@_db_option
def stats(scope, as_json, plot, db):
    """What the tuner has learnt, per language id and proposer.

    From the decayed acceptance ledger that every `assistd complete` adds to:
    coverage (rounds / steps), acceptance rate (accepted / drafted tokens), mean
    acceptance length (1 + accepted / rounds), per-position acceptance (conditional
    a_i and cumulative A_i), and the draft ceiling k the tuner picks with its
    expected speedup over plain decoding on the Target's measured cost model. Then
    what editors reported of their suggestions: shown, accepted (whole or partly,
    with the accepted characters), dismissed.

    \b
    Examples:
        assistd stats
        assistd stats --scope ~/src/myproj --json
        assistd stats --plot tuner.png
    """
    from assistd.runtime.runtime import open_store, store_stats
    from assistd.runtime.stats import plot_stats, print_stats, print_user_acceptance

    both = store_stats(open_store(db, create=False), scope=scope)
    report = both["ledger"]
    if plot is not None:
        plot_stats(report, plot)
        click.echo(f"wrote {plot}", err=True)
    if as_json:
        click.echo(json.dumps({**report, "user_acceptance": both["user_acceptance"]}))
        return
    print_stats(report)
    print_user_acceptance(both["user_acceptance"])


@cli.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="TOML configuration file. [env: ASSISTD_CONFIG; default:"
                                 " <user config dir>/assistd/config.toml]")
@click.option("--model", default=None, help="GGUF file of the Target (torch: also a model dir).")
@click.option("--backend", type=click.Choice(["llama", "torch", "openai"]), default=None)
@_remote_options
@click.option("--n-ctx", type=click.IntRange(64), default=None, help="Context window, tokens.")
@click.option("--db", default=None, help="History database file.")
@click.option("--repo", "repos", multiple=True, help="Repository to index and watch; repeat.")
@click.option("--transcripts", multiple=True, help="Transcript file or folder to watch; repeat.")
@click.option("--agent-transcripts/--no-agent-transcripts", default=None,
              help="Also watch ~/.claude/projects, ~/.codex/sessions, ~/.gemini/tmp.")
@click.option("--socket", default=None, help="Unix socket path (created 0600).")
@click.option("--tcp", default=None, metavar="HOST:PORT",
              help="Also listen on loopback TCP (bearer token from --token-file).")
@click.option("--allow-remote", is_flag=True, default=None,
              help="Allow --tcp on a non-loopback address.")
@click.option("--token-file", default=None, help="Bearer token file (created 0600 if missing).")
@click.option("--proposer", default=None, help="Default proposer (suffix, ngram, none).")
@click.option("--k", default=None, help="Default draft ceiling: auto or 0-64.")
@click.option("--numerics", type=click.Choice(NUMERICS), default=None,
              help=f"{_NUMERICS_HELP} [default: {DEFAULT_NUMERICS}]")
@click.option("--sequences", default=None, metavar="auto|N",
              help="KV sequences kept warm (each of n_ctx tokens), so an editor, each agent"
                   " and the shell keep their prompts: auto (as many as fit 512 MiB of KV,"
                   " at most 4) or a number.")
@click.option("--log-file", default=None, help="Structured (JSON lines) log file.")
@click.option("--log-level", default=None, type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--print-config", is_flag=True,
              help="Print the effective configuration (TOML) and where it came from; exit.")
def serve(config_file, print_config, **flags):
    """Run the daemon: one Target, the history and the watchers for every client.

    Serves the local API (OpenAI-compatible /v1/completions and /v1/chat/completions,
    /v1/models, /v1/assistd/stats, /healthz) on a Unix socket, and `assistd
    complete`, `assistd lsp` and `assistd mcp` use it when it runs. Settings:
    defaults < config file < ASSISTD_* environment < these flags. SIGTERM or
    Ctrl-C finishes the request in hand and exits cleanly.

    \b
    Examples:
        assistd serve --repo ~/src/myproject
        assistd serve --tcp 127.0.0.1:8765 --print-config
        curl --unix-socket "$(assistd serve --print-config | sed -n 's/^socket_path = //p' | tr -d '\"')" http://x/v1/models
    """
    from assistd.serving.config import load_config

    config, sources = load_config(config_file, flags)
    if print_config:
        click.echo(f"# sources, lowest first: {', '.join(sources)}")
        click.echo(config.to_toml(), nl=False)
        click.echo(f"# derived\nsocket_path = {json.dumps(str(config.socket_path()))}")
        click.echo(f"log_path = {json.dumps(str(config.log_path()))}")
        if config.tcp:
            click.echo(f"token_path = {json.dumps(str(config.token_path()))}")
        click.echo(_key_line(config))
        return
    from assistd.serving.daemon import serve as run
    from editors.server import serve_hosted

    run(config, lsp_host=serve_hosted)  # the roof composes: the daemon hosts editor sessions


def _key_line(config) -> str:
    """--print-config's line on $ASSISTD_TARGET_KEY: whether it is set (never its value),
    and whether a target_key_file takes its place."""
    import os

    from assistd.targets.remote import KEY_ENV

    state = "set" if os.environ.get(KEY_ENV) else "not set"
    note = " (unused: target_key_file is read instead)" if (
        config.target_key_file and state == "set") else ""
    return f"# ${KEY_ENV}: {state}{note}; its value is never printed"


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(as_json):
    """What the daemon is doing: model, queue, requests, watcher, memory.

    Exit code 1 when no daemon answers.

    \b
    Example:
        assistd status --json
    """
    from assistd.serving.client import find_daemon, socket_path

    client = find_daemon()
    if client is None:
        if as_json:
            click.echo(json.dumps({"running": False, "socket": str(socket_path())}))
        else:
            click.echo(f"no daemon answers on {socket_path()}; start one with `assistd serve`")
        sys.exit(1)
    st = client.get("/v1/assistd/status")
    if as_json:
        click.echo(json.dumps({"running": True, "socket": str(client.path), **st}))
        return
    target = st["target"]
    numerics = (f", {target['numerics']} numerics (promise: {target['promise']})"
                if target.get("promise") else "")  # (a remote Target verifies nothing)
    click.echo(f"daemon on {client.path}: {st['model']} ({target['backend']},"
               f" n_ctx {target['n_ctx']}{numerics}), up {st['uptime_s']:.0f} s,"
               f" max RSS {st['max_rss_mb']} MB")
    remote = (st.get("target") or {}).get("remote")
    if remote:
        click.echo(_printable(f"remote Target {remote['url']}: "
                   + ("reachable" if remote["reachable"] else "not reachable" if
                      remote["reachable"] is False else "not contacted yet")
                   + (f", model {remote['model']}" if remote.get("model") else "")
                   + (" (not among the server's models)" if remote.get("model_listed") is False
                      else "")
                   + (f", latency {remote['latency_ms']:.0f} ms" if remote.get("latency_ms")
                      is not None else "")
                   + (f" (checked {remote['checked_ago_s']:.0f} s ago)"
                      if remote.get("checked_ago_s") is not None else "")
                   + (f"; last error: {remote['last_error']}" if remote.get("last_error") else "")))
    click.echo(f"requests: {st['requests']}; tokens generated {st['tokens_generated']};"
               f" editor sessions {st.get('lsp_sessions', 0)}")
    click.echo(f"running: {', '.join(st['jobs_running']) or 'idle'}; queued: {len(st['jobs_queued'])};"
               f" preemptions {st['scheduler']['preemptions']}")
    w = st.get("watcher") or {}
    click.echo(f"watcher: {w.get('state', 'n/a')}, {w.get('batches', 0)} batches"
               + (f", {w['restarts']} restarts" if w.get("restarts") else "")
               + (f", retry in {w['retry_in_s']:.0f} s" if w.get("retry_in_s") is not None
                  else "")
               + (f" ({w['off_reason']})" if w.get("off_reason") else "")
               + (f"; last error: {w['error']}" if w.get("error") else ""))
    conns = st.get("connections")
    if conns:
        click.echo(f"connections: unix {conns['open']['unix']}, tcp {conns['open']['tcp']}"
                   f" (cap {conns['cap']} each); closed: {conns['timed_out']} timed out,"
                   f" {conns['evicted']} evicted at the cap, {conns['refused']} refused")
    ed = st.get("editors")
    if ed:
        click.echo(f"editor socket: {ed['sessions']} sessions, {ed['initializing']} initializing"
                   f" (cap {ed['cap']}); closed: {ed['timed_out']} before initialize,"
                   f" {ed['evicted']} evicted at the cap, {ed['refused']} refused,"
                   f" {ed['not_lsp']} not LSP")
    seqs = st.get("sequences")
    if seqs:
        mib = 2**20
        click.echo(f"KV sequences: {seqs['n_seq']} ({seqs['kv_bytes_reserved'] / mib:.0f} MiB"
                   f" reserved), evictions {seqs['evictions']}")
        for s in seqs["slots"]:
            if s["owner"] is not None:
                click.echo(f"  seq {s['seq']}: {s['owner']}, {s['tokens']} tokens,"
                           f" {s['kv_bytes'] / mib:.1f} MiB, idle {s['idle_s']:.0f} s")


@cli.command()
@click.option("--no-daemon", is_flag=True,
              help="Never use the daemon; always run the Target in this process.")
@_model_option
@_n_ctx_option
@_complete_backend_option
@_numerics_option
@_remote_options(env=True)
@_db_option
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the server log here too (stderr always gets warnings and errors).")
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail.")
def mcp(no_daemon, model, n_ctx, backend, numerics, target_url, target_key_file, target_model,
        target_ca_bundle, target_timeout_ms, target_deadline_ms, target_context, target_fim, db,
        log_file, verbose):
    """Run the MCP server on stdio: tools for coding agents (Claude Code, Codex, ...).

    Tools: complete_code (complete at a line/column of a file), continue_text and
    acceptance_stats. Each call uses the daemon (`assistd serve`) when one answers,
    else loads the Target in this process on first use (--model, --n-ctx, --backend,
    --numerics, the --target-* options of a remote server and --db apply to that; the
    daemon's Target runs the numerics of its own configuration). stdout carries
    the protocol; logs go to stderr.

    \b
    Examples:
        assistd mcp
        claude mcp add assistd -- assistd mcp
        assistd mcp --no-daemon --db /tmp/history.db
        assistd mcp --no-daemon --backend openai --target-url http://127.0.0.1:8080
    """
    from assistd.ground.logs import setup_logging
    from assistd.serving.mcp_server import serve_stdio

    if backend != "openai" and target_url:  # would silently go unused
        raise click.BadParameter(f"needs --backend openai (the backend is {backend})",
                                 param_hint="'--target-url'")
    if backend == "openai" and not target_url:
        raise click.BadParameter("--backend openai needs --target-url URL (the server's base"
                                 " URL, e.g. http://127.0.0.1:8080)", param_hint="'--target-url'")
    setup_logging(log_file, verbose)
    options = {"backend": backend}
    if backend == "llama":
        options["numerics"] = numerics
    elif backend == "openai":
        # Checked now, not at the first tool call: an agent's `claude mcp add` would
        # not see a mistyped URL, a readable key file or a bad --target-fim until then.
        # (--target-fim: its option type)
        from assistd.targets.remote import base_url, read_key

        base_url(target_url)
        read_key(target_key_file)
        options.update(target_url=target_url, target_key_file=target_key_file,
                       target_model=target_model, target_ca_bundle=target_ca_bundle,
                       target_timeout_s=(target_timeout_ms or 30_000) / 1000,
                       target_deadline_s=target_deadline_ms and target_deadline_ms / 1000,
                       target_fim=target_fim or "auto")  # (target_context: editors only)
    serve_stdio(use_daemon=not no_daemon, model=model, db=db, n_ctx=n_ctx, target_options=options)


class _HostPort(click.ParamType):
    """--tcp: HOST:PORT (IPv6 as [::1]:PORT)."""

    name = "HOST:PORT"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        host, sep, port = str(value).rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
            self.fail(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:2087)", param, ctx)
        return host, int(port)


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@cli.command()
@click.option("--stdio", is_flag=True, help="Speak LSP over stdin/stdout (the default).")
@click.option("--tcp", type=_HostPort(), default=None,
              help="Listen on HOST:PORT instead of stdio (loopback only unless --allow-remote).")
@click.option("--allow-remote", is_flag=True,
              help="Allow --tcp on a non-loopback address (the token is still required,"
                   " but LSP is plain text: anyone on the path reads your code).")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="--tcp: the file holding the token editors must send as"
                   " initializationOptions.token (created 0600 if missing)."
                   " [default: the daemon's token file]")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the server log here too (stderr always gets warnings and errors).")
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail.")
@click.option("--daemon/--no-daemon", "use_daemon", default=None,
              help="Run completions on the daemon (`assistd serve`: its Target, history and"
                   " tuner, shared with every editor and agent), or in this process."
                   " [default: the daemon when one answers]")
def lsp(stdio, tcp, allow_remote, token_file, log_file, verbose, use_daemon):
    """Run the language server: inline completions for VS Code, Neovim and other LSP clients.

    Settings come from the client (initializationOptions / didChangeConfiguration,
    under "assistd"); see editors/ for VS Code and Neovim setup. Over --tcp the
    editor must send the token (--token-file) as initializationOptions.token; the
    server answers nothing else until it has, and serves one editor at a time.

    \b
    Examples:
        assistd lsp
        assistd lsp --tcp 127.0.0.1:2087
    """
    import logging

    from assistd.ground.logs import setup_logging
    from editors.server import build_server

    if tcp is not None and stdio:
        raise click.UsageError("--stdio and --tcp are exclusive")
    if tcp is not None and tcp[0] not in _LOOPBACK and not allow_remote:
        raise click.UsageError(f"--tcp {tcp[0]} is not a loopback address; anyone who can reach"
                               " it could read your code: pass --allow-remote to mean it")
    setup_logging(log_file, verbose)
    token = token_path = None
    if tcp is not None:
        from assistd.serving.config import load_config
        from assistd.serving.daemon import read_or_create_token

        token_path = token_file or load_config()[0].token_path()
        token = read_or_create_token(token_path)
        click.echo(f"assistd lsp --tcp {tcp[0]}:{tcp[1]}: editors send the token in"
                   f" {token_path} as initializationOptions.token", err=True)
    if use_daemon is not False:
        from assistd.serving.client import find_daemon, pipe_lsp, pipe_lsp_tcp, socket_path
        from assistd.serving.lsp_host import lsp_socket_for

        client = find_daemon()
        if client is None and use_daemon:
            raise InputError(f"no daemon answers on {socket_path()}; start `assistd serve`")
        if client is not None:
            # The language server runs in the daemon, on its Target and history; this
            # process only carries the bytes (the editor's connection to it).
            path = lsp_socket_for(client.path)
            logging.getLogger("assistd.lsp").info("the language server runs in the daemon"
                                                  " (%s)", path)
            if tcp is None:
                pipe_lsp(path, sys.stdin.fileno(), sys.stdout.fileno())
            else:
                pipe_lsp_tcp(path, tcp, token, token_path)
            return
    from editors.settings import environment_settings

    settings, warnings = environment_settings()
    for w in warnings:
        logging.getLogger("assistd.lsp").warning("%s", w)
    server = build_server(settings)
    if tcp is None:
        server.start_io()
        _end_lsp(server)
    import socket
    import threading

    from assistd.serving.lsp_host import LspTcpGate

    # The same gate as through the daemon; the server reads its end of a socket pair,
    # and ends with the first editor's session (as it does with stdio).
    mine, theirs = socket.socketpair()
    gate = LspTcpGate(tcp, token, lambda: theirs, token_path=token_path, once=True)
    gate.bind()
    threading.Thread(target=gate.serve_forever, name="assistd-lsp-tcp", daemon=True).start()
    with mine, mine.makefile("rb") as reader, mine.makefile("wb") as writer:
        server.start_io(reader, writer)
    _end_lsp(server)


def _end_lsp(server) -> None:
    """The session is over (exit, end of input, or the client's process gone): close the
    engine and leave now. pygls's reader thread may still block on an input another
    process holds open, and a model still loading is not worth waiting for."""
    import logging
    import os

    server.finish()
    logging.shutdown()  # pygls flushed every message it wrote; exit may have closed stdout
    os._exit(0)


def main():
    cli(prog_name="assistd")

