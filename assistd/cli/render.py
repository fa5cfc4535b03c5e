"""How every command prints: one JSON object or array with --json, else its human form
(lines or rich tables on stdout); progress goes to stderr. Control characters from a
server are escaped before they reach the terminal."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

import click


def emit(data: Any, as_json: bool, human: Callable[[Any], None] | str) -> None:
    """Print ``data`` as one line of JSON when ``as_json``, else its human form:
    ``human(data)`` when a callable, or the string ``human`` as one line.

    >>> emit({"n": 1}, True, "one")
    {"n": 1}
    >>> emit({"n": 1}, False, lambda d: click.echo(f"n is {d['n']}"))
    n is 1
    """
    if as_json:
        click.echo(json.dumps(data))
    elif callable(human):
        human(data)
    else:
        click.echo(human)


def printable(text: str) -> str:
    """``text`` with control characters escaped, newlines and tabs kept (a message may
    quote a server: assistd.targets.remote.printable)."""
    from assistd.targets.remote import printable as escape

    return "\n".join("\t".join(map(escape, line.split("\t"))) for line in text.split("\n"))


def write_text(text: str) -> None:
    """A completion on stdout, ending in exactly one newline it did not already end in."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def table(columns: dict[str, str], rows, *, title: str | None = None, fold: bool = False) -> None:
    """A rich table on stdout: ``columns`` maps each header to its justification
    ("left" or "right"); ``rows`` are lists of cell strings; ``fold`` wraps long cells."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col, justify in columns.items():
        t.add_column(col, justify=justify, **({"overflow": "fold"} if fold else {}))
    for row in rows:
        t.add_row(*row)
    Console().print(t)


def progress(label: str):
    """A rich progress bar on stderr when it is a terminal, else nothing.

    Returns ``(callback(done, total) or None, close())``."""
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
