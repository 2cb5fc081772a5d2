"""The benchmark core (pipeline.lib.measure) and the pair benchmark stage (pipeline.pair_bench) on tiny models."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import specrt
from pipeline.lib.measure import Prompt, Run, markdown, matched_prefix, measure, summarize
from tests.helpers import PROMPTS, specbench_questions
from tests.tiny_pair import build_tiny_pair


@pytest.fixture(scope="module")
def model(tiny_artifact):
    return specrt.load(tiny_artifact[0])


def test_matched_prefix_counts_tokens_before_the_first_difference():
    ref = np.array([5, 6, 7, 8])
    assert matched_prefix(np.array([5, 6, 7, 8]), ref) == (4, 4)  # identical
    assert matched_prefix(np.array([5, 6, 9, 8]), ref) == (2, 4)  # differs at index 2
    assert matched_prefix(np.array([5, 6]), ref) == (2, 4)  # stopped early
    assert matched_prefix(np.array([5, 6, 7, 8, 1]), ref) == (4, 4)  # ran longer: counted at its end


def test_measure_runs_each_method_against_the_baseline_of_its_temperature(model):
    prompts = [Prompt("qa", model.encode(PROMPTS[0])), Prompt("rag", model.encode(PROMPTS[1]))]
    runs = [Run("pld", False, 0.0), Run("pld", True, 0.0), Run("pld", False, 1.0)]
    results = summarize(measure(model, prompts, runs, max_new_tokens=12, draft_budget=4))
    assert set(results) == {"baseline/chain/t0", "baseline/chain/t1", "pld/chain/t0", "pld/tree/t0", "pld/chain/t1"}
    for by_task in results.values():
        assert set(by_task) == {"qa", "rag", "all"}
        assert by_task["all"]["decode_tokens"] == by_task["qa"]["decode_tokens"] + by_task["rag"]["decode_tokens"]
    assert results["baseline/chain/t0"]["all"]["speedup"] == 1.0
    assert results["baseline/chain/t0"]["all"]["token_match"] == 1.0
    assert results["pld/chain/t0"]["all"]["token_match"] == 1.0  # greedy: compared with the baseline
    assert results["pld/chain/t1"]["all"]["token_match"] is None  # sampled: not comparable token for token
    pld = results["pld/chain/t0"]["all"]
    assert pld["mean_tokens_per_step"] >= 1.0 and 0 <= pld["acceptance_rate"] <= 1
    shares = pld["draft_share"] + pld["verify_share"] + pld["overhead_share"]
    assert shares == pytest.approx(1.0, abs=1e-3) and pld["verify_share"] > 0
    assert markdown(results).count("\n") == 1 + len(results)  # header and rule, then one row per run


def test_every_run_is_measured_against_two_baseline_runs_that_bracket_it(model, monkeypatch):
    prompts = [Prompt("qa", model.encode(PROMPTS[0])), Prompt("rag", model.encode(PROMPTS[1]))]
    order, real = [], model.generate_ids

    def spy(ids, **options):
        ids_out, loop = real(ids, **options)
        order.append(options["method"])
        # a machine that slows down while the methods run: the opening baseline decodes in 1 s, the closing one in 2 s
        if options["method"] == "baseline":
            loop.stats.decode_s = 1.0 if order.count("baseline") % 2 else 2.0
        return ids_out, loop

    monkeypatch.setattr(model, "generate_ids", spy)
    tallies = measure(model, prompts, [Run("pld", False, 0.0)], max_new_tokens=10, draft_budget=4)
    assert order == ["baseline", "pld", "baseline"] * 2
    base, pld = tallies["baseline/chain/t0"]["all"], tallies["pld/chain/t0"]["all"]
    assert base.summary()["baseline_drift"] == pytest.approx(-0.5, abs=1e-9)  # half the speed the second time
    assert pld.summary()["baseline_drift"] == pytest.approx(-0.5, abs=1e-9)
    assert base.summary()["speedup"] == 1.0 and base.summary()["token_match"] == 1.0
    # the reference of a run is the mean of the two baseline runs: 1.5 s per prompt
    assert pld.base_seconds == pytest.approx(2 * 1.5)
    assert base.base_seconds == pytest.approx(2 * 2 * 1.5) and base.seconds == pytest.approx(2 * (1.0 + 2.0))
    assert base.prefill_s == pytest.approx(pld.prefill_s)  # the prompt's prefill counted once


def test_baseline_every_brackets_each_run_with_the_nearest_baseline_runs(model, monkeypatch):
    prompts = [Prompt("qa", model.encode(PROMPTS[0]))]
    order, real = [], model.generate_ids

    def spy(ids, **options):
        ids_out, loop = real(ids, **options)
        order.append(options["method"])
        if options["method"] == "baseline":  # a machine that keeps slowing down: 1 s, 2 s, 3 s, 4 s
            loop.stats.decode_s = float(order.count("baseline"))
        return ids_out, loop

    monkeypatch.setattr(model, "generate_ids", spy)
    runs = [Run("pld", False, 0.0), Run("pld", True, 0.0), Run("suffix_decoding", False, 0.0)]
    tallies = measure(model, prompts, runs, max_new_tokens=10, draft_budget=4, baseline_every=1)
    assert order == ["baseline", "pld", "baseline", "pld", "baseline", "suffix_decoding", "baseline"]
    pld, tree, suffix = (tallies[n]["all"] for n in ("pld/chain/t0", "pld/tree/t0", "suffix_decoding/chain/t0"))
    assert (pld.base_seconds, tree.base_seconds, suffix.base_seconds) == pytest.approx((1.5, 2.5, 3.5))
    assert pld.summary()["baseline_drift"] == pytest.approx(-0.5)  # 1 s -> 2 s
    assert suffix.summary()["baseline_drift"] == pytest.approx(3 / 4 - 1)  # 3 s -> 4 s
    base = tallies["baseline/chain/t0"]["all"].summary()
    assert base["speedup"] == 1.0 and base["token_match"] == 1.0 and base["baseline_drift"] == pytest.approx(-0.5)
    order.clear()
    measure(model, prompts, runs, max_new_tokens=10, draft_budget=4, baseline_every=2)
    assert order == ["baseline", "pld", "pld", "baseline", "suffix_decoding", "baseline"]
    with pytest.raises(ValueError, match="baseline_every"):
        measure(model, prompts, runs, max_new_tokens=10, baseline_every=0)


def test_with_a_prefix_cache_methods_reuse_the_cold_baseline_prefill(tiny_artifact, monkeypatch):
    model = specrt.load(tiny_artifact[0], prefix_cache_mb=8)
    prompts = [Prompt("qa", model.encode(PROMPTS[0])), Prompt("qa", model.encode(PROMPTS[0]))]  # the same twice
    stats = []  # (method, cached prompt tokens, prefill seconds) per request
    real = model.generate_ids

    def spy(ids, **options):
        out = real(ids, **options)
        stats.append((options["method"], out[1].stats.cached_prompt_tokens, out[1].stats.prefill_s))
        return out

    monkeypatch.setattr(model, "generate_ids", spy)
    tallies = measure(model, prompts, [Run("pld", False, 0.0), Run("suffix_decoding", True, 0.0)],
                      max_new_tokens=8, draft_budget=4)
    n = len(prompts[0].ids)
    # per prompt: the baseline prefills cold (the cache is cleared before it, even for a repeated
    # prompt), every method after it and the closing baseline reuse the whole prompt
    assert [(m, c) for m, c, _ in stats] == [("baseline", 0), ("pld", n), ("suffix_decoding", n), ("baseline", n)] * 2
    cold = stats[0][2] + stats[4][2]
    for name in ("baseline/chain/t0", "pld/chain/t0", "suffix_decoding/tree/t0"):
        assert tallies[name]["all"].prefill_s == pytest.approx(cold)  # every run reports the cold prefill
        assert tallies[name]["all"].summary()["token_match"] in (None, 1.0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("pair"))


PAIR_PARAMS = """pair_bench:
  prompts_per_task: 1
  max_prompt_tokens: 64
  max_new_tokens: 10
  temperatures: [0, 1]
  methods: [sd, hsd, hsd_capped]
  modes: [chain, tree]
  draft_budget: 4
  threads: 1
"""


def test_pair_bench_stage_reports_every_method_at_every_temperature(pair, tmp_path):
    import pipeline.pair_bench as stage

    target, draft = pair
    params = tmp_path / "params.yaml"
    params.write_text(PAIR_PARAMS)
    out, plot, table = tmp_path / "bench.json", tmp_path / "plots" / "bench.json", tmp_path / "bench.md"
    argv = ["--target", str(target), "--draft", str(draft), "--prompts", str(specbench_questions(tmp_path / "q.jsonl")),
            "--params", str(params), "--out", str(out), "--plot", str(plot), "--table", str(table)]
    assert stage.main(argv) == 0
    report = json.loads(out.read_text())
    expected = {f"{m}/{mode}/t{t}" for m in ("sd", "hsd", "hsd_capped") for mode in ("chain", "tree") for t in (0, 1)}
    assert set(report["runs"]) == expected | {"baseline/chain/t0", "baseline/chain/t1"}
    assert report["lossless_greedy"] and report["prompts"] == 6 and report["draft"] == "tiny-qwen2-draft"
    for name, r in report["runs"].items():
        assert r["token_match"] == (1.0 if name.endswith("/t0") else None), name
        if not name.startswith("baseline"):
            assert r["acceptance_rate"] > 0 and r["draft_share"] > 0, name  # the draft model ran and was accepted
    assert set(report["per_task"]["sd/chain/t0"]) == {"mt_bench", "translation", "summarization", "qa",
                                                      "math_reasoning", "rag"}
    assert {r["run"] for r in json.loads(plot.read_text())} == set(report["runs"])
    assert table.read_text().count("\n") == 2 + len(report["runs"])


def test_pair_bench_runs_only_the_tasks_asked_for_and_names_an_unknown_one(pair, tmp_path):
    import pipeline.pair_bench as stage

    target, draft = pair
    params = tmp_path / "params.yaml"
    base = ["--target", str(target), "--draft", str(draft), "--prompts", str(specbench_questions(tmp_path / "q.jsonl")),
            "--params", str(params), "--out", str(tmp_path / "bench.json")]
    params.write_text(PAIR_PARAMS.replace("[0, 1]", "[0]").replace("[chain, tree]", "[chain]")
                      + "  tasks: [qa, rag]\n")
    assert stage.main(base) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["prompts"] == 2 and set(report["per_task"]["sd/chain/t0"]) == {"qa", "rag"}
    params.write_text(PAIR_PARAMS + "  tasks: [qa, coding]\n")
    with pytest.raises(ValueError, match="pair_bench.tasks: unknown \\['coding'\\]"):
        stage.main(base)


def test_pair_bench_reads_the_section_it_is_given(pair, tmp_path):
    # --section pair_bench_full: that section's settings (one task here), and errors name it
    import pipeline.pair_bench as stage

    target, draft = pair
    params = tmp_path / "params.yaml"
    full = PAIR_PARAMS.replace("pair_bench:", "pair_bench_full:").replace("[0, 1]", "[0]")
    full = full.replace("[chain, tree]", "[chain]")
    params.write_text(PAIR_PARAMS + full + "  tasks: [rag]\n")
    base = ["--target", str(target), "--draft", str(draft), "--prompts", str(specbench_questions(tmp_path / "q.jsonl")),
            "--params", str(params), "--out", str(tmp_path / "bench.json"), "--section", "pair_bench_full"]
    assert stage.main(base) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["prompts"] == 1 and set(report["runs"]) == {f"{m}/chain/t0" for m in ("sd", "hsd", "hsd_capped",
                                                                                          "baseline")}
    params.write_text(PAIR_PARAMS + full + "  tasks: [coding]\n")
    with pytest.raises(ValueError, match="pair_bench_full.tasks: unknown"):
        stage.main(base)
    with pytest.raises(SystemExit, match="no section 'pair_bench_nightly'"):
        stage.main(base[:-1] + ["pair_bench_nightly"])


@pytest.mark.parametrize("spec_safe, code", [(True, 1), (False, 0)])
def test_pair_bench_fails_when_a_spec_safe_target_diverges(pair, tmp_path, monkeypatch, spec_safe, code):
    import pipeline.pair_bench as stage

    target, draft = pair
    real_measure, load = stage.measure, specrt.load

    def diverging(*args, **kwargs):
        tallies = real_measure(*args, **kwargs)
        tallies["sd/chain/t0"]["all"].matched -= 1  # one greedy token differs
        return tallies

    def loaded(*args, **kwargs):
        model = load(*args, **kwargs)
        model.manifest = dataclasses.replace(model.manifest, spec_safe=spec_safe)
        return model

    monkeypatch.setattr(stage, "measure", diverging)
    monkeypatch.setattr(stage.specrt, "load", loaded)
    params = tmp_path / "params.yaml"
    params.write_text(PAIR_PARAMS.replace("[0, 1]", "[0]").replace("[sd, hsd, hsd_capped]", "[sd]")
                      .replace("[chain, tree]", "[chain]"))
    out = tmp_path / "bench.json"
    argv = ["--target", str(target), "--draft", str(draft), "--prompts", str(specbench_questions(tmp_path / "q.jsonl")),
            "--params", str(params), "--out", str(out)]
    assert stage.main(argv) == code
    assert json.loads(out.read_text())["lossless_greedy"] is False


def test_summary_prints_one_line_per_pair_run(tmp_path):
    from pipeline.summary import pair_rows

    run = {"decode_tokens_per_s": 7.5, "speedup": 1.25, "mean_tokens_per_step": 2.5, "token_match": 1.0}
    report = {"draft": "d", "target": "t", "variant": "int4",
              "runs": {"sd/chain/t0": run, "sd/chain/t1": {**run, "token_match": None}}}
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "bench-int4.json").write_text(json.dumps(report))
    assert pair_rows(tmp_path) == [
        "d -> t [int4] sd/chain/t0: 7.50 tok/s, 1.25x, 2.50 tokens/step, token match 1.000",
        "d -> t [int4] sd/chain/t1: 7.50 tok/s, 1.25x, 2.50 tokens/step",
    ]
    assert pair_rows(tmp_path / "nothing") == []


def test_summary_prints_the_best_benchmark_run_and_peer_ratios(tmp_path):
    from pipeline.summary import benchmark_rows

    (tmp_path / "m").mkdir()
    run = {"speedup": 1.5, "token_match": 1.0, "baseline_drift": -0.034}
    (tmp_path / "m" / "benchmark-int4.json").write_text(json.dumps(
        {"model": "m", "variant": "int4", "prompts": 7, "best": "pld/tree/t0", "runs": {"pld/tree/t0": run}}))
    (tmp_path / "m" / "peers-int4.json").write_text(json.dumps({"ratios": {"specrt/int4/pld / hf/fp32/plain": 3.0}}))
    (tmp_path / "m" / "peers-int8.json").write_text(json.dumps(
        {"ratios": {"specrt/int8/baseline / ort-genai/int8/plain": 1.01}}))
    assert benchmark_rows(tmp_path) == [
        "m [int4] Spec-Bench (7 prompts): best pld/tree/t0 1.50x over plain decoding, token match 1.000, "
        "baseline drift -3%",
        "m: specrt/int4/pld / hf/fp32/plain = 3.00",
        "m: specrt/int8/baseline / ort-genai/int8/plain = 1.01",
    ]


def test_speedup_interval_resamples_prompts():
    from pipeline.lib.measure import speedup_interval

    assert speedup_interval([(32, 1.0, 32, 2.0)]) is None  # one prompt: no interval
    assert speedup_interval([(32, 1.0, 32, 2.0)] * 4) == [2.0, 2.0]  # identical prompts: no spread
    # a prompt at 1x and one at 0.5x: resamples give 1x (both the first), 0.667x (one each) or 0.5x
    assert speedup_interval([(10, 1.0, 10, 1.0), (10, 2.0, 10, 1.0)]) == [0.5, 1.0]
