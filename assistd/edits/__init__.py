"""Fast apply for agents: one edit to one file, returned as new text or a unified diff.

Nothing here writes a file. The modules, each with one job:

- :mod:`assistd.edits.blocks`: parse aider-style SEARCH/REPLACE blocks, apply them
  deterministically, and tell a "lazy" snippet (``// ... existing code ...``) from them.
- :mod:`assistd.edits.validate`: whether a text still parses for its language.
- :mod:`assistd.edits.merge`: the chat prompt that asks a model to merge a lazy snippet,
  and the code taken back out of its answer.
- :mod:`assistd.edits.fast_apply`: :func:`~assistd.edits.fast_apply.apply_edit`, which reads
  the file under the history's path rules and routes the edit (blocks: no model; a
  snippet: the caller's model, with the original file as the predicted output).
"""
