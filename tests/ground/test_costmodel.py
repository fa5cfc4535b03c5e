"""The Target's cost model: interpolation, files that cannot be a cost model, calibration."""

import json
import time

import pytest

from assistd.ground.costmodel import (BRIEF_CPU_POINTS, CostModel, implausible, low_median,
                                      robust_points)
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


# ---------------------------------------------------------------- calibration


def test_low_median_ignores_the_slow_half_of_busy_timings():
    """Load only ever adds time: of 19, 19, 20, 250, 3000 ms (timings of this shape were
    measured here on 2 loaded cores) the statistic is 19, where a mean is 662."""
    assert low_median([250.0, 19.0, 3000.0, 20.0, 19.0]) == 19.0  # median of 19, 19, 20
    assert low_median([10.0, 12.0, 14.0, 100.0]) == 11.0  # the fastest 2 of 4
    assert low_median([7.0]) == 7.0
    with pytest.raises(ValueError):
        low_median([])


def test_robust_points_are_non_decreasing_and_take_the_fast_half():
    samples = {1: [11, 11, 12, 90, 95], 2: [19, 18, 400, 19, 500], 4: [15, 16, 17, 26, 26],
               8: [43, 44, 42, 41, 900]}
    assert robust_points(samples) == {1: 11.0, 2: 19.0, 4: 19.0, 8: 42.0}  # t(4) lifted to t(2)


@pytest.mark.parametrize("points, why", [
    (BRIEF_CPU_POINTS, None),                              # the reference CPU: 1.7 t(1) at n = 2
    ({1: 10.0, 2: 10.2, 8: 11.0, 32: 15.0}, None),         # a GPU: flat
    ({1: 10.0, 2: 20.0, 4: 40.0}, None),                   # one thread: ~n t(1)
    ({1: 19.0, 2: 175.0, 4: 175.0}, "t(2) = 9.2 t(1)"),    # measured on 2 loaded cores
    ({1: 10.0, 2: 20.0, 32: 500.0}, "t(32) = 50.0 t(1)"),
])
def test_implausible_calibrations_are_named(points, why):
    assert implausible(points) == why


class BusyBatches:
    """The real Target, with a batch of n >= 2 tokens taking 40 ms more per token: a
    busy machine's threads waiting on each other, which a test cannot provoke on demand
    (so it is added by sleeping, and says so)."""

    def __init__(self, target):
        self._t = target

    def __getattr__(self, name):
        return getattr(self._t, name)

    def evaluate(self, tokens, rows):
        out = self._t.evaluate(tokens, rows)
        if len(tokens) >= 2 and len(list(rows)) == len(tokens):
            time.sleep(0.04 * len(tokens))
        return out


def test_calibration_on_the_real_target_is_plausible_or_says_why(target):
    cm = CostModel.calibrate(target)
    assert sorted(cm.points) == [1, 2, 4, 8, 16, 32] and cm.source == "calibrated:llama"
    assert list(cm.points.values()) == sorted(cm.points.values())
    assert target.kv_tokens == []
    if cm.note:  # this machine was busy: the reference curve at the measured t(1)
        assert "busy machine" in cm.note
        assert cm.t_ms(8) / cm.t_ms(1) == pytest.approx(43.0 / 11.0)
    else:
        assert implausible(cm.points) is None


def test_a_busy_machine_gets_the_reference_curve_after_measuring_only_n_up_to_2(target):
    seen = []

    class Counting(BusyBatches):
        def evaluate(self, tokens, rows):
            seen.append(len(tokens))
            return super().evaluate(tokens, rows)

    cm = CostModel.calibrate(Counting(target))
    assert "busy machine (t(2) = " in cm.note and cm.source == "calibrated:llama"
    assert {n: round(ms / cm.points[1], 6) for n, ms in cm.points.items()} == {
        n: round(ms / 11.0, 6) for n, ms in BRIEF_CPU_POINTS.items()}
    assert set(seen[1:]) == {1, 2}  # after the context: never the bigger sizes
