"""A draft model's KV cache behind the drafters' narrow protocol (specrt.drafters.base.DraftModel):
the draft-model drafters feed it a chain of tokens, read the logits after the last one, and cut it back
to the prefix the verifier kept. They never see onnxruntime, windows or attention biases."""

from __future__ import annotations

import numpy as np

from specrt.backend.prefill import prefill
from specrt.backend.session import OrtDecoder
from specrt.backend.window import causal_bias


class OrtDraftModel:
    """specrt.drafters.base.DraftModel over an :class:`OrtDecoder` of the draft artifact; a prompt's
    tokens are fed in chunks of ``prefill_chunk`` positions (specrt.backend.prefill)."""

    def __init__(self, decoder: OrtDecoder, prefill_chunk: int = 256):
        self.decoder = decoder
        self.prefill_chunk = prefill_chunk

    @property
    def max_context(self) -> int:
        return self.decoder.dims.max_context

    @property
    def capacity(self) -> int:
        return self.decoder.capacity

    @property
    def past(self) -> int:
        return self.decoder.past

    def reset(self, capacity: int) -> None:
        self.decoder.reset(capacity)

    def truncate(self, keep: int) -> None:
        self.decoder.truncate(keep)

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """Feed ``tokens`` ([k] int64, k >= 1) after the cached ones and keep them; the draft's logits
        ([draft vocab]) after the last."""
        if len(tokens) == 0:
            raise ValueError("a draft model's forward needs at least one token")
        past = self.decoder.past
        if len(tokens) == 1:
            out = self.decoder.forward(np.asarray(tokens, np.int64), np.array([past], np.int64), causal_bias(past, 1))
            self.decoder.commit(np.zeros(1, np.int64))
            return out.logits[0]
        chunks = list(prefill(self.decoder, np.asarray(tokens, np.int64), self.prefill_chunk, last_logits_only=True))
        return chunks[-1].logits[-1]  # only the final chunk returns a row
