"""The settings vocabulary every front end shares, validated here once.

The draft ceiling ``k`` arrives as ``--k`` (CLI), ``k`` (the TOML config), ``k`` (LSP
``initializationOptions``), ``assistd.k`` (the OpenAI-shaped API) and ``k`` (the
``/v1/assistd/complete`` body and the MCP tool): every one of them goes through
:func:`parse_k`.
"""

from __future__ import annotations

from assistd.ground.errors import InputError

# The largest fixed ceiling a user may ask for (tokens per draft). With k="auto" the
# tuner chooses among 0..assistd.decoding.tuner.K_MAX.
K_LIMIT = 64


def parse_k(value, *, what: str = "k") -> int | str:
    """``"auto"`` or a whole number of tokens in ``0..K_LIMIT`` (0 = plain decoding).

    Accepts an int, or a string of digits (command lines, TOML, JSON from editors).
    Raises :class:`InputError` naming ``what`` (the option as the user spelt it).

    >>> parse_k("auto"), parse_k("8"), parse_k(0)
    ('auto', 8, 0)
    """
    if value == "auto":
        return "auto"
    if isinstance(value, bool):  # True is an int to Python, not a ceiling to a user
        value = None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and 0 <= value <= K_LIMIT:
        return value
    raise InputError(f"{what} must be 'auto' or a number of tokens 0..{K_LIMIT}, not {value!r}")
