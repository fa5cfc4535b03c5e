--- Neovim 0.12+: suggestions through native inline completion
--- (vim.lsp.inline_completion, textDocument/inlineCompletion).
---
--- Acceptance needs nothing from us: on accept, Neovim's inline completion runs
--- the item's command (`assistd.accepted` with the suggestion id) through
--- client:exec_cmd(), which sends workspace/executeCommand to the server.
--- Partial accepts go through get({ on_accept = ... }), which hands us the item
--- instead of inserting it: we insert a word or a line and report it; Neovim
--- then asks again at the new cursor and shows the rest as a new answer.
---
--- Neovim has no "shown" or "dismissed" hook, and its inline completion
--- passes its own response handler to client:request(). To see which
--- suggestion is on screen we wrap request() on the assistd client only:
---   shown     = the first item of a response that arrives in insert mode
---               (Neovim presents item 1; a candidate reached by cycling with
---               select() is not reported);
---   dismissed = a shown suggestion that was not accepted when an empty or
---               different response replaces it, or when insert mode ends.
--- With a second inline-completion server on the same buffer, Neovim may
--- present that server's item first; the events are then approximate.

local config = require('assistd.config')
local lsp = require('assistd.client')
local text = require('assistd.text')

local api = vim.api

local M = {}

-- vim.lsp.inline_completion only exists from Neovim 0.12 on.
local has_ic, inline_completion = pcall(require, 'vim.lsp.inline_completion')
M.available = has_ic

local shown ---@type { client: vim.lsp.Client, id: string }?

local function set_shown(client, id)
  if shown and shown.id == id then
    return
  end
  if shown then
    lsp.send(shown.client, lsp.DISMISSED, shown.id)
  end
  shown = id and { client = client, id = id } or nil
  if shown then
    lsp.send(client, lsp.SHOWN, id)
  end
end

local function observe(client)
  if client._assistd_observed then
    return
  end
  client._assistd_observed = true
  local request = client.request
  client.request = function(self, method, params, handler, ...)
    if method == 'textDocument/inlineCompletion' and handler then
      local present = handler
      handler = function(err, result, ...)
        local ret = present(err, result, ...)
        -- Neovim keeps the current text on a null result and ignores results
        -- outside insert mode; it replaces it with whatever a list holds.
        if not err and type(result) == 'table' and api.nvim_get_mode().mode:sub(1, 1) == 'i' then
          local items = result.items or result
          set_shown(self, lsp.suggestion_id(items[1]))
        end
        return ret
      end
    elseif
      method == 'workspace/executeCommand'
      and type(params) == 'table'
      and params.command == lsp.ACCEPTED
    then
      shown = nil -- accepted; the command itself tells the server
    end
    return request(self, method, params, handler, ...)
  end
end

-- on_accept for get(): inserts the next word or line of the native item.
-- Its range is a vim.Range (0-based rows, byte columns), or nil: the cursor.
local function native_partial(bufnr, kind)
  return function(item)
    local client = vim.lsp.get_client_by_id(item.client_id)
    local new_text = text.of(item)
    if not client or not new_text then
      return
    end
    local row, col = unpack(api.nvim_win_get_cursor(0))
    row = row - 1
    local start = col
    local r = item.range
    if r and r.start and r.start.row == row and r.start.col <= col then
      start = r.start.col
    end
    local line = api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
    local head, rest = text.split_item(new_text, line:sub(start + 1, col))
    local part = text.next_part(rest, kind)
    text.insert(bufnr, row, start, col, head .. part)
    shown = nil -- reported here, not as a dismissal when the next answer replaces it
    if part == rest then
      lsp.run_command(client, item.command, bufnr)
    else
      lsp.send(client, lsp.PARTIAL, lsp.suggestion_id(item), text.utf16_len(head .. part))
    end
  end
end

--- Accepts the suggestion Neovim shows; true when there was one.
function M.accept(bufnr)
  return inline_completion.get({ bufnr = bufnr }) == true
end

--- Accepts its next word or line (`kind`); true when there was one.
function M.accept_part(kind, bufnr)
  return inline_completion.get({ bufnr = bufnr, on_accept = native_partial(bufnr, kind) }) == true
end

function M.select(count)
  inline_completion.select({ count = count })
end

function M.enable(on, bufnr)
  inline_completion.enable(on, { bufnr = bufnr })
end

function M.attach(client, bufnr)
  observe(client)
  -- Per buffer, so that other servers' inline completion stays as the user
  -- configured it elsewhere.
  inline_completion.enable(config.enabled_for(bufnr), { bufnr = bufnr })
end

function M.on_insert_leave()
  set_shown(nil, nil) -- Neovim clears the ghost text on leaving insert mode
end

return M
