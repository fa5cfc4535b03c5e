"""The measuring tools: ``assistd bench`` and ``assistd replay``, their workloads and
reports."""
