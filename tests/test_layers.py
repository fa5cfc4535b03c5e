"""The floors of the house, enforced: every import goes down, and no import cycles.

One sentence (docs/design.md says it at length): ground <- targets <- storage, proposers
<- decoding <- runtime <- serving, measure <- editors <- the CLI. A module imports its
own room and the floors below it, never a room beside it or above it. Imports inside
functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("assistd", "storage", "proposers", "editors")

# room -> floor; rooms on one floor do not import each other.
FLOORS = {
    "ground": 0, "targets": 1, "storage": 2, "proposers": 2, "decoding": 3, "runtime": 4,
    "edits": 4, "fleet": 4,
    "serving": 5, "measure": 5, "editors": 6, "roof": 7,
}


def room(module: str) -> str:
    top, _, rest = module.partition(".")
    if top != "assistd":
        return top
    sub = rest.partition(".")[0]
    if sub in ("cli", "__main__"):
        return "roof"
    if sub == "":
        return "ground"  # assistd/__init__.py: the version only
    return sub


def modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports_of(path: Path, name: str, known: set[str], unresolved: list | None = None) -> set[str]:
    """Project modules that ``path`` imports, anywhere in the file. A ``from X import``
    of a project module X that does not exist goes to ``unresolved``."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` names a submodule when one exists, else a name of pkg.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
            if (unresolved is not None and base.partition(".")[0] in PACKAGES
                    and base not in known):
                unresolved.append(f"{name}: from {base} import ...")
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, name, set(mods)) for name, path in mods.items()}


def test_every_project_import_resolves():
    """A lazy import of a module that moved fails only when it runs: catch it here."""
    mods, missing = modules(), []
    for name, path in mods.items():
        imports_of(path, name, set(mods), missing)
    assert not missing, missing


def test_room_names_cover_every_module():
    """A new folder under assistd/ must be given a floor here, not slip through."""
    assert {room(m) for m in modules()} <= set(FLOORS)


def test_every_import_goes_down_or_stays_in_its_room():
    """An import into another room must reach a lower floor in FLOORS; one to the same floor or
    above is listed as "mod (room) imports dep (room)"."""
    bad = []
    for mod, deps in graph().items():
        for dep in deps:
            a, b = room(mod), room(dep)
            if a != b and FLOORS[b] >= FLOORS[a]:
                bad.append(f"{mod} ({a}) imports {dep} ({b})")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph: all of size one."""
    g = graph()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_rule_catches_a_violation(tmp_path):
    """The walker sees a lazy upward import (a test that cannot fail is a defect)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from assistd.runtime.session import complete_at\n")
    deps = imports_of(f, "storage.m", {"assistd.runtime.session", "assistd.runtime", "storage.m"})
    assert deps == {"assistd.runtime.session"}
    assert FLOORS[room("assistd.runtime.session")] > FLOORS[room("storage.m")]


# The front ends: the CLI, the serving layer (daemon, API, MCP), the editors, and the
# shell front end's helper. They reach generation only through the runtime.
FRONT_ENDS = ("assistd.cli", "assistd.serving", "editors", "assistd.runtime.session")
ENGINE_PARTS = ("assistd.decoding.engine", "assistd.decoding.tuner", "proposers",
                "proposers.index", "storage.ledger_store")


def test_every_front_end_reaches_generation_through_the_runtime():
    """No front end assembles an engine of its own (engine loop, tuner, proposers, history
    index, ledger store): each goes through assistd.runtime.runtime.Runtime."""
    g = graph()
    front = {m: deps for m, deps in g.items() if m.startswith(FRONT_ENDS)}
    bad = [f"{m} imports {d}" for m, deps in front.items() for d in deps
           if d in ENGINE_PARTS and not (m == "assistd.runtime.session"
                                         and d == "assistd.decoding.engine")]
    assert not bad, "\n".join(sorted(bad))  # session.py names the Generation type only
    users = {m for m, deps in front.items() if "assistd.runtime.runtime" in deps}
    for family in ("assistd.serving", "editors", "assistd.runtime.session"):
        assert any(m.startswith(family) for m in users), f"{family} does not use the Runtime"


def test_the_cli_package_is_walked_whole():
    """assistd/cli/ is a package of one module per command family: each module (not only
    its __init__) is on the roof and under the front-end rule above."""
    cli = [m for m in modules() if m.startswith("assistd.cli.")]
    assert {"assistd.cli.complete", "assistd.cli.render", "assistd.cli.target"} <= set(cli)
    assert all(room(m) == "roof" and m.startswith(FRONT_ENDS) for m in cli)


def test_every_benchmark_compiles():
    """The benchmarks are scripts few tests import: at least they must parse (a quote
    edited into a string once broke one unnoticed), benchmarks/gpu/ included."""
    paths = sorted((REPO / "benchmarks").rglob("*.py"))
    assert any(p.parent.name == "gpu" for p in paths)
    for path in paths:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")


def top_packages(path: Path) -> set[str]:
    """The top-level names ``path`` imports, anywhere in the file (lazy imports too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {a.name.partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
            for a in n.names} | {n.module.partition(".")[0] for n in ast.walk(tree)
                                 if isinstance(n, ast.ImportFrom) and n.module and not n.level}


def test_benchmarks_import_no_test_module_and_products_no_rig(tmp_path):
    """The benchmarks share the tests' rig (starting a daemon, a server, an LSP session,
    VS Code) through harness/, never by importing ``tests``; product code imports neither.
    The scan sees a lazy import (checked on a planted file first)."""
    planted = tmp_path / "b.py"
    planted.write_text("def main():\n    from tests.daemon_helpers import start_daemon\n")
    assert "tests" in top_packages(planted)
    bad = [f"{p.relative_to(REPO)} imports tests" for p in sorted((REPO / "benchmarks").rglob("*.py"))
           if "tests" in top_packages(p)]
    bad += [f"{name} imports {pkg}" for name, path in modules().items()
            for pkg in sorted(top_packages(path) & {"tests", "harness"})]
    assert not bad, "\n".join(bad)
