"""MatMulQ4 (runtime/kernels/matmul_q4.h) run by onnxruntime as a one-node graph, and the weights
pipeline/lib/q4_pack.py gives it: exact by construction.

Row r of an M-row call equals the 1-row call on row r bit for bit, for any M, thread count and
instruction set; the integer block sums are the numpy product of the same quantized numbers, and
the float scaling matches within 1e-6 relative.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from pipeline.lib.q4_pack import dequantize_q4, pack_q4, quantize_q4, unpack_q4
from specrt.backend import kernels
from tests.test_spec_attention import isas

pytestmark = pytest.mark.skipif(kernels.library_path() is None, reason="specrt's kernel library is not built")


def q4_graph(k: int, n: int, packed: np.ndarray, scales: np.ndarray, *, as_inputs: bool = False,
             bias: np.ndarray | None = None) -> bytes:
    """One MatMulQ4 node: x [rows, K] -> y [rows, N]; the weights (and ``bias``) as initializers (or graph
    inputs)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", "k"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", "n"])
    names = ["x", "packed", "scales"] + (["bias"] if bias is not None else [])
    node = helper.make_node(kernels.MATMUL_Q4_OP, names, ["y"], domain=kernels.DOMAIN, K=k, N=n)
    inputs, inits = [x], []
    if as_inputs:
        inputs += [helper.make_tensor_value_info("packed", TensorProto.UINT8, ["t", "b", "c"]),
                   helper.make_tensor_value_info("scales", TensorProto.FLOAT16, ["t", "b", "l"])]
        if bias is not None:
            inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["n"]))
    else:
        inits = [numpy_helper.from_array(packed, "packed"), numpy_helper.from_array(scales, "scales")]
        if bias is not None:
            inits.append(numpy_helper.from_array(bias, "bias"))
    model = helper.make_model(helper.make_graph([node], "matmul_q4", inputs, [y], inits), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(kernels.DOMAIN, 1)])
    return model.SerializeToString()


def session(k: int, n: int, weight: np.ndarray, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    kernels.register(options, required=True)
    packed, scales = pack_q4(*quantize_q4(weight))
    return ort.InferenceSession(q4_graph(k, n, packed, scales), options, providers=["CPUExecutionProvider"])


def reference(x: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(integer block sums [rows, K/32, N], dx [rows, K/32], y [rows, N] in float64) of matmul_q4.h."""
    rows, k = x.shape
    blocks = x.reshape(rows, k // 32, 32)
    amax = np.abs(blocks).max(axis=-1)  # [rows, Kb]
    inv = np.float32(127) / np.where(amax > 0, amax, np.float32(1))
    xq = np.where(amax[..., None] > 0, np.rint(blocks * inv[..., None]), 0).astype(np.int64)
    dx = amax / np.float32(127)
    sums = np.einsum("rbi,bin->rbn", xq, codes.astype(np.int64).reshape(k // 32, 32, -1))
    y = np.einsum("rbn,rb,bn->rn", sums.astype(np.float64), dx.astype(np.float64), scales.astype(np.float64))
    return sums, dx, y


def test_quantize_q4_maps_each_blocks_extreme_to_minus_8():
    column = np.array([0.5, -1.0, 0.25, 0.875, 0.0, -0.125] + [0.0] * 26, np.float32)
    weight = np.stack([column, -column, np.zeros(32, np.float32)], axis=1)  # [32, 3]
    codes, scales = quantize_q4(weight)
    assert scales.dtype == np.float16 and scales.tolist() == [[0.125, -0.125, 0.0]]
    assert codes[:6, 0].tolist() == [4, -8, 2, 7, 0, -1]
    assert codes[:6, 1].tolist() == [4, -8, 2, 7, 0, -1]  # the negated column: its extreme is +1 -> scale -1/8
    assert not codes[:, 2].any()
    assert np.array_equal(dequantize_q4(codes, scales)[:6, 0], [0.5, -1.0, 0.25, 0.875, 0.0, -0.125])


def test_quantize_q4_rounds_halves_up_as_onnxruntime_does():
    column = np.array([-1.0, 0.3125, -0.1875, 0.0625, -0.0625, 0.9375] + [0.0] * 26, np.float32)  # scale 1/8
    codes, _ = quantize_q4(column[:, None])
    assert codes[:6, 0].tolist() == [-8, 3, -1, 1, 0, 7]  # 2.5 -> 3, -1.5 -> -1, 0.5 -> 1, -0.5 -> 0, 7.5 -> 7


def test_pack_puts_four_k_of_a_column_in_one_lane_low_then_high_nibbles():
    codes = np.zeros((32, 16), np.int8)
    codes[0, 0], codes[4, 0], codes[1, 3], codes[8, 15], codes[31, 2] = 1, -1, 7, -8, 3
    packed, scales = pack_q4(codes, np.ones((1, 16), np.float16))
    assert packed.shape == (1, 1, 256) and scales.shape == (1, 1, 16)
    group = packed[0, 0].reshape(4, 16, 4)  # [g, column, i]
    assert group[0, 0, 0] == (1 + 8) | ((-1 + 8) << 4)  # k 0 low, k 4 high
    assert group[0, 3, 1] == (7 + 8) | (8 << 4)  # k 1
    assert group[1, 15, 0] == (-8 + 8) | (8 << 4)  # k 8 = group 1
    assert group[3, 2, 3] == 8 | ((3 + 8) << 4)  # k 31 = 8 * 3 + 4 + 3: high nibble
    assert np.count_nonzero(packed != 0x88) == 4


def test_codes_are_computed_with_the_float16_scale():
    # extreme 1.01: scale -0.12625 in float32, -0.1262207 (0xB00A) in float16; w = -0.441874 is code 3.5008
    # against the float16 scale (-> 4) and 3.49999 against the float32 one (-> 3): the codes follow the
    # scale the kernel multiplies by
    column = np.zeros(32, np.float32)
    column[0], column[1] = 1.01, -0.441874
    codes, scales = quantize_q4(column[:, None])
    assert scales.view(np.uint16)[0, 0] == 0xB00A
    assert codes[:2, 0].tolist() == [-8, 4]


def test_tiny_blocks_quantize_to_zero_and_huge_ones_are_refused():
    weight = np.zeros((64, 2), np.float32)
    weight[:32, 0] = 1e-8  # scale 1.25e-9: below float16's smallest subnormal
    weight[32:, 0] = 1e-4  # scale 1.25e-5: a float16 subnormal, kept
    weight[:, 1] = 0.5
    codes, scales = quantize_q4(weight)
    assert scales[0, 0] == 0 and not codes[:32, 0].any()
    assert scales[1, 0] != 0 and (codes[32:, 0] == -8).all()
    weight[0, 1] = 1e6
    with pytest.raises(ValueError, match=r"largest weight magnitude is 1e\+06; float16 scales hold at most 524032"):
        quantize_q4(weight)
    with pytest.raises(ValueError, match="pack_q4: scales are float32, expected float16"):
        pack_q4(codes, scales.astype(np.float32))


@given(k_blocks=st.integers(1, 6), n=st.integers(1, 70), seed=st.integers(0, 2**16))
@settings(max_examples=40, deadline=None)
def test_pack_unpack_round_trip(k_blocks, n, seed):
    rng = np.random.default_rng(seed)
    codes, scales = quantize_q4(rng.standard_normal((32 * k_blocks, n)).astype(np.float32))
    assert codes.min() >= -8 and codes.max() <= 7
    got_codes, got_scales = unpack_q4(*pack_q4(codes, scales), n)
    assert np.array_equal(got_codes, codes) and np.array_equal(got_scales, scales)


@pytest.mark.parametrize("k, n", [(32, 16), (96, 40), (896, 160), (4864, 48)])
def test_values_are_the_integer_product_of_the_quantized_numbers(k, n):
    rng = np.random.default_rng(k + n)
    weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    x = rng.standard_normal((5, k)).astype(np.float32)
    x[1] = 0.0  # an all-zero row: scale 0, output 0
    x[2, :32] = 0.0  # and an all-zero block
    codes, scales = quantize_q4(weight)
    y = session(k, n, weight).run(None, {"x": x})[0]
    sums, dx, want = reference(x, codes, scales)
    assert not y[1].any()
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    if k == 32:  # one block: y = fma(float(sum), scale * dx, 0), one rounding of exact float32 numbers
        exact = sums[:, 0, :].astype(np.float32) * (scales[0][None, :] * dx[:, :1])
        assert np.array_equal(y, exact)


@given(k_blocks=st.sampled_from([1, 3, 28]), n=st.sampled_from([16, 40, 160]), rows=st.integers(1, 64),
       threads=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_a_row_gets_the_same_bits_in_any_number_of_rows_and_threads(k_blocks, n, rows, threads, seed):
    rng = np.random.default_rng(seed)
    k = 32 * k_blocks
    weight = rng.standard_normal((k, n)).astype(np.float32)
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.01, 10)).astype(np.float32)
    many = session(k, n, weight, threads).run(None, {"x": x})[0]
    single = session(k, n, weight, 1)
    for r in sorted({0, rows // 2, rows - 1}):
        assert np.array_equal(single.run(None, {"x": x[r : r + 1]})[0][0], many[r]), r


# amx: 5, 7, 9 and 12 rows in one pass of the tile unit, 29 in passes of 16 and 13, 18 and 33 in
# passes of 16, then 2 and 1 rows on avx512vnni
@pytest.mark.parametrize("k, n, rows, size", [(64, 48, 7, 1.0), (896, 4864 // 8, 9, 1.0), (96, 40, 12, 1.0),
                                             (96, 40, 18, 1.0), (64, 48, 33, 1.0), (64, 48, 29, 1.0),
                                             (64, 48, 5, 1e-4)])  # 1e-4: float16 subnormal scales
def test_every_instruction_set_gives_the_same_bits(monkeypatch, k, n, rows, size):
    available = isas()
    assert "scalar" in available
    rng = np.random.default_rng(k)
    weight = (rng.standard_normal((k, n)) * size).astype(np.float32)
    if size < 1:
        assert (np.abs(quantize_q4(weight)[1]) < np.finfo(np.float16).tiny).any()
    x = rng.standard_normal((rows, k)).astype(np.float32)
    results = {}
    for isa in available:
        monkeypatch.setenv("SPECRT_KERNEL_ISA", isa)
        results[isa] = session(k, n, weight, 2).run(None, {"x": x})[0]
    for isa in available[1:]:
        assert np.array_equal(results[isa], results["scalar"]), f"{isa} differs from scalar"


def test_leading_dims_are_kept():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((64, 24)).astype(np.float32)
    packed, scales = pack_q4(*quantize_q4(weight))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s", 24])
    node = helper.make_node(kernels.MATMUL_Q4_OP, ["x", "packed", "scales"], ["y"], domain=kernels.DOMAIN, K=64, N=24)
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(packed, "packed"),
                                                                          numpy_helper.from_array(scales, "scales")]),
                              ir_version=10, opset_imports=[helper.make_opsetid("", 20),
                                                            helper.make_opsetid(kernels.DOMAIN, 1)])
    options = ort.SessionOptions()
    kernels.register(options, required=True)
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = rng.standard_normal((1, 3, 64)).astype(np.float32)
    got = sess.run(None, {"x": feed})[0]
    assert got.shape == (1, 3, 24)
    assert np.array_equal(got[0], session(64, 24, weight).run(None, {"x": feed[0]})[0])


def test_wrong_inputs_are_named_with_the_expected_shape():
    rng = np.random.default_rng(2)
    packed, scales = pack_q4(*quantize_q4(rng.standard_normal((64, 40)).astype(np.float32)))
    options = ort.SessionOptions()
    kernels.register(options, required=True)
    sess = ort.InferenceSession(q4_graph(64, 40, packed, scales, as_inputs=True), options,
                                providers=["CPUExecutionProvider"])
    x = rng.standard_normal((2, 64)).astype(np.float32)
    with pytest.raises(Exception, match=r"MatMulQ4: packed has shape \[3, 1, 256\], expected \[3, 2, 256\] "
                                        r"for K=64, N=40"):
        sess.run(None, {"x": x, "packed": packed[:, :1], "scales": scales})
    with pytest.raises(Exception, match=r"MatMulQ4: scales has shape \[3, 2, 8\], expected \[3, 2, 16\]"):
        sess.run(None, {"x": x, "packed": packed, "scales": scales[..., :8]})
    with pytest.raises(Exception, match=r"MatMulQ4: x has shape \[2, 32\], expected \[..., K\] with K=64"):
        sess.run(None, {"x": x[:, :32], "packed": packed, "scales": scales})
    with pytest.raises(Exception, match=r"MatMulQ4: K=48, N=40: expected K a positive multiple of 32"):
        ort.InferenceSession(q4_graph(48, 40, packed, scales), options, providers=["CPUExecutionProvider"])


def test_quantize_q4_refuses_a_k_that_is_not_whole_blocks():
    with pytest.raises(ValueError, match=r"weight of shape \(48, 8\): expected \[K, N\] with K a positive "
                                         r"multiple of 32"):
        quantize_q4(np.zeros((48, 8), np.float32))


def test_a_graph_with_float32_scales_is_refused_with_the_fix(tmp_path):
    from specrt.backend.session import make_session

    packed, scales = pack_q4(*quantize_q4(np.ones((64, 40), np.float32)))
    path = tmp_path / "decoder.onnx"
    path.write_bytes(q4_graph(64, 40, packed, scales.astype(np.float32)))
    with pytest.raises(kernels.KernelLibraryError, match=r"decoder.onnx: its MatMulQ4 nodes carry float32 scales, "
                                                         r"which this kernel library reads as float16 .* quantize "
                                                         r"the artifact again"):
        make_session(path, "cpu", 1)


@pytest.mark.parametrize("n, rows", [(16, 1), (40, 5), (160, 9)])  # 40: a partial last tile
def test_a_bias_is_one_float_addition_after_the_product(monkeypatch, n, rows):
    rng = np.random.default_rng(n)
    packed, scales = pack_q4(*quantize_q4(rng.standard_normal((96, n)).astype(np.float32)))
    bias = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((rows, 96)).astype(np.float32)
    options = ort.SessionOptions()
    kernels.register(options, required=True)
    for isa in isas():
        monkeypatch.setenv("SPECRT_KERNEL_ISA", isa)
        plain = ort.InferenceSession(q4_graph(96, n, packed, scales), options, providers=["CPUExecutionProvider"])
        biased = ort.InferenceSession(q4_graph(96, n, packed, scales, bias=bias), options,
                                      providers=["CPUExecutionProvider"])
        assert np.array_equal(biased.run(None, {"x": x})[0], plain.run(None, {"x": x})[0] + bias), isa


def test_a_bias_of_the_wrong_shape_is_named():
    rng = np.random.default_rng(3)
    packed, scales = pack_q4(*quantize_q4(rng.standard_normal((64, 40)).astype(np.float32)))
    options = ort.SessionOptions()
    kernels.register(options, required=True)
    sess = ort.InferenceSession(q4_graph(64, 40, packed, scales, as_inputs=True, bias=np.zeros(40, np.float32)),
                                options, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((2, 64)).astype(np.float32)
    with pytest.raises(Exception, match=r"MatMulQ4: bias has shape \[39\], expected \[40\]"):
        sess.run(None, {"x": x, "packed": packed, "scales": scales, "bias": np.zeros(39, np.float32)})
