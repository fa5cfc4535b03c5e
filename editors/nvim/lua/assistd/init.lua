--- assistd for Neovim: runs `assistd lsp` as a language server and shows its
--- suggestions as ghost text.
---
---   Neovim 0.12+  ghost text from native LSP inline completion
---                 (vim.lsp.inline_completion, textDocument/inlineCompletion):
---                 assistd.native.
---   Neovim 0.10/0.11  ghost text drawn by this plugin from the same request
---                 (extmarks): assistd.ghost; 0.11 also keeps the popup menu
---                 (<C-x><C-o>).
---
--- Both: <Tab> accepts, <M-Right> accepts the next word, <M-Down> the next
--- line; :AssistdToggle [filetype] turns suggestions off and on; status()
--- gives a statusline string.
---
--- Usage, with editors/nvim on the runtimepath:
---   require('assistd').setup({ proposer = 'suffix', maxTokens = 64 })
--- or, on 0.11+, vim.lsp.enable('assistd') for the defaults (lsp/assistd.lua).
--- See editors/nvim/README.md in the assistd repository.

local config = require('assistd.config')
local ghost = require('assistd.ghost')
local keymaps = require('assistd.keymaps')
local lsp = require('assistd.client')
local native = require('assistd.native')
local server = require('assistd.server')
local status = require('assistd.status')

local api = vim.api
local NAME = config.NAME

local M = {}

local function buffer(bufnr)
  return (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
end

--- Accepts the suggestion on screen. Returns true when one was accepted.
---@param bufnr? integer
---@return boolean
function M.accept(bufnr)
  bufnr = buffer(bufnr)
  if native.available then
    return native.accept(bufnr)
  end
  return ghost.accept(bufnr, 'all')
end

--- Accepts the suggestion's next word ('word') or the rest of its line
--- ('line'); the rest stays on screen, and the server hears how many
--- characters (UTF-16 code units) of it were accepted so far. Returns false
--- when there is no suggestion. On 0.12+ Neovim then asks for the rest anew.
---@param kind 'word'|'line'
---@param bufnr? integer
---@return boolean
function M.accept_part(kind, bufnr)
  assert(kind == 'word' or kind == 'line', "assistd: accept_part takes 'word' or 'line'")
  bufnr = buffer(bufnr)
  if native.available then
    return native.accept_part(kind, bufnr)
  end
  return ghost.accept(bufnr, kind)
end

--- The ghost text on screen in `bufnr` (0.10/0.11): `{ id, text, item }`,
--- `text` being what is left to insert at the cursor (LF line breaks) and
--- `item` the server's InlineCompletionItem it came from; nil when there is
--- none.
---@param bufnr? integer
---@return { id: string?, text: string, item: table }?
function M.suggestion(bufnr)
  return ghost.suggestion(buffer(bufnr))
end

--- Shows the next (count 1) or previous (count -1) candidate, when the server
--- returned several. (0.12+)
---@param count integer
function M.select(count)
  if native.available then
    native.select(count)
  end
end

--- Whether `bufnr` gets suggestions: on globally and for its filetype.
---@param bufnr? integer
---@return boolean
function M.is_enabled(bufnr)
  return config.enabled_for(buffer(bufnr))
end

--- Turns suggestions on (true) or off (false): everywhere, or for one
--- filetype with `{ filetype = 'markdown' }`. Off means no requests. The
--- global switch is the server's `enabled` setting too (its status becomes
--- "disabled").
---@param on boolean
---@param opts? { filetype?: string }
function M.enable(on, opts)
  on = on ~= false
  local ft = opts and opts.filetype
  if ft then
    config.disabled_ft[ft] = (not on) or nil
  else
    M.set({ enabled = on })
  end
  for _, client in ipairs(vim.lsp.get_clients({ name = NAME })) do
    for bufnr in pairs(client.attached_buffers or {}) do
      local yes = config.enabled_for(bufnr)
      if native.available then
        native.enable(yes, bufnr)
      elseif not yes then
        ghost.hide(bufnr)
      end
    end
  end
  status.changed()
end

--- Turns suggestions off if on and on if off: everywhere, or for `filetype`.
---@param filetype? string
function M.toggle(filetype)
  if filetype and filetype ~= '' then
    M.enable(config.disabled_ft[filetype] ~= nil, { filetype = filetype })
  else
    M.enable(config.settings.enabled == false)
  end
end

--- A short string for a statusline: "assistd" (ready), "assistd: loading",
--- "assistd: off", "assistd: error", or "" when no assistd server is
--- attached to `bufnr` (and suggestions are not turned off).
---@param bufnr? integer
---@return string
function M.status(bufnr)
  return status.get(buffer(bufnr))
end

--- Changes server settings at run time: merges them into those given to
--- setup() and sends workspace/didChangeConfiguration to running servers,
--- which apply it over their current settings (a key not given keeps its
--- value). vim.NIL sends JSON null (the server's default for `model` and `db`).
---@param new table
function M.set(new)
  config.take_settings(new)
  for _, client in ipairs(vim.lsp.get_clients({ name = NAME })) do
    client.settings = config.server_settings() -- answers workspace/configuration too
    lsp.call(client, 'notify', 'workspace/didChangeConfiguration', { settings = config.server_settings() })
  end
  if vim.lsp.config then -- servers started later get the new values
    vim.lsp.config(NAME, { init_options = config.init_options(), settings = config.server_settings() })
  end
end

--- Prints the server's user-acceptance statistics (workspace/executeCommand
--- assistd.stats).
function M.stats()
  local client = vim.lsp.get_clients({ name = NAME })[1]
  if not client then
    vim.notify('assistd: no server is running (open a file first)', vim.log.levels.WARN)
    return
  end
  local params = { command = 'assistd.stats', arguments = {} }
  lsp.call(client, 'request', 'workspace/executeCommand', params, function(err, result)
    if err then
      vim.notify('assistd.stats failed: ' .. tostring(err.message), vim.log.levels.ERROR)
    else
      vim.notify(vim.inspect(result), vim.log.levels.INFO)
    end
  end)
end

local function on_attach(client, bufnr)
  if native.available then
    native.attach(client, bufnr)
  else
    ghost.attach(client, bufnr)
    if vim.lsp.completion then
      -- 0.11: the popup menu too. Enabling it makes <C-y> run the item's
      -- command, so acceptances reach the server. Not autotriggered: a model
      -- call per keystroke would flood the menu; use <C-x><C-o>.
      vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = false })
    end
    -- 0.10: Neovim sets 'omnifunc' to vim.lsp.omnifunc on attach; <C-x><C-o>.
  end
  keymaps.set(bufnr, M)
  status.changed()
end

local group ---@type integer? the augroup of the editor side, once installed

-- The editor side: the highlight, what happens when an assistd client attaches
-- to a buffer or leaves it, and the user commands. setup() (re)installs it.
local function install()
  ghost.set_highlight()
  group = api.nvim_create_augroup('assistd', { clear = true })
  api.nvim_create_autocmd('ColorScheme', { group = group, callback = ghost.set_highlight })
  api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(ev)
      local client = vim.lsp.get_client_by_id(ev.data.client_id)
      if client and client.name == NAME then
        on_attach(client, ev.buf)
      end
    end,
  })
  api.nvim_create_autocmd('LspDetach', {
    group = group,
    callback = function(ev)
      local client = vim.lsp.get_client_by_id(ev.data.client_id)
      if client and client.name == NAME then
        ghost.detach(ev.buf)
        status.changed()
      end
    end,
  })
  if native.available then
    api.nvim_create_autocmd('InsertLeave', { group = group, callback = native.on_insert_leave })
  end
  api.nvim_create_user_command('AssistdStats', M.stats, {
    desc = 'Show assistd user-acceptance statistics',
  })
  api.nvim_create_user_command('AssistdToggle', function(cmd)
    local ft = cmd.args ~= '' and cmd.args or nil
    M.toggle(ft)
    local off = ft and config.disabled_ft[ft] or (not ft and config.settings.enabled == false)
    vim.notify(('assistd: %s%s'):format(ft and (ft .. ' ') or '', off and 'off' or 'on'))
  end, {
    nargs = '?',
    complete = 'filetype',
    desc = 'Turn assistd suggestions off or on (everywhere, or for a filetype)',
  })
  return group
end

--- For lsp/assistd.lua: vim.lsp.enable('assistd') without setup() gets the
--- editor side too, as setup({}) would give it. Does nothing after setup().
function M._install_once()
  if not group then
    install()
  end
end

--- Configures and enables the assistd language server.
---
--- opts: the server settings (model, backend, proposer, k, maxTokens,
--- maxPromptTokens, fim, db, enabled, telemetry) and the editor options
--- cmd, filetypes, root_markers, keymaps, tcp, disabled_filetypes, debounce_ms.
---@param opts? table
function M.setup(opts)
  config.apply(opts or {})
  install()
  if vim.lsp.config and vim.lsp.enable then -- Neovim 0.11+
    vim.lsp.config(NAME, server.config())
    vim.lsp.enable(NAME)
  else
    server.start_on_filetype(group)
  end
end

return M
