--- The buffer-local insert-mode keys, and what each does when there is
--- nothing to accept: what the key did before we mapped it.

local config = require('assistd.config')
local native = require('assistd.native')

local api = vim.api

local M = {}

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

--- Maps the keys of options.keymaps in `bufnr` to the actions of `assistd`
--- (the public module: accept, accept_part, select).
function M.set(bufnr, assistd)
  local keys = config.options.keymaps
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
    return assistd.accept(bufnr)
  end, 'accept the suggestion')
  map(keys.accept_word, function()
    return assistd.accept_part('word', bufnr)
  end, "accept the suggestion's next word")
  map(keys.accept_line, function()
    return assistd.accept_part('line', bufnr)
  end, "accept the suggestion's next line")
  if native.available then
    if keys.next then
      vim.keymap.set('i', keys.next, function()
        assistd.select(1)
      end, { buffer = bufnr, desc = 'assistd: next suggestion' })
    end
    if keys.prev then
      vim.keymap.set('i', keys.prev, function()
        assistd.select(-1)
      end, { buffer = bufnr, desc = 'assistd: previous suggestion' })
    end
  end
end

return M
