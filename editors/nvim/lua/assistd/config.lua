--- Options and server settings: the defaults, what setup() and set() were
--- given, and what the server is sent from them. The other modules read the
--- state kept here (options, settings, disabled_ft); only setup(), set() and
--- enable() change it.

local M = {}

M.NAME = 'assistd' -- the LSP client's name (and vim.lsp.config's)
M.HL = 'AssistdSuggestion'

-- The keys the server reads from initializationOptions.assistd and from
-- workspace/didChangeConfiguration settings.assistd. All optional: a key left
-- out takes the server's default, so nothing is sent for it.
local SERVER_KEYS = {
  model = true, -- path to a GGUF file (default: the embedded model)
  backend = true, -- 'llama' | 'torch'
  numerics = true, -- 'fast' (default) | 'exact' | 'llama': a server of its own (not the daemon's)
  proposer = true, -- 'suffix' (default) | 'ngram' | 'none'
  k = true, -- 'auto' (default) or an integer 0-64
  maxTokens = true, -- default 64
  maxPromptTokens = true, -- default 1024 (tokens before the cursor)
  maxSuffixChars = true, -- default 2000 (characters after the cursor, for FIM)
  crossFileTokens = true, -- default 0 (off): prompt tokens for snippets of other open files
  maxLatencyMs = true, -- default 250 (generation time budget per suggestion, ms; 0 = none)
  nCtx = true, -- default 2048 (the model's context window)
  fim = true, -- 'auto' | 'off'
  db = true, -- path of the history SQLite file
  enabled = true, -- default true
  telemetry = true, -- default true: the server stores shown/accepted/dismissed events locally
}

-- Editor-side options, also taken by setup().
local EDITOR_KEYS = {
  cmd = true,
  filetypes = true,
  root_markers = true,
  keymaps = true,
  tcp = true,
  disabled_filetypes = true,
  debounce_ms = true,
}
local DEFAULTS = {
  cmd = { 'assistd', 'lsp' },
  -- tcp = { host = '127.0.0.1', port = 2087, token_file = nil }: connect to a
  -- server started with `assistd lsp --tcp 127.0.0.1:2087` instead of `cmd`,
  -- sending the token it asks for (token_file; nil: assistd's default file).
  tcp = nil,
  -- filetypes: nil (the default) attaches to every filetype; Neovim only
  -- attaches to buffers that are files (buftype '').
  root_markers = { '.git' },
  -- Buffer-local insert-mode keys; false to set none, or a table of the keys
  -- to change (a key set to false is not mapped). next/prev: 0.12+ only.
  keymaps = {
    accept = '<Tab>',
    accept_word = '<M-Right>',
    accept_line = '<M-Down>',
    next = '<M-]>',
    prev = '<M-[>',
  },
  disabled_filetypes = {}, -- filetypes that get no suggestions (:AssistdToggle {ft} changes it)
  debounce_ms = 75, -- 0.10/0.11: pause after a keystroke before asking the server
}

M.options = vim.deepcopy(DEFAULTS)
M.settings = {} ---@type table<string, any> the server settings given so far
M.disabled_ft = {} ---@type table<string, true>

-- An empty Lua table would go out as a JSON array; the server expects an object.
function M.server_settings()
  return { [M.NAME] = next(M.settings) and vim.deepcopy(M.settings) or vim.empty_dict() }
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
function M.init_options()
  local opts = M.server_settings()
  if M.options.tcp then
    local file = vim.fs.normalize(M.options.tcp.token_file or default_token_file())
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

function M.server_cmd()
  local tcp = M.options.tcp
  if tcp then
    return vim.lsp.rpc.connect(tcp.host or '127.0.0.1', assert(tcp.port, 'assistd: tcp.port is required'))
  end
  return M.options.cmd
end

--- Merges the server keys of `opts` into the settings; warns about keys that
--- are neither server keys nor editor options.
function M.take_settings(opts)
  for key, value in pairs(opts) do
    if SERVER_KEYS[key] then
      M.settings[key] = value
    elseif not EDITOR_KEYS[key] then
      vim.notify(('assistd: unknown setting %q'):format(key), vim.log.levels.WARN)
    end
  end
end

--- setup()'s options: the editor options given replace the current ones (the
--- keymaps given replace the defaults' one by one), the server keys are merged.
function M.apply(opts)
  local options = M.options
  for key in pairs(EDITOR_KEYS) do
    if opts[key] ~= nil then
      options[key] = opts[key]
    end
  end
  if type(opts.keymaps) == 'table' then
    options.keymaps = vim.tbl_extend('force', DEFAULTS.keymaps, opts.keymaps)
  end
  for _, ft in ipairs(options.disabled_filetypes or {}) do
    M.disabled_ft[ft] = true
  end
  M.take_settings(opts)
end

--- Whether `bufnr` gets suggestions: on globally and for its filetype.
function M.enabled_for(bufnr)
  return M.settings.enabled ~= false and not M.disabled_ft[vim.bo[bufnr].filetype]
end

return M
