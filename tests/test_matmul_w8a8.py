"""MatMulW8A8 (runtime/kernels/matmul_w8a8.h) run by onnxruntime as a one-node graph, the weights
pipeline/lib/w8a8.py packs for it, and the ``specrt_w8a8`` quantize method: exact by construction.

Row r of an M-row call equals the 1-row call on row r bit for bit, for any M, thread count and
instruction set; every output equals a float32 numpy evaluation of the definition bit for bit, and
the ONNX rewrite of the same arithmetic (method ``w8a8``, onnxruntime's MatMulInteger) too.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import specrt
from pipeline.lib.quantize_graph import QuantConfig, load_model, quantize_model, save_model
from pipeline.lib.w8a8 import pack_w8, quantize_w8a8, quantize_weight, unpack_w8
from pipeline.quantize import quantize_artifact
from specrt.backend import kernels
from specrt.backend.session import OrtDecoder
from specrt.backend.window import causal_bias
from tests.helpers import PROMPTS
from tests.test_spec_attention import isas

pytestmark = pytest.mark.skipif(kernels.library_path() is None, reason="specrt's kernel library is not built")
INT8 = QuantConfig(method="specrt_w8a8", bits=8, lm_head_bits=8, reduce_range=False)  # params.yaml's int8
GATE = {"new_tokens": 16, "widths": [4, 8], "prefill_chunk": 16}


def w8_graph(k: int, n: int, packed: np.ndarray, scale: np.ndarray, *, as_inputs: bool = False,
             bias: np.ndarray | None = None, lead: tuple = ("rows",)) -> bytes:
    """One MatMulW8A8 node: x [*lead, K] -> y [*lead, N]; the weights (and ``bias``) as initializers (or graph
    inputs)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, "k"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, "n"])
    names = ["x", "packed", "scale"] + (["bias"] if bias is not None else [])
    node = helper.make_node(kernels.MATMUL_W8A8_OP, names, ["y"], domain=kernels.DOMAIN, K=k, N=n)
    arrays = {"packed": packed, "scale": scale, **({"bias": bias} if bias is not None else {})}
    if as_inputs:
        inputs = [x] + [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                      [f"{name}{i}" for i in range(a.ndim)])  # any shape
                        for name, a in arrays.items()]
        inits = []
    else:
        inputs, inits = [x], [numpy_helper.from_array(a, name) for name, a in arrays.items()]
    model = helper.make_model(helper.make_graph([node], "matmul_w8a8", inputs, [y], inits), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(kernels.DOMAIN, 1)])
    return model.SerializeToString()


def session(graph: bytes, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    kernels.register(options, required=True)
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


def op_session(weight: np.ndarray, threads: int = 1, reduce_range: bool = True) -> ort.InferenceSession:
    k, n = weight.shape
    quantized, scale = quantize_weight(weight, reduce_range)
    return session(w8_graph(k, n, pack_w8(quantized), scale), threads)


def reference(x: np.ndarray, quantized: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(integer sums [rows, N], y [rows, N] float32) of matmul_w8a8.h, each float step in float32."""
    amax = np.abs(x).max(axis=1)
    a_scale = np.maximum(amax, np.float32(1e-30)) / np.float32(127)
    xq = np.rint(x / a_scale[:, None]).astype(np.int64)  # rint: halves to even, as nearbyint
    acc = xq @ quantized.astype(np.int64)
    return acc, (acc.astype(np.float32) * a_scale[:, None]) * scale[None, :]


def test_pack_puts_four_k_of_a_column_in_one_lane():
    weight = np.zeros((8, 20), np.int8)
    weight[0, 0], weight[1, 0], weight[5, 3], weight[7, 15], weight[6, 17] = 1, -2, 3, -127, 127
    packed = pack_w8(weight)
    assert packed.shape == (2, 2, 64) and packed.dtype == np.int8  # 20 columns: two tiles, the last padded
    lanes = packed.reshape(2, 2, 16, 4)  # [tile, group, column, i]
    assert lanes[0, 0, 0].tolist() == [1, -2, 0, 0]
    assert lanes[0, 1, 3, 1] == 3 and lanes[0, 1, 15, 3] == -127  # k 5 = group 1, i 1; k 7: i 3
    assert lanes[1, 1, 1, 2] == 127  # column 17 = tile 1, column 1; k 6
    assert np.count_nonzero(packed) == 5
    assert np.array_equal(unpack_w8(packed, 20), weight)


@given(groups=st.integers(1, 12), n=st.integers(1, 70), seed=st.integers(0, 2**16))
@settings(max_examples=30, deadline=None)
def test_pack_unpack_round_trip(groups, n, seed):
    weight = np.random.default_rng(seed).integers(-127, 128, (4 * groups, n)).astype(np.int8)
    assert np.array_equal(unpack_w8(pack_w8(weight), n), weight)


def test_pack_refuses_what_the_kernel_cannot_take():
    with pytest.raises(ValueError, match=r"pack_w8: weight of shape \(6, 8\): expected \[K, N\] with K a positive "
                                         r"multiple of 4 up to 32768"):
        pack_w8(np.zeros((6, 8), np.int8))
    with pytest.raises(ValueError, match="pack_w8: a weight is -128; MatMulW8A8 takes -127..127"):
        pack_w8(np.full((4, 8), -128, np.int8))
    with pytest.raises(ValueError, match=r"pack_w8: weights float32 of shape \(4, 8\), expected int8 \[K, N\]"):
        pack_w8(np.zeros((4, 8), np.float32))


@pytest.mark.parametrize("k, n, reduce_range", [(4, 16, True), (36, 40, True), (896, 160, False),
                                                (4864, 48, True), (1028, 23, False)])  # 1028: an odd group count
def test_values_are_the_definition_evaluated_in_float32(k, n, reduce_range):
    rng = np.random.default_rng(k + n)
    weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    x = rng.standard_normal((6, k)).astype(np.float32)
    x[1] = 0.0  # an all-zero row: its scale floored at 1e-30 / 127, output 0
    x[2] *= 1e-3
    x[3, 0] = 40.0  # one outlier takes the row's range
    quantized, scale = quantize_weight(weight, reduce_range)
    y = op_session(weight, reduce_range=reduce_range).run(None, {"x": x})[0]
    acc, want = reference(x, quantized, scale)
    assert not y[1].any() and np.abs(acc).max() > 0
    assert np.array_equal(y, want)


@pytest.mark.parametrize("rows", [1, 5, 16])
def test_the_same_bits_as_the_onnx_rewrite_on_matmulinteger(rows):
    rng = np.random.default_rng(rows)
    k, n = 256, 72
    weight = rng.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])], [numpy_helper.from_array(weight, "w")])
    rewrite = quantize_w8a8(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), exclude=[])
    x = (rng.standard_normal((rows, k)) * 3).astype(np.float32)
    want = ort.InferenceSession(rewrite.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.array_equal(op_session(weight).run(None, {"x": x})[0], want)


@given(k=st.sampled_from([4, 68, 896]), n=st.sampled_from([16, 40, 160]), rows=st.integers(1, 64),
       threads=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_a_row_gets_the_same_bits_in_any_number_of_rows_and_threads(k, n, rows, threads, seed):
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((k, n)).astype(np.float32)
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.01, 10)).astype(np.float32)
    many = op_session(weight, threads).run(None, {"x": x})[0]
    single = op_session(weight, 1)
    for r in sorted({0, rows // 2, rows - 1}):
        assert np.array_equal(single.run(None, {"x": x[r : r + 1]})[0][0], many[r]), r


# 31 = 16 + 8 + 4 + 3: every row block; amx (2 rows or more): K 1028 and 132 end in 4 k after whole
# chunks of 64, K 20 is all rest, K 200 three chunks (an odd one) and 8 k; 33 rows: passes of 16, 16, 1
@pytest.mark.parametrize("k, n, rows", [(64, 48, 7), (896, 4864 // 8, 9), (1028, 40, 10), (20, 33, 1),
                                        (20, 33, 8), (132, 24, 31), (200, 40, 33)])
def test_every_instruction_set_gives_the_same_bits(monkeypatch, k, n, rows):
    available = isas()
    assert "scalar" in available
    rng = np.random.default_rng(k)
    weight = rng.standard_normal((k, n)).astype(np.float32)
    quantized, scale = quantize_weight(weight, reduce_range=False)  # 8-bit weights: the pair sums' worst case
    quantized[:, 0], quantized[:, 1] = 127, -127
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0, :] = 3.0  # xq = 127 throughout: every pair sum of columns 0 and 1 is +-2 * 127 * 127
    x[-1, : k // 2] = -3.0  # and -127 on half of the last row
    graph = w8_graph(k, n, pack_w8(quantized), scale, bias=rng.standard_normal(n).astype(np.float32))
    results = {}
    for isa in available:
        monkeypatch.setenv("SPECRT_KERNEL_ISA", isa)
        results[isa] = session(graph, 2).run(None, {"x": x})[0]
    for isa in available[1:]:
        assert np.array_equal(results[isa], results["scalar"]), f"{isa} differs from scalar"


@pytest.mark.parametrize("n, rows", [(16, 1), (40, 5), (160, 9)])  # 40: a partial last tile
def test_a_bias_is_one_float_addition_after_the_product(monkeypatch, n, rows):
    rng = np.random.default_rng(n)
    quantized, scale = quantize_weight(rng.standard_normal((96, n)).astype(np.float32), True)
    packed, bias = pack_w8(quantized), rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((rows, 96)).astype(np.float32)
    for isa in isas():
        monkeypatch.setenv("SPECRT_KERNEL_ISA", isa)
        plain = session(w8_graph(96, n, packed, scale)).run(None, {"x": x})[0]
        biased = session(w8_graph(96, n, packed, scale, bias=bias)).run(None, {"x": x})[0]
        assert np.array_equal(biased, plain + bias), isa


def test_leading_dims_are_kept():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((64, 24)).astype(np.float32)
    quantized, scale = quantize_weight(weight, True)
    x = rng.standard_normal((1, 3, 64)).astype(np.float32)
    got = session(w8_graph(64, 24, pack_w8(quantized), scale, lead=(1, "s"))).run(None, {"x": x})[0]
    assert got.shape == (1, 3, 24)
    assert np.array_equal(got[0], op_session(weight).run(None, {"x": x[0]})[0])


def test_wrong_inputs_are_named_with_the_expected_shape():
    rng = np.random.default_rng(2)
    quantized, scale = quantize_weight(rng.standard_normal((64, 40)).astype(np.float32), True)
    packed = pack_w8(quantized)
    sess = session(w8_graph(64, 40, packed, scale, as_inputs=True, bias=np.zeros(40, np.float32)))
    x, bias = rng.standard_normal((2, 64)).astype(np.float32), np.zeros(40, np.float32)
    feed = {"x": x, "packed": packed, "scale": scale, "bias": bias}
    with pytest.raises(Exception, match=r"MatMulW8A8: packed has shape \[3, 8, 64\], expected \[3, 16, 64\] "
                                        r"for K=64, N=40"):
        sess.run(None, {**feed, "packed": packed[:, :8]})
    with pytest.raises(Exception, match=r"MatMulW8A8: scale has shape \[39\], expected \[40\]"):
        sess.run(None, {**feed, "scale": scale[:39]})
    with pytest.raises(Exception, match=r"MatMulW8A8: bias has shape \[41\], expected \[40\]"):
        sess.run(None, {**feed, "bias": np.zeros(41, np.float32)})
    with pytest.raises(Exception, match=r"MatMulW8A8: x has shape \[2, 32\], expected \[..., K\] with K=64"):
        sess.run(None, {**feed, "x": x[:, :32]})
    with pytest.raises(Exception, match=r"MatMulW8A8: K=62, N=40: expected K a positive multiple of 4 up to 32768"):
        session(w8_graph(62, 40, packed, scale))


def test_the_quantize_method_writes_one_node_per_product_with_the_rewrites_bits(tiny_artifact, tmp_path):
    src = specrt.load(tiny_artifact[0])
    graphs = {}
    for method in ("specrt_w8a8", "w8a8"):
        config = QuantConfig(method=method, bits=8, lm_head_bits=8)
        model = quantize_model(load_model(tiny_artifact[0] / src.manifest.decoder), config)
        graphs[method] = [n.op_type for n in model.graph.node]
        (tmp_path / method).mkdir()
        save_model(model, tmp_path / method / "decoder.onnx")
    ops, rewrite = graphs["specrt_w8a8"], graphs["w8a8"]
    products = rewrite.count("MatMulInteger")
    assert "MatMul" not in ops and "MatMulInteger" not in ops and ops.count(kernels.MATMUL_W8A8_OP) == products
    assert len(ops) <= len(rewrite) - 3 * products  # at least the Cast and two Muls of each product gone
    ids = src.encode(PROMPTS[0])[:12]
    logits = []
    for method in graphs:
        decoder = OrtDecoder(tmp_path / method / "decoder.onnx", src.manifest.dims)
        decoder.reset(len(ids) + 1)
        logits.append(decoder.forward(ids, np.arange(len(ids)), causal_bias(0, len(ids))).logits)
    assert np.array_equal(logits[0], logits[1])


def test_the_int8_variant_is_exact_by_construction(tiny_artifact, tmp_path):
    src = tiny_artifact[0]
    model = specrt.load(src)
    long = np.concatenate([model.encode(p) for p in PROMPTS * 4])[:118]  # windows cross key slot 128
    prompts = [model.encode(p) for p in PROMPTS[:3]] + [long]
    report = quantize_artifact(src, tmp_path / "int8", "int8", INT8, prompts, GATE, bench_steps=2)
    gate = specrt.load(tmp_path / "int8").manifest.checks["gate"]
    assert report["spec_safe"] and gate["positions"] > 0 and gate["max_logit_diff"] == 0.0, gate["modes"]
    assert gate["basis"]["exactness"] == "by_construction" and gate["basis"]["row_dependent_ops"] == []
    assert report["quantization"]["method"] == "specrt_w8a8" and 0.5 < report["top1_agreement"] <= 1.0


def test_a_portable_graph_gets_matmulinteger_for_int8(portable_artifact, tmp_path):
    src = portable_artifact[0]
    prompts = [specrt.load(src).encode(PROMPTS[0])]
    report = quantize_artifact(src, tmp_path / "int8-portable", "int8", INT8, prompts, GATE, bench_steps=1)
    assert report["quantization"]["method"] == "w8a8" and report["quantization"]["reduce_range"]  # AVX2's need
    graph = onnx.load(tmp_path / "int8-portable" / "decoder.onnx", load_external_data=False).graph
    ops = {n.op_type for n in graph.node}
    assert "MatMulInteger" in ops and kernels.MATMUL_W8A8_OP not in ops
