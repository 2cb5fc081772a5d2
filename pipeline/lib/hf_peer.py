"""transformers as a peer: greedy ``generate`` (torch, fp32) on a loaded checkpoint, timed per call.

A streamer stamps the time of each ``put``: the first carries the prompt, the second the first new
token, which ends the prefill. With prompt lookup (``prompt_lookup_num_tokens=N``) the first pass
verifies drafts over the prompt, so the tokens known when the prefill ended are returned as well.
Used by the peers stage and by its worker processes (:mod:`pipeline.lib.peer_worker`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def _hf_clock() -> Any:
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        """Stamps each ``put`` with its token count: the first carries the prompt, the second the
        first new token (prompt lookup: the tokens of the first verify pass, which includes the prefill)."""

        def __init__(self) -> None:
            self.stamps: list[tuple[float, int]] = []

        def put(self, value: Any) -> None:
            self.stamps.append((time.perf_counter(), int(value.numel())))

        def end(self) -> None:
            pass

    return Clock()


HfGenerate = Callable[[np.ndarray, int], tuple[np.ndarray, float, float, int]]


def hf_generator(model: Any, threads: int | None, prompt_lookup: int | None,
                 eos_token_ids: Sequence[int] | None) -> HfGenerate:
    """``generate(prompt [t] ids, n) -> (new ids [k], prefill_s, decode_s, tokens known when the
    prefill ended)``: greedy transformers ``generate`` on ``model``; with ``prompt_lookup`` = N,
    prompt-lookup decoding (``prompt_lookup_num_tokens=N``)."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    eos = list(eos_token_ids) if eos_token_ids is not None else model.generation_config.eos_token_id
    eos_list = eos if isinstance(eos, list) else [eos]
    options: dict[str, Any] = dict(do_sample=False, eos_token_id=eos_list, pad_token_id=eos_list[0])
    if prompt_lookup:
        options["prompt_lookup_num_tokens"] = prompt_lookup

    def generate(prompt: np.ndarray, n: int) -> tuple[np.ndarray, float, float, int]:
        ids = torch.as_tensor(np.asarray(prompt, np.int64))[None]
        clock = _hf_clock()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=0,
                                 streamer=clock, **options)
            t_end = time.perf_counter()
        new = out[0, ids.shape[1]:].numpy().astype(np.int64)
        first, first_tokens = clock.stamps[1] if len(clock.stamps) > 1 else (t_end, len(new))
        return new, first - t0, t_end - first, first_tokens

    return generate
