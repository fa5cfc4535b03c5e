"""Parse checks per language, before and after an edit (real parsers, no files)."""

from __future__ import annotations

import importlib.util

import pytest

from assistd.edits.validate import broke, validate


@pytest.mark.parametrize("path,good,bad,line", [
    ("m.py", "def f():\n    return 1\n", "def f():\n    return (1\n", 2),
    ("c.json", '{"a": [1, 2]}\n', '{"a": [1, 2],\n}\n', 2),
    ("log.jsonl", '{"a": 1}\n{"b": 2}\n', '{"a": 1}\n{"b": \n', 2),
    ("pyproject.toml", "[tool]\nx = 1\n", "[tool]\nx = \n", 2),
    ("ci.yaml", "a: 1\n---\nb: [2]\n", "a: 1\nb: [2\nc: 3\n", 3),
])
def test_each_parsed_language_accepts_good_text_and_names_the_line_of_bad(path, good, bad,
                                                                         line):
    """Python, JSON, JSON Lines, TOML and YAML (multi-document too): good text is
    checked and ok; broken text is checked, not ok, with "line N: message"."""
    ok, ko = validate(good, path), validate(bad, path)
    assert (ok.checked, ok.ok, ok.error) == (True, True, None)
    assert (ko.checked, ko.ok) == (True, False)
    assert ko.error.startswith(f"line {line}: "), ko.error


def test_an_edit_that_breaks_a_parsing_file_is_the_signal():
    """broke(): parsed before and not after. A file already broken says nothing."""
    good, bad = validate("x = 1\n", "a.py"), validate("x = \n", "a.py")
    assert broke(good, bad) and not broke(bad, bad) and not broke(good, good)
    assert not broke(bad, good)


def test_a_bom_is_not_a_syntax_error():
    """A UTF-8 BOM at the start (Windows editors write one) parses as the readers do."""
    assert validate("\ufeffx = 1\n", "a.py").ok
    assert validate('\ufeff{"a": 1}', "a.json").ok


def test_plain_text_and_unknown_languages_are_unchecked_with_a_reason():
    """Markdown and text have no grammar to hold: unchecked, ok None, and a reason."""
    v = validate("# Title\n\ntext", "README.md")
    assert (v.checked, v.ok, v.language) == (False, None, "markdown")
    assert "no grammar" in v.reason


def _c_grammar() -> bool:
    """Whether a C grammar can load here: tree-sitter with tree-sitter-c, or the language
    pack (whose 1.x releases would still have to download it)."""
    spec = importlib.util.find_spec
    return bool(spec("tree_sitter") and spec("tree_sitter_c")) or bool(
        spec("tree_sitter_language_pack"))


@pytest.mark.skipif(_c_grammar(), reason="a C grammar is installed: C is checked")
def test_without_tree_sitter_other_languages_say_which_package_is_missing():
    """C without tree-sitter and a grammar: unchecked, and the reason names the packages."""
    v = validate("int main(void) { return 0; }\n", "main.c")
    assert (v.checked, v.ok, v.language) == (False, None, "c")
    assert "neither tree-sitter with its grammar wheel nor tree-sitter-language-pack" \
        " is installed" in v.reason


@pytest.mark.skipif(not _c_grammar(), reason="no C grammar installed (tree-sitter-c)")
def test_with_tree_sitter_a_broken_c_file_is_found():
    """With a C grammar installed, a missing brace in C is an error with a line (or, for
    a grammar that cannot load, unchecked with the reason: never a crash)."""
    good = validate("int main(void) { return 0; }\n", "main.c")
    bad = validate("int main(void) {\n  return 0;\n", "main.c")
    if not good.checked:
        assert bad.reason.startswith("no c grammar")
        return
    assert good.ok and bad.ok is False and bad.error == "line 2: missing }"
