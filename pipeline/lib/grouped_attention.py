"""Attention written so that a query's result never depends on how many queries share the pass.

Greedy speculation is lossless when the target gives a position the same logits in a verify
window as in a single decoding step. HF's eager/SDPA attention computes ``P @ V`` with one
query row per head when a step decodes one token (M = 1), and onnxruntime's CPU MatMul takes a
matrix-vector path for M = 1 that rounds differently from its matrix-matrix path. Alone that is
a last-bit difference, but MatMulNBits at accuracy level 4 quantizes every activation row to
int8, so a last-bit difference can move a value across a rounding step and flip argmaxes.

Here a key/value head's queries are stacked as rows, and the keys and values stay in the
cache's own rows (grouped-query attention without repeating K and V, and without copying the
cache into a heads-first layout):

    keys, values  [1, t, kv, d]  ->  [t, kv*d]        the runtime's cache rows, reshaped
    query         [1, heads, s, d] -> q_t [kv*d, rows]  rows = kv*g*s; block-diagonal: column (k, r)
                                                        holds its query in head k's d rows, zeros elsewhere
    scores_t = keys @ q_t             [t, rows]         (zeros add nothing: each query's own head)
    e_t      = exp(scores_t * scaling + bias - max over the keys)
    out      = e_t^T @ values         [rows, kv*d]  ->  each row's own head's d columns -> [1, s, heads, d]

The numerators stay keys-first and the products with them read them transposed (FusedMatMul with
transA, ``fuse_graph.fuse_transposed_operands``): MLAS's SGEMM sums the keys in blocks whose size
follows the columns each thread gets, and its threads split the rows or the columns, whichever
are more. Read row-major, a single step (14 rows) summed 256 keys per block and a 15-row tree
window 128, so their bits differed past 256 cached positions (an earlier layout, products per
key/value head, did the same from 4 threads on); read transposed, the blocks are 128 keys for every
shape and thread count (tests/test_grouped_attention.py).

The products have kv*g*s >= 2 rows in every pass; a window's extra keys are masked, so they
add exact zeros; every other op is row-wise, and the MatMulNBits kernels at level 4 quantize per row.
So a chain window gives each row the bits of a single step wherever the weight MatMuls' one-row
kernel rounds like their many-row kernel: on the AVX-512 machines we measured, not on AVX2-only
ones, where only the W8A8 variant's integer MatMuls are exact (docs/quantization.md). Trees need one more rule:
onnxruntime's SGEMM sums the keys in blocks of 128 (fused multiply-adds inside a block, one rounding
more where blocks meet), and a tree puts a path's keys at other slots than the single steps do, so
the runtime keeps a tree window's nodes inside one key block (``specrt.backend.window.fit_window``: at most
once per 128 positions a tree is cut). Without it, the real model's gate saw one tree window
straddle slot 128 and move a row's logits by 0.2. tests/test_quantize.py checks the int4 level-4
graph bit for bit, chains and trees.

The block-diagonal products do kv times the arithmetic of per-head ones, but a decode pass is bound
by moving the cache through memory: here each cached key and value row is copied once per pass
(the concatenation with the new rows), where the heads-first form copied it twice (a transpose and
a concatenation) and the eager form also repeated it per query head (Expand).
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
    if heads < 2:
        raise ValueError(f"{type(module).__name__}: {NAME} needs >= 2 query heads (one would make a "
                         f"single-token step a matrix-vector product); got {heads}")
    rows = kv * g * s  # query rows; row (k, j*s + i) is query i of head k*g + j (as repeat_kv pairs them)
    # keys and values as the cache's rows, [t, kv*d] (a reshape of the runtime's [1, t, kv, d] layout:
    # RowCache hands over the heads-first view of it and the two transposes cancel in the graph)
    key_rows = key.transpose(1, 2).reshape(t, kv * d)
    value_rows = value.transpose(1, 2).reshape(t, kv * d)
    # the queries transposed and block-diagonal over the key/value heads: column (k, r) holds query
    # row r of group k in head k's d rows and exact zeros elsewhere, so one product with every
    # head's keys gives each query its own head's scores
    q_t = query.reshape(kv, g * s, d).permute(2, 0, 1)  # [d, kv, g*s]
    q_t = (q_t[None] * torch.eye(kv, dtype=query.dtype)[:, None, :, None]).reshape(kv * d, rows)  # [kv*d, rows]
    # scores keys-first, [t, rows]: the softmax then leaves e keys-first, which the two products
    # below read transposed (see the module docstring for why that orientation)
    scores_t = torch.matmul(key_rows, q_t) * scaling  # [t, rows]
    if attention_mask is not None:
        # query i's bias column, repeated for every head (the same Tile in every layer, computed
        # once after common-subexpression elimination)
        scores_t = scores_t + attention_mask[0, 0, :, :t].transpose(0, 1).repeat(1, kv * g)  # [t, rows]
    # softmax with its normaliser summed by a matrix product as the values are: a vectorised sum
    # would group terms by key slot, and a tree puts a path's keys in other slots than a chain.
    # Two columns of ones, not one: onnxruntime multiplies by a single column with its
    # matrix-vector kernel, which also sums by vector lanes.
    e_t = torch.exp(scores_t - scores_t.amax(dim=0, keepdim=True))  # [t, rows]; masked keys -> 0
    normaliser = torch.matmul(e_t.T, value_rows.new_ones(t, 2))[:, :1]  # [rows, 1]
    # every row times every head's values; a row keeps its own head's d columns
    numerator = torch.matmul(e_t.T, value_rows).reshape(kv, g * s, kv, d)  # [kv, g*s, kv, d]
    numerator = torch.stack([numerator[k, :, k] for k in range(kv)])  # [kv, g*s, d]
    out = numerator / normaliser.reshape(kv, g * s, 1)  # [kv, g*s, d]
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
