--- Neovim 0.10/0.11: ghost text drawn by this plugin.
---
--- A request goes out debounce_ms after typing or moving in insert mode; a
--- newer one cancels the one in flight (the server stops its generation). The
--- answer is drawn only if the buffer and cursor are where they were asked
--- about. The first line is inline virtual text at the cursor, the rest
--- virtual lines below. Typing a character the ghost text starts with
--- consumes it (no new request); any other change dismisses it.

local config = require('assistd.config')
local lsp = require('assistd.client')
local text = require('assistd.text')

local api = vim.api
local call = lsp.call
local HL = config.HL
local AUTOMATIC = 2 -- lsp.InlineCompletionTriggerKind.Automatic

local M = {}

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
    lsp.send(b.s.client, event, b.s.id)
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

-- The suggestion for an answer's first item at (row, col), or nil.
local function take(bufnr, client, item, row, col, tick)
  local new_text = item and text.of(item)
  if not new_text or new_text == '' then
    return nil
  end
  local line = api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
  local start = col
  local r = item.range
  if type(r) == 'table' and r.start and r.start.line == row and r['end'].line == row then
    start = math.min(text.byte_col(line, r.start.character, client.offset_encoding), col)
  end
  local head, rest = text.split_item(new_text, line:sub(start + 1, col))
  if rest == '' then
    return nil
  end
  return {
    client = client,
    item = item,
    id = lsp.suggestion_id(item),
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
  if not config.enabled_for(bufnr) or vim.fn.pumvisible() == 1 or call(b.client, 'is_stopped') then
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
      or not config.enabled_for(bufnr)
    then
      return
    end
    local items = type(result) == 'table' and (result.items or result) or {}
    local new = take(bufnr, client, items[1], row, col, tick)
    clear(bufnr)
    if new then
      b.s = new
      draw(bufnr, new)
      lsp.send(client, lsp.SHOWN, new.id)
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
  b.timer:start(config.options.debounce_ms, 0, vim.schedule_wrap(function()
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
    clear(bufnr, lsp.DISMISSED)
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
--- line. Returns false when there is none at the cursor.
function M.accept(bufnr, kind)
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
  local part = kind == 'all' and s.rest or text.next_part(s.rest, kind)
  local new_text = s.head .. part
  local new_row, new_col = text.insert(bufnr, s.row, s.start, s.col, new_text)
  b.tick = api.nvim_buf_get_changedtick(bufnr)
  s.accepted = s.accepted .. new_text
  s.rest = s.rest:sub(#part + 1)
  if s.rest == '' then
    clear(bufnr)
    lsp.run_command(s.client, s.command, bufnr)
    return true
  end
  local line = api.nvim_buf_get_lines(bufnr, new_row, new_row + 1, true)[1]
  s.row, s.start, s.col, s.head, s.tick = new_row, new_col, new_col, '', b.tick
  s.prefix, s.suffix = line:sub(1, new_col), line:sub(new_col + 1)
  draw(bufnr, s)
  lsp.send(s.client, lsp.PARTIAL, s.id, text.utf16_len(s.accepted))
  return true
end

--- The ghost text on screen in `bufnr`: `{ id, text, item }`, or nil.
function M.suggestion(bufnr)
  local s = bufs[bufnr] and bufs[bufnr].s
  return s and { id = s.id, text = s.rest, item = s.item } or nil
end

--- Stops asking and clears the ghost text (suggestions turned off).
function M.hide(bufnr)
  cancel(bufnr)
  clear(bufnr)
end

function M.detach(bufnr)
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

function M.attach(client, bufnr)
  M.detach(bufnr)
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
    clear(bufnr, lsp.DISMISSED)
  end)
  on('BufLeave', function()
    cancel(bufnr)
    clear(bufnr)
  end)
  on({ 'BufUnload', 'BufWipeout' }, M.detach)
  if api.nvim_get_current_buf() == bufnr and in_insert() then
    schedule(bufnr) -- typing began before the server was up
  end
end

-- AssistdSuggestion: Comment's colours, unless you set it. Neovim's default
-- colorscheme gives Comment a GUI colour only, so in a terminal without
-- 'termguicolors' the ghost text would look like typed text: grey 244 there.
function M.set_highlight()
  local comment = api.nvim_get_hl(0, { name = 'Comment', link = false })
  if comment.ctermfg then
    api.nvim_set_hl(0, HL, { link = 'Comment', default = true })
  else
    api.nvim_set_hl(0, HL, { fg = comment.fg, ctermfg = 244, italic = comment.italic, default = true })
  end
end

return M
