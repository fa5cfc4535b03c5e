--- Talking to a running assistd client: the method names, calls that work on
--- Neovim 0.10 and 0.11+, and the notifications and command that tell the
--- server what the user did with a suggestion.

local config = require('assistd.config')

local M = {}

M.ACCEPTED = 'assistd.accepted' -- an item's command: all of it was accepted
M.SHOWN = 'assistd/didShowCompletion'
M.PARTIAL = 'assistd/didPartiallyAcceptCompletion'
M.DISMISSED = 'assistd/didDismissCompletion'
M.STATUS = 'assistd/status'

M.has_011 = vim.fn.has('nvim-0.11') == 1

-- Client methods are called `client:m()` from 0.11 on; 0.10 has `client.m()`.
function M.call(client, method, ...)
  if M.has_011 then
    return client[method](client, ...)
  end
  return client[method](...)
end

--- The assistd client attached to `bufnr`, or nil.
function M.get(bufnr)
  return vim.lsp.get_clients({ name = config.NAME, bufnr = bufnr })[1]
end

--- The suggestion id an item carries in its command's argument, or nil.
function M.suggestion_id(item)
  local command = type(item) == 'table' and item.command
  if type(command) ~= 'table' or command.command ~= M.ACCEPTED then
    return nil
  end
  local arg = type(command.arguments) == 'table' and command.arguments[1]
  return type(arg) == 'table' and arg.id or nil
end

-- User-acceptance notifications ({id}, and acceptedLength for a partial accept).
-- Sent whatever `telemetry` says: the server stores them only when it is on, and
-- uses a dismissal either way (not shown again at that place).
function M.send(client, method, id, accepted)
  if id and not M.call(client, 'is_stopped') then
    M.call(client, 'notify', method, { id = id, acceptedLength = accepted })
  end
end

-- Runs an item's command (assistd.accepted {id}) as Neovim's own accept does.
function M.run_command(client, command, bufnr)
  if type(command) == 'table' and not M.call(client, 'is_stopped') then
    local params = { command = command.command, arguments = command.arguments }
    M.call(client, 'request', 'workspace/executeCommand', params, function() end, bufnr)
  end
end

return M
