"""Does a text still parse for its language? The check an edit's result gets, before and after.

Parsers, by the file's LSP language id (:func:`assistd.ground.languages.language_id`):
Python ``ast.parse`` (the grammar of the Python running assistd: a file using newer
syntax fails before and after alike), JSON ``json`` (``.jsonl``: each line), TOML
``tomllib``, YAML ``yaml.safe_load_all`` (multi-document files). Other languages go to
tree-sitter when it is importable with the language's grammar wheel
(``tree-sitter-c``, ``tree-sitter-typescript``, ...) or ``tree-sitter-language-pack``;
neither is a dependency, so without them they come back unchecked, with the reason (so
does a grammar that fails to load). The language pack's 1.x releases download grammars
on first use: only one already downloaded is used, nothing is fetched from here. A
leading UTF-8 BOM is ignored (Python's and JSON's readers drop it too).

The signal for an edit is the pair: a file that parsed before and does not after
(:func:`broke`). A file that did not parse before says nothing about the edit.
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from dataclasses import asdict, dataclass
from pathlib import PurePath

from assistd.ground.languages import language_id

# LSP language id -> tree-sitter-language-pack's grammar name, for the optional fallback.
TREE_SITTER = {
    "javascript": "javascript", "javascriptreact": "javascript", "typescript": "typescript",
    "typescriptreact": "tsx", "c": "c", "cpp": "cpp", "csharp": "csharp", "go": "go",
    "rust": "rust", "java": "java", "kotlin": "kotlin", "scala": "scala", "swift": "swift",
    "ruby": "ruby", "php": "php", "lua": "lua", "shellscript": "bash", "html": "html",
    "css": "css", "scss": "scss", "haskell": "haskell", "ocaml": "ocaml", "elixir": "elixir",
    "julia": "julia", "dart": "dart", "zig": "zig", "sql": "sql", "hcl": "hcl",
    "terraform": "hcl", "xml": "xml", "jsonc": "json", "dockerfile": "dockerfile",
    "makefile": "make", "cmake": "cmake", "proto": "proto", "graphql": "graphql",
}
# Grammar wheels whose module or function is not tree_sitter_<grammar>:language.
GRAMMAR_WHEELS = {
    "typescript": "tree_sitter_typescript:language_typescript",
    "tsx": "tree_sitter_typescript:language_tsx", "csharp": "tree_sitter_c_sharp:language",
    "php": "tree_sitter_php:language_php", "ocaml": "tree_sitter_ocaml:language_ocaml",
    "xml": "tree_sitter_xml:language_xml",
}
PLAIN = ("plaintext", "markdown", "restructuredtext", "ignore", "diff")
_TOML_AT = re.compile(r"^(.*) \(at line (\d+), column (\d+)\)$")


@dataclass(frozen=True)
class Validation:
    """One parse check. ``checked``: a parser ran; ``ok``: it accepted the text (None
    when unchecked); ``language``: the LSP language id; ``error``: ``"line N: message"``
    when ``ok`` is False; ``reason``: why it was not checked."""

    checked: bool
    ok: bool | None
    language: str
    error: str | None = None
    reason: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def broke(before: Validation, after: Validation) -> bool:
    """Whether an edit broke the file: it parsed before and does not after."""
    return before.ok is True and after.ok is False


def _python(text: str) -> str | None:
    try:
        ast.parse(text)
    except SyntaxError as e:
        return f"line {e.lineno or 1}: {e.msg}"
    return None


def _json(text: str) -> str | None:
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        return f"line {e.lineno}: {e.msg} (column {e.colno})"
    return None


def _json_lines(text: str) -> str | None:
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                json.loads(line)
            except json.JSONDecodeError as e:
                return f"line {n}: {e.msg} (column {e.colno})"
    return None


def _toml(text: str) -> str | None:
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = _TOML_AT.match(str(e))  # Python 3.11's message: "What (at line N, column M)"
        if m:
            return f"line {m.group(2)}: {m.group(1)} (column {m.group(3)})"
        return f"line {text.count(chr(10)) + 1}: {e}"  # "(at end of document)"
    return None


def _yaml(text: str) -> str | None:
    import yaml

    try:
        for _ in yaml.safe_load_all(text):
            pass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = e.problem or e.context or "invalid YAML"
        return f"line {mark.line + 1 if mark else 1}: {what}"
    except yaml.YAMLError as e:
        return f"line 1: {e}"
    return None


class _NotDownloaded(ImportError):
    """The language pack is installed without this grammar on disk."""


def _parser(grammar: str):
    """A tree-sitter parser for ``grammar``: from its own grammar wheel
    (``tree_sitter_c``, ``tree_sitter_typescript``' ``language_tsx``, ...) when installed,
    else from ``tree_sitter_language_pack`` (a grammar it already holds). Raises
    ImportError when neither is there."""
    import importlib

    module, _, function = GRAMMAR_WHEELS.get(grammar, f"tree_sitter_{grammar}:language"
                                             ).partition(":")
    try:
        from tree_sitter import Language, Parser

        return Parser(Language(getattr(importlib.import_module(module), function)()))
    except ImportError:
        import tree_sitter_language_pack as pack

        # Its 1.x releases fetch a grammar from the network on first use: never from here
        # (a local daemon makes no requests of its own); only one already on disk is used.
        if hasattr(pack, "downloaded_languages") and grammar not in pack.downloaded_languages():
            raise _NotDownloaded(grammar) from None
        return pack.get_parser(grammar)


def _tree_sitter(text: str, grammar: str) -> str | None:
    """The first MISSING or ERROR node's line and text, or None when the tree is clean.
    Raises ImportError when no grammar for it is installed."""
    root = _parser(grammar).parse(text.encode("utf-8")).root_node
    if not root.has_error:
        return None
    stack = [root]
    while stack:
        node = stack.pop()
        if node.is_missing:
            return f"line {node.start_point[0] + 1}: missing {node.type}"
        if node.is_error:
            near = node.text.decode("utf-8", "replace").strip().splitlines()
            return f"line {node.start_point[0] + 1}: syntax error near {(near or [''])[0][:40]!r}"
        stack.extend(reversed([c for c in node.children if c.has_error or c.is_missing]))
    return f"line 1: syntax error ({grammar})"


_CHECKS = {"python": _python, "json": _json, "toml": _toml, "yaml": _yaml}


def validate(text: str, path: str | PurePath) -> Validation:
    """Parse ``text`` as the language of ``path``'s name (the file is not read).

    Returns a :class:`Validation`; never raises for bad input (a parser's error is the
    answer). Unchecked: plain text and markup with no grammar to hold, and languages
    without a parser here (the reason names the missing package).

    >>> validate("x = (1,\\n", "a.py").error
    "line 1: '(' was never closed"
    >>> validate("{}", "a.json").ok, validate("hi", "notes.txt").checked
    (True, False)
    """
    language = language_id(path)
    text = text.removeprefix("\ufeff")
    if PurePath(path).suffix.lower() == ".jsonl":
        check = _json_lines
    else:
        check = _CHECKS.get(language)
    if check is None and language in PLAIN:
        return Validation(False, None, language, reason=f"{language}: no grammar to check")
    try:
        if check is not None:
            error = check(text)
        elif language in TREE_SITTER:
            error = _tree_sitter(text, TREE_SITTER[language])
        else:
            return Validation(False, None, language, reason=f"no parser for {language}")
    except _NotDownloaded:
        return Validation(False, None, language, reason=(
            f"no parser for {language} here: tree-sitter-language-pack has not downloaded its"
            " grammar (assistd fetches none; its download() can)"))
    except ImportError:
        return Validation(False, None, language, reason=(
            f"no parser for {language} here: neither tree-sitter with its grammar wheel"
            " nor tree-sitter-language-pack is installed"))
    except (RecursionError, MemoryError):  # nesting too deep for the parser
        return Validation(False, None, language, reason="too deeply nested to parse")
    except ValueError as e:  # e.g. ast's "source code string cannot contain null bytes"
        if check is None:  # the grammar's setup, not the text
            return Validation(False, None, language, reason=f"no {language} grammar: {e}")
        return Validation(True, False, language, error=f"line 1: {e}")
    except Exception as e:  # noqa: BLE001 - a grammar that cannot load (the language pack
        # 1.x fetches grammars from the network on first use): unchecked, not a failure
        return Validation(False, None, language,
                          reason=f"no {language} grammar: {type(e).__name__}: {str(e)[:120]}")
    return Validation(True, error is None, language, error=error)
