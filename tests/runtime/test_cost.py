"""VerifyCostModel: measured verify-pass seconds by window size."""

from __future__ import annotations

import pytest

from specrt.cost import DEFAULT_SLOPE, VerifyCostModel


def test_nothing_measured_is_zero():
    assert VerifyCostModel().estimate(4) == 0.0


def test_measured_size_returns_running_mean():
    cost = VerifyCostModel(decay=0.5)
    cost.record(3, 1.0)
    cost.record(3, 2.0)
    assert cost.estimate(3) == pytest.approx(1.5)


def test_one_measured_size_extrapolates_with_default_slope():
    cost = VerifyCostModel()
    cost.record(1, 0.1)
    assert cost.estimate(5) == pytest.approx(0.1 * (1 + DEFAULT_SLOPE * 4))


def test_line_through_measured_sizes_never_below_cheapest():
    cost = VerifyCostModel()
    cost.record(1, 0.10)
    cost.record(9, 0.18)
    assert cost.estimate(5) == pytest.approx(0.14)
    cost2 = VerifyCostModel()
    cost2.record(4, 0.10)
    cost2.record(8, 0.30)
    assert cost2.estimate(1) == pytest.approx(0.10)  # the fitted line would go below the cheapest pass


def test_bad_decay():
    with pytest.raises(ValueError, match="decay"):
        VerifyCostModel(decay=1.0)


def test_estimates_follow_every_new_measurement():
    cost = VerifyCostModel(decay=0.5)
    cost.record(1, 0.10)
    cost.record(9, 0.18)
    assert cost.estimate(5) == pytest.approx(0.14)
    cost.record(9, 0.26)  # running mean at 9: 0.22
    assert cost.estimate(5) == pytest.approx(0.16)
    cost.record(3, 0.13)  # least squares through (1, 0.10), (3, 0.13), (9, 0.22): 0.085 + 0.015 s
    assert cost.estimate(7) == pytest.approx(0.19)
    assert cost.estimate(5) == pytest.approx(0.16)
