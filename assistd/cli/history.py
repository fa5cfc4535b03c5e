"""``assistd index`` (read repositories and transcripts into the history, once or
watching) and ``assistd history`` (inspect and prune it)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from assistd.cli.app import cli
from assistd.cli.options import backend_option, db_option, json_option, model_option
from assistd.cli.render import emit, progress, table
from assistd.ground.errors import InputError


def _repo_line(report) -> str:
    return (
        f"{report.scope}: {report.documents} document{'' if report.documents == 1 else 's'};"
        f" tokenized {report.tokenized}"
        f" ({report.tokens} tokens), unchanged {report.unchanged}, removed {report.removed};"
        f" skipped {report.skipped_binary} binary, {report.skipped_large} large,"
        f" {report.skipped_unreadable} unreadable, {report.vanished} vanished;"
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
@db_option
@model_option
@backend_option
@click.option("--max-bytes", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Skip files, and transcript records, larger than this many bytes.")
@click.option("--max-history-mb", type=click.IntRange(1), default=None, envvar="ASSISTD_MAX_HISTORY_MB",
              help="History size budget (text + tokens, MiB); least recently used scopes are"
                   " evicted first. [env: ASSISTD_MAX_HISTORY_MB; default: 2048]")
@json_option("Print the report as one JSON object (with --watch: one per batch).")
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
    from assistd.targets.spec import TargetSpec
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
    # for its tokenizer (the window is never used)
    target = open_target(TargetSpec(model=str(model) if model else None, backend=backend,
                                    n_ctx=512))
    repos = [find_repository_root(path)] if path is not None else []
    budget = max_history_mb * (1 << 20) if max_history_mb else DEFAULT_MAX_BYTES

    def show(repo_reports, t_report, eviction):
        out = {"repositories": [r.as_dict() for r in repo_reports],
               "transcripts": t_report.as_dict(), "eviction": eviction.as_dict()}
        if len(repo_reports) == 1:  # the one-repository shape earlier releases printed
            out = {**repo_reports[0].as_dict(), **out}

        def lines(_):
            for r in repo_reports:
                click.echo(_repo_line(r))
            if locations or t_report.files or t_report.records_put:
                click.echo(_transcript_line(t_report))
            if eviction.documents_evicted or eviction.over_budget:
                click.echo(f"history: {eviction.size_after} bytes after evicting "
                           f"{eviction.documents_evicted} documents (budget {budget});"
                           + (" still over budget" if eviction.over_budget else ""))

        emit(out, as_json, lines)

    watcher = HistoryWatcher(store, target.tokenize, target.fingerprint, repos=repos,
                             transcripts=locations, max_bytes=max_bytes)
    for ix in watcher.indexers:  # show() prints what was not read: not logged as well
        ix.log_refusals = False
    protect = [str(r.resolve()) for r in repos]
    started_utc = time.time()  # what this run stores is never evicted by this run
    if watch:
        watcher.start()  # before the scan: a change made during the scan is not missed
    update, close = progress("indexing")
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
                r.removed or r.refused for r in batch.repos):
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


def _history_command(name: str, json_help: str = "Print one JSON object."):
    """A ``history`` subcommand with the --db and --json every one of them takes."""
    def wrap(fn):
        return history.command(name)(db_option(json_option(json_help)(fn)))

    return wrap


def _history_store(db):
    from assistd.runtime.runtime import open_store

    return open_store(db, create=False)


@_history_command("stats")
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
    emit(s, as_json, _print_history_stats)


def _print_history_stats(s: dict) -> None:
    table({"kind": "left", "documents": "right", "tokens": "right", "text bytes": "right",
           "secrets redacted": "right"},
          ([kind, f"{k['documents']:,}", f"{k.get('tokens', 0):,}", f"{k['bytes']:,}",
            f"{k['redactions']:,}"] for kind, k in s["kinds"].items()),
          title=f"history {s['db']} ({s['db_bytes']:,} bytes on disk)")
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


@_history_command("sources", "Print a JSON array.")
def history_sources(db, as_json):
    """Every scope (repository) and transcript file in the history.

    \b
    Example:
        assistd history sources
    """
    from storage.retention import sources

    emit(sources(_history_store(db)), as_json, lambda rows: table(
        {"type": "left", "source": "left", "kind": "left", "documents": "right",
         "tokens": "right"},
        ([r["type"], r["source"], r["kind"] or "", f"{r['documents']:,}",
          f"{r['tokens']:,}" if "tokens" in r else ""] for r in rows), fold=True))


@_history_command("forget")
@click.argument("source")
def history_forget(source, db, as_json):
    """Delete a scope, a transcript file, or a file or folder of a scope from the history.

    The text and tokens are overwritten in the database file and its WAL (secure
    delete, then a checkpoint), also while the daemon has them open. A repository
    indexed again comes back; a forgotten transcript stays forgotten, what the agent
    appends to it too, unless the file is rewritten.

    \b
    Example:
        assistd history forget ~/src/oldproject
    """
    from storage.retention import forget

    store = _history_store(db)
    out = forget(store, source)
    if out["documents"] == 0 and not out["transcripts"] and not out["ledger_rows"] \
            and not out["suggestions"]:
        raise InputError(f"nothing in the history matches {source!r};"
                         " see `assistd history sources`")
    if not out["checkpointed"]:
        click.echo("warning: another process held the history database for 30 s, so older"
                   f" copies of the forgotten text may remain in {store.path} or its -wal"
                   " until it lets go; run `assistd history vacuum` then", err=True)
    emit(out, as_json,
         f"forgot {out['documents']} documents from {source}"
         + (f", {out['ledger_rows']} tuner ledger rows" if out["ledger_rows"] else "")
         + (f", {out['suggestions']} suggestion events" if out["suggestions"] else ""))


@_history_command("vacuum")
def history_vacuum(db, as_json):
    """Compact the database file (after forgetting or evicting a lot).

    \b
    Example:
        assistd history vacuum
    """
    from storage.retention import vacuum

    out = vacuum(_history_store(db))
    emit(out, as_json, f"{out['db']}: {out['bytes_before']:,} -> {out['bytes_after']:,} bytes")
