"""The device-resident KV cache (issue 7): the CUDA code path, run on the CPU EP where no GPU is.

``device_cache=True`` on provider "cpu" keeps the cache in onnxruntime memory and compacts it
with the Gather graph, exactly as on "cuda"; it must match the host (numpy) cache bit for bit.
The tests parametrized over providers run again on "cuda" where onnxruntime-gpu finds a GPU.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import specrt
from specrt import InvalidRequestError
from specrt.backend import session as backend
from specrt.backend.gather import Block, RowGather, gather_graph
from specrt.backend.kvstore import DeviceKV, HostKV
from specrt.backend.prefill import prefill
from specrt.backend.session import OrtDecoder
from specrt.backend.window import causal_bias, flatten
from specrt.cli import main as cli_main
from specrt.tree import DraftTree
from tests.helpers import PROMPTS

CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDAExecutionProvider not available in this onnxruntime build")
PROVIDERS = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=needs_cuda)]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(portable_artifact):
    # the portable export: the CUDA provider cannot run SpecAttention, specrt's CPU kernel
    return portable_artifact[0]


@pytest.fixture(scope="module")
def host_model(folder):
    return specrt.load(folder)


@pytest.fixture(scope="module", params=PROVIDERS)
def device_model(request, folder):
    """The model with its KV caches in onnxruntime memory on ``provider``'s device."""
    return specrt.load(folder, provider=request.param, device_cache=True)


def decoders(folder, provider="cpu"):
    manifest = specrt.load(folder).manifest
    host = OrtDecoder(folder / manifest.decoder, manifest.dims)
    device = OrtDecoder(folder / manifest.decoder, manifest.dims, provider=provider, device_cache=True)
    return host, device


def test_the_spec_attention_graph_runs_the_device_code_path_on_the_cpu(tiny_artifact):
    host = specrt.load(tiny_artifact[0])
    device = specrt.load(tiny_artifact[0], device_cache=True)
    assert host.graph.attention == device.graph.attention == "specrt"
    for prompt in PROMPTS[:3]:
        want = host.generate(prompt, method="pld", tree=True, max_new_tokens=24)
        assert device.generate(prompt, method="pld", tree=True, max_new_tokens=24).token_ids == want.token_ids


# ---------------------------------------------------------------------------------------------
# the Gather graph, built without the onnx package


@pytest.mark.parametrize("n", [1, 2, 5])
def test_gather_graph_bytes_equal_what_onnx_helper_builds(n):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Gather", [f"x.{i}", "indices"], [f"y.{i}"], name=f"/gather/{i}", axis=1)
             for i in range(n)]
    inputs = [helper.make_tensor_value_info(f"x.{i}", TensorProto.FLOAT, [None] * 3) for i in range(n)]
    inputs.append(helper.make_tensor_value_info("indices", TensorProto.INT64, [None]))
    outputs = [helper.make_tensor_value_info(f"y.{i}", TensorProto.FLOAT, [None] * 3) for i in range(n)]
    graph = helper.make_graph(nodes, f"specrt_gather_{n}", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8,
                              producer_name="specrt")
    assert gather_graph(n) == model.SerializeToString()
    onnx.checker.check_model(onnx.load_from_string(gather_graph(n)), full_check=True)


def test_row_gather_copies_rows_between_blocks():
    src = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)  # two [6 rows, width 3] blocks
    dst = np.zeros((2, 3, 3), np.float32)
    keep = np.array([1, 4, 5])
    RowGather("CPUExecutionProvider").run(
        [Block("cpu", src[i].ctypes.data, 6, 3) for i in range(2)], keep,
        [Block("cpu", dst[i].ctypes.data, 3, 3) for i in range(2)],
    )
    assert np.array_equal(dst, src[:, keep])


def test_row_gather_refuses_a_target_of_the_wrong_size():
    src, dst = np.zeros((4, 3), np.float32), np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"target \[2, 3\] cannot hold 3 rows of a \[4, 3\] source"):
        RowGather("CPUExecutionProvider").run([Block("cpu", src.ctypes.data, 4, 3)], np.array([0, 1, 2]),
                                              [Block("cpu", dst.ctypes.data, 2, 3)])


def test_device_store_compacts_like_numpy_fancy_indexing():
    # rows written through the store's own pointers: 3 buffers of 10 rows, [2 heads, 2 dims]
    device = DeviceKV(3, 2, 2, "cpu", RowGather("CPUExecutionProvider"))
    host = HostKV(3, 2, 2)
    rng = np.random.default_rng(0)
    for store in (device, host):
        store.allocate(10)
    values = rng.standard_normal((3, 10, 2, 2)).astype(np.float32)
    for store in (device, host):
        for b in range(3):
            view = np.ctypeslib.as_array((ctypes.c_float * 40).from_address(store.ptr(b, 0)))  # [10 rows * 4]
            view[:] = values[b].reshape(-1)
    for past, keep in [(2, [0, 1, 2]), (2, [0, 3, 5]), (1, [2, 4]), (0, [0, 1, 4, 6, 9]), (3, [])]:
        keep = np.array(keep, np.int64)
        expected = values.copy()
        expected[:, past : past + len(keep)] = values[:, past + keep]
        for store in (device, host):
            store.compact(past, keep)
            got = store.to_numpy()
            assert np.array_equal(got[:, : past + len(keep)], expected[:, : past + len(keep)]), (past, keep)
            if len(keep):
                assert np.array_equal(got[:, past + keep[-1] + 1 :], values[:, past + keep[-1] + 1 :])
        assert np.array_equal(device.to_numpy(), host.to_numpy())
        values = host.to_numpy()


# ---------------------------------------------------------------------------------------------
# the decoder on a device cache


@pytest.mark.parametrize("provider", PROVIDERS)
def test_commit_and_truncate_keep_exactly_the_right_rows(folder, provider):
    host, device = decoders(folder, provider)  # host: the numpy cache on the CPU EP, the reference on "cpu"
    rng = np.random.default_rng(1)
    ids = rng.integers(0, host.dims.vocab, 12)
    for d in (host, device):
        d.reset(64)
        for _ in prefill(d, ids, 5):
            pass
    for step in range(8):
        tree = DraftTree(token_ids=rng.integers(0, host.dims.vocab, 6), parents=np.array([-1, 0, -1, 2, 1, 3]))
        window = flatten(int(rng.integers(0, host.dims.vocab)), tree, device.past)
        past = device.past
        for d in (host, device):
            d.forward(window.input_ids, window.position_ids, window.attention_bias)
        before = device.store.to_numpy()  # [2 * layers, capacity, kv_heads, head_dim]
        keep = np.sort(rng.choice(np.arange(1, 7), int(rng.integers(0, 4)), replace=False))
        keep = np.concatenate([[0], keep]).astype(np.int64)
        for d in (host, device):
            d.commit(keep)
        after = device.store.to_numpy()
        assert device.past == host.past == past + len(keep)
        assert np.array_equal(after[:, :past], before[:, :past]), "the past moved"
        assert np.array_equal(after[:, past : device.past], before[:, past + keep]), keep
        if provider == "cpu":
            assert np.array_equal(after[:, : device.past], host.store.to_numpy()[:, : host.past])
        if step % 3 == 2:  # roll back: the next window overwrites what came after
            for d in (host, device):
                d.truncate(d.past - 2)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_only_the_rows_asked_for_come_back(folder, provider):
    host, device = decoders(folder, provider)
    same = np.testing.assert_array_equal if provider == "cpu" else _close  # a GPU may sum in another order
    ids = np.arange(20, dtype=np.int64) % host.dims.vocab
    outs = {}
    for name, d in (("host", host), ("device", device)):
        d.reset(32)
        full = d.forward(ids, np.arange(20), causal_bias(0, 20))
        d.truncate(0)
        last = d.forward(ids, np.arange(20), causal_bias(0, 20), logits_rows=slice(19, 20))
        d.truncate(0)
        none = d.forward(ids, np.arange(20), causal_bias(0, 20), logits_rows=slice(0, 0))
        d.truncate(0)
        some = d.forward(ids, np.arange(20), causal_bias(0, 20), logits_rows=slice(3, 12, 4))
        assert last.logits.shape == (1, host.dims.vocab) and none.logits.shape == (0, host.dims.vocab)
        same(last.logits, full.logits[-1:])
        same(some.logits, full.logits[3:12:4])
        same(none.hidden_states, full.hidden_states)  # hidden states: always every row
        outs[name] = full
    if provider == "cpu":  # the same kernels: the same bits
        same(outs["host"].logits, outs["device"].logits)
        same(outs["host"].hidden_states, outs["device"].hidden_states)


def _close(got, expected):
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_the_loop_fetches_one_prefill_logits_row(device_model, monkeypatch):
    rows = []
    forward = OrtDecoder.forward

    def spy(self, input_ids, *args, **kwargs):
        out = forward(self, input_ids, *args, **kwargs)
        rows.append((len(input_ids), len(out.logits)))
        return out

    monkeypatch.setattr(OrtDecoder, "forward", spy)
    ids = device_model.encode(" ".join(PROMPTS))  # > 100 tokens: 7+ prefill chunks of 16
    device_model.generate_ids(ids, method="pld", tree=True, max_new_tokens=8, prefill_chunk=16)
    chunks = -(-len(ids) // 16)
    assert [r for _, r in rows[:chunks]] == [0] * (chunks - 1) + [1]
    assert all(r == s for s, r in rows[chunks:])  # verify windows: a row per node, for the tree walk


# ---------------------------------------------------------------------------------------------
# lossless on the device cache: CPU EP always, CUDA EP where there is one


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("method", ["pld", "suffix_decoding"])
def test_speculative_output_is_bit_exact_with_baseline(device_model, host_model, method, tree):
    on_cpu = device_model.graph.provider == "cpu"
    for prompt in PROMPTS:
        base = device_model.generate(prompt, method="baseline", max_new_tokens=40)
        # backoff=False: the same drafts verified on both caches (the back-off decides from timings)
        spec = device_model.generate(prompt, method=method, tree=tree, max_new_tokens=40, draft_budget=6,
                                     backoff=False)
        assert spec.token_ids == base.token_ids, prompt
        assert spec.finish_reason == base.finish_reason
        if on_cpu:  # the same kernels as the host cache: the same tokens, the same acceptance
            host = host_model.generate(prompt, method=method, tree=tree, max_new_tokens=40, draft_budget=6,
                                       backoff=False)
            assert host.token_ids == spec.token_ids and host.stats["accepted"] == spec.stats["accepted"]
            assert host_model.generate(prompt, method="baseline", max_new_tokens=40).token_ids == base.token_ids


def test_long_prompt_prefilled_in_chunks_matches(device_model):
    ids = device_model.encode(" ".join(PROMPTS))
    base, _ = device_model.generate_ids(ids, method="baseline", max_new_tokens=20, prefill_chunk=16)
    spec, _ = device_model.generate_ids(ids, method="pld", tree=True, max_new_tokens=20, prefill_chunk=32)
    assert spec.tolist() == base.tolist()


def test_cache_is_reused_across_requests(device_model):
    # a released cache is lent to the next request: grown once, then reused with stale rows behind
    first = device_model.generate(PROMPTS[0] * 3, method="pld", tree=True, max_new_tokens=30)
    device_model.generate(PROMPTS[1], method="pld", max_new_tokens=10)
    again = device_model.generate(PROMPTS[0] * 3, method="pld", tree=True, max_new_tokens=30)
    assert again.token_ids == first.token_ids


# ---------------------------------------------------------------------------------------------
# provider errors


@pytest.mark.skipif(CUDA, reason="this onnxruntime build has the CUDAExecutionProvider")
def test_cuda_on_a_cpu_only_build_says_what_to_install(folder):
    with pytest.raises(InvalidRequestError, match=r"provider 'cuda': the CUDAExecutionProvider is not in this "
                       r"onnxruntime build .*install the extra specrt\[cuda\] \(onnxruntime-gpu\) instead of "
                       r"onnxruntime: the CPU and GPU packages must not be installed together"):
        specrt.load(folder, provider="cuda")


@pytest.mark.skipif(CUDA, reason="this onnxruntime build has the CUDAExecutionProvider")
def test_cli_reports_the_missing_cuda_provider(folder, capsys):
    assert cli_main(["generate", "--model", str(folder), "--provider", "cuda", "x"]) == 2
    assert "specrt[cuda]" in capsys.readouterr().err


def test_unknown_provider_lists_the_valid_ones(folder):
    with pytest.raises(InvalidRequestError, match=r"provider 'tpu' is not supported; choose one of \['cpu', 'cuda'\]"):
        specrt.load(folder, provider="tpu")


@pytest.mark.skipif(CUDA, reason="this onnxruntime build has the CUDAExecutionProvider")
@pytest.mark.filterwarnings("ignore:Specified provider")
def test_a_provider_that_falls_back_to_the_cpu_is_refused(folder, monkeypatch):
    # onnxruntime-gpu without loadable CUDA libraries runs on the CPU instead, with a mere warning
    available = ort.get_available_providers()
    monkeypatch.setattr(backend.ort, "get_available_providers", lambda: [*available, "CUDAExecutionProvider"])
    with pytest.raises(InvalidRequestError, match=r"could not start the CUDAExecutionProvider and fell back to "
                       r"\['CPUExecutionProvider'\]"):
        specrt.load(folder, provider="cuda")


def test_device_cache_must_be_a_bool(folder):
    with pytest.raises(InvalidRequestError, match="device_cache must be a bool or None, got str"):
        specrt.load(folder, device_cache="yes")


def test_device_path_leaves_onnx_and_torch_unloaded(folder):
    script = (
        "import json, sys, specrt\n"
        "m = specrt.load(sys.argv[1], device_cache=True)\n"
        "r = m.generate('def add(', max_new_tokens=8, method='pld', tree=True)\n"
        "print(json.dumps({'heavy': sorted(k for k in ('torch', 'transformers', 'onnx') if k in sys.modules),"
        " 'tokens': len(r.token_ids)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"heavy": [], "tokens": report["tokens"]} and report["tokens"] > 0


def test_gpu_check_script_parses():
    subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_check.sh")], check=True)
