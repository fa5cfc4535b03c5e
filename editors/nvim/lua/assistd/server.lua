--- How Neovim starts the server: the client config (vim.lsp.Config, also what
--- lsp/assistd.lua returns), and on 0.10, which has no vim.lsp.config, a
--- FileType autocmd that starts it.

local config = require('assistd.config')
local lsp = require('assistd.client')
local status = require('assistd.status')

local api = vim.api

local M = {}

--- The client config for the options and settings given so far.
function M.config()
  local options = config.options
  return {
    cmd = config.server_cmd(),
    filetypes = options.filetypes,
    root_markers = options.root_markers,
    init_options = config.init_options(),
    -- Neovim sends these in workspace/didChangeConfiguration right after
    -- initialize and answers workspace/configuration from them.
    settings = config.server_settings(),
    handlers = { [lsp.STATUS] = status.on_status },
  }
end

-- Neovim 0.10: no vim.lsp.config/enable; start the client on FileType.
function M.start_on_filetype(group)
  api.nvim_create_autocmd('FileType', {
    group = group,
    callback = function(ev)
      local bufnr = ev.buf
      local ft = vim.bo[bufnr].filetype
      local options = config.options
      if vim.bo[bufnr].buftype ~= '' or ft == '' then
        return
      end
      if options.filetypes and not vim.tbl_contains(options.filetypes, ft) then
        return
      end
      local c = M.config()
      c.name = config.NAME
      c.root_dir = vim.fs.root(bufnr, options.root_markers)
      c.filetypes, c.root_markers = nil, nil
      vim.lsp.start(c, { bufnr = bufnr })
    end,
  })
  if vim.v.vim_did_enter == 1 then -- setup() ran after files were opened
    vim.cmd.doautoall({ args = { 'assistd', 'FileType' }, mods = { emsg_silent = true } })
  end
end

return M
