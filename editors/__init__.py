"""Editor front ends: the LSP server (pygls, ``assistd lsp``), its completer, prompt and
suggestion rules, positions and settings, and the completer that runs on the daemon."""
