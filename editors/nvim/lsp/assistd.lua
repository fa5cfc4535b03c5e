-- The assistd server's config for vim.lsp.enable('assistd') (Neovim 0.11+),
-- which reads lsp/<name>.lua from the runtimepath: the options given to
-- require('assistd').setup() so far, else the defaults. Enabling it without
-- setup() also installs the editor side (ghost text, keys, commands), as
-- setup({}) would; vim.lsp.config('assistd', {...}) overrides what it returns.
require('assistd')._install_once()
return require('assistd.server').config()
