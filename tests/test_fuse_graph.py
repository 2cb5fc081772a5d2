"""Graph fusions of the export (pipeline.lib.fuse_graph): what they replace, and that nothing else changes."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common  # noqa: F401  (ir.passes.common)
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from pipeline.lib.fuse_graph import concat_sibling_matmuls, fuse_rotary
from specrt.backend.manifest import read_manifest


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _fused(model: onnx.ModelProto, fuse) -> tuple[onnx.ModelProto, int]:
    graph = ir.serde.deserialize_model(model)
    count = fuse(graph)
    ir.passes.common.RemoveUnusedNodesPass()(graph)  # as fuse_for_ort does after its fusions
    return ir.serde.serialize_model(graph), count


def _graph_ops(folder) -> tuple[onnx.GraphProto, collections.Counter]:
    graph = onnx.load(str(folder / read_manifest(folder).decoder), load_external_data=False).graph
    return graph, collections.Counter(n.op_type for n in graph.node)


def test_specrt_graph_is_one_attention_node_per_layer_reading_the_cache_in_place(tiny_artifact):
    folder, model = tiny_artifact
    graph, ops = _graph_ops(folder)
    layers = model.config.num_hidden_layers
    assert ops["SpecAttention"] == layers
    # per layer: q|k|v, o, gate|up, down; plus the lm_head
    assert ops["MatMul"] == 4 * layers + 1 and ops["FusedMatMul"] == 0 and ops["Softmax"] == 0
    # every cached K/V input goes straight into its layer's SpecAttention; its present outputs are the graph's
    readers = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    outputs = {o.name for o in graph.output}
    packed = not model.config.model_type.startswith("gemma3")  # Gemma: q_norm, k_norm between Split and node
    for node in (n for n in graph.node if n.op_type == "SpecAttention"):
        assert node.domain == "ai.specrt"
        assert node.input[3].startswith("past.") and node.input[4].startswith("past.")
        assert {node.output[1], node.output[2]} <= outputs
        assert (list(node.input[1:3]) == ["", ""]) == packed  # the packed q|k|v rows, no Split
    # the SwiGLU MLPs (Gemma's is GeGLU): one node for Split, Sigmoid and two Muls
    assert ops["SwiGLU"] == (layers if packed else 0)
    assert ops["Sigmoid"] == 0 and ops["Split"] == 0 if packed else ops["Split"] >= layers
    for name in (i.name for i in graph.input if i.name.startswith("past.")):
        assert [n.op_type for n in readers[name] if n.op_type != "Shape"] == ["SpecAttention"]


def test_exported_graph_has_fused_norms_projections_and_rotary(portable_artifact):
    folder, model = portable_artifact
    graph = onnx.load(str(folder / read_manifest(folder).decoder), load_external_data=False)
    ops = collections.Counter(n.op_type for n in graph.graph.node)
    layers = model.config.num_hidden_layers
    assert ops["RotaryEmbedding"] == 2 * layers  # q and k of every layer
    assert ops["Neg"] == 0 and ops["Sin"] == 0 and ops["Cos"] == 0  # rotate-half and the per-step cos/sin are gone
    assert ops["SkipSimplifiedLayerNormalization"] >= layers and ops["Pow"] == 0
    # per layer: q|k|v, o, gate|up, down, and the scores; plus the lm_head. The products with the
    # softmax's numerators (values, normaliser) read them transposed. No Pad: the cached values are
    # not copied into a wider tensor
    assert ops["MatMul"] == 5 * layers + 1 and ops["FusedMatMul"] == 2 * layers and ops["Pad"] == 0


def test_exported_graph_reads_the_cache_in_its_own_layout(portable_artifact):
    """The cached K/V rows [1, past, kv, d] go straight into their concatenation with the new rows,
    and that goes (reshaped) into the attention products: no pass transposes a copy of the cache."""
    folder, model = portable_artifact
    graph = onnx.load(str(folder / read_manifest(folder).decoder), load_external_data=False).graph
    consumers = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    past = [i.name for i in graph.input if i.name.startswith("past.")]
    assert len(past) == 2 * model.config.num_hidden_layers
    for name in past:
        (concat,) = [n for n in consumers[name] if n.op_type != "Shape"]  # (a Shape reads no data)
        assert concat.op_type == "Concat" and concat.input[0] == name
        (reshape,) = consumers[concat.output[0]]
        assert reshape.op_type == "Reshape"
        assert {n.op_type for n in consumers[reshape.output[0]]} <= {"MatMul", "FusedMatMul"}


def _projections(bias: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits, outputs = [], [], []
    for name, n in (("q", 8), ("k", 4), ("v", 4)):
        inits.append(numpy_helper.from_array(rng.standard_normal((6, n)).astype(np.float32), f"W{name}"))
        out = f"{name}_mm" if bias else name
        nodes.append(helper.make_node("MatMul", ["x", f"W{name}"], [out], name=f"mm_{name}"))
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"b{name}"))
            nodes.append(helper.make_node("Add", [out, f"b{name}"], [name]))
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, n]))
    graph = helper.make_graph(nodes, "projections", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def test_sibling_projections_become_one_matmul_and_a_split_with_or_without_bias():
    x = np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32)
    for bias in (True, False):
        model = _projections(bias)
        fused, count = _fused(model, concat_sibling_matmuls)
        assert count == 1
        ops = collections.Counter(n.op_type for n in fused.graph.node)
        assert ops["MatMul"] == 1 and ops["Split"] == 1 and ops["Add"] == int(bias)
        assert [o.name for o in fused.graph.output] == ["q", "k", "v"]
        for got, want in zip(_run(fused, {"x": x}), _run(model, {"x": x}), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _rotary(cos_from: str) -> onnx.ModelProto:
    """out = x * cos + Concat(-x[..., 4:], x[..., :4]) * sin, cos/sin from position_ids (or ``other``)."""
    inv_freq = (1.0 / 10000 ** (np.arange(0, 8, 2) / 8)).astype(np.float32)  # [4]
    c = numpy_helper.from_array
    nodes = [
        helper.make_node("Unsqueeze", [cos_from, "ax_last"], ["p3"]),
        helper.make_node("Cast", ["p3"], ["pf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["pf", "inv_freq"], ["freqs"]),  # [1, s, 4]
        helper.make_node("Concat", ["freqs", "freqs"], ["emb"], axis=-1),  # [1, s, 8]
        helper.make_node("Cos", ["emb"], ["cos3"]),
        helper.make_node("Sin", ["emb"], ["sin3"]),
        helper.make_node("Unsqueeze", ["cos3", "ax1"], ["cos"]),  # [1, 1, s, 8]
        helper.make_node("Unsqueeze", ["sin3", "ax1"], ["sin"]),
        helper.make_node("Slice", ["x", "zero", "four", "ax_last"], ["x1"]),
        helper.make_node("Slice", ["x", "four", "big", "ax_last"], ["x2"]),
        helper.make_node("Neg", ["x2"], ["nx2"]),
        helper.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
        helper.make_node("Mul", ["x", "cos"], ["a"]),
        helper.make_node("Mul", ["rot", "sin"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["out"]),
    ]
    inits = [c(inv_freq, "inv_freq"), c(np.array([-1], np.int64), "ax_last"), c(np.array([1], np.int64), "ax1"),
             c(np.array([0], np.int64), "zero"), c(np.array([4], np.int64), "four"),
             c(np.array([2**62], np.int64), "big")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "s", 8]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "s"]),
              helper.make_tensor_value_info("other", TensorProto.INT64, [1, "s"])]
    graph = helper.make_graph(nodes, "rotary", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT,
                                                                                       [1, 3, "s", 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def test_rotary_becomes_one_op_whose_caches_give_every_position_the_same_values():
    model = _rotary("position_ids")
    fused, count = _fused(model, lambda m: fuse_rotary(m, "position_ids", 64))
    assert count == 1
    ops = collections.Counter(n.op_type for n in fused.graph.node)
    assert ops["RotaryEmbedding"] == 1
    rng = np.random.default_rng(2)
    for positions in ([0, 1, 2, 3, 4], [63], [10, 11, 12, 11, 12]):  # a chain, one step, a tree's depths
        pos = np.array([positions], np.int64)
        feeds = {"x": rng.standard_normal((1, 3, len(positions), 8)).astype(np.float32), "position_ids": pos,
                 "other": pos}
        got = _run(fused, {k: v for k, v in feeds.items() if k in {i.name for i in fused.graph.input}})[0]
        np.testing.assert_allclose(got, _run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_rotary_whose_angles_do_not_come_from_position_ids_is_left_alone():
    model = _rotary("other")
    _, count = _fused(model, lambda m: fuse_rotary(m, "position_ids", 64))
    assert count == 0
