"""The ``assistd`` group: its help, its version, and the one place project errors
become one line on stderr and exit code 2."""

from __future__ import annotations

import sqlite3

import click

from assistd import __version__
from assistd.cli.render import printable
from assistd.ground.errors import AssistdError


class _Group(click.Group):
    """Translate project errors into one line on stderr and exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AssistdError as e:  # (control characters escaped: it may quote a server)
            click.echo(f"error: {printable(str(e))}", err=True)
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
