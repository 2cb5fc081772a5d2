"""The target distribution: temperature, top-k, top-p (specrt.sampling)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specrt.errors import InvalidRequestError
from specrt.sampling import SAMPLE_BLOCK, SamplingParams, TargetRows, outside_nucleus, sample, target_probs


def logits_of(probs: list[float]) -> np.ndarray:
    """[1, vocab] logits whose softmax at temperature 1 is ``probs`` (0 -> a very low logit)."""
    return np.array([[math.log(p) if p > 0 else -1e9 for p in probs]], np.float32)


def test_temperature_one_is_softmax():
    # logits [0, ln 2]: probabilities 1/3, 2/3
    p = target_probs(np.array([[0.0, math.log(2.0)]]), SamplingParams(temperature=1.0))
    np.testing.assert_allclose(p, [[1 / 3, 2 / 3]])
    assert p.dtype == np.float64


def test_low_temperature_sharpens():
    # T = 0.5 doubles the logits: [0, 2 ln 2] -> 1/5, 4/5
    p = target_probs(np.array([[0.0, math.log(2.0)]]), SamplingParams(temperature=0.5))
    np.testing.assert_allclose(p, [[1 / 5, 4 / 5]])


def test_high_temperature_flattens():
    # T = 2 halves the logits: [0, 2 ln 3] -> [0, ln 3] -> 1/4, 3/4
    p = target_probs(np.array([[0.0, 2 * math.log(3.0)]]), SamplingParams(temperature=2.0))
    np.testing.assert_allclose(p, [[1 / 4, 3 / 4]])


def test_rows_are_independent():
    # each window slot is its own distribution; a huge logit does not overflow
    logits = np.array([[0.0, math.log(3.0)], [1000.0, 1000.0]])
    p = target_probs(logits, SamplingParams(temperature=1.0))
    np.testing.assert_allclose(p, [[1 / 4, 3 / 4], [1 / 2, 1 / 2]])


def test_top_k_keeps_the_k_largest():
    # logits [1, 3, 2, 0], k = 2: tokens 1 and 2 survive, renormalised
    p = target_probs(np.array([[1.0, 3.0, 2.0, 0.0]]), SamplingParams(temperature=1.0, top_k=2))
    e = math.e
    np.testing.assert_allclose(p, [[0.0, e / (e + 1), 1 / (e + 1), 0.0]])


def test_top_k_keeps_ties_at_the_kth_value():
    # k = 1 but tokens 1 and 2 tie for the largest logit: both are kept
    p = target_probs(np.array([[1.0, 2.0, 2.0, 0.0]]), SamplingParams(temperature=1.0, top_k=1))
    np.testing.assert_allclose(p, [[0.0, 0.5, 0.5, 0.0]])


@pytest.mark.parametrize("top_k", [4, 10])
def test_top_k_at_or_above_vocab_is_off(top_k):
    logits = logits_of([0.1, 0.2, 0.3, 0.4])
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=top_k))
    np.testing.assert_allclose(p, [[0.1, 0.2, 0.3, 0.4]], atol=1e-6)


@pytest.mark.parametrize(
    "top_p, expected",
    [
        (0.4, [0.0, 1.0, 0.0, 0.0]),  # the first token alone (0.5) already reaches 0.4
        (0.7, [0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8]),  # 0.5 < 0.7 <= 0.5 + 0.3: two tokens
        (0.9, [0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95]),  # 0.8 < 0.9 <= 0.95: three tokens
        (0.99, [0.15, 0.5, 0.05, 0.3]),  # 0.95 < 0.99: everything
        (1e-9, [0.0, 1.0, 0.0, 0.0]),  # tiny mass: the first token is always kept
    ],
)
def test_top_p_keeps_the_smallest_prefix_reaching_the_mass(top_p, expected):
    # vocabulary order is not the sorted order: probabilities 0.15, 0.5, 0.05, 0.3
    logits = logits_of([0.15, 0.5, 0.05, 0.3])
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))
    np.testing.assert_allclose(p, [expected], atol=1e-6)


def test_top_k_then_top_p():
    # top_k = 3 drops 0.05 -> [0.15, 0.5, 0.3] / 0.95; top_p = 0.6 then keeps 0.5/0.95 (0.526)
    # and 0.3/0.95 (cumulative 0.842 >= 0.6)
    logits = logits_of([0.15, 0.5, 0.05, 0.3])
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.6))
    np.testing.assert_allclose(p, [[0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8]], atol=1e-6)


def sorted_nucleus_drop(p: np.ndarray, top_p: float) -> np.ndarray:
    """top-p's definition on the whole row: a stable sort of every token by descending probability."""
    order = np.argsort(-p, kind="stable")
    sorted_p = p[order]
    drop = np.empty(len(p), bool)
    drop[order] = np.cumsum(sorted_p) - sorted_p >= top_p
    return drop


@pytest.mark.parametrize("vocab, spread, top_k, top_p", [
    (151_936, 3.0, 0, 0.9),    # a peaked row: the nucleus within the first candidates
    (151_936, 0.1, 0, 0.95),   # a nearly flat row: the candidates grow to the whole vocabulary
    (20_000, 1.0, 0, 0.999),   # the candidates grow several times
    (151_936, 3.0, 50, 0.9),   # top-k's zeros
    (5_000, 0.0, 0, 0.5),      # all tokens tied: the order is by token id
    (3_000, 1.0, 0, 0.7),      # fewer tokens than the first candidates
])
def test_top_p_on_the_candidates_equals_top_p_on_the_whole_sorted_row(vocab, spread, top_k, top_p):
    rng = np.random.default_rng(vocab + top_k)
    logits = np.round(rng.standard_normal((3, vocab)) * spread * 4) / 4  # many ties
    params = SamplingParams(temperature=0.8, top_k=top_k)
    probs = target_probs(logits.astype(np.float32), params)
    for row in probs:
        assert np.array_equal(outside_nucleus(row, top_p), sorted_nucleus_drop(row, top_p))


def test_sampling_params_defaults_are_greedy():
    params = SamplingParams()
    assert (params.temperature, params.top_k, params.top_p) == (0.0, 0, 1.0)
    assert params.greedy
    assert not SamplingParams(temperature=0.7).greedy


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature must be a finite number >= 0, got -0.1"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
        ({"temperature": float("inf")}, "temperature must be a finite number >= 0, got inf"),
        ({"top_k": -1}, "top_k must be >= 0, got -1"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_p": -0.2}, r"top_p must be in \(0, 1\], got -0.2"),
    ],
)
def test_sampling_params_validation(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs)


def test_invalid_request_error_is_a_value_error():
    with pytest.raises(ValueError):
        SamplingParams(top_k=-3)


@pytest.mark.parametrize("token", [0, 2, 4])
def test_sample_point_mass(token):
    rng = np.random.default_rng(0)
    p = np.zeros(5)
    p[token] = 3.0  # unnormalised is fine
    assert [sample(p, rng) for _ in range(100)] == [token] * 100


def test_sample_never_draws_zero_probability_tokens():
    # mass only on tokens 1 and 3; tokens 0, 2, 4 must never come out
    rng = np.random.default_rng(0)
    p = np.array([0.0, 1.0, 0.0, 1.0, 0.0])
    draws = {sample(p, rng) for _ in range(2000)}
    assert draws == {1, 3}


class FixedUniform:
    """An rng whose random() always returns ``u``: drives sample() onto the edges of [0, 1)."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


@pytest.mark.parametrize(
    "u, expected",
    [
        (0.0, 1),  # u = 0: the first token with mass, not the zero-mass token 0
        (0.5, 3),  # u on the cdf step between tokens 1 and 3: the upper token, not the empty 2
        (1.0 - 2.0**-53, 3),  # the largest u: the last token with mass, not the trailing 4
    ],
)
def test_sample_edges_of_the_unit_interval(u, expected):
    p = np.array([0.0, 1.0, 0.0, 1.0, 0.0])  # cdf [0, 1, 1, 2, 2]
    assert sample(p, FixedUniform(u)) == expected


def test_sample_frequencies_follow_p():
    # 20k draws from [0.1, 0.2, 0.7]: each frequency within 5 standard errors of p
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.2, 0.7])
    counts = np.bincount([sample(p, rng) for _ in range(20_000)], minlength=3)
    np.testing.assert_allclose(counts / 20_000, p, atol=5 * math.sqrt(0.25 / 20_000))


def whole_vector_draw(p: np.ndarray, u: float) -> int:
    """The definition sample() implements: the step of p's running sum that holds u * total."""
    cdf = np.cumsum(p)
    return int(np.searchsorted(cdf, u * cdf[-1], side="right"))


def test_sample_two_levels_draw_the_whole_vectors_token():
    # a vocabulary of 8 blocks and a ragged tail, a fifth of it at zero: every u of a grid draws the
    # token the whole running sum gives (rounding could split them only within ~1e-16 of a step)
    rng = np.random.default_rng(3)
    p = rng.random(8 * SAMPLE_BLOCK + 77) ** 4
    p[rng.random(len(p)) < 0.2] = 0.0
    grid = np.linspace(0.0, 1.0, 4001)[:-1]
    drawn = [sample(p, FixedUniform(u)) for u in grid]
    assert drawn == [whole_vector_draw(p, u) for u in grid]
    assert min(p[drawn]) > 0 and len(set(drawn)) > 1500


@pytest.mark.parametrize(
    "u, expected",
    [
        (0.0, SAMPLE_BLOCK + 5),  # the first token with mass, past an empty first block
        (0.25 - 2.0**-40, SAMPLE_BLOCK + 5),  # the end of its step, a quarter of the mass
        (0.25, 3 * SAMPLE_BLOCK - 1),  # on the edge of the next step: the upper token, the third block's last
        (0.5, 3 * SAMPLE_BLOCK + 2),  # the next edge: past the empty token that starts the fourth block
        (1.0 - 2.0**-53, 3 * SAMPLE_BLOCK + 2),  # the largest u: the last token with mass, not the zero tail
    ],
)
def test_sample_two_levels_at_the_edges(u, expected):
    p = np.zeros(4 * SAMPLE_BLOCK - 3)  # mass 1, 1, 2 on three tokens of three blocks; the rest 0
    p[[SAMPLE_BLOCK + 5, 3 * SAMPLE_BLOCK - 1, 3 * SAMPLE_BLOCK + 2]] = 1.0, 1.0, 2.0
    assert sample(p, FixedUniform(u)) == expected
    assert whole_vector_draw(p, u) == expected


def test_sample_two_levels_frequencies_follow_p():
    # 20k draws over three blocks: each frequency within 5 standard errors of p; nothing else drawn
    rng = np.random.default_rng(0)
    p = np.zeros(3 * SAMPLE_BLOCK + 10)
    p[[7, SAMPLE_BLOCK + 300, 3 * SAMPLE_BLOCK + 9]] = 0.1, 0.2, 0.7
    counts = np.bincount([sample(p, rng) for _ in range(20_000)], minlength=len(p))
    kept = [7, SAMPLE_BLOCK + 300, 3 * SAMPLE_BLOCK + 9]
    assert counts.sum() == counts[kept].sum()
    np.testing.assert_allclose(counts[kept] / 20_000, [0.1, 0.2, 0.7], atol=5 * math.sqrt(0.25 / 20_000))


def test_sample_refuses_a_vector_without_mass():
    for n in (5, 3 * SAMPLE_BLOCK):
        with pytest.raises(ValueError, match="no positive mass"):
            sample(np.zeros(n), np.random.default_rng(0))


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=50),
                                    SamplingParams(temperature=1.0, top_p=0.9),
                                    SamplingParams(temperature=0.8, top_k=200, top_p=0.95)])
def test_target_rows_are_the_batched_rows_bit_for_bit(params):
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((5, 4099)) * 4).astype(np.float32)  # [slots, vocab], an odd vocab
    batched = target_probs(logits, params)
    rows = TargetRows(logits, params)
    assert len(rows) == 5 and rows.computed == []
    for slot in (3, 0, 4, 3):  # any order; a row read twice is computed once
        assert np.array_equal(rows[slot], batched[slot]), slot
    assert rows.computed == [0, 3, 4]
    with pytest.raises(IndexError, match=r"window slot 5 out of range \[0, 5\)"):
        rows[5]
