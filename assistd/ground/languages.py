"""File name -> LSP language identifier.

Identifiers are the ones listed in the LSP specification ("Text Document Item",
language identifiers table), so the history, the tuner and editors agree on them.
Unknown extensions map to "plaintext".
"""

from pathlib import PurePath

_BY_SUFFIX = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".jsx": "javascriptreact", ".ts": "typescript", ".mts": "typescript",
    ".cts": "typescript", ".tsx": "typescriptreact",
    ".json": "json", ".jsonc": "jsonc", ".jsonl": "json",
    ".md": "markdown", ".markdown": "markdown", ".rst": "restructuredtext",
    ".txt": "plaintext", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml",
    ".ini": "ini", ".cfg": "ini", ".xml": "xml", ".html": "html", ".htm": "html",
    ".css": "css", ".scss": "scss", ".less": "less",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp",
    ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp", ".cs": "csharp",
    ".go": "go", ".rs": "rust", ".java": "java", ".kt": "kotlin", ".kts": "kotlin",
    ".scala": "scala", ".swift": "swift", ".m": "objective-c", ".mm": "objective-cpp",
    ".rb": "ruby", ".php": "php", ".pl": "perl", ".pm": "perl", ".lua": "lua",
    ".r": "r", ".jl": "julia", ".dart": "dart", ".ex": "elixir", ".exs": "elixir",
    ".erl": "erlang", ".hs": "haskell", ".ml": "ocaml", ".mli": "ocaml",
    ".clj": "clojure", ".fs": "fsharp", ".vb": "vb", ".sql": "sql",
    ".sh": "shellscript", ".bash": "shellscript", ".zsh": "shellscript",
    ".ps1": "powershell", ".bat": "bat", ".cmd": "bat",
    ".tex": "latex", ".bib": "bibtex", ".vue": "vue", ".svelte": "svelte",
    ".zig": "zig", ".nim": "nim", ".groovy": "groovy", ".gradle": "groovy",
    ".proto": "proto", ".graphql": "graphql", ".tf": "terraform",
    ".diff": "diff", ".patch": "diff",
}

_BY_NAME = {
    "Dockerfile": "dockerfile", "Makefile": "makefile", "makefile": "makefile",
    "GNUmakefile": "makefile", "CMakeLists.txt": "cmake", ".gitignore": "ignore",
    "Jenkinsfile": "groovy",
}


def language_id(path: str | PurePath) -> str:
    """LSP language id for a file name, e.g. ``"src/app.py"`` -> ``"python"``.

    >>> language_id("a/b/Makefile"), language_id("x.TSX"), language_id("notes")
    ('makefile', 'typescriptreact', 'plaintext')
    """
    p = PurePath(path)
    if p.name in _BY_NAME:
        return _BY_NAME[p.name]
    return _BY_SUFFIX.get(p.suffix.lower(), "plaintext")
