--- Suggestion text: what is drawn and what each accept inserts, and the
--- column arithmetic between LSP positions and Neovim's byte columns.
---
--- The server's item replaces the range [start, cursor] on the cursor's line
--- with insertText: `start` lies before the cursor when the suggestion changes
--- the indentation the editor put there. That text splits into `head`, what
--- [start, cursor] becomes (the buffer's own text when the item starts with
--- it, else the item's indentation), and `rest`, drawn at the cursor.

local api = vim.api
local has_011 = vim.fn.has('nvim-0.11') == 1

local M = {}

local WORD = '^%s*[%w_\128-\255]+' -- bytes >= 0x80 count as word characters: no split UTF-8
local PUNCT = '^%s*[^%w_%s\128-\255]+'

---@return string head, string rest
function M.split_item(text, before)
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
function M.next_part(rest, kind)
  if kind == 'word' then
    return rest:match('^[ \t]*\n[ \t]*') or rest:match(WORD) or rest:match(PUNCT) or rest
  end
  if rest:sub(1, 1) == '\n' then
    return '\n' .. rest:sub(2):match('^[^\n]*')
  end
  return rest:match('^[^\n]*')
end

-- Replaces [row, start_col .. col] with `text`; puts the cursor after it.
function M.insert(bufnr, row, start_col, col, text)
  local lines = vim.split(text, '\n', { plain = true })
  api.nvim_buf_set_text(bufnr, row, start_col, row, col, lines)
  local new_row = row + #lines - 1
  local new_col = (#lines == 1 and start_col or 0) + #lines[#lines]
  api.nvim_win_set_cursor(0, { new_row + 1, new_col })
  return new_row, new_col
end

--- An item's text, LF line breaks (the LSP item's insertText, or 0.12's
--- insert_text); nil when it has none.
function M.of(item)
  local text = item.insertText or item.insert_text
  if type(text) == 'table' then
    text = text.value -- a snippet: drawn and inserted as plain text
  end
  return type(text) == 'string' and (text:gsub('\r\n', '\n')) or nil
end

-- Length of `s` in UTF-16 code units: what VS Code reports as acceptedLength.
function M.utf16_len(s)
  if has_011 then
    return vim.str_utfindex(s, 'utf-16')
  end
  local _, n = vim.str_utfindex(s)
  return n
end

-- Byte column of a position's `character` on `line`, in the client's encoding.
function M.byte_col(line, character, encoding)
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

return M
