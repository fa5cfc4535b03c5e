--- assistd for Neovim: runs `assistd lsp` as a language server and shows its
--- suggestions as ghost text.
---
---   Neovim 0.12+  ghost text from native LSP inline completion
---                 (vim.lsp.inline_completion, textDocument/inlineCompletion).
---   Neovim 0.10/0.11  ghost text drawn by this module from the same request
---                 (extmarks); 0.11 also keeps the popup menu (<C-x><C-o>).
---
--- Both: <Tab> accepts, <M-Right> accepts the next word, <M-Down> the next
--- line; :AssistdToggle [filetype] turns suggestions off and on; status()
--- gives a statusline string.
---
--- Usage: require('assistd').setup({ proposer = 'suffix', maxTokens = 64 })
--- See editors/nvim/README.md in the assistd repository.

local M = {}
local api = vim.api

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

local NAME = 'assistd'
local ACCEPTED = 'assistd.accepted'
local SHOWN = 'assistd/didShowCompletion'
local PARTIAL = 'assistd/didPartiallyAcceptCompletion'
local DISMISSED = 'assistd/didDismissCompletion'
local STATUS = 'assistd/status'
local HL = 'AssistdSuggestion'
local AUTOMATIC = 2 -- lsp.InlineCompletionTriggerKind.Automatic

local options = vim.deepcopy(DEFAULTS)
local settings = {} ---@type table<string, any> the server settings given so far
local disabled_ft = {} ---@type table<string, true>

-- vim.lsp.inline_completion only exists from Neovim 0.12 on.
local has_ic, inline_completion = pcall(require, 'vim.lsp.inline_completion')
if not has_ic then
  inline_completion = nil
end
local has_011 = vim.fn.has('nvim-0.11') == 1

-- Client methods are called `client:m()` from 0.11 on; 0.10 has `client.m()`.
local function call(client, method, ...)
  if has_011 then
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

local function get_client(bufnr)
  return vim.lsp.get_clients({ name = NAME, bufnr = bufnr })[1]
end

local function suggestion_id(item)
  local command = type(item) == 'table' and item.command
  if type(command) ~= 'table' or command.command ~= ACCEPTED then
    return nil
  end
  local arg = type(command.arguments) == 'table' and command.arguments[1]
  return type(arg) == 'table' and arg.id or nil
end

-- User-acceptance notifications ({id}, and acceptedLength for a partial accept).
-- Sent whatever `telemetry` says: the server stores them only when it is on, and
-- uses a dismissal either way (not shown again at that place).
local function send(client, method, id, accepted)
  if id and not call(client, 'is_stopped') then
    call(client, 'notify', method, { id = id, acceptedLength = accepted })
  end
end

-- Runs an item's command (assistd.accepted {id}) as Neovim's own accept does.
local function run_command(client, command, bufnr)
  if type(command) == 'table' and not call(client, 'is_stopped') then
    local params = { command = command.command, arguments = command.arguments }
    call(client, 'request', 'workspace/executeCommand', params, function() end, bufnr)
  end
end

-- Length of `s` in UTF-16 code units: what VS Code reports as acceptedLength.
local function utf16_len(s)
  if has_011 then
    return vim.str_utfindex(s, 'utf-16')
  end
  local _, n = vim.str_utfindex(s)
  return n
end

-- Byte column of a position's `character` on `line`, in the client's encoding.
local function byte_col(line, character, encoding)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col
  if has_011 then
    ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  else
    ok, col = pcall(vim.str_byteindex, line, character, encoding == 'utf-16')
  end
  return ok and col or #line
end

---------------------------------------------------------------------------
-- Suggestion text: what is drawn and what each accept inserts.
--
-- The server's item replaces the range [start, cursor] on the cursor's line
-- with insertText: `start` lies before the cursor when the suggestion changes
-- the indentation the editor put there. That text splits into `head`, what
-- [start, cursor] becomes (the buffer's own text when the item starts with
-- it, else the item's indentation), and `rest`, drawn at the cursor.
---------------------------------------------------------------------------

local WORD = '^%s*[%w_\128-\255]+' -- bytes >= 0x80 count as word characters: no split UTF-8
local PUNCT = '^%s*[^%w_%s\128-\255]+'

---@return string head, string rest
local function split_item(text, before)
  if text:sub(1, #before) == before then
    return before, text:sub(#before + 1)
  end
  if before:match('^%s*$') then -- the item re-indents the line
    local head = text:match('^[ \t]*')
    return head, text:sub(#head + 1)
  end
  return before, text -- a range we cannot place: insert at the cursor
end

--- The part of `rest` that accepting a word or a line inserts: up to the end
--- of the next word (a line break first: it and the next line's indentation),
--- or to the end of the line (a line break first: it and the next line).
local function next_part(rest, kind)
  if kind == 'word' then
    return rest:match('^[ \t]*\n[ \t]*') or rest:match(WORD) or rest:match(PUNCT) or rest
  end
  if rest:sub(1, 1) == '\n' then
    return '\n' .. rest:sub(2):match('^[^\n]*')
  end
  return rest:match('^[^\n]*')
end

-- Replaces [row, start_col .. col] with `text`; puts the cursor after it.
local function insert_text(bufnr, row, start_col, col, text)
  local lines = vim.split(text, '\n', { plain = true })
  api.nvim_buf_set_text(bufnr, row, start_col, row, col, lines)
  local new_row = row + #lines - 1
  local new_col = (#lines == 1 and start_col or 0) + #lines[#lines]
  api.nvim_win_set_cursor(0, { new_row + 1, new_col })
  return new_row, new_col
end

local function insert_text_of(item)
  local text = item.insertText or item.insert_text
  if type(text) == 'table' then
    text = text.value -- a snippet: drawn and inserted as plain text
  end
  return type(text) == 'string' and (text:gsub('\r\n', '\n')) or nil
end

---------------------------------------------------------------------------
-- Neovim 0.12+: native inline completion.
--
-- Acceptance needs nothing from us: on accept, Neovim's inline completion runs
-- the item's command (`assistd.accepted` with the suggestion id) through
-- client:exec_cmd(), which sends workspace/executeCommand to the server.
-- Partial accepts go through get({ on_accept = ... }), which hands us the item
-- instead of inserting it: we insert a word or a line and report it; Neovim
-- then asks again at the new cursor and shows the rest as a new answer.
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
---------------------------------------------------------------------------

local shown ---@type { client: vim.lsp.Client, id: string }?

local function set_shown(client, id)
  if shown and shown.id == id then
    return
  end
  if shown then
    send(shown.client, DISMISSED, shown.id)
  end
  shown = id and { client = client, id = id } or nil
  if shown then
    send(client, SHOWN, id)
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

-- on_accept for get(): inserts the next word or line of the native item.
-- Its range is a vim.Range (0-based rows, byte columns), or nil: the cursor.
local function native_partial(bufnr, kind)
  return function(item)
    local client = vim.lsp.get_client_by_id(item.client_id)
    local text = insert_text_of(item)
    if not client or not text then
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
    local head, rest = split_item(text, line:sub(start + 1, col))
    local part = next_part(rest, kind)
    insert_text(bufnr, row, start, col, head .. part)
    shown = nil -- reported here, not as a dismissal when the next answer replaces it
    if part == rest then
      run_command(client, item.command, bufnr)
    else
      send(client, PARTIAL, suggestion_id(item), utf16_len(head .. part))
    end
  end
end

---------------------------------------------------------------------------
-- Neovim 0.10/0.11: ghost text drawn by this module.
--
-- A request goes out debounce_ms after typing or moving in insert mode; a
-- newer one cancels the one in flight (the server stops its generation). The
-- answer is drawn only if the buffer and cursor are where they were asked
-- about. The first line is inline virtual text at the cursor, the rest
-- virtual lines below. Typing a character the ghost text starts with
-- consumes it (no new request); any other change dismisses it.
---------------------------------------------------------------------------

local ns = api.nvim_create_namespace('assistd.suggestion')

---@class assistd.Suggestion
---@field client vim.lsp.Client
---@field item table the server's lsp.InlineCompletionItem
---@field id string?
---@field command table?
---@field row integer 0-based
---@field start integer byte column the item's range starts at
---@field col integer byte column of the cursor
---@field head string what [start, col] becomes on accept
---@field rest string drawn at the cursor, LF line breaks
---@field prefix string the line before the cursor
---@field suffix string the line after the cursor
---@field tick integer b:changedtick it matches
---@field accepted string text accepted so far (partial accepts)

---@class assistd.Buffer
---@field client vim.lsp.Client
---@field timer uv.uv_timer_t?
---@field pending table? the request in flight: { id, tick, row, col }
---@field s assistd.Suggestion?
---@field tick integer b:changedtick last seen
---@field group integer

local bufs = {} ---@type table<integer, assistd.Buffer>

local function cursor()
  local pos = api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

local function in_insert()
  return api.nvim_get_mode().mode:sub(1, 1) == 'i'
end

local function draw(bufnr, s)
  api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  local lines = vim.split(s.rest, '\n', { plain = true })
  local opts = { hl_mode = 'combine' }
  if lines[1] ~= '' then
    opts.virt_text = { { lines[1], HL } }
    opts.virt_text_pos = 'inline'
  end
  if #lines > 1 then
    opts.virt_lines = {}
    for i = 2, #lines do
      opts.virt_lines[#opts.virt_lines + 1] = { { lines[i], HL } }
    end
  end
  api.nvim_buf_set_extmark(bufnr, ns, s.row, s.col, opts)
end

-- Removes the suggestion; `event` (DISMISSED) tells the server.
local function clear(bufnr, event)
  local b = bufs[bufnr]
  if not b then
    return
  end
  if b.s and event then
    send(b.s.client, event, b.s.id)
  end
  b.s = nil
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  end
end

local function cancel(bufnr)
  local b = bufs[bufnr]
  if not b then
    return
  end
  if b.timer then
    b.timer:stop()
  end
  if b.pending then
    if not call(b.client, 'is_stopped') then
      pcall(call, b.client, 'cancel_request', b.pending.id)
    end
    b.pending = nil
  end
end

local function enabled_for(bufnr)
  return settings.enabled ~= false and not disabled_ft[vim.bo[bufnr].filetype]
end

-- The suggestion for an answer's first item at (row, col), or nil.
local function take(bufnr, client, item, row, col, tick)
  local text = item and insert_text_of(item)
  if not text or text == '' then
    return nil
  end
  local line = api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
  local start = col
  local r = item.range
  if type(r) == 'table' and r.start and r.start.line == row and r['end'].line == row then
    start = math.min(byte_col(line, r.start.character, client.offset_encoding), col)
  end
  local head, rest = split_item(text, line:sub(start + 1, col))
  if rest == '' then
    return nil
  end
  return {
    client = client,
    item = item,
    id = suggestion_id(item),
    command = item.command,
    row = row,
    start = head == line:sub(start + 1, col) and col or start,
    col = col,
    head = head == line:sub(start + 1, col) and '' or head,
    rest = rest,
    prefix = line:sub(1, col),
    suffix = line:sub(col + 1),
    tick = tick,
    accepted = '',
  }
end

local function request(bufnr)
  local b = bufs[bufnr]
  if not b or api.nvim_get_current_buf() ~= bufnr or not in_insert() then
    return
  end
  if not enabled_for(bufnr) or vim.fn.pumvisible() == 1 or call(b.client, 'is_stopped') then
    return
  end
  local row, col = cursor()
  local tick = api.nvim_buf_get_changedtick(bufnr)
  local s, p = b.s, b.pending
  if s and s.row == row and s.col == col and s.tick == tick then
    return -- already on screen
  end
  if p and p.row == row and p.col == col and p.tick == tick then
    return -- already asked
  end
  cancel(bufnr)
  local client = b.client
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = AUTOMATIC }
  local token = { row = row, col = col, tick = tick }
  local ok, id = call(client, 'request', 'textDocument/inlineCompletion', params, function(err, result)
    if b.pending ~= token then
      return -- superseded or cancelled
    end
    b.pending = nil
    if err then
      vim.lsp.log.warn('assistd: inlineCompletion failed', err)
      return
    end
    local now_row, now_col = cursor()
    if
      not in_insert()
      or api.nvim_get_current_buf() ~= bufnr
      or api.nvim_buf_get_changedtick(bufnr) ~= tick
      or now_row ~= row
      or now_col ~= col
      or not enabled_for(bufnr)
    then
      return
    end
    local items = type(result) == 'table' and (result.items or result) or {}
    local new = take(bufnr, client, items[1], row, col, tick)
    clear(bufnr)
    if new then
      b.s = new
      draw(bufnr, new)
      send(client, SHOWN, new.id)
    end
  end, bufnr)
  if ok and id then
    token.id = id
    b.pending = token
  end
end

local function schedule(bufnr)
  local b = bufs[bufnr]
  if not b then
    return
  end
  b.timer = b.timer or vim.uv.new_timer()
  b.timer:stop()
  b.timer:start(options.debounce_ms, 0, vim.schedule_wrap(function()
    request(bufnr)
  end))
end

local function on_text_changed(bufnr)
  local b = bufs[bufnr]
  local tick = api.nvim_buf_get_changedtick(bufnr)
  if tick == b.tick then
    return -- our own edit (an accept), already accounted for
  end
  b.tick = tick
  local s = b.s
  if s then
    local row, col = cursor()
    local line = api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
    if row == s.row and col > s.col and line:sub(1, s.col) == s.prefix and line:sub(col + 1) == s.suffix then
      local typed = line:sub(s.col + 1, col)
      if typed == s.rest then
        clear(bufnr) -- typed all of it: nothing left to show; ask for what follows
        schedule(bufnr)
        return
      elseif vim.startswith(s.rest, typed) then -- type-through
        if s.head ~= '' then
          s.head = s.head .. typed -- the indentation is still to be replaced (and counted then)
        else
          s.start = col
          s.accepted = s.accepted .. typed
        end
        s.rest, s.col, s.prefix, s.tick = s.rest:sub(#typed + 1), col, line:sub(1, col), tick
        draw(bufnr, s)
        return
      end
    end
    if row == s.row + 1 then
      -- Enter where the ghost text breaks the line: the new line's indentation
      -- (the editor's) must be the start of the ghost text's next line.
      local above = api.nvim_buf_get_lines(bufnr, s.row, s.row + 1, true)[1]
      local typed = '\n' .. line:sub(1, col)
      if
        above == s.prefix
        and line:sub(col + 1) == s.suffix
        and line:sub(1, col):match('^[ \t]*$')
        and vim.startswith(s.rest, typed)
        and #typed < #s.rest
        and s.head == ''
      then
        s.rest, s.row, s.start, s.col = s.rest:sub(#typed + 1), row, col, col
        s.prefix, s.tick, s.accepted = line:sub(1, col), tick, s.accepted .. typed
        draw(bufnr, s)
        return
      end
    end
    clear(bufnr, DISMISSED)
  end
  schedule(bufnr)
end

local function on_cursor_moved(bufnr)
  local b = bufs[bufnr]
  if api.nvim_buf_get_changedtick(bufnr) ~= b.tick then
    return -- a text change: TextChangedI follows
  end
  local row, col = cursor()
  if b.s and b.s.row == row and b.s.col == col then
    return
  end
  clear(bufnr) -- moved away: hidden, not dismissed
  schedule(bufnr)
end

--- Accepts all of the ghost text (`kind` 'all'), its next word or its next
--- line. Returns false when there is none at the cursor. (0.10/0.11)
local function accept_drawn(bufnr, kind)
  local b = bufs[bufnr]
  local s = b and b.s
  if not s or vim.fn.pumvisible() == 1 then
    return false
  end
  local row, col = cursor()
  if row ~= s.row or col ~= s.col then
    clear(bufnr)
    return false
  end
  local part = kind == 'all' and s.rest or next_part(s.rest, kind)
  local text = s.head .. part
  local new_row, new_col = insert_text(bufnr, s.row, s.start, s.col, text)
  b.tick = api.nvim_buf_get_changedtick(bufnr)
  s.accepted = s.accepted .. text
  s.rest = s.rest:sub(#part + 1)
  if s.rest == '' then
    clear(bufnr)
    run_command(s.client, s.command, bufnr)
    return true
  end
  local line = api.nvim_buf_get_lines(bufnr, new_row, new_row + 1, true)[1]
  s.row, s.start, s.col, s.head, s.tick = new_row, new_col, new_col, '', b.tick
  s.prefix, s.suffix = line:sub(1, new_col), line:sub(new_col + 1)
  draw(bufnr, s)
  send(s.client, PARTIAL, s.id, utf16_len(s.accepted))
  return true
end

local function detach(bufnr)
  local b = bufs[bufnr]
  if not b then
    return
  end
  cancel(bufnr)
  clear(bufnr)
  if b.timer then
    b.timer:close()
  end
  pcall(api.nvim_del_augroup_by_id, b.group)
  bufs[bufnr] = nil
end

local function attach(client, bufnr)
  detach(bufnr)
  local group = api.nvim_create_augroup('assistd.buffer.' .. bufnr, { clear = true })
  bufs[bufnr] = { client = client, tick = api.nvim_buf_get_changedtick(bufnr), group = group }
  local function on(events, fn)
    api.nvim_create_autocmd(events, {
      group = group,
      buffer = bufnr,
      callback = function()
        if bufs[bufnr] then
          fn(bufnr)
        end
      end,
    })
  end
  on('InsertEnter', function()
    bufs[bufnr].tick = api.nvim_buf_get_changedtick(bufnr)
    schedule(bufnr)
  end)
  on('TextChangedI', on_text_changed)
  on('CursorMovedI', on_cursor_moved)
  on('InsertLeave', function()
    cancel(bufnr)
    clear(bufnr, DISMISSED)
  end)
  on('BufLeave', function()
    cancel(bufnr)
    clear(bufnr)
  end)
  on({ 'BufUnload', 'BufWipeout' }, detach)
  if api.nvim_get_current_buf() == bufnr and in_insert() then
    schedule(bufnr) -- typing began before the server was up
  end
end

---------------------------------------------------------------------------
-- Server state, for a statusline.
---------------------------------------------------------------------------

local server_state = {} ---@type table<integer, { state: string, message: string }>

local function status_changed()
  vim.schedule(function()
    vim.cmd('redrawstatus!')
    api.nvim_exec_autocmds('User', { pattern = 'AssistdStatus', modeline = false })
  end)
end

-- assistd/status {state, message}: "loading" | "ready" | "error" | "disabled".
local function on_status(_, params, ctx)
  if type(params) == 'table' and type(params.state) == 'string' then
    server_state[ctx.client_id] = { state = params.state, message = params.message or '' }
    status_changed()
  end
end

---------------------------------------------------------------------------
-- Public functions
---------------------------------------------------------------------------

--- Accepts the suggestion on screen. Returns true when one was accepted.
---@param bufnr? integer
---@return boolean
function M.accept(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  if inline_completion then
    return inline_completion.get({ bufnr = bufnr }) == true
  end
  return accept_drawn(bufnr, 'all')
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
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  if inline_completion then
    return inline_completion.get({ bufnr = bufnr, on_accept = native_partial(bufnr, kind) }) == true
  end
  return accept_drawn(bufnr, kind)
end

--- The ghost text on screen in `bufnr` (0.10/0.11): `{ id, text, item }`,
--- `text` being what is left to insert at the cursor (LF line breaks) and
--- `item` the server's InlineCompletionItem it came from; nil when there is
--- none.
---@param bufnr? integer
---@return { id: string?, text: string, item: table }?
function M.suggestion(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  local s = bufs[bufnr] and bufs[bufnr].s
  return s and { id = s.id, text = s.rest, item = s.item } or nil
end

--- Shows the next (count 1) or previous (count -1) candidate, when the server
--- returned several. (0.12+)
---@param count integer
function M.select(count)
  if inline_completion then
    inline_completion.select({ count = count })
  end
end

--- Whether `bufnr` gets suggestions: on globally and for its filetype.
---@param bufnr? integer
---@return boolean
function M.is_enabled(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  return enabled_for(bufnr)
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
    disabled_ft[ft] = (not on) or nil
  else
    M.set({ enabled = on })
  end
  for _, client in ipairs(vim.lsp.get_clients({ name = NAME })) do
    for bufnr in pairs(client.attached_buffers or {}) do
      local yes = enabled_for(bufnr)
      if inline_completion then
        inline_completion.enable(yes, { bufnr = bufnr })
      elseif not yes then
        cancel(bufnr)
        clear(bufnr)
      end
    end
  end
  status_changed()
end

--- Turns suggestions off if on and on if off: everywhere, or for `filetype`.
---@param filetype? string
function M.toggle(filetype)
  if filetype and filetype ~= '' then
    M.enable(disabled_ft[filetype] ~= nil, { filetype = filetype })
  else
    M.enable(settings.enabled == false)
  end
end

--- A short string for a statusline: "assistd" (ready), "assistd: loading",
--- "assistd: off", "assistd: error", or "" when no assistd server is
--- attached to `bufnr` (and suggestions are not turned off).
---@param bufnr? integer
---@return string
function M.status(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  if not enabled_for(bufnr) then
    return 'assistd: off'
  end
  local client = get_client(bufnr)
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

-- What `lhs` did before our buffer-local mapping: that mapping (a completion
-- plugin's, a snippet engine's) is called, or, with none, the key itself is
-- typed (not remapped). Read once per buffer, before we map the key.
local fallbacks = {} ---@type table<integer, table<string, table|false>>

local function fallback(bufnr, lhs)
  fallbacks[bufnr] = fallbacks[bufnr] or {}
  local known = fallbacks[bufnr][lhs]
  if known == nil then
    local prev = vim.fn.maparg(lhs, 'i', false, true)
    local ours = type(prev) == 'table' and vim.startswith(prev.desc or '', 'assistd:')
    known = (type(prev) == 'table' and next(prev) and not ours) and prev or false
    fallbacks[bufnr][lhs] = known
  end
  local prev = known
  return function()
    if not prev then
      api.nvim_feedkeys(vim.keycode(lhs), 'in', false)
      return
    end
    if prev.callback and prev.expr ~= 1 then
      prev.callback()
      return
    end
    local keys
    if prev.callback then
      keys = prev.callback()
    elseif prev.expr == 1 then
      keys = api.nvim_eval((prev.rhs:gsub('<[Ss][Ii][Dd]>', ('<SNR>%d_'):format(prev.sid or 0))))
    else
      keys = prev.rhs:gsub('<[Ss][Ii][Dd]>', ('<SNR>%d_'):format(prev.sid or 0))
    end
    if type(keys) ~= 'string' or keys == '' then
      return
    end
    if prev.expr ~= 1 or prev.replace_keycodes == 1 then
      keys = vim.keycode(keys)
    end
    -- 'i': before keys typed after this one, so they keep their order.
    api.nvim_feedkeys(keys, prev.noremap == 1 and 'in' or 'im', false)
  end
end

local function set_keymaps(bufnr)
  local keys = options.keymaps
  if not keys then
    return
  end
  local function map(lhs, action, desc)
    if lhs then
      local otherwise = fallback(bufnr, lhs)
      vim.keymap.set('i', lhs, function()
        if not action() then
          otherwise()
        end
      end, { buffer = bufnr, desc = 'assistd: ' .. desc })
    end
  end
  map(keys.accept, function()
    return M.accept(bufnr)
  end, 'accept the suggestion')
  map(keys.accept_word, function()
    return M.accept_part('word', bufnr)
  end, "accept the suggestion's next word")
  map(keys.accept_line, function()
    return M.accept_part('line', bufnr)
  end, "accept the suggestion's next line")
  if inline_completion then
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
end

local function on_attach(client, bufnr)
  if inline_completion then
    observe(client)
    -- Per buffer, so that other servers' inline completion stays as the user
    -- configured it elsewhere.
    inline_completion.enable(enabled_for(bufnr), { bufnr = bufnr })
  else
    attach(client, bufnr)
    if vim.lsp.completion then
      -- 0.11: the popup menu too. Enabling it makes <C-y> run the item's
      -- command, so acceptances reach the server. Not autotriggered: a model
      -- call per keystroke would flood the menu; use <C-x><C-o>.
      vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = false })
    end
    -- 0.10: Neovim sets 'omnifunc' to vim.lsp.omnifunc on attach; <C-x><C-o>.
  end
  set_keymaps(bufnr)
  status_changed()
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
    handlers = { [STATUS] = on_status },
  }
end

-- Neovim 0.10: no vim.lsp.config/enable; start the client on FileType.
local function start_on_filetype(group)
  api.nvim_create_autocmd('FileType', {
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

-- AssistdSuggestion: Comment's colours, unless you set it. Neovim's default
-- colorscheme gives Comment a GUI colour only, so in a terminal without
-- 'termguicolors' the ghost text would look like typed text: grey 244 there.
local function set_highlight()
  local comment = api.nvim_get_hl(0, { name = 'Comment', link = false })
  if comment.ctermfg then
    api.nvim_set_hl(0, HL, { link = 'Comment', default = true })
  else
    api.nvim_set_hl(0, HL, { fg = comment.fg, ctermfg = 244, italic = comment.italic, default = true })
  end
end

--- Configures and enables the assistd language server.
---
--- opts: the server settings (model, backend, proposer, k, maxTokens,
--- maxPromptTokens, fim, db, enabled, telemetry) and the editor options
--- cmd, filetypes, root_markers, keymaps, tcp, disabled_filetypes, debounce_ms.
---@param opts? table
function M.setup(opts)
  opts = opts or {}
  for key in pairs(EDITOR_KEYS) do
    if opts[key] ~= nil then
      options[key] = opts[key]
    end
  end
  if type(opts.keymaps) == 'table' then -- the keys given replace the defaults' one by one
    options.keymaps = vim.tbl_extend('force', DEFAULTS.keymaps, opts.keymaps)
  end
  for _, ft in ipairs(options.disabled_filetypes or {}) do
    disabled_ft[ft] = true
  end
  take_settings(opts)

  set_highlight()
  local group = api.nvim_create_augroup('assistd', { clear = true })
  api.nvim_create_autocmd('ColorScheme', { group = group, callback = set_highlight })
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
        detach(ev.buf)
        status_changed()
      end
    end,
  })
  if inline_completion then
    api.nvim_create_autocmd('InsertLeave', {
      group = group,
      callback = function()
        set_shown(nil, nil) -- Neovim clears the ghost text on leaving insert mode
      end,
    })
  end
  api.nvim_create_user_command('AssistdStats', M.stats, {
    desc = 'Show assistd user-acceptance statistics',
  })
  api.nvim_create_user_command('AssistdToggle', function(cmd)
    local ft = cmd.args ~= '' and cmd.args or nil
    M.toggle(ft)
    local off = ft and disabled_ft[ft] or (not ft and settings.enabled == false)
    vim.notify(('assistd: %s%s'):format(ft and (ft .. ' ') or '', off and 'off' or 'on'))
  end, {
    nargs = '?',
    complete = 'filetype',
    desc = 'Turn assistd suggestions off or on (everywhere, or for a filetype)',
  })

  if vim.lsp.config and vim.lsp.enable then -- Neovim 0.11+
    vim.lsp.config(NAME, client_config())
    vim.lsp.enable(NAME)
  else
    start_on_filetype(group)
  end
end

return M
