--- The server's state, for a statusline: what its assistd/status notification
--- last said, else the LSP client's own state.

local config = require('assistd.config')
local lsp = require('assistd.client')

local api = vim.api

local M = {}

local server_state = {} ---@type table<integer, { state: string, message: string }>

--- Redraws statuslines and fires `User AssistdStatus` (scheduled: it may be
--- called from an LSP handler).
function M.changed()
  vim.schedule(function()
    vim.cmd('redrawstatus!')
    api.nvim_exec_autocmds('User', { pattern = 'AssistdStatus', modeline = false })
  end)
end

-- assistd/status {state, message}: "loading" | "ready" | "error" | "disabled".
function M.on_status(_, params, ctx)
  if type(params) == 'table' and type(params.state) == 'string' then
    server_state[ctx.client_id] = { state = params.state, message = params.message or '' }
    M.changed()
  end
end

--- See require('assistd').status().
function M.get(bufnr)
  if not config.enabled_for(bufnr) then
    return 'assistd: off'
  end
  local client = lsp.get(bufnr)
  if not client then
    return ''
  end
  local st = server_state[client.id]
  local state = st and st.state or (client.initialized and 'ready' or 'loading')
  if state == 'ready' then
    return 'assistd'
  elseif state == 'disabled' then
    return 'assistd: off'
  end
  return 'assistd: ' .. state
end

return M
