--- assistd for Neovim: runs `assistd lsp` as a language server and shows its
--- completions.
---
---   Neovim 0.12+  ghost text from native LSP inline completion
---                 (textDocument/inlineCompletion), accepted with <Tab>.
---   Neovim 0.11   vim.lsp.config/vim.lsp.enable; completions in the popup menu
---                 (textDocument/completion, <C-x><C-o>).
---   Neovim 0.10   the same through vim.lsp.start on FileType.
---
--- Usage: require('assistd').setup({ proposer = 'suffix', maxTokens = 64 })
--- See editors/nvim/README.md in the assistd repository.

local M = {}

-- The keys the server reads from initializationOptions.assistd and from
-- workspace/didChangeConfiguration settings.assistd. All optional: a key left
-- out takes the server's default, so nothing is sent for it.
local SERVER_KEYS = {
  model = true, -- path to a GGUF file (default: the embedded model)
  backend = true, -- 'llama' | 'torch'
  proposer = true, -- 'suffix' (default) | 'ngram' | 'none'
  k = true, -- 'auto' (default) or an integer 0-64
  maxTokens = true, -- default 64
  maxPromptTokens = true, -- default 1024 (tokens before the cursor)
  maxSuffixChars = true, -- default 2000 (characters after the cursor, for FIM)
  maxLatencyMs = true, -- default 250 (generation time budget per suggestion, ms; 0 = none)
  nCtx = true, -- default 2048 (the model's context window)
  fim = true, -- 'auto' | 'off'
  db = true, -- path of the history SQLite file
  enabled = true, -- default true
  telemetry = true, -- default true: the server stores shown/accepted/dismissed events locally
}

-- Editor-side options, also taken by setup().
local EDITOR_KEYS = { cmd = true, filetypes = true, root_markers = true, keymaps = true, tcp = true }
local DEFAULTS = {
  cmd = { 'assistd', 'lsp' },
  -- tcp = { host = '127.0.0.1', port = 2087, token_file = nil }: connect to a
  -- server started with `assistd lsp --tcp 127.0.0.1:2087` instead of `cmd`,
  -- sending the token it asks for (token_file; nil: assistd's default file).
  tcp = nil,
  -- filetypes: nil (the default) attaches to every filetype; Neovim only
  -- attaches to buffers that are files (buftype '').
  root_markers = { '.git' },
  -- Buffer-local insert-mode keys for inline completion (Neovim 0.12+);
  -- false to set none, or a table to pick other keys.
  keymaps = { accept = '<Tab>', next = '<M-]>', prev = '<M-[>' },
}

local NAME = 'assistd'
local ACCEPTED = 'assistd.accepted'

local options = vim.deepcopy(DEFAULTS)
local settings = {} ---@type table<string, any> the server settings given so far

-- vim.lsp.inline_completion only exists from Neovim 0.12 on.
local has_ic, inline_completion = pcall(require, 'vim.lsp.inline_completion')
if not has_ic then
  inline_completion = nil
end

-- Client methods are called `client:m()` from 0.11 on; 0.10 has `client.m()`.
local function call(client, method, ...)
  if vim.fn.has('nvim-0.11') == 1 then
    return client[method](client, ...)
  end
  return client[method](...)
end

-- An empty Lua table would go out as a JSON array; the server expects an object.
local function server_settings()
  return { [NAME] = next(settings) and vim.deepcopy(settings) or vim.empty_dict() }
end

-- The token file `assistd lsp --tcp` reads by default: platformdirs' user
-- config dir, as the server computes it.
local function default_token_file()
  if vim.fn.has('mac') == 1 then
    return vim.fs.joinpath(vim.env.HOME, 'Library', 'Application Support', 'assistd', 'token')
  end
  local base = vim.env.XDG_CONFIG_HOME or vim.fs.joinpath(vim.env.HOME, '.config')
  return vim.fs.joinpath(base, 'assistd', 'token')
end

-- initializationOptions: the settings, and over TCP the token (only here: it
-- is never sent in didChangeConfiguration). Raises when the file is unreadable.
local function init_options()
  local opts = server_settings()
  if options.tcp then
    local file = vim.fs.normalize(options.tcp.token_file or default_token_file())
    local f, err = io.open(file, 'r')
    if not f then
      error(('assistd: cannot read the token file (%s)'):format(err))
    end
    local token = vim.trim(f:read('*a') or '')
    f:close()
    if token == '' then
      error(('assistd: the token file %s is empty'):format(file))
    end
    opts.token = token
  end
  return opts
end

local function server_cmd()
  local tcp = options.tcp
  if tcp then
    return vim.lsp.rpc.connect(tcp.host or '127.0.0.1', assert(tcp.port, 'assistd: tcp.port is required'))
  end
  return options.cmd
end

local function take_settings(opts)
  for key, value in pairs(opts) do
    if SERVER_KEYS[key] then
      settings[key] = value
    elseif not EDITOR_KEYS[key] then
      vim.notify(('assistd: unknown setting %q'):format(key), vim.log.levels.WARN)
    end
  end
end

---------------------------------------------------------------------------
-- User acceptance events (Neovim 0.12+ inline completion only).
--
-- Acceptance needs nothing from us: on accept, Neovim's inline completion runs
-- the item's command (`assistd.accepted` with the suggestion id) through
-- client:exec_cmd(), which sends workspace/executeCommand to the server.
-- vim.lsp.inline_completion.get() also takes an `on_accept` callback, but it
-- only lets a caller change or veto the item before insertion, and a user's
-- own get() mapping would bypass it; so it is not used here.
--
-- Neovim has no "shown" or "dismissed" hook, and its inline completion
-- passes its own response handler to client:request(). To see which
-- suggestion is on screen we wrap request() on the assistd client only:
--   shown     = the first item of a response that arrives in insert mode
--               (Neovim presents item 1; a candidate reached by cycling with
--               select() is not reported);
--   dismissed = a shown suggestion that was not accepted when an empty or
--               different response replaces it, or when insert mode ends.
-- With a second inline-completion server on the same buffer, Neovim may
-- present that server's item first; the events are then approximate.
-- Neovim has no partial accept, so assistd/didPartiallyAcceptCompletion is
-- never sent.
---------------------------------------------------------------------------

local shown ---@type { client: vim.lsp.Client, id: string }?

local function suggestion_id(item)
  local command = type(item) == 'table' and item.command
  if type(command) ~= 'table' or command.command ~= ACCEPTED then
    return nil
  end
  local arg = type(command.arguments) == 'table' and command.arguments[1]
  return type(arg) == 'table' and arg.id or nil
end

local function send(client, method, id)
  if settings.telemetry ~= false and not client:is_stopped() then
    client:notify(method, { id = id })
  end
end

local function set_shown(client, id)
  if shown and shown.id == id then
    return
  end
  if shown then
    send(shown.client, 'assistd/didDismissCompletion', shown.id)
  end
  shown = id and { client = client, id = id } or nil
  if shown then
    send(client, 'assistd/didShowCompletion', id)
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
        if not err and type(result) == 'table' and vim.api.nvim_get_mode().mode:sub(1, 1) == 'i' then
          local items = result.items or result
          set_shown(self, suggestion_id(items[1]))
        end
        return ret
      end
    elseif
      method == 'workspace/executeCommand'
      and type(params) == 'table'
      and params.command == ACCEPTED
    then
      shown = nil -- accepted; the command itself tells the server
    end
    return request(self, method, params, handler, ...)
  end
end

---------------------------------------------------------------------------
-- Public functions
---------------------------------------------------------------------------

--- Accepts the suggestion on screen. Returns true when one was accepted.
--- (0.12+; vim.lsp.inline_completion.get() returns false when there is none.)
---@param bufnr? integer
---@return boolean
function M.accept(bufnr)
  return inline_completion ~= nil and inline_completion.get({ bufnr = bufnr }) == true
end

--- Shows the next (count 1) or previous (count -1) candidate, when the server
--- returned several. (0.12+)
---@param count integer
function M.select(count)
  if inline_completion then
    inline_completion.select({ count = count })
  end
end

--- Changes server settings at run time: merges them into those given to
--- setup() and sends workspace/didChangeConfiguration to running servers,
--- which apply it over their current settings (a key not given keeps its
--- value). vim.NIL sends JSON null (the server's default for `model` and `db`).
---@param new table
function M.set(new)
  take_settings(new)
  for _, client in ipairs(vim.lsp.get_clients({ name = NAME })) do
    client.settings = server_settings() -- answers workspace/configuration too
    call(client, 'notify', 'workspace/didChangeConfiguration', { settings = server_settings() })
  end
  if vim.lsp.config then -- servers started later get the new values
    vim.lsp.config(NAME, { init_options = init_options(), settings = server_settings() })
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
  call(client, 'request', 'workspace/executeCommand', params, function(err, result)
    if err then
      vim.notify('assistd.stats failed: ' .. tostring(err.message), vim.log.levels.ERROR)
    else
      vim.notify(vim.inspect(result), vim.log.levels.INFO)
    end
  end)
end

---------------------------------------------------------------------------
-- Setup
---------------------------------------------------------------------------

local function set_keymaps(bufnr)
  local keys = options.keymaps
  if not keys then
    return
  end
  if keys.accept then
    -- An <expr> mapping, as in Neovim's own example for get(): with nothing
    -- to accept it returns the key itself (not remapped), so <Tab> still
    -- inserts a tab, in order with the keys typed after it. get() defers the
    -- edit, which <expr> mappings may not make themselves.
    vim.keymap.set('i', keys.accept, function()
      return M.accept(bufnr) and '' or keys.accept
    end, { buffer = bufnr, expr = true, desc = 'assistd: accept the suggestion' })
  end
  if keys.next then
    vim.keymap.set('i', keys.next, function()
      M.select(1)
    end, { buffer = bufnr, desc = 'assistd: next suggestion' })
  end
  if keys.prev then
    vim.keymap.set('i', keys.prev, function()
      M.select(-1)
    end, { buffer = bufnr, desc = 'assistd: previous suggestion' })
  end
end

local function on_attach(client, bufnr)
  if inline_completion then
    observe(client)
    -- Per buffer, so that other servers' inline completion stays as the user
    -- configured it elsewhere.
    inline_completion.enable(true, { bufnr = bufnr })
    set_keymaps(bufnr)
  elseif vim.lsp.completion then
    -- 0.11: popup completion. Enabling it makes <C-y> run the item's command,
    -- so acceptances reach the server. Not autotriggered: a model call per
    -- keystroke would flood the menu; use <C-x><C-o>.
    vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = false })
  end
  -- 0.10: Neovim sets 'omnifunc' to vim.lsp.omnifunc on attach; <C-x><C-o>.
end

local function client_config()
  return {
    cmd = server_cmd(),
    filetypes = options.filetypes,
    root_markers = options.root_markers,
    init_options = init_options(),
    -- Neovim sends these in workspace/didChangeConfiguration right after
    -- initialize and answers workspace/configuration from them.
    settings = server_settings(),
  }
end

-- Neovim 0.10: no vim.lsp.config/enable; start the client on FileType.
local function start_on_filetype(group)
  vim.api.nvim_create_autocmd('FileType', {
    group = group,
    callback = function(ev)
      local bufnr = ev.buf
      local ft = vim.bo[bufnr].filetype
      if vim.bo[bufnr].buftype ~= '' or ft == '' then
        return
      end
      if options.filetypes and not vim.tbl_contains(options.filetypes, ft) then
        return
      end
      local config = client_config()
      config.name = NAME
      config.root_dir = vim.fs.root(bufnr, options.root_markers)
      config.filetypes, config.root_markers = nil, nil
      vim.lsp.start(config, { bufnr = bufnr })
    end,
  })
  if vim.v.vim_did_enter == 1 then -- setup() ran after files were opened
    vim.cmd.doautoall({ args = { 'assistd', 'FileType' }, mods = { emsg_silent = true } })
  end
end

--- Configures and enables the assistd language server.
---
--- opts: the server settings (model, backend, proposer, k, maxTokens,
--- maxPromptTokens, fim, db, enabled, telemetry) and the editor options
--- cmd, filetypes, root_markers, keymaps, tcp.
---@param opts? table
function M.setup(opts)
  opts = opts or {}
  for key in pairs(EDITOR_KEYS) do
    if opts[key] ~= nil then
      options[key] = opts[key]
    end
  end
  take_settings(opts)

  local group = vim.api.nvim_create_augroup('assistd', { clear = true })
  vim.api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(ev)
      local client = vim.lsp.get_client_by_id(ev.data.client_id)
      if client and client.name == NAME then
        on_attach(client, ev.buf)
      end
    end,
  })
  if inline_completion then
    vim.api.nvim_create_autocmd('InsertLeave', {
      group = group,
      callback = function()
        set_shown(nil, nil) -- Neovim clears the ghost text on leaving insert mode
      end,
    })
  end
  vim.api.nvim_create_user_command('AssistdStats', M.stats, {
    desc = 'Show assistd user-acceptance statistics',
  })

  if vim.lsp.config and vim.lsp.enable then -- Neovim 0.11+
    vim.lsp.config(NAME, client_config())
    vim.lsp.enable(NAME)
  else
    start_on_filetype(group)
  end
end

return M
