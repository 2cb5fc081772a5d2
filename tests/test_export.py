"""Export tier: the ONNX decoder matches torch (tolerance 1e-3 on logits, fp32), chain and tree."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.lib.decoder_graph import sliding_bias
from pipeline.lib.parity import torch_logits
from specrt.backend import contract, verdict
from specrt.backend.manifest import read_manifest
from specrt.backend.prefill import prefill
from specrt.backend.session import OrtDecoder
from specrt.backend.window import causal_bias, flatten
from specrt.tree import DraftTree
from tests.helpers import GEMMA_WINDOW

TOLERANCE = 1e-3


def test_manifest_records_parity_and_contract(tiny_artifact):
    folder, model = tiny_artifact
    manifest = read_manifest(folder)
    parity = manifest.checks["parity"]
    assert parity["ok"] and parity["chain"]["max_abs_diff"] <= TOLERANCE and parity["tree"]["max_abs_diff"] <= TOLERANCE
    assert manifest.dims.num_layers == model.config.num_hidden_layers
    names = [t["name"] for t in manifest.io["inputs"]]
    assert names[:3] == [contract.INPUT_IDS, contract.POSITION_IDS, contract.ATTENTION_BIAS]
    assert set(manifest.files) == {"decoder.onnx", "decoder.onnx.data", "tokenizer.json"}
    assert manifest.eos_token_ids == (model.config.eos_token_id,)
    assert {"torch", "transformers", "onnxruntime"} <= set(manifest.producers)
    gate = manifest.checks["gate"]
    assert gate["basis"]["exactness"] == "measured" and verdict.covers(gate["basis"], "cpu")  # measured here


def test_tree_nodes_equal_sequential_decoding_of_their_paths(tiny_artifact):
    #            root
    #          /   |   \
    #        n0    n1   n2
    #       /  \         |
    #     n3    n4       n5
    #     |
    #     n6
    folder, model = tiny_artifact
    manifest = read_manifest(folder)
    decoder = OrtDecoder(folder / manifest.decoder, manifest.dims)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, manifest.dims.vocab, 20)  # longer than Gemma's window of 8
    tree = DraftTree(rng.integers(0, manifest.dims.vocab, 7), np.array([-1, -1, -1, 0, 0, 2, 3]))
    decoder.reset(64)
    for _ in prefill(decoder, prompt[:-1], chunk=6):
        pass
    window = flatten(int(prompt[-1]), tree, decoder.past)
    got = decoder.forward(window.input_ids, window.position_ids, window.attention_bias).logits
    for slot in range(len(window.input_ids)):
        path, node = [], slot - 1
        while node >= 0:
            path.insert(0, int(tree.token_ids[node]))
            node = int(tree.parents[node])
        want = torch_logits(model, np.concatenate([prompt, path]))[-1]
        np.testing.assert_allclose(got[slot], want, atol=TOLERANCE, err_msg=f"slot {slot} path {path}")


def test_present_holds_only_new_positions_and_commit_keeps_accepted_path(tiny_artifact):
    folder, model = tiny_artifact
    manifest = read_manifest(folder)
    decoder = OrtDecoder(folder / manifest.decoder, manifest.dims)
    ids = np.random.default_rng(2).integers(0, manifest.dims.vocab, 16)
    decoder.reset(32)
    for _ in prefill(decoder, ids[:10], chunk=4):
        pass
    # chain of 4 new tokens, keep root + first 2 (slots 0..2), then decode the next token alone
    window = flatten(int(ids[10]), DraftTree.chain(ids[11:14]), decoder.past)
    decoder.forward(window.input_ids, window.position_ids, window.attention_bias)
    decoder.commit(np.array([0, 1, 2]))
    assert decoder.past == 13
    step = flatten(int(ids[13]), DraftTree.empty(), decoder.past)
    got = decoder.forward(step.input_ids, step.position_ids, step.attention_bias).logits[0]
    np.testing.assert_allclose(got, torch_logits(model, ids[:14])[-1], atol=TOLERANCE)


def test_the_graph_computes_the_logits_of_the_rows_it_is_asked_for(tiny_artifact):
    folder, model = tiny_artifact
    manifest = read_manifest(folder)
    assert contract.LOGITS_INDEX in [t["name"] for t in manifest.io["inputs"]]
    decoder = OrtDecoder(folder / manifest.decoder, manifest.dims)
    assert decoder.graph.logits_index
    ids = np.random.default_rng(3).integers(0, manifest.dims.vocab, 6)
    want = torch_logits(model, ids)  # [6, vocab]
    got = {}
    for rows in (None, slice(5, 6), slice(1, 3), slice(0, 0)):
        decoder.reset(8)
        # the binding holds len(rows) logits rows: a graph that computed all six would not fit it
        got[str(rows)] = decoder.forward(ids, np.arange(6), causal_bias(0, 6), logits_rows=rows).logits
    assert got["None"].shape == (6, manifest.dims.vocab) and got[str(slice(0, 0))].shape == (0, manifest.dims.vocab)
    np.testing.assert_allclose(got["None"], want, atol=TOLERANCE)
    np.testing.assert_allclose(got[str(slice(5, 6))], want[5:6], atol=TOLERANCE)
    np.testing.assert_allclose(got[str(slice(1, 3))], want[1:3], atol=TOLERANCE)


def test_a_graph_without_logits_index_still_gives_the_rows_asked_for(tiny_artifact, tmp_path):
    """Artifacts exported before the input: every row's logits computed, the rows asked for returned."""
    import onnx

    folder, model = tiny_artifact
    manifest = read_manifest(folder)
    graph = onnx.load(str(folder / manifest.decoder))  # with its external weights
    (gather,) = [node for node in graph.graph.node if node.op_type == "Gather" and contract.LOGITS_INDEX in node.input]
    for node in graph.graph.node:  # the lm_head reads the hidden rows again, as before the input
        node.input[:] = [gather.input[0] if name == gather.output[0] else name for name in node.input]
    graph.graph.node.remove(gather)
    (index,) = [i for i in graph.graph.input if i.name == contract.LOGITS_INDEX]
    graph.graph.input.remove(index)
    onnx.save(graph, str(tmp_path / "decoder.onnx"), save_as_external_data=True, location="decoder.onnx.data")
    decoder = OrtDecoder(tmp_path / "decoder.onnx", manifest.dims)
    assert not decoder.graph.logits_index
    ids = np.random.default_rng(4).integers(0, manifest.dims.vocab, 6)
    decoder.reset(8)
    last = decoder.forward(ids, np.arange(6), causal_bias(0, 6), logits_rows=slice(5, 6)).logits
    assert last.shape == (1, manifest.dims.vocab)
    np.testing.assert_allclose(last, torch_logits(model, ids)[5:6], atol=TOLERANCE)


def test_sliding_bias_masks_keys_a_window_behind():
    # past = 3 cached positions (0, 1, 2); queries at positions 3 and 4; window 2
    bias = torch.zeros(1, 1, 2, 5)
    out = sliding_bias(bias, torch.tensor([[3, 4]]), window=2)[0, 0]
    m = contract.MASK_VALUE
    assert out.tolist() == [[m, m, 0.0, 0.0, 0.0], [m, m, m, 0.0, 0.0]]


def test_gemma_sliding_window_matters_on_long_prompts(tmp_path):
    """Negative check: the same export with the sliding rule dropped differs from torch, so the
    parity check above can fail."""
    from pipeline.lib import decoder_graph
    from tests.tiny import build_tiny_artifact

    original = decoder_graph.sliding_bias
    decoder_graph.sliding_bias = lambda bias, pos, window: bias  # every layer sees everything
    try:
        with pytest.raises(Exception, match="differ from torch"):
            build_tiny_artifact("gemma3", tmp_path / "fp32")
    finally:
        decoder_graph.sliding_bias = original
    report = json.loads((tmp_path / "fp32" / "parity_failed.json").read_text())
    assert report["chain"]["max_abs_diff"] > TOLERANCE
    assert 40 > GEMMA_WINDOW  # the parity prompt (40 tokens) is longer than the window


def _grouped_case(heads: int, kv: int, s: int = 5, past: int = 7, d: int = 8):
    torch.manual_seed(0)
    query = torch.randn(1, heads, s, d)
    key, value = torch.randn(1, kv, past + s, d), torch.randn(1, kv, past + s, d)
    tree = DraftTree(np.array([11, 12, 13, 14], np.int64), np.array([-1, -1, 0, 0], np.int64))  # root + 4 nodes
    bias = torch.from_numpy(flatten(10, tree, past).attention_bias).reshape(1, 1, s, past + s)
    return query, key, value, bias


@pytest.mark.parametrize("heads, kv", [(6, 2), (4, 4), (4, 1)])
def test_grouped_attention_equals_eager_attention_on_a_tree_mask(heads, kv):
    from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward

    from pipeline.lib.grouped_attention import grouped_attention

    query, key, value, bias = _grouped_case(heads=heads, kv=kv)
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = heads // kv, False
    want, _ = eager_attention_forward(module, query, key, value, bias, scaling=0.35)
    got, _ = grouped_attention(module, query, key, value, bias, scaling=0.35)
    assert got.shape == want.shape == (1, 5, heads, 8)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("heads, kv, message", [(1, 1, "needs >= 2 query heads"), (6, 4, "do not group")])
def test_grouped_attention_refuses_layouts_it_cannot_keep_batch_invariant(heads, kv, message):
    from pipeline.lib.grouped_attention import grouped_attention

    query, key, value, bias = _grouped_case(heads, kv)
    with pytest.raises(ValueError, match=message):
        grouped_attention(torch.nn.Module(), query, key, value, bias, scaling=1.0)


def test_spec_attention_export_refuses_a_head_dim_the_kernel_does_not_take(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from pipeline.lib.decoder_graph import export_onnx, model_dims

    config = Qwen2Config(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)  # head_dim 12
    model = Qwen2ForCausalLM(config).eval()
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn: head_dim 12 is not a multiple of 16 up to "
                       r"1024, which SpecAttention requires; export with export.attention: portable"):
        export_onnx(model, model_dims(model, 64), tmp_path / "decoder.onnx", 20)
    assert not (tmp_path / "decoder.onnx").exists()


def test_spec_attention_in_torch_equals_the_models_own_attention(tiny_artifact):
    # the patched forward (pipeline.lib.spec_attention) computes what the HF module computes
    from pipeline.lib.decoder_graph import DecoderForExport, example_inputs, model_dims
    from pipeline.lib.spec_attention import spec_attention_of

    _, model = tiny_artifact
    inputs = example_inputs(model_dims(model, 64), s=4, past=6)
    wrapper = DecoderForExport(model).eval()
    with torch.no_grad():
        want = wrapper(*inputs)
        with spec_attention_of(model):
            got = wrapper(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)



def test_export_skips_the_gate_where_its_section_leaves_fp32_out(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from pipeline.export import build_artifact, main
    from tests.helpers import EOS
    from tests.tiny import tiny_model, tiny_tokenizer

    tokenizer_json = tiny_tokenizer(tmp_path / "tokenizer.json")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token=EOS)
    model = tiny_model("qwen2", tokenizer.vocab_size, tokenizer.eos_token_id)
    gate = {"variants": ["int4"], "new_tokens": 3, "widths": [4], "prefill_chunk": 16}
    manifest = build_artifact(model, tokenizer, tokenizer_json, tmp_path / "fp32", name="tiny", max_context=64,
                              opset=20, check_ids=np.arange(24) % tokenizer.vocab_size, tolerance=1e-3,
                              prefill_chunk=16, gate=gate)
    assert manifest.checks["parity"]["ok"] and "gate" not in manifest.checks
    assert "gate" not in read_manifest(tmp_path / "fp32").checks  # the runtime self-checks it (test_quantize)
    with pytest.raises(SystemExit):
        main(["--hf", str(tmp_path), "--out", str(tmp_path / "x"), "--name", "tiny", "--parity-text", "q.jsonl",
              "--parity-tokens", "1"])
