"""Chunked prefill: a decoder's cache filled with a run of tokens, a chunk of positions per pass.

The engine prefills a request's prompt with it, a draft model catches up with it, and the pipeline's
checks (parity, fidelity, the gate) build their contexts with it: a backend-level loop that knows
decoders and causal masks, and nothing of drafting.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from specrt.backend.session import ForwardOutput, OrtDecoder
from specrt.backend.window import causal_bias


def prefill(
    decoder: OrtDecoder, ids: np.ndarray, chunk: int, *, last_logits_only: bool = False
) -> Iterator[ForwardOutput]:
    """Cache ``ids`` ([t] int64) after the decoder's past, ``chunk`` positions per pass; yields
    each pass's output (logits [<= chunk, vocab], hidden states [<= chunk, hidden]).

    ``last_logits_only``: the passes return no logits ([0, vocab]) but the final one, which
    returns its last row ([1, vocab]): all that the next token needs (on a GPU, all that is copied
    to the host)."""
    for start in range(0, len(ids), chunk):
        piece = ids[start : start + chunk]
        past, n = decoder.past, len(piece)
        position_ids, bias = np.arange(past, past + n), causal_bias(past, n)
        if last_logits_only:
            rows = slice(n - 1, n) if start + chunk >= len(ids) else slice(0, 0)
            out = decoder.forward(piece, position_ids, bias, logits_rows=rows)
        else:
            out = decoder.forward(piece, position_ids, bias)
        decoder.commit(np.arange(n))
        yield out
