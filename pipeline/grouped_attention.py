"""Attention written so that a query's result never depends on how many queries share the pass.

Greedy speculation is lossless when the target gives a position the same logits in a verify
window as in a single decoding step. HF's eager/SDPA attention computes ``P @ V`` with one
query row per head when a step decodes one token (M = 1), and onnxruntime's CPU MatMul takes a
matrix-vector path for M = 1 that rounds differently from its matrix-matrix path. Alone that is
a last-bit difference, but MatMulNBits at accuracy level 4 quantizes every activation row to
int8, so a last-bit difference can move a value across a rounding step and flip argmaxes.

Here the queries of a key/value head are stacked as rows (grouped-query attention without
repeating K and V):

    query  [1, heads, s, d]  ->  q  [1, kv, g*s, d]         g = heads / kv (>= 2 for every
    scores = q @ k^T         [1, kv, g*s, past+s]            supported model, so M >= 2)
    p      = softmax(scores * scaling + bias)                 per row
    out    = p @ v           [1, kv, g*s, d]  ->  [1, s, heads, d]

The products have M = g*s >= 2 in every pass; a window's extra keys are masked, so they add
exact zeros; every other op is row-wise, and the MatMulNBits kernels at level 4 quantize per row.
So a chain window gives each row the bits of a single step wherever the weight MatMuls' one-row
kernel rounds like their many-row kernel: on the AVX-512 machines we measured, not on AVX2-only
ones, where only the W8A8 variant's integer MatMuls are exact (docs/quantization.md). Trees need one more rule:
onnxruntime's SGEMM sums the keys in blocks of 128 (fused multiply-adds inside a block, one rounding
more where blocks meet), and a tree puts a path's keys at other slots than the single steps do, so
the runtime keeps a tree window's nodes inside one key block (``specrt.tree.fit_window``: at most
once per 128 positions a tree is cut). Without it, the real model's gate saw one tree window
straddle slot 128 and move a row's logits by 0.2. tests/test_quantize.py checks the int4 level-4
graph bit for bit, chains and trees. The
stacking also drops the ``repeat_kv`` copies (Expand) of K and V that the eager form makes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import AttentionInterface, PreTrainedModel

NAME = "specrt_grouped"


def grouped_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, heads, s, d]
    key: torch.Tensor,  # [1, kv, t, d]  (t = past + s)
    value: torch.Tensor,  # [1, kv, t, d]
    attention_mask: torch.Tensor | None,  # [1, 1, s, >= t] additive
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if softcap is not None:
        raise ValueError(f"{type(module).__name__}: attention logit softcapping is not supported by {NAME}")
    batch, heads, s, d = query.shape
    kv, t = key.shape[1], key.shape[2]
    if heads % kv:
        raise ValueError(f"{type(module).__name__}: {heads} query heads do not group over {kv} key/value heads")
    g = heads // kv
    if g < 2:
        raise ValueError(f"{type(module).__name__}: {NAME} needs >= 2 query heads per key/value head "
                         f"(one would make a single-token step a matrix-vector product); got {heads}/{kv}")
    q = query.reshape(batch, kv, g * s, d)  # head h = kv_index * g + j, as repeat_kv pairs them
    scores = torch.matmul(q, key.transpose(2, 3)) * scaling  # [1, kv, g*s, t]
    if attention_mask is not None:
        # row j*s + i of q is query i of head j: the bias rows repeat g times (the same Tile in
        # every layer, computed once after common-subexpression elimination)
        scores = scores + attention_mask[:, :, :, :t].repeat(1, 1, g, 1)  # [1, 1, g*s, t]
    # softmax with its normaliser summed by a matrix product as the values are: a vectorised row
    # sum would group terms by key slot, and a tree puts a path's keys in other slots than a chain.
    # Two columns of ones, not one: onnxruntime multiplies by a single column with its
    # matrix-vector kernel, which also sums by vector lanes. (Padding V with the ones column
    # instead copies every cached value row each pass.)
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))  # [1, kv, g*s, t]; masked keys -> 0
    numerator = torch.matmul(e, value)  # [1, kv, g*s, d]
    normaliser = torch.matmul(e, value.new_ones(t, 2))[..., :1]  # [1, kv, g*s, 1]
    out = numerator / normaliser  # [1, kv, g*s, d]
    return out.reshape(batch, heads, s, d).transpose(1, 2).contiguous(), None  # [1, s, heads, d]


@contextlib.contextmanager
def grouped_attention_of(model: PreTrainedModel) -> Iterator[PreTrainedModel]:
    """``model`` running :func:`grouped_attention` inside the block, its own attention after."""
    AttentionInterface.register(NAME, grouped_attention)
    before = model.config._attn_implementation
    model.set_attn_implementation(NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)
