"""The settings vocabulary, validated once (assistd.ground.options)."""

from __future__ import annotations

import pytest

from assistd.ground.errors import InputError
from assistd.ground.options import K_LIMIT, parse_k


@pytest.mark.parametrize("value,expected", [("auto", "auto"), (0, 0), (8, 8), ("8", 8),
                                            (" 16", 16), (K_LIMIT, K_LIMIT)])
def test_k_accepts_auto_and_tokens(value, expected):
    """parse_k takes 'auto' and whole numbers of tokens 0..K_LIMIT, as ints or decimal strings
    (leading space allowed)."""
    assert parse_k(value) == expected


@pytest.mark.parametrize("value", [-1, K_LIMIT + 1, "65", "1_0", "+3", "\u0663", "", "x",
                                   True, None, 2.0, "Auto"])
def test_k_refuses_the_rest_naming_the_option(value):
    """parse_k refuses negatives, over K_LIMIT, underscores, signs, non-ASCII digits, empty,
    words, booleans, None, floats and 'Auto', with one message naming the option."""
    with pytest.raises(InputError, match=r"assistd\.k must be 'auto' or a number of tokens 0\.\.64"):
        parse_k(value, what="assistd.k")


def test_every_front_end_validates_k_here():
    """The CLI, the TOML config and LSP settings give the same verdict as parse_k."""
    from click.testing import CliRunner

    from assistd.cli import cli
    from assistd.serving.config import Config, _validate
    from editors.settings import parse_settings

    r = CliRunner().invoke(cli, ["complete", "--file", "x.py", "--k", "65"])
    assert r.exit_code == 2 and "0..64, not '65'" in r.output
    with pytest.raises(InputError, match="0..64, not '65'"):
        _validate(Config(k="65"))
    settings, warnings = parse_settings({"assistd": {"k": 65}})
    assert settings.k == "auto" and any("0..64" in w for w in warnings)
    assert parse_settings({"assistd": {"k": "12"}})[0].k == 12
