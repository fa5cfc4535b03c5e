"""``assistd serve`` (run the daemon) and ``assistd status`` (ask it what it is doing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from assistd.cli.app import cli
from assistd.cli.options import NUMERICS_HELP, json_option
from assistd.cli.render import emit, printable
from assistd.cli.target import remote_options
from assistd.ground.numerics import DEFAULT_NUMERICS, NUMERICS


@cli.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="TOML configuration file. [env: ASSISTD_CONFIG; default:"
                                 " <user config dir>/assistd/config.toml]")
@click.option("--model", default=None, help="GGUF file of the Target (torch: also a model dir; --backend openai: the served model's GGUF or Hugging Face folder, for its tokenizer).")
@click.option("--backend", type=click.Choice(["llama", "torch", "openai"]), default=None)
@remote_options
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
              help=f"{NUMERICS_HELP} [default: {DEFAULT_NUMERICS}]")
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
@json_option()
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
        emit({"running": False, "socket": str(socket_path())}, as_json,
             f"no daemon answers on {socket_path()}; start one with `assistd serve`")
        sys.exit(1)
    st = client.get("/v1/assistd/status")
    emit({"running": True, "socket": str(client.path), **st}, as_json,
         lambda _: _print_status(st, client.path))


def _print_status(st: dict, path) -> None:
    """``status``'s lines from the daemon's ``/v1/assistd/status`` on socket ``path``."""
    target = st["target"]
    numerics = (f", {target['numerics']} numerics (promise: {target['promise']})"
                if target.get("promise") else "")  # (a remote Target verifies nothing)
    click.echo(f"daemon on {path}: {st['model']} ({target['backend']},"
               f" n_ctx {target['n_ctx']}{numerics}), up {st['uptime_s']:.0f} s,"
               f" max RSS {st['max_rss_mb']} MB")
    remote = (st.get("target") or {}).get("remote")
    if remote:
        click.echo(printable(f"remote Target {remote['url']}: "
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
    asked = ", ".join(f"{kind} {n}" for kind, n in st["requests"].items())
    click.echo(f"requests: {asked}; tokens generated {st['tokens_generated']};"
               f" editor sessions {st.get('lsp_sessions', 0)}")
    click.echo(f"running: {', '.join(st['jobs_running']) or 'idle'}; queued: {len(st['jobs_queued'])};"
               f" preemptions {st['scheduler']['preemptions']}")
    if st.get("db"):
        click.echo(f"history: {st['db']}")
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
