"""specrt.drafters.indexes.topk.top_k: the k largest logits per row, best first, ties by smaller id."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.drafters.indexes.topk import COLUMNS, top_k


def reference(logits: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-logits, axis=-1, kind="stable")[:, :k]


def test_literal_rows_and_ties():
    logits = np.array([[0.5, 2.0, -1.0, 2.0, 1.0], [3.0, 3.0, 3.0, 0.0, 3.0]], np.float32)
    assert top_k(logits, 3).tolist() == [[1, 3, 4], [0, 1, 2]]
    assert top_k(logits, 5).tolist() == [[1, 3, 4, 0, 2], [0, 1, 2, 4, 3]]
    assert top_k(logits, 1).tolist() == [[1], [0]]


@pytest.mark.parametrize("vocab", [COLUMNS * 3, COLUMNS * 40 + 17, 50, 1500])
@pytest.mark.parametrize("k", [1, 8, 64])
def test_matches_a_stable_sort_of_the_whole_row(vocab, k):
    rng = np.random.default_rng(vocab * 100 + k)
    k = min(k, vocab)
    rows = rng.standard_normal((5, vocab)).astype(np.float32)
    rows[1] = np.round(rows[1])  # many ties, across columns
    rows[2, -3:] = 10.0  # the best ids sit among the leftover ids
    rows[3, ::7] = 7.0  # tied best values in many columns
    assert np.array_equal(top_k(rows, k), reference(rows, k))


def test_nan_logits_sort_last():
    logits = np.full((1, 3 * COLUMNS), np.nan, np.float32)
    logits[0, [5, 2000]] = [1.0, 2.0]
    top = top_k(logits, 4)
    assert top.shape == (1, 4) and top[0, :2].tolist() == [2000, 5]


def test_bad_k():
    with pytest.raises(ValueError, match="k must be in"):
        top_k(np.zeros((1, 4), np.float32), 5)
    with pytest.raises(ValueError, match="k must be in"):
        top_k(np.zeros((1, 4), np.float32), 0)
