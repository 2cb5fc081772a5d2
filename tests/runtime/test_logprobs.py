"""Log-probabilities of emitted tokens (specrt.logprobs): those of plain decoding at the same
positions, whatever the method drafted and verified; top-k alternatives most likely first."""

from __future__ import annotations

import numpy as np
import pytest

import specrt
from specrt.backend.session import OrtDecoder
from specrt.backend.window import causal_bias
from specrt.logprobs import token_logprobs, window_rows


@pytest.fixture(scope="module")
def model(runtime_chat_artifact):
    return specrt.load(runtime_chat_artifact)


def test_token_logprobs_literal():
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]], np.float32))
    got = token_logprobs(logits, np.array([1, 2]), top=2)
    assert [g.token_id for g in got] == [1, 2]
    assert np.allclose([g.logprob for g in got], np.log([0.25, 0.7]))
    assert [t for t, _ in got[0].top] == [0, 1] and [t for t, _ in got[1].top] == [2, 1]  # ties: lowest id first
    assert token_logprobs(logits, np.array([0, 0]), top=0)[0].top == ()
    assert window_rows(np.array([0, 2])).tolist() == [0, 1, 3]


def plain_logprobs(model, prompt: np.ndarray, n: int) -> tuple[list[int], list[np.ndarray]]:
    """Plain decoding one token per pass, by hand: the tokens and each position's log-softmax."""
    decoder = OrtDecoder.on(model.graph)
    decoder.reset(len(prompt) + n + 1)
    out = decoder.forward(prompt, np.arange(len(prompt)), causal_bias(0, len(prompt)))
    decoder.commit(np.arange(len(prompt)))
    tokens, rows = [], []
    logits = out.logits[-1]
    for _ in range(n):
        x = logits.astype(np.float64)
        rows.append(x - x.max() - np.log(np.exp(x - x.max()).sum()))
        tokens.append(int(np.argmax(logits)))
        past = decoder.past
        logits = decoder.forward(np.array([tokens[-1]]), np.array([past]), causal_bias(past, 1)).logits[0]
        decoder.commit(np.array([0]))
    return tokens, rows


@pytest.mark.parametrize("method, tree", [("baseline", False), ("pld", False), ("pld", True)])
def test_logprobs_equal_plain_decoding(model, method, tree):
    prompt = model.encode("The quick brown fox jumps over the lazy dog. The quick brown")
    tokens, rows = plain_logprobs(model, prompt, 30)
    got = model.generate_result(prompt, method=method, tree=tree, max_new_tokens=30, logprobs=3, backoff=False)
    if method != "baseline":
        assert got.stats["accepted"] > 0  # drafts were verified: the logprobs came from verify windows
    n = len(got.token_ids)  # up to its EOS
    assert n > 10 and list(got.token_ids) == tokens[:n] and len(got.logprobs) == n
    for lp, row, token in zip(got.logprobs, rows[:n], tokens[:n], strict=True):
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(row[token], abs=1e-4)
        assert [t for t, _ in lp.top] == np.argsort(-row, kind="stable")[:3].tolist()
        assert np.allclose([v for _, v in lp.top], row[[t for t, _ in lp.top]], atol=1e-4)


def test_logprobs_off_by_default_and_checked(model):
    assert model.generate("hello", max_new_tokens=3).logprobs is None
    assert len(model.generate("hello", max_new_tokens=3, logprobs=0).logprobs) == 3
    with pytest.raises(specrt.InvalidRequestError, match=r"^logprobs must be >= 0, got -1$"):
        model.generate("hello", max_new_tokens=3, logprobs=-1)
