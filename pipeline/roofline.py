"""The memory roofline of plain decoding on this machine.

Batch-1 decoding reads every weight once per token, so its speed is bounded by
``bandwidth / bytes_per_token``. The bandwidth is measured here the way onnxruntime reads weights:
an onnxruntime ``ReduceSum`` over a 1 GiB float32 tensor with the benchmark's thread count (best
of ``repeats``); bytes per token are the decoder's files (weights) plus the KV cache read at the
mean context length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from specrt.manifest import Manifest

GIB = 2**30


@dataclass(frozen=True)
class Roofline:
    bandwidth_gb_s: float  # measured read bandwidth, 1e9 bytes per second
    bytes_per_token: int  # weights + KV cache at the mean context
    ceiling_tokens_per_s: float  # bandwidth / bytes_per_token
    plain_tokens_per_s: float  # measured plain decoding
    fraction: float  # plain / ceiling


def read_bandwidth(threads: int | None, size_bytes: int = GIB, repeats: int = 5) -> float:
    """Bytes per second that onnxruntime reads when summing a ``size_bytes`` float32 tensor."""
    n = size_bytes // 4
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], "read",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = np.ones(n, np.float32)
    session.run(None, {"x": x})  # warm up (page in)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, {"x": x})
        best = min(best, time.perf_counter() - t0)
    return n * 4 / best


def kv_bytes_per_position(manifest: Manifest) -> int:
    d = manifest.dims
    return 2 * d.num_layers * d.kv_heads * d.head_dim * 4  # K and V, float32


def weight_bytes(manifest: Manifest) -> int:
    """Bytes of the decoder graph and its external weights (not the tokenizer)."""
    return sum(f.bytes for name, f in manifest.files.items() if name != manifest.tokenizer)


def roofline(manifest: Manifest, bandwidth: float, mean_context: float, plain_tokens_per_s: float) -> Roofline:
    per_token = weight_bytes(manifest) + int(kv_bytes_per_position(manifest) * mean_context)
    ceiling = bandwidth / per_token
    return Roofline(
        bandwidth_gb_s=round(bandwidth / 1e9, 3),
        bytes_per_token=per_token,
        ceiling_tokens_per_s=round(ceiling, 3),
        plain_tokens_per_s=round(plain_tokens_per_s, 3),
        fraction=round(plain_tokens_per_s / ceiling, 4),
    )
