"""The I/O contract of an exported decoder: the one table that the exporter and the runtime share.

One forward pass verifies a whole draft tree: ``s`` new positions go in together with an additive
attention bias that says, per query, which cached and which new positions it may see. The runtime
owns the KV cache (one preallocated buffer per layer, batch 1, layout ``[1, seq, kv_heads,
head_dim]`` so that any prefix ``buf[:, :past]`` is contiguous); the graph reads the ``past``
prefix and returns only the keys/values of its ``s`` new positions, which the runtime writes
behind that prefix.

Invariant the runtime keeps: cache slot ``j`` holds the token at absolute position ``j``. Models
whose attention rule depends on positions (Gemma 3's sliding-window layers) derive key positions
from it inside the graph, so a single bias input stays exact for every layer type.

    name                 dtype    shape                               meaning
    -------------------  -------  ----------------------------------  ------------------------------
    input_ids            int64    [1, s]                              tokens of the s new positions
    position_ids         int64    [1, s]                              absolute position of each one
    attention_bias       float32  [1, 1, s, past + s]                 0 = may attend, MASK_VALUE = not
    past.{i}.key         float32  [1, past, kv_heads, head_dim]       cached keys of layer i (post-RoPE)
    past.{i}.value       float32  [1, past, kv_heads, head_dim]       cached values of layer i
    logits               float32  [1, s, vocab]                       next-token logits per position
    present.{i}.key      float32  [1, s, kv_heads, head_dim]          keys of the s NEW positions only
    present.{i}.value    float32  [1, s, kv_heads, head_dim]          values of the s new positions
    hidden_states        float32  [1, s, hidden]                      final-norm hidden states

A decoder exported with ``logits_index`` (pipeline.lib.logits_rows; every graph the pipeline
exports) computes the lm_head on the rows it names only, and returns their logits instead:

    logits_index         int64    [r]                                 window rows whose logits to compute
    logits               float32  [1, r, vocab]                       their logits, in that order

A prefill chunk asks for its last row or none, a verify window for all. Graphs without the input
compute every row's logits ([1, s, vocab]); the runtime reads either.

A vision-language decoder (``io_table(..., image_embeds=True)``) has one more input:

    image_embeds         float32  [n, hidden]                         rows for this pass's image tokens

The k-th ``image_token_id`` among the pass's input ids (k = 1, 2, ...) takes row k - 1 of
``image_embeds`` as its embedding instead of the token's own, while k <= n; every other token, and
an image token beyond the n rows, embeds as usual. Prefill passes of a prompt with images hand over
the rows of the image tokens they hold (the vision encoder's output, in prompt order); every other
pass gives ``n = 0``, so an image token that a drafter copies or the model generates is an ordinary
token, as in the model's own ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Additive bias for a masked (query, key) pair. Finite, so that sums never produce NaN.
MASK_VALUE = float(np.finfo(np.float32).min)

INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
ATTENTION_BIAS = "attention_bias"
LOGITS = "logits"
LOGITS_INDEX = "logits_index"
# The graph's metadata key naming its attention: "specrt" (ai.specrt.SpecAttention, specrt's CPU
# kernel library) or "portable" (standard and com.microsoft operators, any provider).
ATTENTION_METADATA = "specrt.attention"
HIDDEN_STATES = "hidden_states"
IMAGE_EMBEDS = "image_embeds"
# A vision-language artifact's encoder graph: pixel_values [1, 3, side, side] (one frame, as
# specrt.vision prepares it) -> image_embeds [1, image_seq_len, hidden] (that frame's decoder rows).
PIXEL_VALUES = "pixel_values"


def past_key(layer: int) -> str:
    return f"past.{layer}.key"


def past_value(layer: int) -> str:
    return f"past.{layer}.value"


def present_key(layer: int) -> str:
    return f"present.{layer}.key"


def present_value(layer: int) -> str:
    return f"present.{layer}.value"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[str | int, ...]  # symbolic dims are strings
    doc: str


def io_table(
    num_layers: int, kv_heads: int, head_dim: int, hidden: int, vocab: int, *, image_embeds: bool = False,
    logits_index: bool = False,
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """(inputs, outputs) of a decoder with these dims, in graph order; ``image_embeds``: a
    vision-language decoder's, ``logits_index``: a decoder that computes the logits of the rows it
    is given (see the module docstring)."""
    inputs = [
        TensorSpec(INPUT_IDS, "int64", (1, "s"), "tokens of the s new positions"),
        TensorSpec(POSITION_IDS, "int64", (1, "s"), "absolute position of each new token"),
        TensorSpec(ATTENTION_BIAS, "float32", (1, 1, "s", "past+s"), "additive; 0 attend, MASK_VALUE not"),
    ]
    if image_embeds:
        inputs.append(TensorSpec(IMAGE_EMBEDS, "float32", ("n", hidden), "embeddings of the pass's image tokens"))
    if logits_index:
        outputs = [TensorSpec(LOGITS, "float32", (1, "r", vocab), "next-token logits of the logits_index rows")]
    else:
        outputs = [TensorSpec(LOGITS, "float32", (1, "s", vocab), "next-token logits per position")]
    for i in range(num_layers):
        inputs.append(TensorSpec(past_key(i), "float32", (1, "past", kv_heads, head_dim), "cached keys"))
        inputs.append(TensorSpec(past_value(i), "float32", (1, "past", kv_heads, head_dim), "cached values"))
        outputs.append(TensorSpec(present_key(i), "float32", (1, "s", kv_heads, head_dim), "new keys only"))
        outputs.append(TensorSpec(present_value(i), "float32", (1, "s", kv_heads, head_dim), "new values only"))
    outputs.append(TensorSpec(HIDDEN_STATES, "float32", (1, "s", hidden), "final-norm hidden states"))
    if logits_index:
        inputs.append(TensorSpec(LOGITS_INDEX, "int64", ("r",), "window rows whose logits to compute, ascending"))
    return tuple(inputs), tuple(outputs)
