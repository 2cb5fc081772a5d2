"""Quantized variants on tiny models: the quantizer, the spec-safety gate and the regression check."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import specrt
from pipeline.lib.quantize_graph import QuantConfig, fold_tied_lm_head, lm_head_node, quantize_model
from pipeline.lossless import compare_methods
from pipeline.quantize import quantize_artifact
from specrt.backend.session import OrtDecoder
from specrt.engine.spec_gate import reference_run, run_gate
from tests.helpers import PROMPTS, specbench_questions

GATE = {"new_tokens": 16, "widths": [4], "prefill_chunk": 16}
INT4 = QuantConfig(method="specrt_q4", bits=4, block_size=32, lm_head_bits=4, embedding_bits=4)  # params.yaml's int4
NBITS = QuantConfig(method="matmul_nbits", bits=4, block_size=32, accuracy_level=4, lm_head_bits=4, embedding_bits=4)


@pytest.fixture(scope="module")
def int4(tiny_artifact, tmp_path_factory):
    src = tiny_artifact[0]
    out = tmp_path_factory.mktemp("q") / "int4"
    prompts = [specrt.load(src).encode(p) for p in PROMPTS[:3]]
    report = quantize_artifact(src, out, "int4", INT4, prompts, GATE, bench_steps=2)
    return out, report


def test_int4_artifact_is_smaller_loads_and_records_its_checks(int4, tiny_artifact):
    out, report = int4
    model = specrt.load(out)
    assert model.manifest.variant == "int4"
    assert report["size_vs_source"] < 0.6  # tiny models: the tokenizer and graph are a larger share
    assert model.manifest.checks["quantization"]["bits"] == 4
    gate = model.manifest.checks["gate"]
    assert model.manifest.spec_safe == gate["spec_safe"] == (gate["disagreements"] == 0)
    assert 0.5 < report["top1_agreement"] <= 1.0 and report["mean_kl"] >= 0
    graph = onnx.load(out / model.manifest.decoder, load_external_data=False).graph
    ops = {n.op_type for n in graph.node}
    assert "MatMulQ4" in ops and "GatherBlockQuantized" in ops and "MatMulNBits" not in ops
    assert not [n for n in graph.node if n.op_type == "MatMul" and any(i.endswith("weight") for i in n.input)]


def test_int4_speculation_equals_plain_decoding_of_int4(int4):
    # the regression stage's core on the quantized variant: every drafter family, chain and tree
    model = specrt.load(int4[0])
    assert model.manifest.spec_safe, model.manifest.checks["gate"]
    prompts = [model.encode(p) for p in PROMPTS]
    report = compare_methods(model, prompts, ["pld", "suffix_decoding", "lookahead", "token_recycling"],
                             max_new_tokens=24, draft_budget=6)
    assert report["lossless"], {k: v["divergences"] for k, v in report["runs"].items()}


def test_tied_lm_head_is_folded_into_its_own_initializer(tiny_artifact):
    folder = tiny_artifact[0]
    model = onnx.load(folder / "decoder.onnx")
    tied = specrt.load(folder).manifest.arch.startswith(("qwen2", "gemma3"))  # tests/tiny.py ties these two
    assert fold_tied_lm_head(model) == tied
    head = lm_head_node(model.graph)
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    assert head.input[1] in inits and inits[head.input[1]][0] == 64  # [hidden, vocab]


class SkewedDecoder:
    """A decoder whose multi-position windows swap each row's top-2 logits at near-ties: a
    deliberately spec-unsafe kernel (a window answers differently than a single step)."""

    def __init__(self, inner: OrtDecoder, margin: float):
        self.inner, self.margin = inner, margin

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, input_ids, position_ids, attention_bias):
        out = self.inner.forward(input_ids, position_ids, attention_bias)
        if len(input_ids) > 1 and attention_bias.shape[1] > len(input_ids):  # a verify window, not a prefill
            for row in out.logits:
                second, first = np.argsort(row)[-2:]
                if row[first] - row[second] < self.margin:
                    row[first], row[second] = row[second], row[first]
        return out


def test_gate_flags_a_kernel_that_answers_differently_in_windows(tiny_artifact):
    folder = tiny_artifact[0]
    model = specrt.load(folder)
    prompts = [model.encode(p) for p in PROMPTS[:3]]
    decoder = OrtDecoder(folder / "decoder.onnx", model.manifest.dims)
    honest = run_gate(decoder, prompts, new_tokens=16, widths=(4,), chunk=16)
    assert honest["spec_safe"] and honest["disagreements"] == 0 and honest["positions"] > 0
    margins = np.concatenate([reference_run(decoder, p, 16, 16).margins for p in prompts])
    skew = float(np.sort(margins)[len(margins) // 4]) + 1e-6  # swaps a quarter of the positions
    skewed = run_gate(SkewedDecoder(decoder, skew), prompts, new_tokens=16, widths=(4,), chunk=16)
    assert not skewed["spec_safe"] and skewed["disagreements"] > 0
    flagged = [m for mode in skewed["modes"] for m in mode["disagreement_margins"]]
    assert max(flagged) < skew + 1e-5  # the report rounds margins to 5 places


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("method", "gptq", "quantize method must be one of"),
        ("bits", 3, "quantize bits must be 4, 8 or null"),
        ("block_size", 24, "power of two"),
        ("accuracy_level", 7, "accuracy_level must be 0..4"),
    ],
)
def test_bad_quantize_settings_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        QuantConfig(**{"method": "matmul_nbits", field: value})


@pytest.mark.parametrize("field, value", [("bits", 8), ("block_size", 64), ("symmetric", False), ("lm_head_bits", 8)])
def test_specrt_q4_refuses_settings_its_kernel_does_not_compute(field, value):
    with pytest.raises(ValueError, match=rf"'specrt_q4' is 4-bit symmetric blocks of 32: .*{field} {value}"):
        QuantConfig(**{"method": "specrt_q4", field: value})


def test_int4_is_exact_on_this_cpu(tiny_artifact, tmp_path):
    # MatMulQ4 and SpecAttention give a row the same bits in any window on every CPU: the gate finds
    # no difference at all, chains and trees of 4 and 8, windows crossing slot 128 of a long prompt
    src = tiny_artifact[0]
    model = specrt.load(src)
    long = np.concatenate([model.encode(p) for p in PROMPTS * 4])[:118]
    prompts = [model.encode(p) for p in PROMPTS[:3]] + [long]
    report = quantize_artifact(src, tmp_path / "int4", "int4", INT4, prompts, {**GATE, "widths": [4, 8]},
                               bench_steps=2)
    gate = specrt.load(tmp_path / "int4").manifest.checks["gate"]
    assert report["spec_safe"] and gate["disagreements"] == 0 and gate["max_logit_diff"] == 0.0, gate["modes"]
    assert report["quantization"]["method"] == "specrt_q4"
    assert gate["basis"]["exactness"] == "by_construction" and gate["basis"]["row_dependent_ops"] == []


def test_a_portable_graph_gets_matmul_nbits_for_int4(portable_artifact, tmp_path):
    src = portable_artifact[0]
    prompts = [specrt.load(src).encode(PROMPTS[0])]
    portable = quantize_artifact(src, tmp_path / "int4-portable", "int4", INT4, prompts, GATE, bench_steps=1)
    assert portable["quantization"]["method"] == "matmul_nbits"
    graph = onnx.load(tmp_path / "int4-portable" / "decoder.onnx", load_external_data=False).graph
    assert "MatMulNBits" in {n.op_type for n in graph.node} and "MatMulQ4" not in {n.op_type for n in graph.node}


@pytest.mark.parametrize("spec_safe, diverged, code", [(True, False, 0), (True, True, 1), (False, True, 0)])
def test_regression_stage_fails_only_a_spec_safe_variant_that_diverges(
    int4, tmp_path, monkeypatch, spec_safe, diverged, code
):
    import json

    import pipeline.lossless as stage

    real = stage.compare_methods

    def compare(model, prompts, methods, **kw):
        report = real(model, prompts, methods[:1], **kw)
        if diverged:
            next(iter(report["runs"].values())).update(identical=False, divergences=[{"prompt": 0, "position": 3}])
            report["lossless"] = False
        return report

    monkeypatch.setattr(stage, "compare_methods", compare)
    load = specrt.load
    monkeypatch.setattr(stage.specrt, "load", lambda *a, **kw: _with_spec_safe(load(int4[0]), spec_safe))
    params = tmp_path / "params.yaml"
    params.write_text("lossless: {prompts_per_task: 1, max_prompt_tokens: 64, max_new_tokens: 8, draft_budget: 4}\n")
    out, plot = tmp_path / "lossless-int4.json", tmp_path / "plots" / "acceptance-int4.json"
    questions = specbench_questions(tmp_path / "q.jsonl")
    argv = ["--model", str(int4[0]), "--prompts", str(questions), "--params", str(params),
            "--out", str(out), "--plot", str(plot)]
    assert stage.main(argv) == code
    report = json.loads(out.read_text())
    assert report["variant"] == "int4" and report["spec_safe"] == spec_safe and report["lossless"] == (not diverged)
    rows = json.loads(plot.read_text())
    assert {r["run"] for r in rows} == set(report["runs"]) and all("mean_tokens_per_step" in r for r in rows)


def _with_spec_safe(model, spec_safe):
    import dataclasses

    model.manifest = dataclasses.replace(model.manifest, spec_safe=spec_safe)
    return model


def test_load_model_reads_weights_that_have_several_hard_links(tiny_artifact, tmp_path):
    # DVC's hardlink cache leaves the workspace's decoder.onnx.data with 2 links; onnx.load refuses that
    import os
    import shutil

    from pipeline.lib.quantize_graph import load_model

    src = tiny_artifact[0] / "decoder.onnx"
    expected = {t.name: numpy_helper.to_array(t) for t in onnx.load(src).graph.initializer}
    shutil.copyfile(src, tmp_path / "decoder.onnx")
    shutil.copyfile(str(src) + ".data", tmp_path / "weights")
    os.link(tmp_path / "weights", tmp_path / "decoder.onnx.data")
    with pytest.raises(onnx.checker.ValidationError, match="hard links"):
        onnx.load(tmp_path / "decoder.onnx")
    loaded = {t.name: numpy_helper.to_array(t) for t in load_model(tmp_path / "decoder.onnx").graph.initializer}
    assert loaded.keys() == expected.keys() and all(np.array_equal(loaded[k], expected[k]) for k in expected)


def _matmul_nbits_row_invariant() -> bool:
    """Whether this CPU's MatMulNBits (4-bit, level 4) gives a row the same bits alone as in a pair.
    onnxruntime's MLAS picks a one-row kernel for M = 1; on AVX-512 machines it agreed with the
    M >= 2 kernel bit for bit, on AVX2-only ones (AMD EPYC Zen 3, 2026-12-01) it differs by ~1e-6."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((256, 256)) * 0.02).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"], name="proj")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", 256])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "s", 256])],
                              [numpy_helper.from_array(weight, "w")])
    config = QuantConfig(method="matmul_nbits", bits=4, accuracy_level=4, lm_head_bits=4)  # the one MatMul: "lm_head"
    model = quantize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), config)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 2, 256)).astype(np.float32)
    alone, paired = session.run(None, {"x": x[:, :1]})[0], session.run(None, {"x": x})[0]
    return bool(np.array_equal(alone[0, 0], paired[0, 0]))


def test_level4_int4_gate_measures_what_the_cpu_kernels_do(tiny_artifact, tmp_path):
    # grouped attention keeps every attention product at M >= 2 and every other op row-wise, so a
    # position's logits differ between a window and a single step only where MatMulNBits's one-row
    # kernel rounds differently from its many-row one: bit for bit equal where the kernels agree
    # (chains and trees; trees kept inside one key block by specrt.backend.window.fit_window; the long prompt
    # makes windows cross slot 128), and a difference the gate records where they do not (the w8a8
    # variant is exact on every CPU: tests/test_w8a8.py)
    src = tiny_artifact[0]
    model = specrt.load(src)
    long = np.concatenate([model.encode(p) for p in PROMPTS * 4])[:118]
    assert len(long) == 118
    prompts = [model.encode(p) for p in PROMPTS[:3]] + [long]
    assert NBITS.accuracy_level == 4
    report = quantize_artifact(src, tmp_path / "int4", "int4", NBITS, prompts, {**GATE, "widths": [4, 8]},
                               bench_steps=2)
    gate = specrt.load(tmp_path / "int4").manifest.checks["gate"]
    assert gate["positions"] > 0 and report["spec_safe"] == (gate["disagreements"] == 0)
    assert {m["mode"] for m in gate["modes"]} == {"chain", "tree"}
    if _matmul_nbits_row_invariant():
        assert report["spec_safe"] and gate["max_logit_diff"] == 0.0, gate["modes"]
    else:
        assert gate["max_logit_diff"] > 0.0, gate["modes"]


def test_specrt_q4_folds_a_bias_add_into_the_product():
    # x W + b as MatMul then Add: one MatMulQ4 node with the bias input, the same bits as the unfused pair;
    # an Add whose other input is not a [N] constant (here a graph input) stays
    from onnx import TensorProto, helper

    from pipeline.lib.quantize_graph import _specrt_q4

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 40)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(40).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((64, 40)).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"), helper.make_node("Add", ["b", "xw"], ["y"]),
             helper.make_node("MatMul", ["x", "w2"], ["xw2"], name="mm2"), helper.make_node("Add", ["xw2", "c"], ["z"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 64])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [40])
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [3, 40]) for name in ("y", "z")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, c], outputs, inits), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 20)])
    _specrt_q4(model, exclude=[])
    assert [(n.op_type, len(n.input)) for n in model.graph.node] == [("MatMulQ4", 4), ("MatMulQ4", 3), ("Add", 2)]
    options = ort.SessionOptions()
    specrt.backend.kernels.register(options, required=True)
    feed = {"x": rng.standard_normal((3, 64)).astype(np.float32), "c": np.zeros(40, np.float32)}
    y, z = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feed)
    del model.graph.node[0].input[3]  # the same node without its bias: x W alone
    product = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert np.array_equal(y, product.run(None, feed)[0] + numpy_helper.to_array(inits[1]))


def test_quantize_stage_reads_the_gate_section_it_is_given(tiny_qwen2, tmp_path):
    import json

    from pipeline.quantize import main

    params = tmp_path / "params.yaml"
    gate = "{prompts_per_task: 1, max_prompt_tokens: 64, new_tokens: %d, widths: [4], prefill_chunk: 16}"
    variants = "{int4: {method: specrt_q4, lm_head_bits: 4}}"
    params.write_text(f"quantize: {{bench_steps: 1, threads: null, variants: {variants}}}\n"
                      f"gate: {gate % 6}\ngate_target: {gate % 3}\n")
    questions = specbench_questions(tmp_path / "q.jsonl")
    base = ["--src", str(tiny_qwen2[0]), "--variant", "int4", "--prompts", str(questions), "--params", str(params)]
    positions = {}
    for section in ("gate", "gate_target"):
        report = tmp_path / f"{section}.json"
        main([*base, "--out", str(tmp_path / section), "--report", str(report), "--gate-section", section])
        positions[section] = json.loads(report.read_text())["gate_positions"]
    assert positions["gate_target"] < positions["gate"]
    with pytest.raises(SystemExit, match=r"no section 'gate_pair' .*sections: quantize, gate, gate_target"):
        main([*base, "--out", str(tmp_path / "x"), "--report", str(tmp_path / "x.json"), "--gate-section", "gate_pair"])


def test_a_gate_section_that_leaves_the_variant_out_records_no_verdict_and_the_runtime_self_checks(
        tiny_qwen2, tmp_path, monkeypatch):
    import json

    from pipeline.quantize import main

    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "cache"))
    params = tmp_path / "params.yaml"
    params.write_text("quantize: {bench_steps: 1, threads: null, "
                      "variants: {int4: {method: specrt_q4, lm_head_bits: 4}}}\n"
                      "gate: {variants: [int8], prompts_per_task: 1, max_prompt_tokens: 64, new_tokens: 3, "
                      "widths: [4], prefill_chunk: 16}\n")
    report = tmp_path / "int4.json"
    main(["--src", str(tiny_qwen2[0]), "--variant", "int4", "--prompts", str(specbench_questions(tmp_path / "q.jsonl")),
          "--params", str(params), "--out", str(tmp_path / "int4"), "--report", str(report)])
    written = json.loads(report.read_text())
    assert (written["spec_safe"], written["gate_disagreements"], written["gate_positions"]) == (None, None, None)
    assert written["top1_agreement"] is not None  # fidelity still measured on the section's prompts
    model = specrt.load(tmp_path / "int4")
    assert "gate" not in model.manifest.checks
    assert model.spec_safety().source == "self-check" and model.spec_safety().spec_safe
