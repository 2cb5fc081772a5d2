"""The export's attention (pipeline.lib.grouped_attention) on its own: a query row gets the same bits
alone as in a window of any size, at cache lengths past onnxruntime's key blocks of 128, with any
number of threads (MLAS splits a product between threads by rows or by columns, whichever are
more, and a row-major product's key blocks follow the split: the form with products batched per
key/value head gave a 15-row window other bits than a single step from 4 threads on)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common  # noqa: F401  (ir.passes.common)
import onnxruntime as ort
import pytest
import torch

from pipeline.lib.fuse_graph import fuse_transposed_operands
from pipeline.lib.grouped_attention import grouped_attention
from specrt.backend import contract

HEADS, KV, D = 14, 2, 64  # Qwen2.5-0.5B's attention


class _Attention(torch.nn.Module):
    def forward(self, query, key_rows, value_rows, bias):  # [1, heads, s, d], [1, t, kv, d] x2, [1, 1, s, t]
        out, _ = grouped_attention(self, query, key_rows.transpose(1, 2), value_rows.transpose(1, 2), bias,
                                   scaling=D ** -0.5)
        return out  # [1, s, heads, d]


@pytest.fixture(scope="module")
def attention_graph(tmp_path_factory) -> str:
    s, t = torch.export.Dim("s", min=1, max=64), torch.export.Dim("t", min=2, max=4096)
    inputs = (torch.randn(1, HEADS, 3, D), torch.randn(1, 8, KV, D), torch.randn(1, 8, KV, D), torch.zeros(1, 1, 3, 8))
    program = torch.onnx.export(_Attention(), inputs, input_names=["query", "key", "value", "bias"],
                                dynamic_shapes=({2: s}, {1: t}, {1: t}, {2: s, 3: t}), dynamo=True, optimize=True)
    model = program.model
    ir.passes.common.CommonSubexpressionEliminationPass()(model)
    assert fuse_transposed_operands(model) == 2  # the numerators' two products, as the decoder export does
    ir.passes.common.RemoveUnusedNodesPass()(model)
    path = tmp_path_factory.mktemp("attention") / "attention.onnx"
    ir.save(model, path)
    return str(path)


@pytest.mark.parametrize("threads", [1, 2, 4, 8])
@pytest.mark.parametrize("past", [40, 300, 700])
def test_a_query_row_gets_the_same_bits_alone_and_in_windows_of_any_size(attention_graph, past, threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    attention_session = ort.InferenceSession(attention_graph, options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(past)
    keys = rng.standard_normal((1, past + 15, KV, D)).astype(np.float32)
    values = rng.standard_normal((1, past + 15, KV, D)).astype(np.float32)
    queries = rng.standard_normal((1, HEADS, 15, D)).astype(np.float32)

    def run(s: int) -> np.ndarray:  # row 0 sees the cache and itself; rows 1.. a chain after it
        bias = np.zeros((1, 1, s, past + s), np.float32)
        bias[0, 0, :, past:] = np.triu(np.full((s, s), contract.MASK_VALUE, np.float32), k=1)
        feeds = {"query": queries[:, :, :s], "key": keys[:, : past + s], "value": values[:, : past + s], "bias": bias}
        return attention_session.run(None, feeds)[0]  # [1, s, heads, d]

    alone = run(1)[0, 0]
    for s in (2, 4, 8, 15):  # 15 rows: a width-8 tree with a sibling per node
        np.testing.assert_array_equal(run(s)[0, 0], alone, err_msg=f"window of {s} rows at past {past}")
