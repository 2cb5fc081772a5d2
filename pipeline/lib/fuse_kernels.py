"""Rewrites of the exported graph onto specrt's kernel library (runtime/kernels), after fuse_graph:

    q|k|v   MatMul(x, [Wq | Wk | Wv]) (+ bias) ─► Split ─► SpecAttention(q, k, v, ...)
                                       ──► SpecAttention(qkv, -, -, ...)       (packed: no Split)

    MLP     MatMul(x, [Wg | Wu]) ─► Split ─► g * Sigmoid(g) * u
                                       ──► ai.specrt.SwiGLU(gu)                 (one node for four)

Both keep every output row a function of its own input row (the packed query row holds the same
values the Split would have copied out; SwiGLU is elementwise per row), so verify windows keep the
bits of single steps. Only for graphs whose attention is SpecAttention: they need the library.
"""

from __future__ import annotations

import logging

import onnx_ir as ir
import onnx_ir.passes.common  # noqa: F401  (ir.passes.common)

from specrt.backend import kernels

from .fuse_graph import take_over

log = logging.getLogger(__name__)


def fuse_for_kernels(model: ir.Model) -> dict[str, int]:
    """Rewrite ``model`` in place; returns how many of each rewrite were made."""
    counts = {"packed_attention": pack_attention_inputs(model), "swiglu": fuse_swiglu(model)}
    ir.passes.common.RemoveUnusedNodesPass()(model)  # the Splits, Sigmoids and Muls replaced
    log.info("kernel rewrites: %s", counts)
    return counts


def _split_of(values: list[ir.Value | None]) -> ir.Node | None:
    """The last-axis Split whose outputs are exactly ``values``, in order, or None."""
    if any(v is None for v in values):
        return None
    split = values[0].producer()  # type: ignore[union-attr]
    if split is None or split.op_type != "Split" or split.domain != "" or list(split.outputs) != values:
        return None
    axis = split.attributes.get("axis")
    shape = split.inputs[0].shape if split.inputs[0] is not None else None
    last = -1 if shape is None else len(shape) - 1  # (fuse_graph's Splits take axis -1 of an unknown shape)
    return split if axis is not None and axis.as_int() in (-1, last) else None


def pack_attention_inputs(model: ir.Model) -> int:
    """SpecAttention reading q, k, v from one Split of the packed projection -> reading the packed
    rows itself; returns how many nodes were rewritten."""
    count = 0
    for node in list(model.graph):
        if node.op_type != kernels.ATTENTION_OP or node.domain != kernels.DOMAIN:
            continue
        split = _split_of(list(node.inputs[:3]))
        if split is None or any(len(out.uses()) != 1 for out in split.outputs):
            continue
        node.replace_input_with(0, split.inputs[0])
        node.replace_input_with(1, None)
        node.replace_input_with(2, None)
        count += 1
    return count


def _other(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The operand of the two-input ``node`` that is not ``value``."""
    a, b = node.inputs
    return b if a is value else a if b is value else None


def fuse_swiglu(model: ir.Model) -> int:
    """Mul(Mul(g, Sigmoid(g)), u) with g, u the two halves of one last-axis Split -> SwiGLU of the
    Split's input; returns how many were fused."""
    count = 0
    for sigmoid in list(model.graph):
        if sigmoid.op_type != "Sigmoid" or sigmoid.domain != "":
            continue
        gate = sigmoid.inputs[0]
        uses = sigmoid.outputs[0].uses()
        if gate is None or len(uses) != 1 or uses[0].node.op_type != "Mul":
            continue
        silu = uses[0].node
        if _other(silu, sigmoid.outputs[0]) is not gate or len(silu.outputs[0].uses()) != 1:
            continue
        product = silu.outputs[0].uses()[0].node
        up = _other(product, silu.outputs[0]) if product.op_type == "Mul" else None
        split = _split_of([gate, up])
        if split is None or len(gate.uses()) != 2 or len(up.uses()) != 1:  # type: ignore[union-attr]
            continue
        fused = ir.node(kernels.SWIGLU_OP, [split.inputs[0]], domain=kernels.DOMAIN, version=kernels.OPSET,
                        name=f"{product.name or 'mlp'}.swiglu")
        model.graph.insert_before(product, fused)
        take_over(product.outputs[0], fused.outputs[0])
        count += 1
    if count:
        model.opset_imports.setdefault(kernels.DOMAIN, kernels.OPSET)
    return count
