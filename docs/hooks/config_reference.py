"""mkdocs hook: the configuration reference, rendered from the settings classes.

A page that holds the line ``<!-- config-reference -->`` gets, in its place, one table
per section of the daemon's settings, :class:`assistd.serving.config.Config`, and of the
Target's settings it nests (``assistd.targets.spec.TargetSpec``, whose keys the config
file takes flat): key, type, default, environment variable, the ``assistd serve`` flag,
and what it is (the field's description, else the help of the option named after it,
else the comment written beside the field in the code). Nothing here is hand-written,
so the page cannot drift from the code; ``tests/test_docs.py`` checks that every key
appears in the built page.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import io
import json
import re
import tokenize
import typing

MARKER = "<!-- config-reference -->"
HEADER = ("| key | type | default | environment | `serve` flag | what it is |\n"
          "|---|---|---|---|---|---|")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())


def render() -> str:
    """The Markdown that replaces :data:`MARKER`."""
    from assistd.serving.config import Config

    options = _options()
    nested: list[type] = []
    text = _dataclass_tables(Config, options, nested)
    spec = _target_spec()
    if spec is not None and spec not in nested:  # a TargetSpec the daemon does not nest yet
        text += "\n\n### Target specification\n\n" + _pydantic_rows(spec, options)
    return text


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell (``<runtime dir>`` is no HTML tag)."""
    text = " ".join(str(text).split())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "\\|")


def _options() -> dict[str, tuple[str, str]]:
    """{setting: (flag, help)}: the option of ``assistd serve`` named after the setting,
    else the first command's (``complete`` takes ``--threads``, ``--device``, ...)."""
    import click

    from assistd.cli import cli

    found: dict[str, tuple[str, str]] = {}
    for command in [cli.commands["serve"], *cli.commands.values()]:
        for p in command.params:
            if not p.opts or not p.opts[0].startswith("--") or p.name in found:
                continue
            text = " ".join((getattr(p, "help", None) or "").split())
            if not text and isinstance(p.type, click.Choice):
                text = "One of " + ", ".join(map(str, p.type.choices)) + "."
            found[p.name] = (p.opts[0] if command.name == "serve" else "", text)
    return found


def _kind(annotation) -> str:
    """A type for people: ``str | None`` -> string, ``Literal['a', 'b']`` -> a, b."""
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    text = annotation if isinstance(annotation, str) else getattr(
        annotation, "__name__", str(annotation))
    text = re.sub(r"\s*\|\s*None", "", str(text))
    text = re.sub(r"\b\w+\.", "", text)  # pydantic.types.SecretStr -> SecretStr
    return {"str": "string", "int": "integer", "bool": "boolean", "float": "number",
            "list[str]": "list of strings", "SecretStr": "string (secret)"}.get(text, text)


def _field_comments(cls) -> tuple[dict[str, str], dict[str, str]]:
    """({field: its comment}, {field: the section it opens}) read from ``cls``'s source.

    A field's comment is the comment lines right above it plus the one at the end of its
    line; a one-word comment line (``# logs``) names the section of the fields below.
    """
    source = inspect.getsource(cls)
    lines = source.splitlines()
    trailing = {t.start[0]: t.string.lstrip("# ").strip()
                for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT and not lines[t.start[0] - 1].strip().startswith("#")}
    comments: dict[str, str] = {}
    sections: dict[str, str] = {}
    pending: list[str] = []
    section = None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("#"):
            text = stripped.lstrip("# ").strip()
            if text and " " not in text:
                section, pending = text, []
            else:
                pending.append(text)
            continue
        name = stripped.split(":", 1)[0]
        if ":" in stripped and name.isidentifier() and not stripped.startswith(("def ", "class ")):
            comments[name] = " ".join(w for w in [*pending, trailing.get(number, "")] if w)
            if section is not None:
                sections[name], section = section, None
        pending = []
    return comments, sections


def _row(name: str, kind: str, default: str, env: str, options, what: str) -> str:
    flag, help_text = options.get(name, ("", ""))
    return (f"| `{name}` | {kind} | {default} | `{env}` | {f'`{flag}`' if flag else ''} "
            f"| {_cell(what or help_text)} |")


def _shown(value) -> str:
    return "unset" if value is None else f"`{json.dumps(value)}`"


def _dataclass_tables(cls, options, nested: list[type]) -> str:
    """One table per section of the dataclass ``cls``; a field whose default is a settings
    model (pydantic) becomes that model's own section, appended to ``nested``."""
    comments, sections = _field_comments(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if hasattr(type(default), "model_fields"):  # the Target's settings, keys flat
            nested.append(type(default))
            out.append(f"\n### {f.name.capitalize()}\n\n" + _pydantic_rows(type(default), options))
            continue
        if f.name in sections or not out or out[-1].startswith("\n### Target"):
            title = sections.get(f.name, "daemon")
            out.append(f"\n### {title[0].upper() + title[1:]}\n\n{HEADER}")
        comment = comments.get(f.name, "")
        shown = "required" if default is dataclasses.MISSING else _shown(default)
        if default is None and "None = " in comment:  # "None = <runtime dir>/assistd.sock"
            shown = "unset: " + _cell(comment.split("None = ", 1)[1].split(";")[0])
        # the flag's help first, else the comment in the code
        what = options.get(f.name, ("", ""))[1] or comment.replace("None = ", "unset: ")
        out.append(_row(f.name, _kind(f.type), shown, f"ASSISTD_{f.name.upper()}", options, what))
    return "\n".join(out).lstrip()


def _target_spec():
    """``assistd.targets.spec.TargetSpec`` when that module exists, else None."""
    try:
        module = importlib.import_module("assistd.targets.spec")
    except ImportError:
        return None
    return getattr(module, "TargetSpec", None)


def _pydantic_rows(model, options) -> str:
    """The docstring's first paragraph, then a table of the settings model's fields."""
    prefix = (getattr(model, "model_config", {}) or {}).get("env_prefix", "")
    doc = (inspect.getdoc(model) or "").split("\n\n")[0]
    doc = re.sub(r"``([^`]+)``", r"`\1`", " ".join(doc.split()))
    rows = [doc, "", HEADER] if doc else [HEADER]
    for name, field in model.model_fields.items():
        if field.is_required():
            shown = "required"
        else:
            value = field.get_default(call_default_factory=True)
            shown = _shown(value) if isinstance(value, (str, int, float, bool, type(None), list)) \
                else f"`{value}`"
        rows.append(_row(name, _kind(field.annotation), shown, f"{prefix}{name}".upper(),
                         options, field.description or ""))
    return "\n".join(rows)
