"""The settings vocabulary every front end shares, validated here once.

The draft ceiling ``k`` arrives as ``--k`` (CLI), ``k`` (the TOML config), ``k`` (LSP
``initializationOptions``), ``assistd.k`` (the OpenAI-shaped API) and ``k`` (the
``/v1/assistd/complete`` body and the MCP tool): every one of them goes through
:func:`parse_k`.
"""

from __future__ import annotations

from assistd.ground.errors import InputError

# The Target's context window when no flag, variable, config key or setting names one,
# tokens (every front end; assistd.targets.spec.TargetSpec.n_ctx).
DEFAULT_N_CTX = 4096

# The largest fixed ceiling a user may ask for (tokens per draft). With k="auto" the
# tuner chooses among 0..assistd.decoding.tuner.K_MAX.
K_LIMIT = 64


def parse_k(value, *, what: str = "k") -> int | str:
    """``"auto"`` or a whole number of tokens in ``0..K_LIMIT`` (0 = plain decoding).

    Accepts an int, or a string of digits (command lines, TOML, JSON from editors).
    Raises :class:`InputError` naming ``what`` (the option as the user spelt it).

    >>> parse_k("auto"), parse_k("8"), parse_k(0)
    ('auto', 8, 0)
    >>> parse_k("\u0663")
    Traceback (most recent call last):
    ...
    assistd.ground.errors.InputError: k must be 'auto' or a number of tokens 0..64, not '٣'
    """
    if value == "auto":
        return "auto"
    n = None
    if isinstance(value, int) and not isinstance(value, bool):  # True is no ceiling
        n = value
    elif isinstance(value, str) and value.isascii() and value.strip().isdigit():
        n = int(value.strip())  # ASCII digits only: int() also takes "1_0", "+3", "٣"
    if n is not None and 0 <= n <= K_LIMIT:
        return n
    raise InputError(f"{what} must be 'auto' or a number of tokens 0..{K_LIMIT}, not {value!r}")
