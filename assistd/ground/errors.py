"""The project's exceptions. Each message names the fix.

Only the front ends (the CLI, the LSP server, the HTTP API and the MCP tools) translate
these for their audience; core code raises them and never prints.
"""


class AssistdError(Exception):
    """Base class: an error the user can act on. The CLI prints it on one line, exit 2."""


class ModelError(AssistdError):
    """The Target model is missing, unreadable or fails to load."""


class InputError(AssistdError):
    """A file, position or option given by the user cannot be used."""


class HistoryError(AssistdError):
    """The history database cannot be opened or belongs to a newer assistd."""
