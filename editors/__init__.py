"""Editor front ends. The LSP server (pygls) arrives with the `lsp` issue; it will be a thin
layer over :func:`assistd.runtime.session.complete_at`, like the CLI."""
