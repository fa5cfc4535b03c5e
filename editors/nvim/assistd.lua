-- Kept so that configs written for the old single-file plugin keep working: a
-- link to this file in ~/.config/nvim/lua/, or lazy.nvim's
-- `dofile(plugin.dir .. '/assistd.lua')`. The plugin now lives in lua/assistd/;
-- put this folder on the runtimepath instead (README.md).
local dir = vim.fs.dirname(vim.uv.fs_realpath(debug.getinfo(1, 'S').source:sub(2)))
local init = dir .. '/lua/assistd/init.lua'
if not vim.uv.fs_stat(init) then -- a copy of this file, away from its folder
  error('assistd: put the folder editors/nvim on the runtimepath (see its README.md); '
    .. 'this file only loads it from there')
end
vim.opt.rtp:append(dir)
-- By path: require('assistd') would find the link to this file again.
local M = dofile(init)
package.loaded.assistd = M
return M
