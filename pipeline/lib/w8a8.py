"""W8A8 with per-token activation scales: a quantized MatMul whose rows never depend on each other.

Every ``MatMul(x, W)`` with a constant 2-D weight ``W [K, N]`` becomes

    W  ──offline──► Wq [K, N] int8 = round(W / w_scale),  w_scale [N] = max_k |W[k, n]| / q_w
    x [1, s, K] ──► a_scale [1, s, 1] = max(max_k |x|, tiny) / 127                 (one scale per token)
                ──► xq = Cast<uint8>(Round(x / a_scale) + 128)                    (zero point 128)
                ──► acc [1, s, N] int32 = MatMulInteger(xq, Wq, 128)               (exact integer sums)
                ──► y = Cast<float>(acc) * a_scale * w_scale

Why: onnxruntime's float and MatMulNBits kernels pick another code path for one row than for
several (on AVX2 CPUs a single step and a verify window then differ in the last bits, and a greedy
argmax at a near-tie flips: the spec-safety gate counts these). Here every step that mixes rows is
an integer sum, exact in any order, and the rest is elementwise or per row, so a position's logits
are the same bit for bit in a window of any size, on every CPU: speculation equals plain decoding.

``q_w`` is 127, or 63 with ``reduce_range`` (onnxruntime's own name for it): AVX2 without VNNI
multiplies u8 x s8 pairs with ``vpmaddubsw``, which saturates a pair sum at 16 bits (255 * 127 * 2
does not fit; 255 * 63 * 2 does).

The same arithmetic in one node per product is specrt's MatMulW8A8 operator
(runtime/kernels/matmul_w8a8.h; ``quantize_graph`` method ``specrt_w8a8``), whose weights
:func:`pack_w8` lays out. Its AVX2 path multiplies |xq| by W with xq's sign, which never
saturates, so it takes 8-bit weights as well as 7-bit ones.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TINY = 1e-30  # a row of zeros gets this absmax: scale > 0, its quantized values 0


def _consts(graph: onnx.GraphProto) -> dict[str, str]:
    """Shared scalar initializers of the rewrite, added once; name by role."""
    values = {
        "axes": np.array([-1], np.int64),
        "tiny": np.array(TINY, np.float32),
        "a_max": np.array(127.0, np.float32),
        "shift": np.array(128.0, np.float32),
        "zero_point": np.array(128, np.uint8),
    }
    names = {}
    for role, value in values.items():
        name = f"w8a8/{role}"
        graph.initializer.append(numpy_helper.from_array(value, name))
        names[role] = name
    return names


def _quantize_activations(x: str, c: dict[str, str]) -> tuple[list[onnx.NodeProto], str, str]:
    """Nodes that quantize ``x`` per token: (nodes, xq uint8 name, a_scale name)."""
    p = f"{x}/w8a8_input"
    nodes = [
        helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs"),
        helper.make_node("ReduceMax", [f"{p}/abs", c["axes"]], [f"{p}/absmax"], keepdims=1, name=f"{p}/ReduceMax"),
        helper.make_node("Max", [f"{p}/absmax", c["tiny"]], [f"{p}/range"], name=f"{p}/Max"),
        helper.make_node("Div", [f"{p}/range", c["a_max"]], [f"{p}/a_scale"], name=f"{p}/Scale"),
        helper.make_node("Div", [x, f"{p}/a_scale"], [f"{p}/scaled"], name=f"{p}/Div"),
        helper.make_node("Round", [f"{p}/scaled"], [f"{p}/rounded"], name=f"{p}/Round"),
        helper.make_node("Add", [f"{p}/rounded", c["shift"]], [f"{p}/shifted"], name=f"{p}/Shift"),
        helper.make_node("Cast", [f"{p}/shifted"], [f"{p}/xq"], to=TensorProto.UINT8, name=f"{p}/Cast"),
    ]
    return nodes, f"{p}/xq", f"{p}/a_scale"


def quantize_weight(weight: np.ndarray, reduce_range: bool) -> tuple[np.ndarray, np.ndarray]:
    """``weight [K, N]`` float -> (int8 [K, N], per-column scale [N] float32)."""
    q_w = 63.0 if reduce_range else 127.0
    absmax = np.abs(weight).max(axis=0)  # [N]
    scale = np.where(absmax > 0, absmax / q_w, 1.0).astype(np.float32)
    quantized = np.clip(np.round(weight / scale), -q_w, q_w).astype(np.int8)
    return quantized, scale


TILE = 16  # MatMulW8A8: columns per tile
GROUP = 4  # k per 32-bit lane
MAX_K = 32768  # 255 * 127 * K < 2^31: the kernel's int32 sums cannot overflow


def pack_w8(quantized: np.ndarray) -> np.ndarray:
    """int8 weights [K, N] (K a multiple of 4, |w| <= 127) -> MatMulW8A8's packed
    [ceil(N/16), K/4, 64] int8: byte 4c + i of group q of tile t is W[4q + i, 16t + c]; the last
    tile's missing columns are zeros."""
    if quantized.ndim != 2 or quantized.dtype != np.int8:
        raise ValueError(f"pack_w8: weights {quantized.dtype} of shape {quantized.shape}, expected int8 [K, N]")
    k, n = quantized.shape
    if k == 0 or k % GROUP or k > MAX_K:
        raise ValueError(f"pack_w8: weight of shape {quantized.shape}: expected [K, N] with K a positive multiple "
                         f"of {GROUP} up to {MAX_K}")
    if (quantized == -128).any():
        raise ValueError("pack_w8: a weight is -128; MatMulW8A8 takes -127..127")
    tiles = -(-n // TILE)
    padded = np.zeros((k, tiles * TILE), np.int8)
    padded[:, :n] = quantized
    return np.ascontiguousarray(padded.reshape(k // GROUP, GROUP, tiles, TILE).transpose(2, 0, 3, 1)
                                .reshape(tiles, k // GROUP, TILE * GROUP))


def unpack_w8(packed: np.ndarray, n: int) -> np.ndarray:
    """Inverse of :func:`pack_w8`: packed [tiles, K/4, 64] -> int8 [K, N]."""
    tiles, groups, _ = packed.shape
    return packed.reshape(tiles, groups, TILE, GROUP).transpose(1, 3, 0, 2).reshape(groups * GROUP, tiles * TILE)[:, :n]


def quantize_w8a8(model: onnx.ModelProto, exclude: list[str], *, reduce_range: bool = True) -> onnx.ModelProto:
    """Rewrite every constant-weight MatMul of ``model`` (not named in ``exclude``) in place; returns it.
    MatMuls that share an input share its quantization."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    targets = {n.output[0] for n in graph.node if n.op_type == "MatMul" and n.name not in exclude
               and n.input[1] in inits and len(inits[n.input[1]].dims) == 2}  # by output name: unique
    if not targets:
        return model
    c = _consts(graph)
    quantized_inputs: dict[str, tuple[str, str]] = {}  # x -> (xq, a_scale)
    replaced_weights = set()
    rewritten = []
    for node in graph.node:
        if node.op_type != "MatMul" or node.output[0] not in targets:
            rewritten.append(node)
            continue
        x, w = node.input
        if x not in quantized_inputs:
            nodes, xq, a_scale = _quantize_activations(x, c)
            rewritten += nodes
            quantized_inputs[x] = (xq, a_scale)
        xq, a_scale = quantized_inputs[x]
        if w not in replaced_weights:  # a weight two MatMuls share is quantized once
            wq, w_scale = quantize_weight(numpy_helper.to_array(inits[w]), reduce_range)
            graph.initializer.extend([numpy_helper.from_array(wq, f"{w}/int8"),
                                      numpy_helper.from_array(w_scale, f"{w}/scale")])
            replaced_weights.add(w)
        p = f"{node.output[0]}/w8a8_matmul"  # names from the output: unique even where nodes are unnamed
        rewritten += [
            helper.make_node("MatMulInteger", [xq, f"{w}/int8", c["zero_point"]], [f"{p}/acc"],
                             name=f"{p}/MatMulInteger"),
            helper.make_node("Cast", [f"{p}/acc"], [f"{p}/acc_float"], to=TensorProto.FLOAT, name=f"{p}/Cast"),
            helper.make_node("Mul", [f"{p}/acc_float", a_scale], [f"{p}/row_scaled"], name=f"{p}/RowScale"),
            helper.make_node("Mul", [f"{p}/row_scaled", f"{w}/scale"], [node.output[0]], name=f"{p}/ColumnScale"),
        ]
    del graph.node[:]
    graph.node.extend(rewritten)
    still_used = {name for n in graph.node for name in n.input}
    kept = [i for i in graph.initializer if i.name not in replaced_weights or i.name in still_used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model
