"""A real VS Code for the end-to-end tests and the editor benchmark: code-server (pinned,
installed by ``tests/e2e/setup.sh``) with this checkout's extension, driven by Debian's
headless chromium through Playwright (the Python package only; never ``playwright install``).

:class:`VSCode` starts one isolated session: a fresh user-data dir, a fresh git workspace,
``ASSISTD_DB``/``ASSISTD_HOME``/``ASSISTD_CACHE_DIR`` and the XDG dirs under its root
(so the model is cold and the database empty), and the extension's server run as
``assistd lsp --stdio --no-daemon --log-file ROOT/assistd-lsp.log -v``. Its methods are
the page helpers (open a file, go to a line, the ghost text, the command palette, the
status bar) and what the server did (its log, its processes, the stored user acceptance).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from harness.ports import free_port

REPO = Path(__file__).resolve().parents[1]
EXTENSION_SRC = REPO / "editors" / "vscode"
SETUP = "tests/e2e/setup.sh"


def e2e_home() -> Path:
    """Where setup.sh installs: ASSISTD_E2E_HOME, else ${XDG_CACHE_HOME:-~/.cache}/assistd-e2e."""
    if os.environ.get("ASSISTD_E2E_HOME"):
        return Path(os.environ["ASSISTD_E2E_HOME"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "assistd-e2e"


class SetupMissing(RuntimeError):
    """A prerequisite of the e2e tests is not installed; the message says what to run."""


def load_env() -> dict:
    """setup.sh's ``env.json`` (code_server, node_bin, chromium), checked. Raises
    :class:`SetupMissing` when it or a program it names is missing."""
    path = e2e_home() / "env.json"
    try:
        env = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SetupMissing(f"{path}: {e}; run {SETUP} first (installs chromium, Node 20 and"
                           " code-server; see README)") from None
    for key in ("code_server", "chromium"):
        if not os.access(env.get(key, ""), os.X_OK):
            raise SetupMissing(f"{key} {env.get(key)!r} (from {path}) is not a program;"
                               f" run {SETUP} again")
    assistd = REPO / ".venv" / "bin" / "assistd"
    if not os.access(assistd, os.X_OK):
        raise SetupMissing(f"no {assistd}: run ./install.sh dev, then {SETUP}")
    try:
        import playwright  # noqa: F401
    except ImportError:
        raise SetupMissing("the playwright package is missing: ./install.sh dev") from None
    return env


def _tool_env(env: dict) -> dict:
    """The environment for npm and code-server: setup.sh's Node first on PATH."""
    out = dict(os.environ)
    out["PATH"] = f"{env['node_bin']}{os.pathsep}{out.get('PATH', '')}"
    return out


def _source_digest() -> str:
    h = hashlib.sha256()
    files = [EXTENSION_SRC / n for n in ("package.json", "package-lock.json", "tsconfig.json")]
    files += sorted((EXTENSION_SRC / "src").rglob("*"))
    for f in files:
        if f.is_file():
            h.update(f.relative_to(EXTENSION_SRC).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def install_extension(env: dict) -> Path:
    """The extensions dir holding this checkout's editors/vscode, built into a .vsix (npm
    ci, compile, vsce package) and installed into code-server. Cached under the e2e home by
    a digest of the extension's sources, so an edit there is always what gets tested.
    Raises RuntimeError with npm's output when the build fails."""
    root = e2e_home() / "extensions" / _source_digest()
    if (root / ".installed").is_file():
        return root / "ext"
    shutil.rmtree(root, ignore_errors=True)
    build = root / "build"
    shutil.copytree(EXTENSION_SRC, build,
                    ignore=shutil.ignore_patterns("node_modules", "out", "*.vsix"))
    tool_env = _tool_env(env)
    steps = [["npm", "ci", "--no-fund", "--no-audit"], ["npm", "run", "compile"],
             ["npx", "vsce", "package", "--skip-license", "--allow-missing-repository",
              "--out", "assistd.vsix"],
             [env["code_server"], "--extensions-dir", str(root / "ext"), "--user-data-dir",
              str(root / "install-data"), "--install-extension", str(build / "assistd.vsix")]]
    for cmd in steps:
        r = subprocess.run(cmd, cwd=build, env=tool_env, capture_output=True, text=True,
                           timeout=600)
        if r.returncode:
            raise RuntimeError(f"{' '.join(cmd[:3])} failed in {build}:\n"
                               f"{(r.stdout + r.stderr)[-3000:]}")
    (root / ".installed").touch()
    return root / "ext"


GEOMETRY = '''"""Small geometry helpers."""
import math


def circle_area(radius):
    return math.pi * radius * radius


def rectangle_area(width, height):
    return width * height


def square_area(side):
'''
MAIN = '''from geometry import circle_area, rectangle_area


def main():
    print(circle_area(2.0))
    print(rectangle_area(3, 4))


if __name__ == "__main__":
    main()
'''

# The settings a user would write (editors/vscode/README.md); the rest keeps the workbench
# quiet and the word-completion popup out of Tab's way.
BASE_SETTINGS = {
    "workbench.startupEditor": "none",
    "security.workspace.trust.enabled": False,
    "telemetry.telemetryLevel": "off",
    "extensions.autoUpdate": False,
    "extensions.autoCheckUpdates": False,
    "update.mode": "none",
    "workbench.tips.enabled": False,
    "editor.quickSuggestions": {"other": False, "comments": False, "strings": False},
    "editor.suggestOnTriggerCharacters": False,
    "files.autoSave": "off",
}

GHOST = ", ".join(f".monaco-editor .{c}" for c in
                  ("ghost-text-decoration", "ghost-text", "ghost-text-decoration-preview"))
EDITOR = ".editor-group-container.active .monaco-editor .view-lines"
_GHOST_JS = f"""() => [...document.querySelectorAll({json.dumps(GHOST)})]
    .map(e => e.textContent).join('').replace(/\\u00a0/g, ' ')"""
_LINES_JS = """(sel) => {
    const v = document.querySelector(sel);
    if (!v) return null;
    const lines = [...v.querySelectorAll('.view-line')];
    lines.sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top));
    return lines.map(l => l.textContent.replace(/\\u00a0/g, ' ')).join('\\n');
}"""


# One LSP message in the client's trace (the extension's log): its kind, method and body.
TRACE = re.compile(r"^\S+ \S+ \[trace\] (?P<kind>Sending request|Received response|Sending "
                   r"notification|Received notification) '(?P<method>[^']+)'[^\n]*\n"
                   r"(?:(?:Params|Result): (?P<body>.*?))?(?=^\d{4}-\d\d-\d\d \d|\Z)", re.M | re.S)


def _cmdlines():
    """(pid, argv) of every process /proc shows (psutil is not a dependency)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                raw = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if raw:
                yield int(d.name), raw.rstrip(b"\0").decode(errors="replace").split("\0")


class VSCode:
    """One code-server + headless chromium session rooted at ``root`` (created empty).

    ``settings``: more VS Code settings over :data:`BASE_SETTINGS`; ``nice``: code-server's
    nice level (its extension host and the server inherit it); ``shots``: where
    screenshots go (default ROOT/shots). The browser page is blank until
    :meth:`open_workbench` (so that timings can start there). The client's LSP trace
    (``assistd.trace.server: verbose``, code-server at ``--log trace``) is in the
    extension's log file: :meth:`trace` reads it. Raises :class:`SetupMissing` when
    setup.sh has not run, RuntimeError when the extension does not build or code-server
    does not start. Use as a context manager, or call :meth:`close`; code-server runs in
    its own process group, which close() kills (its extension hosts and the servers).
    """

    def __init__(self, root: Path, settings: dict | None = None, *, nice: int = 0,
                 shots: Path | None = None):
        self.env = load_env()
        self.root = Path(root)
        self.extensions = install_extension(self.env)
        self.ws = self.root / "ws"
        self.lsp_log = self.root / "assistd-lsp.log"
        self.home = self.root / "assistd-home"
        self.db = self.home / "history.db"
        self.shots = Path(shots) if shots else self.root / "shots"
        for d in (self.ws, self.home, self.shots, self.root / "data" / "User",
                  self.root / "cache", *(self.root / "xdg" / x for x in ("data", "config", "cache"))):
            d.mkdir(parents=True, exist_ok=True)
        (self.ws / "geometry.py").write_text(GEOMETRY)
        (self.ws / "main.py").write_text(MAIN)
        git = ["git", "-C", str(self.ws), "-c", "user.name=test", "-c", "user.email=test@localhost"]
        subprocess.run(git + ["init", "-q"], check=True)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-qm", "init"], check=True)
        assistd = str(REPO / ".venv" / "bin" / "assistd")
        self.settings = {**BASE_SETTINGS,
                         "assistd.serverPath": assistd,
                         "assistd.trace.server": "verbose",
                         "assistd.serverArgs": ["lsp", "--stdio", "--no-daemon", "--log-file",
                                                str(self.lsp_log), "-v"],
                         **(settings or {})}
        (self.root / "data" / "User" / "settings.json").write_text(json.dumps(self.settings, indent=1))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        env = _tool_env(self.env)
        env.update(ASSISTD_DB=str(self.db), ASSISTD_HOME=str(self.home),
                   ASSISTD_CACHE_DIR=str(self.root / "cache"),
                   ASSISTD_SOCKET=str(self.root / "no-daemon.sock"),
                   XDG_DATA_HOME=str(self.root / "xdg" / "data"),
                   XDG_CONFIG_HOME=str(self.root / "xdg" / "config"),
                   XDG_CACHE_HOME=str(self.root / "xdg" / "cache"))
        env.pop("ASSISTD_CONFIG", None)
        self.cs_log = open(self.root / "code-server.log", "wb")
        self.proc = subprocess.Popen(
            ["nice", "-n", str(nice), self.env["code_server"], "--bind-addr", f"127.0.0.1:{self.port}",
             "--auth", "none", "--user-data-dir", str(self.root / "data"),
             "--extensions-dir", str(self.extensions), "--disable-telemetry",
             "--disable-update-check", "--disable-workspace-trust",
             # the client's LSP trace (assistd.trace.server) goes to its log file
             "--log", "trace", str(self.ws)],
            env=env, stdout=self.cs_log, stderr=subprocess.STDOUT, start_new_session=True)
        self._pw = self.browser = self.page = None
        try:
            self._wait_healthy(120)
            from playwright.sync_api import sync_playwright
            self._pw = sync_playwright().start()
            self.browser = self._pw.chromium.launch(
                executable_path=self.env["chromium"], headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            self.page = self.browser.new_page(viewport={"width": 1400, "height": 900})
            self.page.set_default_timeout(30_000)
        except BaseException:
            self.close()
            raise

    # -- lifetime ------------------------------------------------------------------------

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"code-server exited ({self.proc.returncode}):\n"
                                   f"{self.text(self.root / 'code-server.log')[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.url}healthz", timeout=2).close()
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"code-server not up on {self.url} after {timeout_s:.0f} s")

    def open_workbench(self, timeout_s: float = 120) -> None:
        """Load the workbench on the workspace and wait for the explorer's files."""
        self.page.goto(f"{self.url}?folder={self.ws}", wait_until="domcontentloaded")
        self.page.wait_for_selector(".monaco-workbench", timeout=timeout_s * 1000)
        self.page.wait_for_selector(".explorer-folders-view .monaco-list-row",
                                    timeout=timeout_s * 1000)

    def close(self) -> None:
        for part in (self.browser, self._pw):
            try:
                if part is not None:
                    part.close() if part is self.browser else part.stop()
            except Exception:  # noqa: BLE001 - closing after a failure: the rest must go too
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(15)
        # The servers are in code-server's process group, but a reparented one must not
        # outlive the session either.
        for pid in self.server_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.cs_log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the server ----------------------------------------------------------------------

    @staticmethod
    def text(path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_text(self) -> str:
        """The servers' log (every server of the session appends to the same file)."""
        return self.text(self.lsp_log)

    def log_mark(self) -> int:
        return len(self.log_text())

    def wait_log(self, pattern: str, timeout_s: float, after: int = 0, count: int = 1) -> bool:
        """Whether the log from character ``after`` on matches ``pattern`` ``count`` times
        within ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            if len(re.findall(pattern, self.log_text()[after:])) >= count:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def requests_since(self, mark: int) -> list[str]:
        """The ``source`` of the inline completions the server logged since ``mark``:
        "target", "type-through", "cancelled", ... Not every request: the server's log
        keeps one line per message a minute (assistd.ground.logs.RateLimitFilter)."""
        text = self.log_text()[mark:]
        out = re.findall(r"inlineCompletion \S+: ([a-z-]+), \d+ prompt tokens", text)
        out += ["cancelled"] * len(re.findall(r"inlineCompletion \S+: cancelled after", text))
        return out

    def server_pids(self) -> list[int]:
        """The live ``assistd lsp`` processes of this session (their ``--log-file``)."""
        log = str(self.lsp_log)
        return [pid for pid, argv in _cmdlines()
                if "lsp" in argv and log in argv and not _zombie(pid)]

    def user_acceptance(self) -> dict:
        """What the server stored: per language, shown/accepted/partial/dismissed counts and
        accepted chars (``SuggestionStore.summary``), read from the session's database."""
        from storage.store import HistoryStore
        from storage.suggestions import SuggestionStore

        if not self.db.exists():
            return {}
        store = HistoryStore(self.db)
        try:
            return SuggestionStore(store).summary()
        finally:
            store.close()

    # -- the client's LSP trace (assistd.trace.server, at code-server's --log trace) -------

    def trace_text(self) -> str:
        """The extension's log: vscode-languageclient's trace of every LSP message, all
        extension hosts of the session (a reload starts a new one) in order."""
        files = sorted((self.root / "data" / "logs").glob("*/exthost*/assistd.assistd/assistd.log"),
                       key=lambda f: f.stat().st_mtime)
        return "".join(self.text(f) for f in files)

    def trace(self, kind: str, method: str) -> list:
        """The payloads (Params or Result, parsed; None when absent) of the traced messages
        of ``kind`` ("Sending request", "Received response", "Sending notification",
        "Received notification") whose method starts with ``method``, oldest first."""
        out = []
        for m in TRACE.finditer(self.trace_text()):
            if m["kind"] == kind and m["method"].startswith(method):
                try:
                    out.append(json.loads(m["body"]) if m["body"] else None)
                except ValueError:
                    out.append(None)
        return out

    def last_item(self) -> dict | None:
        """The first item of the last non-empty inline completion answer the client got."""
        for result in reversed(self.trace("Received response", "textDocument/inlineCompletion")):
            items = (result or {}).get("items") if isinstance(result, dict) else result
            if items:
                return items[0]
        return None

    # -- the page ------------------------------------------------------------------------

    def screenshot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        try:
            self.page.screenshot(path=str(path))
        except Exception as e:  # noqa: BLE001 - a failed screenshot must not hide the failure
            path.with_suffix(".txt").write_text(f"screenshot failed: {e}\n")
        return path

    def open_file(self, name: str) -> None:
        """Open ``name`` from the explorer and focus its editor."""
        self.page.locator(f'.explorer-folders-view .monaco-list-row[aria-label^="{name}"]').first.click()
        self.page.wait_for_selector(f'.tab[aria-label^="{name}"]')
        self.page.wait_for_selector(EDITOR)
        self.page.locator(EDITOR).first.click()

    def goto_line(self, line: int, end: bool = True) -> None:
        """Put the cursor on ``line`` (1-based), at its end when ``end``."""
        self.page.keyboard.press("Control+g")
        self.page.wait_for_selector(".quick-input-widget input")
        self.page.keyboard.type(str(line))
        self.page.keyboard.press("Enter")
        if end:
            self.page.keyboard.press("End")

    def ghost(self) -> str:
        """The ghost text on screen ("" when none), spaces as spaces."""
        return self.page.evaluate(_GHOST_JS)

    def wait_ghost(self, timeout_s: float, settle_s: float = 0.5) -> str | None:
        """The ghost text once there is some (after ``settle_s`` more, for multi-line
        suggestions to render), or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ghost().strip():
                time.sleep(settle_s)
                return self.ghost() or None
            time.sleep(0.1)
        return None

    def wait_no_ghost(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.ghost().strip():
                return True
            time.sleep(0.1)
        return False

    def editor_lines(self) -> str | None:
        """The active editor's rendered lines (ghost text included), top to bottom."""
        return self.page.evaluate(_LINES_JS, EDITOR)

    def saved_text(self, name: str = "geometry.py") -> str:
        """Save the active editor (``name`` in the workspace) and return the file as it is on
        disk once the editor is no longer dirty."""
        self.page.keyboard.press("Control+s")
        self.page.wait_for_function(
            "() => !document.querySelector('.tab.active').classList.contains('dirty')",
            timeout=10_000)
        return (self.ws / name).read_text()

    def empty_last_line(self, name: str = "geometry.py") -> None:
        """The cursor on an empty last line of the active editor (a new one after text;
        the editor's auto-indent there removed)."""
        self.page.keyboard.press("Escape")
        self.page.keyboard.press("Control+End")
        if self.saved_text(name).split("\n")[-1]:
            self.page.keyboard.press("Enter")
        for _ in range(3):
            if not self.saved_text(name).split("\n")[-1]:
                return
            self.page.keyboard.press("Shift+Home")
            self.page.keyboard.press("Delete")
        raise AssertionError(f"could not empty the last line of {name}")

    def command(self, title: str) -> None:
        """Run a command by its title from the palette (F1).

        Opening, typing and choosing are retried together: the palette can close between
        opening and typing (focus taken by an editor widget; CI run of stop 43), which left
        ``fill`` waiting 30 s on a hidden input."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        # (focus in a tab list can swallow a key: the other one next)
        for key in ("F1", "Control+Shift+P", "F1", "Control+Shift+P"):
            self.page.keyboard.press("Escape")
            self.page.keyboard.press(key)
            try:
                box = self.page.wait_for_selector(".quick-input-widget input", timeout=5_000)
                box.fill(">" + title, timeout=5_000)
                # The first row must be the command asked for, not a fuzzy neighbour.
                self.page.wait_for_selector(
                    f'.quick-input-list .monaco-list-row[aria-label^="{title}"]', timeout=10_000)
            except PlaywrightTimeout:
                self.page.locator(EDITOR).first.click()
                continue
            self.page.keyboard.press("Enter")
            return
        raise TimeoutError(f"the command palette did not open, or closed, for {title!r}")

    def status_item(self) -> str | None:
        """The text of the status bar item whose text starts with "assistd" (codicons as
        VS Code renders them: a span with the icon's class), else None."""
        return self.page.evaluate("""() => {
            for (const e of document.querySelectorAll('.statusbar-item')) {
                const t = (e.textContent || '').trim();
                if (t.startsWith('assistd')) {
                    const icon = e.querySelector('.codicon');
                    const name = icon ? [...icon.classList].find(c => c.startsWith('codicon-')
                                                                  && c !== 'codicon-modifier-spin') : null;
                    const spin = icon && icon.classList.contains('codicon-modifier-spin') ? '~spin' : '';
                    return (name ? '$(' + name.slice(8) + spin + ') ' : '') + t;
                }
            }
            return null;
        }""")

    def tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log, for a failure message."""
        return "\n".join(self.log_text().splitlines()[-n:])

    def failure_report(self, name: str) -> str:
        """A screenshot now (its path), the status bar item, the servers alive and the server
        log's tail: what tests/e2e/conftest.py adds to a failing test's report."""
        shot = self.screenshot(f"FAILED-{name}")
        try:
            status = self.status_item()
        except Exception as e:  # noqa: BLE001 - the page may be what broke
            status = f"? ({e})"
        return (f"screenshot: {shot}\nall screenshots: {self.shots}\nsession: {self.root}"
                f" (server log {self.lsp_log}, client trace under {self.root / 'data' / 'logs'})\n"
                f"status bar: {status!r}; server processes: {self.server_pids()}\n"
                f"server log, last lines:\n{self.tail()}")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
