"""The rig that the tests and the benchmarks share: real processes started and waited
for (the daemon, ``assistd lsp`` under a real LSP client, llama-cpp-python's server,
VS Code in a browser) and the texts both feed them.

Neither product code nor a test module: a benchmark imports from here, never from
``tests`` (tests/test_layers.py checks both rules), and nothing in ``assistd``,
``storage``, ``proposers`` or ``editors`` imports it. Not shipped in the wheel.
"""
