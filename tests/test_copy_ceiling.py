"""scripts/copy_ceiling.py: what a copy drafter could draft at each position, and the oracle's
least verify cost, on literal answers worked by hand."""

import numpy as np
import pytest

from scripts.copy_ceiling import copy_ceiling, copy_lengths


def linear(s: int) -> float:
    return 1.0 + 0.1 * (s - 1)


def test_copy_lengths_count_only_text_already_seen():
    prompt, output = np.array([5, 6, 7, 8]), np.array([1, 5, 6, 7, 9])
    np.testing.assert_array_equal(copy_lengths(prompt, output), [0, 3, 2, 1, 0])


def test_an_occurrence_may_not_run_into_the_text_being_drafted():
    # at answer position 1 the context is [3, 3]: [3, 3] occurs in it, [3, 3, 3] does not
    np.testing.assert_array_equal(copy_lengths(np.array([3]), np.array([3, 3, 3, 3])), [1, 2, 2, 1])


def test_the_oracle_takes_the_cheapest_path():
    prompt, output = np.array([5, 6, 7, 8]), np.array([1, 5, 6, 7, 9])
    tokens, cost = copy_ceiling(prompt, output, linear, max_draft=8)
    assert tokens == 4
    assert cost == pytest.approx(1.3)  # one window of 4: [1 | 5 6 7] emits 5 6 7 9


def test_the_draft_budget_caps_each_step():
    prompt, output = np.array([5, 6, 7, 8]), np.array([1, 5, 6, 7, 9])
    assert copy_ceiling(prompt, output, linear, max_draft=1) == (4, pytest.approx(2.2))
    assert copy_ceiling(prompt, output, linear, max_draft=0) == (4, pytest.approx(4.0))  # plain decoding


def test_windows_that_cost_more_than_they_emit_are_not_taken():
    prompt, output = np.array([5, 6, 7, 8]), np.array([1, 5, 6, 7, 9])
    steep = lambda s: 1.0 + 2.0 * (s - 1)  # noqa: E731  (a drafted token costs two single steps)
    assert copy_ceiling(prompt, output, steep, max_draft=8) == (4, pytest.approx(4.0))


def test_answers_too_short_to_decode_and_bad_budgets():
    assert copy_ceiling(np.array([1]), np.array([2]), linear, max_draft=4) == (0, 0.0)
    with pytest.raises(ValueError, match="max_draft must be >= 0"):
        copy_ceiling(np.array([1]), np.array([2, 3]), linear, max_draft=-1)


def test_anchored_copies_start_right_after_an_earlier_occurrence_of_the_suffix():
    prompt, output = np.array([5, 6, 7, 8]), np.array([1, 5, 6, 7, 9])
    # anchor 1: after "5" the prompt continues 6 7 (8 differs from 9); after "6": 7; "1" and "8" never occurred before
    np.testing.assert_array_equal(copy_lengths(prompt, output, anchor=1), [0, 0, 2, 1, 0])
    np.testing.assert_array_equal(copy_lengths(prompt, output, anchor=2), [0, 0, 0, 1, 0])
    # position 1 cannot draft its "5" (nothing ends in "1" before): one plain step, then one window of 3
    assert copy_ceiling(prompt, output, linear, max_draft=8, anchor=1) == (4, pytest.approx(1.0 + 1.2))
    with pytest.raises(ValueError, match="anchor must be >= 0"):
        copy_lengths(prompt, output, anchor=-1)
