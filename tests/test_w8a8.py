"""W8A8 with per-token scales (pipeline/lib/w8a8.py): exact integer sums, so windows equal single steps."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import specrt
from pipeline.lib.quantize_graph import QuantConfig
from pipeline.lib.w8a8 import quantize_w8a8, quantize_weight
from pipeline.lossless import compare_methods
from pipeline.quantize import quantize_artifact
from tests.helpers import PROMPTS

W8A8 = QuantConfig(method="w8a8", bits=8, lm_head_bits=8)
GATE = {"new_tokens": 16, "widths": [4, 8], "prefill_chunk": 16}


def test_weights_get_one_scale_per_output_column():
    weight = np.array([[1.0, -0.5, 0.0], [0.25, 0.125, 0.0]], np.float32)  # [K=2, N=3]
    q, scale = quantize_weight(weight, reduce_range=True)
    assert q.dtype == np.int8 and scale.dtype == np.float32
    np.testing.assert_array_equal(scale, np.float32([1 / 63, 0.5 / 63, 1.0]))  # an all-zero column: scale 1
    np.testing.assert_array_equal(q, [[63, -63, 0], [16, 16, 0]])  # 0.25 * 63 = 15.75, 0.125 * 126 = 15.75
    q, _ = quantize_weight(weight, reduce_range=False)
    np.testing.assert_array_equal(q, [[127, -127, 0], [32, 32, 0]])  # 31.75 rounds to 32


def _one_matmul(k: int, n: int, rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray]:
    weight = rng.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s", n])],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), weight


def test_a_row_gets_the_same_bits_in_any_window_and_stays_close_to_float():
    rng = np.random.default_rng(0)
    model, weight = _one_matmul(256, 512, rng)
    model = quantize_w8a8(model, exclude=[])
    ops = [n.op_type for n in model.graph.node]
    assert "MatMul" not in ops and ops.count("MatMulInteger") == 1
    assert "w" not in {i.name for i in model.graph.initializer}  # the float weight is dropped
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 16, 256)).astype(np.float32)
    x[0, 3] = 0.0  # a row of zeros: absmax floored, output exactly 0
    singles = np.concatenate([session.run(None, {"x": x[:, i : i + 1]})[0] for i in range(16)], axis=1)
    for m in (2, 3, 8, 16):
        np.testing.assert_array_equal(session.run(None, {"x": x[:, :m]})[0], singles[:, :m])
    assert not singles[0, 3].any()
    exact = x[0] @ weight
    assert np.linalg.norm(singles[0] - exact) / np.linalg.norm(exact) < 0.02


def test_matmuls_sharing_an_input_share_its_quantization_and_excluded_ones_stay_float():
    rng = np.random.default_rng(1)
    w1, w2, w3 = (numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), n) for n in "abc")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "a"], ["y1"]),  # unnamed nodes
         helper.make_node("MatMul", ["x", "b"], ["y2"]),
         helper.make_node("MatMul", ["y2", "a"], ["y4"]),  # shares weight a
         helper.make_node("MatMul", ["x", "c"], ["y3"], name="head")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", 8])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, "s", 8]) for y in ("y1", "y3", "y4")],
        [w1, w2, w3])
    model = quantize_w8a8(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), exclude=["head"])
    onnx.checker.check_model(model, full_check=True)  # types, shapes, one initializer per quantized weight
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("ReduceMax") == 2 and ops.count("MatMulInteger") == 3 and ops.count("MatMul") == 1
    names = [i.name for i in model.graph.initializer]
    assert "c" in names and "a" not in names and names.count("a/int8") == 1
    # onnxruntime refuses duplicate node names at load (the checker does not look at names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 3, 8)).astype(np.float32)
    y1, y3, _ = session.run(None, {"x": x})
    np.testing.assert_array_equal(y3, x @ numpy_helper.to_array(w3))  # the excluded MatMul stays float
    a = numpy_helper.to_array(w1)
    assert np.abs(y1 - x @ a).max() < 0.05 * np.abs(x @ a).max()


def test_w8a8_needs_8_bits():
    with pytest.raises(ValueError, match="'w8a8' is int8 MatMuls only"):
        QuantConfig(method="w8a8", bits=4)


def test_w8a8_variant_speculation_equals_plain_decoding_bit_for_bit(tiny_artifact, tmp_path):
    # on every CPU: the gate sees no logit difference at all between windows and single steps
    src = tiny_artifact[0]
    model = specrt.load(src)
    long = np.concatenate([model.encode(p) for p in PROMPTS * 4])[:118]  # windows cross key slot 128
    prompts = [model.encode(p) for p in PROMPTS[:3]] + [long]
    report = quantize_artifact(src, tmp_path / "int8", "int8", W8A8, prompts, GATE, bench_steps=2)
    quantized = specrt.load(tmp_path / "int8")
    gate = quantized.manifest.checks["gate"]
    assert report["spec_safe"] and gate["positions"] > 0 and gate["max_logit_diff"] == 0.0, gate["modes"]
    assert 0.5 < report["top1_agreement"] <= 1.0
    result = compare_methods(quantized, prompts[:3], ["pld", "suffix_decoding", "lookahead"], max_new_tokens=24,
                             draft_budget=6)
    assert result["lossless"], {k: v["divergences"] for k, v in result["runs"].items()}
