"""The Spec-Bench benchmark stage (pipeline.benchmark) and the roofline (pipeline.lib.roofline) on a tiny model."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

import specrt
from pipeline.benchmark import baseline_speed, chat_renderer, conversation_prompts, histogram, main, methods_to_run
from pipeline.lib.measure import Prompt, Tally
from pipeline.lib.roofline import kv_bytes_per_position, roofline, weight_bytes
from pipeline.lib.specbench import Question
from specrt.backend.manifest import read_manifest
from tests.helpers import PROMPTS


@pytest.fixture(scope="module")
def folder(tiny_artifact):
    return tiny_artifact[0]


def test_later_turns_carry_the_models_own_greedy_answer(folder):
    model = specrt.load(folder)
    render = chat_renderer(None)  # the tiny tokenizer has no chat template: turns joined by blank lines
    q = Question(1, "mt_bench", (PROMPTS[0], PROMPTS[1]))
    first, second = conversation_prompts(model, render, q, max_prompt_tokens=10_000, max_new_tokens=8)
    answer, _ = model.generate_ids(first.ids, method="baseline", max_new_tokens=8)
    text = render([{"role": "user", "content": PROMPTS[0]},
                   {"role": "assistant", "content": model.tokenizer.decode(answer.tolist(), skip_special_tokens=True)},
                   {"role": "user", "content": PROMPTS[1]}])
    assert first.ids.tolist() == model.encode(PROMPTS[0]).tolist()
    assert second.ids.tolist() == model.encode(text).tolist()
    cut = conversation_prompts(model, render, q, max_prompt_tokens=5, max_new_tokens=8)
    assert [p.ids.tolist() for p in cut] == [first.ids[-5:].tolist(), second.ids[-5:].tolist()]  # tails kept


def test_methods_to_run_needs_the_datastore_and_draft_for_their_methods():
    everything = methods_to_run("all", datastore=True, draft=True)
    assert "baseline" not in everything and {"rest", "sd", "pld"} <= set(everything)
    plain = methods_to_run("all", datastore=False, draft=False)
    assert not {"rest", "sam_decoding", "asam", "asam_verify", "sd", "hsd", "hsd_capped"} & set(plain)
    assert methods_to_run(["pld"], datastore=False, draft=False) == ["pld"]
    with pytest.raises(ValueError, match="benchmark.methods: unknown \\['nope'\\]"):
        methods_to_run(["pld", "nope"], datastore=False, draft=False)


def test_histogram_counts_accepted_lengths():
    assert histogram([0, 2, 0, 1, 2, 2]) == {0: 2, 1: 1, 2: 3}


def test_roofline_is_bandwidth_over_bytes_per_token(folder):
    manifest = read_manifest(folder)
    r = roofline(manifest, bandwidth=1e10, mean_context=100, plain_tokens_per_s=50.0)
    per_token = weight_bytes(manifest) + 100 * kv_bytes_per_position(manifest)
    assert r.bytes_per_token == per_token and r.bandwidth_gb_s == 10.0
    assert r.ceiling_tokens_per_s == pytest.approx(1e10 / per_token, rel=1e-3)
    assert r.fraction == pytest.approx(50.0 / (1e10 / per_token), abs=1e-4)  # rounded to 4 places
    d = manifest.dims
    assert kv_bytes_per_position(manifest) == 2 * d.num_layers * d.kv_heads * d.head_dim * 4


def test_roofline_of_the_benchmarked_artifact_comes_from_its_baseline_runs():
    # two prompts of 10 and 30 tokens, two plain runs each of 15 decode tokens (16 new tokens)
    plain = Tally(tokens=60, seconds=2.0)
    prompts = [Prompt("qa", np.arange(10)), Prompt("qa", np.arange(30))]
    assert baseline_speed(plain, prompts) == (30.0, 20 + 16 / 2)


def test_stage_writes_metrics_csv_table_and_plots(folder, tmp_path, monkeypatch):
    import pipeline.benchmark as stage

    probes = iter([2e10, 3e10])  # read bandwidth before and after the timed runs: the best is the ceiling
    monkeypatch.setattr(stage, "read_bandwidth", lambda threads: next(probes))
    rows = [{"question_id": 1, "category": "writing", "turns": [PROMPTS[0], PROMPTS[1]]},
            {"question_id": 2, "category": "summarization", "turns": [PROMPTS[3]]}]
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = tmp_path / "params.yaml"
    params.write_text("benchmark: {prompts_per_task: 1, max_prompt_tokens: 64, max_new_tokens: 10, "
                      "methods: [pld, suffix_decoding], without_backoff: [pld], modes: [chain, tree], draft_budget: 4, "
                      "threads: 1}\n")
    out = tmp_path / "bench"
    argv = ["--model", str(folder), "--roofline", str(folder), "--prompts", str(questions), "--params", str(params),
            "--metrics", str(out / "m.json"), "--csv", str(out / "r.csv"), "--table", str(out / "r.md"),
            "--plots", str(out / "plots")]
    assert main(argv) == 0
    report = json.loads((out / "m.json").read_text())
    assert report["prompts"] == 3 and report["tasks"]["mt_bench"] == 2 and report["lossless"]
    runs = {"baseline/chain/t0", "pld/chain/t0", "pld/tree/t0", "suffix_decoding/chain/t0", "suffix_decoding/tree/t0",
            "pld/chain/t0/no-backoff", "pld/tree/t0/no-backoff"}
    assert set(report["runs"]) == runs and report["best"] in runs - {"baseline/chain/t0"}
    assert set(report["speedup_per_task"]["pld/tree/t0"]) == {"mt_bench", "summarization"}
    assert report["roofline"]["fp32"]["fraction"] > 0
    assert report["roofline"]["fp32"]["bandwidth_gb_s"] == 30.0 and next(probes, None) is None  # probed twice
    table = list(csv.DictReader((out / "r.csv").open()))
    tasks = ("mt_bench", "summarization", "all")
    assert {(r["run"], r["task"]) for r in table} == {(n, t) for n in runs for t in tasks}
    assert (out / "r.md").read_text().count("\n") == 2 + len(runs)
    speedups = json.loads((out / "plots" / "speedup.json").read_text())
    assert len(speedups) == 2 * len(runs) and all(s["speedup"] > 0 for s in speedups)
    accepted = json.loads((out / "plots" / "accepted.json").read_text())
    for name in runs:  # one histogram per run over all its verify steps
        assert sum(a["steps"] for a in accepted if a["run"] == name) == report["runs"][name]["steps"] > 0
    assert all(a["accepted_length"] >= 0 for a in accepted)


def test_gathered_bytes_counts_tables_that_only_a_gather_reads(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.lib.roofline import gathered_bytes

    table = numpy_helper.from_array(np.zeros((10, 4), np.float32), "table")  # embedding only: 160 bytes
    tied = numpy_helper.from_array(np.zeros((10, 4), np.float32), "tied")  # gathered and read by a MatMul
    weight = numpy_helper.from_array(np.zeros((4, 4), np.float32), "weight")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["a"]), helper.make_node("Gather", ["tied", "ids"], ["b"]),
             helper.make_node("MatMul", ["a", "weight"], ["c"]), helper.make_node("MatMul", ["c", "tied_t"], ["d"]),
             helper.make_node("Transpose", ["tied"], ["tied_t"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("d", TensorProto.FLOAT, None)], [table, tied, weight])
    onnx.save(helper.make_model(graph), tmp_path / "m.onnx")
    assert gathered_bytes(tmp_path / "m.onnx") == 160
