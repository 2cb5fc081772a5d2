"""Fewer, larger operators in the exported decoder graph, for onnxruntime's CPU provider.

On a 0.5B model a decode step was ~1,900 operators, most of them tiny, and each costs
onnxruntime a few microseconds of dispatch whatever its size. Four rewrites of the fp32 graph
(before quantization, so the quantizers see the final weights):

    RMSNorm  Pow-ReduceMean-Add-Sqrt-Reciprocal-Mul-Mul ──► SimplifiedLayerNormalization
    residual Add + RMSNorm                              ──► SkipSimplifiedLayerNormalization
             (onnxscript's ORT fusions; onnxruntime's own optimizer does not match the
              Reciprocal form that torch's rsqrt exports)

    sibling projections  MatMul(x, Wq) + bq, MatMul(x, Wk) + bk, MatMul(x, Wv) + bv
                         ──► Split(MatMul(x, [Wq | Wk | Wv]) + [bq | bk | bv])   (q/k/v, gate/up)

    transposed left operand  MatMul(Transpose(a), b) ──► com.microsoft.FusedMatMul(a, b, transA=1)
             (the grouped attention's two products with the softmax numerators, which it keeps
              keys-first: MLAS then sums the keys in blocks of 128 whatever the window's size)

    rotary (RoPE, rotate-half form)
             x * cos + Concat(-x[..., h:], x[..., :h]) * sin   (cos, sin: functions of position_ids)
                         ──► com.microsoft.RotaryEmbedding(x, position_ids, cos_cache, sin_cache)
             the caches are the graph's own cos/sin subgraph, run by onnxruntime once at export
             for positions 0 .. max_positions-1: every pass then reads a position's row of one
             table, whatever the window

All keep every output row a function of its own input row only (a norm reduces over the hidden
axis; a column of the concatenated product is the same dot product over K as before, and block
quantization runs along K per column; a rotary row reads its own position's cache row), so a
verify window still gives each row the bits of a single step; the quantize stage's gate checks
that on the real graph. Common-subexpression elimination first merges the layers' identical
subgraphs (the grouped attention's tiled bias is built once).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common  # noqa: F401  (ir.passes.common)
import onnxruntime as ort
from onnxscript.rewriter.ort_fusions.rms_normalization import fuse_rms_normalization
from onnxscript.rewriter.ort_fusions.skip_normalization import fuse_skip_rms_normalization

log = logging.getLogger(__name__)


def fuse_for_ort(model: ir.Model, position_ids: str, max_positions: int) -> dict[str, int]:
    """Rewrite ``model`` in place; returns how many of each fusion were made.

    position_ids: the graph input the rotary embedding reads; max_positions: cache rows (the
    artifact's max_context)."""
    ir.passes.common.CommonSubexpressionEliminationPass()(model)  # e.g. every layer's Tile of the bias
    counts = {
        "rms_normalization": fuse_rms_normalization(model),
        "skip_rms_normalization": fuse_skip_rms_normalization(model),
        "sibling_matmuls": concat_sibling_matmuls(model),
        "transposed_operands": fuse_transposed_operands(model),
        "rotary_embedding": fuse_rotary(model, position_ids, max_positions),
    }
    ir.passes.common.RemoveUnusedNodesPass()(model)  # the replaced nodes, their weights, the cos/sin subgraph
    log.info("graph fusions: %s", counts)
    return counts


def _constant_weight(node: ir.Node) -> np.ndarray | None:
    """The [K, N] float32 constant right operand of a MatMul, or None."""
    weight = node.inputs[1] if len(node.inputs) == 2 else None
    if weight is None or weight.const_value is None or not weight.is_initializer():
        return None
    if weight.const_value.dtype != ir.DataType.FLOAT or len(weight.const_value.shape) != 2:
        return None
    return weight.const_value.numpy()


def concat_sibling_matmuls(model: ir.Model) -> int:
    """Replace MatMuls that read the same activation with constant weights of the same K by one
    MatMul over the concatenated weights and a Split; returns the number of groups fused."""
    graph = model.graph
    groups: dict[int, list[tuple[ir.Node, np.ndarray]]] = {}  # activation -> its MatMuls and their weights
    for node in graph:  # graph order: a group's first node comes first
        if node.op_type == "MatMul" and node.domain == "" and node.inputs[0] is not None:
            weight = _constant_weight(node)
            if weight is not None:
                groups.setdefault(id(node.inputs[0]), []).append((node, weight))
    fused = 0
    for group in groups.values():
        if len(group) < 2 or len({w.shape[0] for _, w in group}) != 1:
            continue
        _fuse_group(graph, [n for n, _ in group], [w for _, w in group])
        fused += 1
    return fused


def _bias_add(value: ir.Value, width: int) -> tuple[ir.Node, np.ndarray] | None:
    """The Add of a constant [width] float32 bias that is ``value``'s only use, or None."""
    uses = value.uses()
    if len(uses) != 1 or uses[0].node.op_type != "Add" or uses[0].node.domain != "":
        return None
    add = uses[0].node
    bias = add.inputs[1 - uses[0].idx]
    if bias is None or bias.const_value is None or bias.const_value.dtype != ir.DataType.FLOAT:
        return None
    array = bias.const_value.numpy()
    return (add, array) if array.shape == (width,) else None


def _constant(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(np.ascontiguousarray(array)))
    value.shape, value.dtype = value.const_value.shape, value.const_value.dtype  # type: ignore[union-attr]
    graph.register_initializer(value)
    return value


def _fuse_group(graph: ir.Graph, nodes: Sequence[ir.Node], weights: Sequence[np.ndarray]) -> None:
    """MatMul(x, [W1 | W2 ...]) (+ [b1 | b2 ...] where every sibling adds a bias) -> Split."""
    x = nodes[0].inputs[0]
    stem = nodes[0].name or "matmul"
    widths = [w.shape[1] for w in weights]
    adds = [_bias_add(n.outputs[0], width) for n, width in zip(nodes, widths, strict=True)]
    with_bias = all(a is not None for a in adds)
    joined = _constant(graph, f"{stem}.siblings_weight", np.concatenate(weights, axis=1))  # [K, sum N]
    sizes = _constant(graph, f"{stem}.siblings_split", np.array(widths, np.int64))
    new_nodes = [ir.node("MatMul", [x, joined], name=f"{stem}.siblings")]
    if with_bias:
        bias = _constant(graph, f"{stem}.siblings_bias", np.concatenate([a[1] for a in adds]))  # type: ignore[index]
        new_nodes.append(ir.node("Add", [new_nodes[-1].outputs[0], bias], name=f"{stem}.siblings_bias"))
    split = ir.node("Split", [new_nodes[-1].outputs[0], sizes], {"axis": -1}, num_outputs=len(nodes),
                    name=f"{stem}.siblings_split")
    graph.insert_before(nodes[0], [*new_nodes, split])
    replaced = [a[0] for a in adds] if with_bias else list(nodes)  # type: ignore[index]
    for node, out in zip(replaced, split.outputs, strict=True):
        take_over(node.outputs[0], out)


def take_over(old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` everywhere, under its name (graph outputs keep their names)."""
    name, old.name = old.name, None
    new.name, new.shape, new.dtype = name, old.shape, old.dtype
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)


MS_DOMAIN = "com.microsoft"


def fuse_transposed_operands(model: ir.Model) -> int:
    """MatMul(Transpose(a), b) with ``a`` of rank 2 -> FusedMatMul(a, b, transA=1); returns how many.

    Not for speed: for the bits. MLAS's SGEMM sums K (here the keys) in blocks whose size depends on
    the columns each thread gets, and the threads split the columns or the rows whichever are more, so
    with A stored row-major the blocks change with the number of rows (a single step summed 256 keys
    per block, a 15-row tree window 128: the real model's gate saw it). With A read transposed MLAS
    keeps the blocks at 128 keys for every shape (it does not widen them when it must transpose A).
    onnxruntime's optimizer makes the same fusion at its extended level; in the graph itself it holds
    at every level a session may choose (tests/test_grouped_attention.py fails without it when a
    session disables the optimizer).
    """
    graph = model.graph
    fused = 0
    for node in list(graph):
        transpose = _producer(node.inputs[0], "Transpose") if node.op_type == "MatMul" and node.domain == "" else None
        perm = transpose.attributes.get_ints("perm") if transpose is not None else None
        if transpose is None or perm is None or list(perm) != [1, 0]:
            continue
        matmul = ir.node("FusedMatMul", [transpose.inputs[0], node.inputs[1]], {"transA": 1}, domain=MS_DOMAIN,
                         name=f"{node.name}.transposed_a")
        graph.insert_before(node, matmul)
        take_over(node.outputs[0], matmul.outputs[0])
        graph.remove(node, safe=True)
        fused += 1
    if fused:
        graph.opset_imports.setdefault(MS_DOMAIN, 1)
    return fused


# ---------------------------------------------------------------------------------------------
# rotary embedding


@dataclass(frozen=True)
class RotaryMatch:
    """``out = x * cos + Concat(-x[..., half:], x[..., :half]) * sin`` found in the graph."""

    out: ir.Value  # [1, heads, s, d]
    x: ir.Value  # [1, heads, s, d]
    cos: ir.Value  # broadcast to x, [1, 1, s, d]
    sin: ir.Value
    add: ir.Node  # the last node of the pattern; the fused node takes its place


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain == "" else None


def _ints(value: ir.Value | None) -> list[int] | None:
    if value is None or value.const_value is None:
        return None
    return [int(v) for v in np.atleast_1d(value.const_value.numpy())]


def _last_axis_slice(node: ir.Node | None, rank: int) -> tuple[int, int] | None:
    """(start, end) of a Slice along the last axis with step 1, or None."""
    if node is None or len(node.inputs) < 4:
        return None
    starts, ends, axes = (_ints(v) for v in node.inputs[1:4])
    steps = _ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
    if starts is None or ends is None or axes is None or steps != [1] or len(axes) != 1:
        return None
    return (starts[0], ends[0]) if axes[0] in (-1, rank - 1) else None


def _match_rotary(add: ir.Node, positions: ir.Value) -> RotaryMatch | None:
    """The rotary pattern ending in ``add``, on x [1, heads, s, d] with ``positions`` [1, s]."""
    for plain, rotated in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        mul_cos, mul_sin = _producer(plain, "Mul"), _producer(rotated, "Mul")
        if mul_cos is None or mul_sin is None:
            continue
        for x, cos in (mul_cos.inputs, reversed(mul_cos.inputs)):
            for concat, sin in (mul_sin.inputs, reversed(mul_sin.inputs)):
                if (cos is not None and sin is not None and _heads_first(x, positions)
                        and _rotate_half_of(x, _producer(concat, "Concat"))):  # type: ignore[arg-type]
                    return RotaryMatch(add.outputs[0], x, cos, sin, add)  # type: ignore[arg-type]
    return None


def _heads_first(x: ir.Value | None, positions: ir.Value) -> bool:
    """x is [1, heads, s, d] (d even, known) with s the positions' sequence axis."""
    if x is None or x.shape is None or len(x.shape) != 4 or positions.shape is None or len(positions.shape) != 2:
        return False
    d = x.shape[3]
    return isinstance(d, int) and d % 2 == 0 and x.shape[2] == positions.shape[1]


def _rotate_half_of(x: ir.Value, concat: ir.Node | None) -> bool:
    """``concat`` is ``Concat(Neg(x[..., d/2:]), x[..., :d/2])``."""
    if concat is None or len(concat.inputs) != 2 or concat.attributes.get_int("axis") not in (-1, 3):
        return False
    d = x.shape[3]  # type: ignore[index]
    neg, low = _producer(concat.inputs[0], "Neg"), _producer(concat.inputs[1], "Slice")
    high = _producer(neg.inputs[0], "Slice") if neg is not None else None
    if low is None or high is None or low.inputs[0] is not x or high.inputs[0] is not x:
        return False
    high_range = _last_axis_slice(high, 4)
    return (_last_axis_slice(low, 4) == (0, d // 2) and high_range is not None
            and high_range[0] == d // 2 and high_range[1] >= d)


def _evaluate(graph: ir.Graph, position_ids: ir.Value, outputs: Sequence[ir.Value],
              positions: np.ndarray) -> list[np.ndarray]:
    """``outputs`` computed by onnxruntime from ``position_ids = positions`` alone (the
    subgraph between them; ValueError if they need any other graph input)."""
    sub = ir.convenience.extract(graph, [position_ids], list(outputs))
    model = ir.Model(sub, ir_version=10)
    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {sub.inputs[0].name: positions})


def fuse_rotary(model: ir.Model, position_ids: str, max_positions: int) -> int:
    """Replace every rotate-half rotary embedding whose cos/sin are functions of the graph input
    ``position_ids`` by onnxruntime's RotaryEmbedding on cos/sin caches of ``max_positions`` rows."""
    graph = model.graph
    pos = next((v for v in graph.inputs if v.name == position_ids), None)
    if pos is None:
        raise ValueError(f"fuse_rotary: the graph has no input {position_ids!r}")
    adds = [n for n in graph if n.op_type == "Add" and n.domain == ""]
    matches = [m for m in (_match_rotary(n, pos) for n in adds) if m is not None]
    caches: dict[tuple[int, int], tuple[ir.Value, ir.Value] | None] = {}
    fused = 0
    for match in matches:
        key = (id(match.cos), id(match.sin))
        if key not in caches:
            caches[key] = _rotary_caches(graph, pos, match, max_positions, len(caches))
        if caches[key] is None:
            continue
        cos_cache, sin_cache = caches[key]  # type: ignore[misc]
        node = ir.node("RotaryEmbedding", [match.x, pos, cos_cache, sin_cache], {"interleaved": 0},
                       domain=MS_DOMAIN, name=f"{match.add.name}.rotary")
        graph.insert_before(match.add, node)
        take_over(match.out, node.outputs[0])
        fused += 1
    if fused:
        graph.opset_imports.setdefault(MS_DOMAIN, 1)
    return fused


def _rotary_caches(graph: ir.Graph, pos: ir.Value, match: RotaryMatch, max_positions: int,
                   index: int) -> tuple[ir.Value, ir.Value] | None:
    """cos/sin caches [max_positions, d/2] for ``match``; None where its cos/sin are not the
    rotate-half form (both halves equal) of a function of the positions alone."""
    d = match.x.shape[-1]  # type: ignore[index]
    positions = np.arange(max_positions, dtype=np.int64)[None]  # [1, max_positions]
    try:
        cos, sin = _evaluate(graph, pos, [match.cos, match.sin], positions)
    except ValueError:  # needs another input than the positions
        return None
    cos, sin = (np.asarray(v, np.float32) for v in (cos, sin))
    if cos.shape != sin.shape or cos.shape[-2:] != (max_positions, d) or cos.size != max_positions * d:
        return None
    cos, sin = cos.reshape(max_positions, d), sin.reshape(max_positions, d)
    half = d // 2
    if not (np.array_equal(cos[:, :half], cos[:, half:]) and np.array_equal(sin[:, :half], sin[:, half:])):
        return None
    return (_constant(graph, f"rotary_{index}.cos_cache", cos[:, :half]),  # [max_positions, d/2]
            _constant(graph, f"rotary_{index}.sin_cache", sin[:, :half]))
