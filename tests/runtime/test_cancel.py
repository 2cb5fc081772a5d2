"""Cancelling a request or giving it a deadline (specrt.cancel): it stops before its next prefill
pass or verify step, with finish_reason "cancelled" or "timeout", having emitted a prefix of the
uncancelled output, and gives its KV cache back."""

from __future__ import annotations

import numpy as np
import pytest

import specrt
from specrt.cancel import CANCELLED, CancelToken


class CancelAtCheck(CancelToken):
    """Cancelled from its ``n``-th check on (the loop checks before the prefill, after each prefill
    pass but the last, and before each verify step)."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.checks = n, 0

    def reason(self) -> str | None:
        self.checks += 1
        return CANCELLED if self.checks >= self.n else super().reason()


@pytest.fixture(scope="module")
def model(runtime_chat_artifact):
    return specrt.load(runtime_chat_artifact)


PROMPT = "The quick brown fox jumps over the lazy dog. " * 4


def test_cancelled_before_it_starts(model):
    token = CancelToken()
    token.cancel()
    ids, loop = model.generate_ids(model.encode("hello"), method="pld", max_new_tokens=10, cancel=token)
    assert ids.tolist() == [] and loop.finish_reason == "cancelled" and loop.stats.new_tokens == 0


def test_cancelled_between_prefill_passes(model):
    prompt = model.encode(PROMPT)
    assert len(prompt) > 40
    token = CancelAtCheck(4)  # check 1: before the prefill; 2, 3, 4: after passes 1, 2, 3
    loop, chunks = model.stream_ids(prompt, method="pld", max_new_tokens=10, prefill_chunk=10, cancel=token)
    assert list(chunks) == []
    assert loop.finish_reason == "cancelled" and loop.decoder.past == 30  # three passes of 10 ran, no more
    assert model._idle == [loop.decoder]  # the KV cache was given back


@pytest.mark.parametrize("method", ["baseline", "pld"])
def test_cancelled_mid_decode_emits_a_prefix_of_plain_decoding(model, method):
    prompt = model.encode("hello")
    want, _ = model.generate_ids(prompt, method="baseline", max_new_tokens=60)
    token = CancelToken()
    loop, chunks = model.stream_ids(prompt, method=method, max_new_tokens=60, cancel=token)
    got = [next(chunks), next(chunks)]
    token.cancel()
    got += list(chunks)
    ids = np.concatenate(got)
    assert 2 <= len(ids) < 60 and ids.tolist() == want[: len(ids)].tolist()
    assert loop.finish_reason == "cancelled"


def test_timeout(model):
    ids, loop = model.generate_ids(model.encode("hello"), method="pld", max_new_tokens=10, timeout_s=0)
    assert ids.tolist() == [] and loop.finish_reason == "timeout"
    token = CancelToken(timeout_s=3600)
    loop, chunks = model.stream_ids(model.encode("hello"), method="baseline", max_new_tokens=60, cancel=token)
    first = [next(chunks), next(chunks)]
    token.deadline = 0.0  # the deadline passes
    assert list(chunks) == [] and loop.finish_reason == "timeout" and loop.stats.new_tokens == len(first) == 2
    result = model.generate("hello", method="baseline", max_new_tokens=5, timeout_s=3600)
    assert (result.text, result.finish_reason) == ("ooooo", "length")


@pytest.mark.parametrize("options, message", [
    ({"timeout_s": -1}, r"^timeout_s must be >= 0, got -1$"),
    ({"timeout_s": "1"}, r"^timeout_s must be a number, got str '1'$"),
    ({"cancel": object()}, r"^cancel must be a specrt.CancelToken, got object$"),
    ({"cancel": CancelToken(), "timeout_s": 1}, r"^give either cancel or timeout_s"),
])
def test_bad_cancel_options(model, options, message):
    with pytest.raises(specrt.InvalidRequestError, match=message):
        model.generate("hello", max_new_tokens=2, **options)
