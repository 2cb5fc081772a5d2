"""Chunked prefill: a decoder's cache filled with a run of tokens, a chunk of positions per pass.

The engine prefills a request's prompt with it, a draft model catches up with it, and the pipeline's
checks (parity, fidelity, the gate) build their contexts with it: a backend-level loop that knows
decoders and causal masks, and nothing of drafting.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from specrt.backend.session import ForwardOutput, OrtDecoder
from specrt.backend.window import causal_bias


@dataclass(frozen=True)
class PromptImages:
    """The image rows of a vision-language prompt: its ``token_id`` placeholders take the rows of
    ``embeds`` in order (specrt.backend.contract)."""

    token_id: int  # the image placeholder token
    embeds: np.ndarray  # [n, hidden] float32, n = the prompt's count of token_id


def prefill(
    decoder: OrtDecoder, ids: np.ndarray, chunk: int, *, last_logits_only: bool = False,
    images: PromptImages | None = None,
) -> Iterator[ForwardOutput]:
    """Cache ``ids`` ([t] int64) after the decoder's past, ``chunk`` positions per pass; yields
    each pass's output (logits [<= chunk, vocab], hidden states [<= chunk, hidden]).

    ``last_logits_only``: the passes return no logits ([0, vocab]) but the final one, which
    returns its last row ([1, vocab]): all that the next token needs (on a GPU, all that is copied
    to the host). ``images``: each pass hands the decoder the rows of the image tokens it holds
    (``ids`` start at the first placeholder's row)."""
    used = 0  # image rows of earlier passes
    for start in range(0, len(ids), chunk):
        piece = ids[start : start + chunk]
        past, n = decoder.past, len(piece)
        position_ids, bias = np.arange(past, past + n), causal_bias(past, n)
        options = {}
        if images is not None:  # only then: the hf backend's decoders take no image rows
            count = int(np.count_nonzero(piece == images.token_id))
            options["image_embeds"], used = images.embeds[used : used + count], used + count
        if last_logits_only:
            options["logits_rows"] = slice(n - 1, n) if start + chunk >= len(ids) else slice(0, 0)
        out = decoder.forward(piece, position_ids, bias, **options)
        decoder.commit(np.arange(n))
        yield out
