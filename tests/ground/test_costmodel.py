"""The Target's cost model: interpolation, and files that cannot be a cost model."""

import json

import pytest

from assistd.ground.costmodel import CostModel
from assistd.ground.errors import InputError


def test_brief_figures_interpolate_and_extrapolate():
    cm = CostModel.brief()
    assert cm.t_ms(1) == 11.0 and cm.t_ms(8) == 43.0
    assert cm.t_ms(3) == pytest.approx(22.5)  # between 2 (19) and 4 (26)
    assert cm.round_ms(0) == 11.0 and cm.round_ms(7) == 43.0  # a round evaluates last + draft
    assert cm.t_ms(64) == pytest.approx(142.0 + (142.0 - 75.0) / 16 * 32)


@pytest.mark.parametrize("points, why", [
    ({"8": 43.0}, "starting with 1"),                      # no plain-step cost
    ({"1": 11.0, "2": 5.0}, "cannot take less time"),      # decreasing
    ({"1": float("nan")}, "finite positive"),
    ({"1": 11.0, "2": float("inf")}, "finite positive"),
    ({"1": True}, "must be numbers"),
    ({"1": 0.0}, "finite positive"),
])
def test_bad_cost_model_files_are_refused_naming_the_file(tmp_path, points, why):
    """NaN or Infinity would print invalid JSON and a missing t(1) or a decreasing t(n)
    would give meaningless speedups (all seen in a newcomer's run): refused."""
    f = tmp_path / "cost.json"
    f.write_text(json.dumps({"points": points}))
    with pytest.raises(InputError, match=why) as e:
        CostModel.load(f)
    assert str(f) in str(e.value)
