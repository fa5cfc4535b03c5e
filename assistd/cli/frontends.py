"""The front ends that speak a protocol on stdio (or TCP): ``assistd mcp`` for coding
agents and ``assistd lsp`` for editors; each runs on the daemon when one answers."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from assistd.cli.app import cli
from assistd.cli.options import (complete_backend_option, db_option, model_option,
                                 target_n_ctx_option, target_numerics_option)
from assistd.cli.target import remote_options, target_spec
from assistd.ground.errors import InputError
from assistd.ground.loopback import LOOPBACK_HOSTS


@cli.command()
@click.option("--no-daemon", is_flag=True,
              help="Never use the daemon; always run the Target in this process.")
@model_option
@target_n_ctx_option
@complete_backend_option
@target_numerics_option
@remote_options
@db_option
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the server log here too (stderr always gets warnings and errors).")
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail.")
def mcp(no_daemon, db, log_file, verbose, **target):
    """Run the MCP server on stdio: tools for coding agents (Claude Code, Codex, ...).

    Tools: complete_code (complete at a line/column of a file), continue_text and
    acceptance_stats. Each call uses the daemon (`assistd serve`) when one answers,
    else loads the Target in this process on first use (--model, --n-ctx, --backend,
    --numerics, the --target-* options of a remote server and --db apply to that, then
    ASSISTD_* variables and the config file `assistd serve` reads: the daemon's Target;
    a running daemon's Target is its own). stdout carries the protocol; logs go to stderr.

    \b
    Examples:
        assistd mcp
        claude mcp add assistd -- assistd mcp
        assistd mcp --no-daemon --db /tmp/history.db
        assistd mcp --no-daemon --backend openai --target-url http://127.0.0.1:8080
    """
    from assistd.ground.logs import setup_logging
    from assistd.serving.mcp_server import serve_stdio

    # Checked now, not at the first tool call: an agent's `claude mcp add` would not see
    # a mistyped URL, a bad --n-ctx or a readable key file until then.
    spec = target_spec(target)
    if spec.remote:
        spec.key()
    setup_logging(log_file, verbose)
    serve_stdio(use_daemon=not no_daemon, spec=spec, db=db)


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
    if tcp is not None and tcp[0] not in LOOPBACK_HOSTS and not allow_remote:
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
