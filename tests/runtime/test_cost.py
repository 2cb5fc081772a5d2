"""VerifyCostModel: measured verify-pass seconds by window size."""

from __future__ import annotations

import pytest

from specrt.cost import DEFAULT_SLOPE, MIN_SHIFTED_SHARE, AtContext, VerifyCostModel, nondecreasing


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


def test_nondecreasing_pools_each_decreasing_run_into_its_weighted_mean():
    assert nondecreasing([1.0, 3.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0]) == pytest.approx([1.0, 2.5, 2.5, 4.0])
    assert nondecreasing([1.0, 3.0, 2.0, 4.0], [1.0, 1.0, 3.0, 1.0]) == pytest.approx([1.0, 2.25, 2.25, 4.0])
    assert nondecreasing([5.0, 4.0, 3.0], [1.0, 1.0, 2.0]) == pytest.approx([3.75, 3.75, 3.75])
    assert nondecreasing([1.0, 2.0, 2.0], [1.0, 1.0, 1.0]) == [1.0, 2.0, 2.0]


def test_a_size_measured_once_in_a_slow_moment_is_pooled_with_a_bigger_cheaper_one():
    # the benchmark's trace: 7 positions measured once at 86 ms while another process ran, 8
    # positions at 59.5 ms over 15 passes; unpooled, 7 would look dearer than 8 for good
    cost = VerifyCostModel()
    cost.record(7, 0.086)
    for _ in range(15):
        cost.record(8, 0.0595)
    pooled = (0.086 * 1 + 0.0595 * 10) / 11  # 8's running mean weighs at most 1 / (1 - decay) = 10 passes
    assert cost.estimate(7) == pytest.approx(pooled)
    assert cost.estimate(8) == pytest.approx(pooled)
    for _ in range(3):
        cost.record(7, 0.040)  # measured again, cheaper: each size has its own mean once the order holds
    assert cost.estimate(7) == pytest.approx((0.086 + 3 * 0.040) / 4)  # the first passes are averaged
    assert cost.estimate(8) == pytest.approx(0.0595)


def test_the_first_passes_are_averaged_then_enter_an_exponential_mean():
    cost = VerifyCostModel(decay=0.75)  # averaged up to 4 passes
    for seconds in (0.08, 0.02, 0.02, 0.02):
        cost.record(1, seconds)
    assert cost.estimate(1) == pytest.approx(0.035)
    cost.record(1, 0.055)
    assert cost.estimate(1) == pytest.approx(0.75 * 0.035 + 0.25 * 0.055)


def test_an_unmeasured_size_stays_between_the_measured_sizes_around_it():
    cost = VerifyCostModel()
    cost.record(1, 0.010)
    cost.record(2, 0.030)
    cost.record(9, 0.031)  # the line through the three: 0.0165 + 0.0017 s, 0.025 at 5
    assert cost.estimate(5) == pytest.approx(0.030)  # never below the window of 2
    cost.record(6, 0.030)
    assert cost.estimate(3) == pytest.approx(0.030)  # between 2 and 6, both 0.030


def _pass_seconds(s: int, past: int) -> float:
    """A machine whose pass costs 10 ms + 2 ms per extra row, plus attention: 4 us per cached
    position for the first row and 1.5 us for each further row."""
    return 0.010 + 0.002 * (s - 1) + (4e-6 + 1.5e-6 * (s - 1)) * past


def test_attention_slopes_are_recovered_from_passes_at_varied_cached_lengths():
    cost = VerifyCostModel()
    for past in (100, 900, 300, 1200, 150, 700, 1000, 250):
        for s in (1, 4, 8):
            cost.record(s, _pass_seconds(s, past), past)
    first, further = cost.attention_slopes()
    assert first == pytest.approx(4e-6) and further == pytest.approx(1.5e-6)
    for past in (50, 600, 2000):  # every measured size, at any cached length
        for s in (1, 4, 8):
            assert cost.estimate(s, past) == pytest.approx(_pass_seconds(s, past))
    assert cost.estimate(4) == pytest.approx(cost.estimate(4, None))  # no length: the size's mean as it stands


def test_a_request_after_long_contexts_prices_its_windows_at_its_own_length():
    # the sizes a short request rarely uses were last measured after a long document: their means
    # hold that document's attention until the shift takes it out
    cost = VerifyCostModel()
    for past in (900, 1000, 1100, 950):
        for s in (1, 5):
            cost.record(s, _pass_seconds(s, past), past)
    for past in (100, 110, 120):  # the short request's single steps
        cost.record(1, _pass_seconds(1, past), past)
    assert cost.estimate(5, 120) == pytest.approx(_pass_seconds(5, 120))
    assert cost.estimate(5) == pytest.approx(_pass_seconds(5, 987.5))  # unshifted: the long document's mean
    assert cost.estimate(5, 120) / cost.estimate(1, 120) < cost.estimate(5, 1000) / cost.estimate(1, 1000)


def test_one_window_size_gives_one_slope_for_every_row_and_no_spread_gives_none():
    cost = VerifyCostModel()
    for past in (100, 500, 300):
        cost.record(1, 0.010 + 4e-6 * past, past)
    assert cost.attention_slopes() == pytest.approx((4e-6, 4e-6))
    flat = VerifyCostModel()
    for _ in range(3):
        flat.record(1, 0.010, 400)
        flat.record(4, 0.016, 400)
    assert flat.attention_slopes() == (0.0, 0.0)
    assert flat.estimate(4, 2000) == pytest.approx(0.016)  # nothing to shift by


def test_a_slope_fitted_on_noise_never_makes_a_pass_nearly_free():
    cost = VerifyCostModel()
    for past, seconds in ((100, 0.010), (1000, 0.050), (120, 0.011), (980, 0.049)):
        cost.record(1, seconds, past)
    cost.record(4, 0.030, 1000)
    assert cost.estimate(4, 0) >= MIN_SHIFTED_SHARE * 0.030
    assert cost.estimate(1, 0) >= MIN_SHIFTED_SHARE * cost.estimate(1)


def test_a_request_s_view_estimates_at_its_cached_length_of_the_moment():
    cost = VerifyCostModel()
    for past in (100, 900, 300):
        cost.record(1, _pass_seconds(1, past), past)
    view = AtContext(cost, 200)
    assert view.estimate(1) == pytest.approx(_pass_seconds(1, 200))
    view.past = 800  # the request's loop moves it on
    assert view.estimate(1) == pytest.approx(_pass_seconds(1, 800))


def test_bad_slope_decay():
    with pytest.raises(ValueError, match="slope_decay"):
        VerifyCostModel(slope_decay=1.0)
