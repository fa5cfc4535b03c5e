"""The documentation: the site builds strictly, its generated references cover the code,
the README keeps its shape, and the service units run what the daemon expects.

The site is built once per module by the real ``mkdocs build --strict`` (mkdocs-click
imports the real CLI; the hook reads the real settings classes) and its HTML is read
back, so these tests check what a reader gets, not the Markdown sources.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import plistlib
import re
import shlex
import subprocess
import sys
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
MAIN_COMMAND = ("./install.sh && .venv/bin/assistd complete --file assistd/decoding/engine.py"
                " --line 76 --column 1")
TEST_COMMAND = "./install.sh dev && .venv/bin/python -m pytest"
SYSTEMD_UNIT = REPO / "packaging" / "systemd" / "assistd.service"
LAUNCHD_PLIST = REPO / "packaging" / "launchd" / "local.assistd.plist"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built by ``mkdocs build --strict`` (any warning fails the build)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    return out


class _Sections(HTMLParser):
    """The text of an HTML page, cut at every heading that has an id: {id: text}."""

    def __init__(self):
        super().__init__()
        self.sections: dict[str, list[str]] = {"": []}
        self.current = ""

    def handle_starttag(self, tag, attrs):
        anchor = dict(attrs).get("id")
        if re.fullmatch(r"h[1-6]", tag) and anchor:
            self.current = anchor
            self.sections[anchor] = []

    def handle_data(self, data):
        self.sections[self.current].append(data)


def _sections(page: Path) -> dict[str, str]:
    parser = _Sections()
    parser.feed(page.read_text(encoding="utf-8"))
    return {k: " ".join(v) for k, v in parser.sections.items()}


def _commands(group, prefix=("assistd",)):
    """(path, command) for every command of the click tree, groups included."""
    import click

    for name, command in group.commands.items():
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


def _config_keys() -> list[str]:
    """Every key the config file takes: the daemon's settings, and the Target's settings
    they nest (flat in the file), plus ``assistd.targets.spec.TargetSpec`` where present."""
    from assistd.serving import config

    keys: list[str] = []
    for f in dataclasses.fields(config.Config):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        keys += list(type(default).model_fields) if hasattr(type(default), "model_fields") else [f.name]
    try:
        from assistd.targets.spec import TargetSpec
    except ImportError:  # before the Target's settings had a class of their own
        TargetSpec = None
    if TargetSpec is not None:
        keys += [k for k in TargetSpec.model_fields if k not in keys]
    return keys


def test_site_builds_strictly(site):
    """`mkdocs build --strict` succeeds (no broken link or anchor, both references render)
    and writes every page of the nav, the generated ones included."""
    for page in ("index.html", "install/index.html", "reference/cli/index.html",
                 "reference/config/index.html", "daemon/index.html", "changelog/index.html"):
        assert (site / page).is_file(), page


def test_every_page_is_in_the_nav():
    """A page under docs/ that the nav leaves out is unreachable from the site's menu."""
    nav = (REPO / "mkdocs.yml").read_text()
    pages = [p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")]
    missing = [p for p in pages if f" {p}" not in nav]
    assert not missing, f"mkdocs.yml's nav lacks {missing}"


def test_cli_reference_lists_every_option_of_every_command(site):
    """Walking the click tree of `assistd`: each command has its own section in the built
    CLI reference, and each of its options appears in that section."""
    from assistd.cli import cli

    sections = _sections(site / "reference" / "cli" / "index.html")
    for path, command in _commands(cli):
        anchor = "-".join(path)
        assert anchor in sections, f"the CLI reference has no section for {' '.join(path)}"
        for param in command.params:
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("-") and opt not in ("-h", "--help"):
                    assert opt in sections[anchor], f"{' '.join(path)} {opt} is not in the CLI reference"


def test_config_reference_lists_every_key(site):
    """Every key the code reads from the config file is a row of the built configuration
    reference, with its environment variable."""
    html = (site / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    keys = _config_keys()
    assert "n_ctx" in keys and "socket" in keys and "log_file" in keys
    for key in keys:
        assert f"<code>{key}</code>" in html, f"config key {key} is not in the reference"
        assert f"<code>ASSISTD_{key.upper()}</code>" in html, key


def test_readme_is_short_and_starts_with_the_two_commands():
    """README stays under 250 lines; its first two code blocks are the main job and the
    test command, and the test command is the one under the test-command marker."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    assert [b.strip() for b in blocks[:2]] == [MAIN_COMMAND, TEST_COMMAND]
    marked = readme[readme.index("<!-- test-command -->"):].split("```", 2)[1]
    assert marked.removeprefix("sh").strip() == TEST_COMMAND
    assert "<!-- e2e-command -->" in readme


def _clean_env(monkeypatch, tmp_path, **xdg):
    """No ASSISTD_* setting and no user config file: the daemon's defaults."""
    for name in list(os.environ):
        if name.startswith("ASSISTD_") or name.startswith("XDG_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name, value in xdg.items():
        monkeypatch.setenv(name, str(value))


def _named_paths(text: str) -> dict[str, str]:
    """{'socket': ..., 'log': ..., 'config': ...} from a unit's comment lines."""
    return {m[1]: m[2].strip() for m in re.finditer(r"^[#\s]*(socket|log|config):\s+(.+)$", text, re.M)}


def _script_name() -> str:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    (name,) = [n for n, target in scripts.items() if target.startswith("assistd.cli")]
    return name


def test_systemd_unit_runs_serve_on_the_daemons_own_paths(monkeypatch, tmp_path):
    """packaging/systemd/assistd.service runs `assistd serve`, and the socket, log and
    config it names (%t, %S, %E: the XDG runtime, state and config dirs) are the ones
    the daemon and its clients compute with those XDG variables set."""
    from assistd.cli import cli
    from assistd.serving.client import socket_path
    from assistd.serving.config import default_config_file, load_config

    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str
    unit.read(SYSTEMD_UNIT)
    argv = shlex.split(unit["Service"]["ExecStart"])
    assert Path(argv[0]).name == _script_name() and argv[1:] == ["serve"]
    assert "serve" in cli.commands and unit["Install"]["WantedBy"] == "default.target"

    run, state, conf = tmp_path / "run", tmp_path / "state", tmp_path / "conf"
    run.mkdir()
    _clean_env(monkeypatch, tmp_path, XDG_RUNTIME_DIR=run, XDG_STATE_HOME=state,
               XDG_CONFIG_HOME=conf)
    named = _named_paths(SYSTEMD_UNIT.read_text())
    expand = {"%t": str(run), "%S": str(state), "%E": str(conf)}
    expanded = {k: Path(re.sub(r"%[tSE]", lambda m: expand[m[0]], v)) for k, v in named.items()}
    config, _ = load_config()
    assert expanded == {"socket": config.socket_path(), "log": config.log_path(),
                        "config": default_config_file()}
    assert socket_path() == expanded["socket"]  # where `assistd status` looks

    # The daemon page's Linux column names the same paths.
    daemon_page = (REPO / "docs" / "daemon.md").read_text()
    shown = {"%t": "$XDG_RUNTIME_DIR", "%S": "~/.local/state", "%E": "~/.config"}
    for value in named.values():
        assert re.sub(r"%[tSE]", lambda m: shown[m[0]], value) in daemon_page, value


def test_launchd_agent_runs_serve_on_the_daemons_own_macos_paths(monkeypatch, tmp_path):
    """packaging/launchd/local.assistd.plist runs `assistd serve`, and the socket, log and
    config it names are the daemon's defaults on macOS. platformdirs' macOS class is put
    in place of this platform's (the one substitution: the code under test is the
    daemon's own path logic, which asks platformdirs for the user dirs)."""
    import platformdirs
    from platformdirs.macos import MacOS

    from assistd.serving.config import default_config_file, load_config

    with LAUNCHD_PLIST.open("rb") as f:
        plist = plistlib.load(f)
    assert plist["Label"] == LAUNCHD_PLIST.stem
    argv = shlex.split(plist["ProgramArguments"][-1])
    assert argv[0] == "exec" and Path(argv[1]).name == _script_name() and argv[2:] == ["serve"]

    _clean_env(monkeypatch, tmp_path)  # launchd sets no XDG_RUNTIME_DIR
    home = tmp_path / "home"
    for name in ("user_cache_dir", "user_log_dir", "user_config_dir"):
        monkeypatch.setattr(platformdirs, name,
                            lambda appname, appauthor=None, _n=name: getattr(
                                MacOS(appname, appauthor=appauthor), _n))
    named = _named_paths(LAUNCHD_PLIST.read_text())
    expanded = {k: Path(v.replace("~", str(home), 1)) for k, v in named.items()}
    config, _ = load_config()
    assert expanded == {"socket": config.socket_path(), "log": config.log_path(),
                        "config": default_config_file()}
    daemon_page = (REPO / "docs" / "daemon.md").read_text()
    for value in named.values():
        assert value in daemon_page, value
