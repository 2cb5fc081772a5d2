"""The memory roofline of plain decoding on this machine.

Batch-1 decoding reads every weight once per token, so its speed is bounded by ``bandwidth /
bytes_per_token``. The bandwidth is measured the way decoding reads weights: an onnxruntime MatMul
of one row by a 1 GiB float32 matrix (a matrix-vector product, MLAS), with the benchmark's thread
count, best of ``repeats``; the benchmark stage probes before and after its timed runs and takes the
best probe (the shared machine's read speed wanders). Bytes per token: the decoder's weights (its
files) less the embedding tables that a Gather reads one row of, plus the KV cache read at the mean
context length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from specrt.backend.manifest import Manifest

GIB = 2**30


@dataclass(frozen=True)
class Roofline:
    bandwidth_gb_s: float  # measured read bandwidth, 1e9 bytes per second
    bytes_per_token: int  # weights (less the gathered embedding tables) + KV cache at the mean context
    ceiling_tokens_per_s: float  # bandwidth / bytes_per_token
    plain_tokens_per_s: float  # measured plain decoding
    fraction: float  # plain / ceiling


def read_bandwidth(threads: int | None, size_bytes: int = GIB, repeats: int = 10) -> float:
    """Bytes per second that onnxruntime reads when summing a ``size_bytes`` float32 tensor."""
    k = 4096
    n = size_bytes // 4 // k
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "read",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [k, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {"x": np.ones((1, k), np.float32), "w": np.ones((k, n), np.float32)}
    session.run(None, feeds)  # warm up (page in)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, feeds)
        best = min(best, time.perf_counter() - t0)
    return k * n * 4 / best


def kv_bytes_per_position(manifest: Manifest) -> int:
    d = manifest.dims
    return 2 * d.num_layers * d.kv_heads * d.head_dim * 4  # K and V, float32


def weight_bytes(manifest: Manifest) -> int:
    """Bytes of the decoder graph and its external weights (not the tokenizer)."""
    template = manifest.chat_template.file if manifest.chat_template else None
    return sum(f.bytes for name, f in manifest.files.items() if name not in (manifest.tokenizer, template))


def gathered_bytes(decoder: Path) -> int:
    """Bytes of the initializers that only a Gather reads (embedding tables, with the scales and
    zero points of a GatherBlockQuantized): a token reads one row of them, not all."""
    model = onnx.load(decoder, load_external_data=False)
    sizes = {}
    for t in model.graph.initializer:
        if external_data_helper.uses_external_data(t):
            sizes[t.name] = external_data_helper.ExternalDataInfo(t).length or 0
        else:
            sizes[t.name] = len(t.raw_data) or numpy_helper.to_array(t).nbytes
    gathered, elsewhere = set(), set()
    for node in model.graph.node:
        tables = node.input[:1] if node.op_type == "Gather" else (
            [node.input[0], *node.input[2:]] if node.op_type == "GatherBlockQuantized" else [])
        gathered.update(name for name in tables if name in sizes)
        elsewhere.update(name for name in node.input if name in sizes and name not in tables)
    return sum(sizes[name] for name in gathered - elsewhere)


def roofline(
    manifest: Manifest, bandwidth: float, mean_context: float, plain_tokens_per_s: float, gathered: int = 0
) -> Roofline:
    """``gathered``: bytes of the weights a token reads one row of (:func:`gathered_bytes`)."""
    per_token = weight_bytes(manifest) - gathered + int(kv_bytes_per_position(manifest) * mean_context)
    ceiling = bandwidth / per_token
    return Roofline(
        bandwidth_gb_s=round(bandwidth / 1e9, 3),
        bytes_per_token=per_token,
        ceiling_tokens_per_s=round(ceiling, 3),
        plain_tokens_per_s=round(plain_tokens_per_s, 3),
        fraction=round(plain_tokens_per_s / ceiling, 4),
    )
