"""SpecAttention (runtime/kernels) run by onnxruntime as a one-node graph: exact by construction.

Every row of a verify window, chain or tree, must equal the single step that decodes the same token
after the same path, bit for bit, whatever the cache length, window size, thread count and
instruction set; and the values must be attention's, within 1e-5 of a float64 numpy reference.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from specrt.backend import kernels
from specrt.backend.contract import MASK_VALUE

pytestmark = pytest.mark.skipif(kernels.library_path() is None, reason="specrt's kernel library is not built")

INPUTS = ("query", "key", "value", "past_key", "past_value", "cos", "sin", "bias")
CACHE_LENGTHS = (0, 1, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025)


def attention_graph(heads: int, kv: int, d: int, scale: float) -> bytes:
    """One SpecAttention node with the operator's inputs and outputs as the graph's; every dim is
    symbolic, so that the operator's own shape checks are what a wrong input meets."""
    def value(name: str, rank: int) -> helper.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [f"{name}{i}" for i in range(rank)])

    inputs = [value(name, rank) for name, rank in zip(INPUTS, (3, 3, 3, 4, 4, 3, 3, 4), strict=True)]
    outputs = [value("output", 3), value("present_key", 4), value("present_value", 4)]
    node = helper.make_node(kernels.ATTENTION_OP, INPUTS, [o.name for o in outputs], domain=kernels.DOMAIN,
                            num_heads=heads, kv_heads=kv, scale=scale)
    model = helper.make_model(helper.make_graph([node], "spec_attention", inputs, outputs), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(kernels.DOMAIN, 1)])
    return model.SerializeToString()


_SESSIONS: dict[tuple, ort.InferenceSession] = {}


def session(heads: int, kv: int, d: int, threads: int = 1) -> ort.InferenceSession:
    key = (heads, kv, d, threads)
    if key not in _SESSIONS:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        kernels.register(options, required=True)
        _SESSIONS[key] = ort.InferenceSession(attention_graph(heads, kv, d, d**-0.5), options,
                                              providers=["CPUExecutionProvider"])
    return _SESSIONS[key]


def rotary(positions: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [1, s, d] of the rotate-half form at ``positions``."""
    freqs = np.outer(positions, 1.0 / 10000 ** (np.arange(0, d, 2) / d))
    angles = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(angles).astype(np.float32)[None], np.sin(angles).astype(np.float32)[None]


def window_bias(past: int, parents: list[int]) -> np.ndarray:
    """[1, 1, s, past + s]: every row sees the past, its ancestors in the window and itself."""
    s = len(parents)
    bias = np.full((1, 1, s, past + s), MASK_VALUE, np.float32)
    bias[0, 0, :, :past] = 0.0
    for i in range(s):
        node = i
        while node >= 0:
            bias[0, 0, i, past + node] = 0.0
            node = parents[node]
    return bias


def depth(parents: list[int], i: int) -> int:
    return 0 if parents[i] < 0 else 1 + depth(parents, parents[i])


def ancestors(parents: list[int], i: int) -> list[int]:
    """Window rows on the path to row i, root first, i excluded."""
    path = []
    while parents[i] >= 0:
        i = parents[i]
        path.append(i)
    return path[::-1]


def random_pass(rng: np.random.Generator, heads: int, kv: int, d: int, past: int, parents: list[int]) -> dict:
    s = len(parents)
    positions = past + np.array([depth(parents, i) for i in range(s)])
    cos, sin = rotary(positions, d)
    return {
        "query": rng.standard_normal((1, s, heads * d), np.float32),
        "key": rng.standard_normal((1, s, kv * d), np.float32),
        "value": rng.standard_normal((1, s, kv * d), np.float32),
        "past_key": rng.standard_normal((1, past, kv, d), np.float32),
        "past_value": rng.standard_normal((1, past, kv, d), np.float32),
        "cos": cos, "sin": sin, "bias": window_bias(past, parents),
    }


def single_step(sess: ort.InferenceSession, feeds: dict, present_key, present_value, parents, i) -> np.ndarray:
    """Row i decoded alone: the cache holds the past and then row i's ancestors, in order."""
    path = ancestors(parents, i)
    past_key = np.concatenate([feeds["past_key"], present_key[:, path]], axis=1)
    past_value = np.concatenate([feeds["past_value"], present_value[:, path]], axis=1)
    one = {name: feeds[name][:, i:i + 1] for name in ("query", "key", "value", "cos", "sin")}
    bias = np.zeros((1, 1, 1, past_key.shape[1] + 1), np.float32)
    out, _, _ = sess.run(None, {**one, "past_key": past_key, "past_value": past_value, "bias": bias})
    return out[0, 0]


def reference(feeds: dict, heads: int, kv: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(output [s, heads * d], present_key [s, kv, d]) in float64."""
    s = feeds["query"].shape[1]
    cos, sin = feeds["cos"][0].astype(np.float64)[:, None], feeds["sin"][0].astype(np.float64)[:, None]

    def rotate(x):
        return x * cos + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1) * sin

    q = rotate(feeds["query"][0].reshape(s, heads, d).astype(np.float64))
    k_new = rotate(feeds["key"][0].reshape(s, kv, d).astype(np.float64))
    keys = np.concatenate([feeds["past_key"][0], k_new])
    values = np.concatenate([feeds["past_value"][0], feeds["value"][0].reshape(s, kv, d)]).astype(np.float64)
    out = np.zeros((s, heads, d))
    for i in range(s):
        visible = feeds["bias"][0, 0, i] > -1e30
        for h in range(heads):
            g = h // (heads // kv)
            scores = keys[visible, g] @ q[i, h] * d**-0.5
            w = np.exp(scores - scores.max())
            out[i, h] = w @ values[visible, g] / w.sum()
    return out.reshape(s, heads * d), k_new


def random_parents(rng: np.random.Generator, s: int, chain: bool) -> list[int]:
    return [i - 1 for i in range(s)] if chain else [-1] + [int(rng.integers(-1, i)) for i in range(1, s)]


@settings(max_examples=30, deadline=None)
@given(
    kv=st.sampled_from([1, 2, 3]),
    group=st.sampled_from([1, 2, 7, 9]),  # 7 and 9: more heads than a unit's value pass takes at once
    d=st.sampled_from([16, 32, 64, 128]),
    past=st.sampled_from(CACHE_LENGTHS),
    s=st.integers(1, 64),
    chain=st.booleans(),
    threads=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**31),
)
def test_window_rows_equal_single_steps_and_attention(kv, group, d, past, s, chain, threads, seed):
    heads = kv * group
    rng = np.random.default_rng(seed)
    parents = random_parents(rng, s, chain)
    feeds = random_pass(rng, heads, kv, d, past, parents)
    window = session(heads, kv, d, threads)
    out, present_key, present_value = window.run(None, feeds)
    want, want_key = reference(feeds, heads, kv, d)
    np.testing.assert_allclose(out[0], want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(present_key[0], want_key, atol=1e-5, rtol=0)
    assert np.array_equal(present_value[0], feeds["value"][0].reshape(s, kv, d))
    step = session(heads, kv, d, 1)
    for i in range(s):  # bit for bit, against single steps on one thread
        got = single_step(step, feeds, present_key, present_value, parents, i)
        assert np.array_equal(got, out[0, i]), f"row {i} (parents {parents}) differs from its single step"


def test_a_tree_row_equals_the_chain_row_on_its_path():
    #   past 300 | root r0 ─ a1 ─ b3          chain: r0 ─ a1 ─ b (the same tokens at slots 0, 1, 2)
    #            |    └──── x2
    rng = np.random.default_rng(7)
    heads, kv, d, past = 14, 2, 64, 300
    tree = random_pass(rng, heads, kv, d, past, [-1, 0, 0, 1])
    chain_rows = [0, 1, 3]
    chain = {name: tree[name][:, chain_rows] for name in ("query", "key", "value", "cos", "sin")}
    chain.update(past_key=tree["past_key"], past_value=tree["past_value"], bias=window_bias(past, [-1, 0, 1]))
    sess = session(heads, kv, d, 2)
    tree_out = sess.run(None, tree)[0][0]
    chain_out = sess.run(None, chain)[0][0]
    assert np.array_equal(tree_out[chain_rows], chain_out)
    assert not np.array_equal(tree_out[2], chain_out[2])  # x2 is another token: another row


def isas() -> list[str]:
    """The instruction sets this CPU can run the kernels with, scalar first."""
    have = []
    for isa in ("scalar", "avx2", "avxvnni", "avx512", "avx512vnni", "amx"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SPECRT_KERNEL_ISA", isa)
            if kernels.describe()["isa"] == isa:
                have.append(isa)
    return have


# (heads, kv heads, head dim): groups of 4, 7 and 9 query heads and 16 split in two tasks, against the
# units' value passes of 2, 6 and 8 heads; head dims that leave a rest after passes of 32 or 64 lanes
@pytest.mark.parametrize("heads, kv, d", [(8, 2, 128), (14, 2, 64), (18, 2, 48), (16, 1, 80)])
@pytest.mark.parametrize("past", [0, 129, 1025])
def test_every_instruction_set_gives_the_same_bits(monkeypatch, past, heads, kv, d):
    available = isas()
    assert "scalar" in available
    rng = np.random.default_rng(past)
    feeds = random_pass(rng, heads, kv, d, past, random_parents(rng, 9, chain=False))
    results = {}
    for isa in available:
        monkeypatch.setenv("SPECRT_KERNEL_ISA", isa)
        options = ort.SessionOptions()
        kernels.register(options, required=True)
        sess = ort.InferenceSession(attention_graph(heads, kv, d, d**-0.5), options, providers=["CPUExecutionProvider"])
        results[isa] = sess.run(None, feeds)
    for isa in available[1:]:
        for got, want in zip(results[isa], results["scalar"], strict=True):
            assert np.array_equal(got, want), f"{isa} differs from scalar"


def test_an_unknown_instruction_set_is_refused(monkeypatch):
    monkeypatch.setenv("SPECRT_KERNEL_ISA", "sse9")
    options = ort.SessionOptions()
    kernels.register(options, required=True)
    expected = "SPECRT_KERNEL_ISA=sse9: expected scalar, avx2, avxvnni, avx512, avx512vnni or amx"
    with pytest.raises(Exception, match=expected):
        ort.InferenceSession(attention_graph(2, 1, 16, 0.25), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name, shape, message", [
    ("bias", (1, 1, 2, 5), r"bias has shape \[1, 1, 2, 5\], expected \[1, 1, 2, 6\]"),
    ("key", (1, 2, 48), r"key has shape \[1, 2, 48\], expected \[1, 2, 32\]"),
    ("cos", (1, 2, 8), r"cos has shape \[1, 2, 8\], expected \[1, 2, 16\]"),
])
def test_inputs_of_the_wrong_shape_are_named(name, shape, message):
    rng = np.random.default_rng(0)
    feeds = random_pass(rng, 4, 2, 16, 4, [-1, 0])
    feeds[name] = np.zeros(shape, np.float32)
    with pytest.raises(Exception, match=message):
        session(4, 2, 16).run(None, feeds)


def test_a_head_dim_the_kernel_does_not_take_is_refused():
    rng = np.random.default_rng(0)
    feeds = random_pass(rng, 2, 1, 16, 3, [-1])
    feeds["query"] = np.zeros((1, 1, 2 * 24), np.float32)  # head_dim 24
    with pytest.raises(Exception, match="head_dim 24 is not a multiple of 16"):
        session(2, 1, 16).run(None, feeds)


def test_a_missing_library_is_named_with_its_fix(monkeypatch, tmp_path):
    path = tmp_path / "attention.onnx"
    path.write_bytes(attention_graph(2, 1, 16, 0.25))
    monkeypatch.setattr(kernels, "library_path", lambda: None)
    from specrt.backend.session import make_session

    with pytest.raises(kernels.KernelLibraryError, match=r"uses specrt's ai.specrt operators: specrt's kernel library "
                       r"is not installed: reinstall specrt with its kernel library: `bash runtime/kernels/"
                       r"fetch_ort_headers.sh && pip install .`"):
        make_session(path, "cpu", 1)


def test_a_library_newer_than_onnxruntime_is_refused_with_its_fix(monkeypatch):
    monkeypatch.setattr(kernels, "onnxruntime_api_version", lambda: 20)
    with pytest.raises(kernels.KernelLibraryError, match=r"built against onnxruntime C API 21, but onnxruntime "
                       r".* serves up to 20: `pip install 'onnxruntime>=1.21'`"):
        kernels.register(ort.SessionOptions(), required=True)


def packed_graph(heads: int, kv: int, d: int, scale: float) -> bytes:
    """SpecAttention with key and value absent: each query row holds [q | k | v]."""
    model = onnx.load_from_string(attention_graph(heads, kv, d, scale))
    node = model.graph.node[0]
    node.input[1], node.input[2] = "", ""
    keep = [i for i in model.graph.input if i.name not in ("key", "value")]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    return model.SerializeToString()


def test_packed_query_rows_give_the_bits_of_separate_inputs():
    rng = np.random.default_rng(3)
    heads, kv, d = 14, 2, 64
    feeds = random_pass(rng, heads, kv, d, 130, [-1, 0, 0, 2, 3])
    options = ort.SessionOptions()
    kernels.register(options, required=True)
    packed = ort.InferenceSession(packed_graph(heads, kv, d, d**-0.5), options, providers=["CPUExecutionProvider"])
    rows = np.concatenate([feeds["query"], feeds["key"], feeds["value"]], axis=-1)  # [1, s, (heads + 2 kv) d]
    got = packed.run(None, {**{k: v for k, v in feeds.items() if k not in ("key", "value")}, "query": rows})
    want = session(heads, kv, d, 2).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)


def swiglu_session(threads: int = 1) -> ort.InferenceSession:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["r", "s", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["r", "s", "n"])
    node = helper.make_node(kernels.SWIGLU_OP, ["x"], ["y"], domain=kernels.DOMAIN)
    model = helper.make_model(helper.make_graph([node], "swiglu", [x], [y]), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(kernels.DOMAIN, 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    kernels.register(options, required=True)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("threads", [1, 2])
def test_swiglu_is_silu_of_the_gate_times_up_row_by_row(threads):
    rng = np.random.default_rng(threads)
    x = (rng.standard_normal((1, 9, 2 * 48)) * 6).astype(np.float32)
    x[0, 0, :4] = [0.0, -0.0, 90.0, -90.0]  # both zeros, and gates whose exp(-|g|) flushes to 0
    y = swiglu_session(threads).run(None, {"x": x})[0]
    g, u = x[..., :48].astype(np.float64), x[..., 48:].astype(np.float64)
    np.testing.assert_allclose(y, g / (1 + np.exp(-g)) * u, rtol=1e-6, atol=1e-6)
    one = swiglu_session(1)
    for i in range(9):  # a row alone gives the bits it gets among the others
        assert np.array_equal(one.run(None, {"x": x[:, i:i + 1]})[0][0, 0], y[0, i])


def test_swiglu_gives_the_same_bits_on_every_instruction_set(monkeypatch):
    x = (np.random.default_rng(5).standard_normal((1, 3, 2 * 64)) * 4).astype(np.float32)
    results = {}
    for isa in isas():
        monkeypatch.setenv("SPECRT_KERNEL_ISA", isa)
        results[isa] = swiglu_session().run(None, {"x": x})[0]
    for isa, got in results.items():
        assert np.array_equal(got, results["scalar"]), f"{isa} differs from scalar"


def test_swiglu_refuses_halves_that_are_not_multiples_of_16():
    with pytest.raises(Exception, match=r"SwiGLU: x has shape \[1, 2, 40\], expected a last dimension 2 \* inner"):
        swiglu_session().run(None, {"x": np.zeros((1, 2, 40), np.float32)})
