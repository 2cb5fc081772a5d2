"""pipeline.report: the results page from small metrics files shaped like the stages' own."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.report import main, render

MODEL = "m"
PARAMS = {"models": [MODEL], "quantized": ["int4"], "variants": ["fp32", "int4"],
          "benchmark": {"variants": ["int4"]}, "peers": {"variants": ["int4"]}}


def bench_run(speedup: float, tokens_per_step: float, match: float = 1.0, **extra) -> dict:
    return {"decode_tokens": 64, "steps": 50, "decode_tokens_per_s": 40.0 * speedup, "decode_tokens_per_s_std": 1.0,
            "baseline_decode_tokens_per_s": 40.0, "speedup": speedup, "baseline_drift": 0.01,
            "mean_tokens_per_step": tokens_per_step, "acceptance_rate": 0.3, "token_match": match,
            "prefill_s": 2.5, "draft_share": 0.01, "verify_share": 0.95, "overhead_share": 0.04, **extra}


def benchmark(**ci95) -> dict:
    return {
        "model": MODEL, "variant": "int4", "spec_safe": True, "prompts": 2, "tasks": {"qa": 1, "rag": 1},
        "max_new_tokens": 32, "threads": None, "seconds": 10.0, "lossless": True, "best": "pld/tree/t0",
        "runs": {
            "pld/chain/t0": bench_run(1.05, 1.1),
            "pld/tree/t0": bench_run(1.1, 1.2, **ci95),
            "pld/chain/t0/no-backoff": bench_run(0.8, 1.3, match=0.99),
            "baseline/chain/t0": bench_run(1.0, 1.0),
        },
        "speedup_per_task": {"pld/chain/t0": {"qa": 1.0, "rag": 1.1}, "pld/tree/t0": {"qa": 1.2, "rag": 1.0},
                             "pld/chain/t0/no-backoff": {"qa": 0.7, "rag": 0.9},
                             "baseline/chain/t0": {"qa": 1.0, "rag": 1.0}},
        "roofline": {"int4": {"bandwidth_gb_s": 20.0, "bytes_per_token": 300e6, "ceiling_tokens_per_s": 66.7,
                              "plain_tokens_per_s": 40.0, "fraction": 0.6}},
    }


PEERS = {
    "threads": 2, "prompts": 2, "rounds": 2, "max_new_tokens": 32,
    "runs": {"specrt/int4/baseline": {"decode_tokens_per_s": 40.0, "prefill_s": 2.0, "token_match": 1.0},
             "specrt/int4/pld": {"decode_tokens_per_s": 44.0, "prefill_s": 2.0, "token_match": 1.0},
             "ort-genai/int4/plain": {"decode_tokens_per_s": 40.0, "prefill_s": 4.0, "token_match": 0.9},
             "ort-genai/int4/ngram": {"decode_tokens_per_s": 32.0, "prefill_s": 4.0, "token_match": 0.9}},
    "ratios": {"specrt/int4/pld / ort-genai/int4/plain": 1.1, "specrt/int4/pld / ort-genai/int4/ngram": 1.375},
    "round_ratios": {"specrt/int4/pld / ort-genai/int4/plain": [1.05, 1.15]},
}

QUANTIZE = {"model": MODEL, "variant": "int4", "bytes": 2**20 * 100, "size_vs_source": 0.16, "spec_safe": True,
            "gate_disagreements": 0, "gate_positions": 936, "top1_agreement": 0.85, "mean_kl": 0.125,
            "decode_ms_per_token": 24.0, "source_decode_ms_per_token": 96.0, "speedup_vs_source": 4.0,
            "quantization": {"method": "specrt_q4", "bits": 4}}


def lossless(variant: str, tree_identical: bool) -> dict:
    run = {"token_match": 1.0, "identical": True, "divergences": [], "mean_tokens_per_step": 1.2,
           "decode_tokens_per_s": 40.0, "speedup": 1.0}
    return {"prompts": 6, "max_new_tokens": 24, "baseline_decode_tokens_per_s": 40.0, "lossless": tree_identical,
            "model": MODEL, "variant": variant, "chat": True, "spec_safe": True, "seconds": 1.0,
            "runs": {"pld/chain": run, "pld/tree": {**run, "identical": tree_identical, "token_match": 0.9}}}


def write(root: Path, rel: str, data: dict) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def artifacts(tmp_path: Path) -> Path:
    root = tmp_path / "artifacts"
    write(root, f"{MODEL}/benchmark-int4.json", benchmark())
    write(root, f"{MODEL}/peers-int4.json", PEERS)
    write(root, f"{MODEL}/int4.json", QUANTIZE)
    write(root, f"{MODEL}/lossless-fp32.json", lossless("fp32", True))
    write(root, f"{MODEL}/lossless-int4.json", lossless("int4", False))
    return root


def test_benchmark_tables(tmp_path):
    page = render(artifacts(tmp_path), PARAMS).splitlines()
    # chain and tree side by side; the back-off-off runs are rows of their own; baseline is no row
    assert "| method | speedup chain | speedup tree | tokens/step chain | tokens/step tree | token match |" in page
    assert "| pld | 1.05x | 1.10x | 1.10 | 1.20 | 1.000 |" in page
    assert "| pld (back-off off) | 0.80x | - | 1.30 | - | 0.990 |" in page
    assert not any(line.startswith("| baseline") for line in page)
    # per task, one row per run
    assert "| run | qa | rag |" in page
    assert "| pld/tree/t0 | 1.20x | 1.00x |" in page
    assert "| int4 | 20.0 | 300 | 66.7 | 40.0 | 60% |" in page


def test_ci95_shown_when_present(tmp_path):
    root = artifacts(tmp_path)
    write(root, f"{MODEL}/benchmark-int4.json", benchmark(speedup_ci95=[1.02, 1.18]))
    assert "| pld | 1.05x | 1.10x (1.02-1.18) | 1.10 | 1.20 | 1.000 |" in render(root, PARAMS).splitlines()


def test_peers_table_ratios_vs_genai_plain(tmp_path):
    page = render(artifacts(tmp_path), PARAMS).splitlines()
    # recorded ratios where the stage wrote them (with each round's spread), computed otherwise
    assert "| specrt/int4/pld | 44.0 | 2.0 | 1.000 | 1.10x (rounds 1.05-1.15) | 1.38x |" in page
    assert "| specrt/int4/baseline | 40.0 | 2.0 | 1.000 | 1.00x | 1.25x |" in page
    assert "| ort-genai/int4/plain | 40.0 | 4.0 | 0.900 | 1.00x | 1.25x |" in page
    assert "| ort-genai/int4/ngram | 32.0 | 4.0 | 0.900 | 0.80x | 1.00x |" in page


def test_quantize_and_lossless_tables(tmp_path):
    page = render(artifacts(tmp_path), PARAMS).splitlines()
    assert "| m | int4 | specrt_q4 | 100 | 16% | yes | 0/936 | 0.850 | 0.1250 | 24.0 | 96.0 | 4.00x |" in page
    assert "| method | m fp32 | m int4 |" in page
    assert "| pld | pass | FAIL: tree |" in page


def test_full_benchmark_heads_the_page(tmp_path):
    root = artifacts(tmp_path)
    full = benchmark(speedup_ci95=[1.08, 1.12])
    full["prompts"] = 480
    write(root, f"{MODEL}/full/benchmark-int4.json", full)
    text = render(root, PARAMS)
    assert text.index(f"`artifacts/{MODEL}/full/benchmark-int4.json`") < text.index(
        f"`artifacts/{MODEL}/benchmark-int4.json`)")
    assert "| pld | 1.05x | 1.10x (1.08-1.12) | 1.10 | 1.20 | 1.000 |" in text.splitlines()
    assert "No full-benchmark metrics" not in text
    assert "No full-benchmark metrics" in render(artifacts(tmp_path / "quick"), PARAMS)


def pair_bench(speedups: dict[str, float]) -> dict:
    return {"draft": "d", "draft_variant": "int4", "target": "t", "variant": "int4", "prompts": 12,
            "max_new_tokens": 64, "threads": None, "baseline": "cached",
            "runs": {"auto/chain/t1": bench_run(1.03, 1.06), "baseline/chain/t1": bench_run(1.0, 1.0)},
            "per_task": {"auto/chain/t1": {t: bench_run(x, 1.0) for t, x in speedups.items()},
                         "baseline/chain/t1": {t: bench_run(1.0, 1.0) for t in speedups}}}


def test_pair_tables_per_task_and_the_full_run_in_the_headline(tmp_path):
    root = artifacts(tmp_path)
    write(root, "pair/bench-int4.json", pair_bench({"rag": 1.02, "qa": 0.99}))
    write(root, "pair/full/bench-int4.json", pair_bench({"qa": 0.98, "translation": 1.1, "rag": 1.05}))
    text = render(root, {**PARAMS, "pair": {"target": "t", "variants": ["int4"]}})
    lines = text.splitlines()
    # per task in Spec-Bench's order, baseline no row; the full run's table heads the page
    assert "| run | translation | qa | rag |" in lines and "| auto/chain/t1 | 1.10x | 0.98x | 1.05x |" in lines
    assert "| run | qa | rag |" in lines and "| auto/chain/t1 | 0.99x | 1.02x |" in lines
    assert not any(line.startswith("| baseline/chain/t1 | 1.00x") for line in lines)
    heading = "### d (int4) drafting for t (int4) (`artifacts/pair/{}bench-int4.json`)"
    assert text.index(heading.format("full/")) < text.index("## Quick CI profile") < text.index(heading.format(""))


def test_missing_file_is_named(tmp_path):
    root = artifacts(tmp_path)
    (root / MODEL / "peers-int4.json").unlink()
    out = tmp_path / "results.md"
    params = tmp_path / "params.yaml"
    params.write_text(json.dumps(PARAMS))  # JSON is YAML
    assert main(["--artifacts", str(root), "--out", str(out), "--params", str(params)]) == 0
    text = out.read_text()
    missing = next(line for line in text.splitlines() if line.startswith("- Missing"))
    assert f"`artifacts/{MODEL}/peers-int4.json`" in missing
    assert f"`artifacts/{MODEL}/export.json`" in missing  # expected by params, never written here
    assert "ort-genai" not in text  # its table is left out
    assert "Do not edit by hand".lower() in text.lower() and "python -m pipeline.report" in text


def test_unreadable_file_is_named(tmp_path):
    root = artifacts(tmp_path)
    (root / MODEL / "int4.json").write_text("{not json")
    text = render(root, PARAMS)
    assert f"- Unreadable: `artifacts/{MODEL}/int4.json`" in text
    assert "| m | int4 | specrt_q4 |" not in text


def test_peers_table_has_llama_cpp_columns_only_when_the_run_had_it(tmp_path):
    root = artifacts(tmp_path)
    assert not any("vs llama.cpp plain" in line for line in render(root, PARAMS).splitlines())
    llama = {"llama.cpp/q4_k_m/plain": {"decode_tokens_per_s": 50.0, "prefill_s": 1.0, "token_match": 0.8},
             "llama.cpp/q4_k_m/prompt_lookup": {"decode_tokens_per_s": 80.0, "prefill_s": 1.5, "token_match": 0.8,
                                                "token_match_plain": 0.97}}
    write(root, f"{MODEL}/peers-int4.json", {**PEERS, "runs": {**PEERS["runs"], **llama},
                                             "ratios": {**PEERS["ratios"],
                                                        "specrt/int4/pld / llama.cpp/q4_k_m/plain": 0.88}})
    page = render(root, PARAMS).splitlines()
    assert ("| run | decode tok/s | prefill s | token match | vs genai plain | vs genai n-gram | vs llama.cpp plain "
            "| vs llama.cpp lookup | own plain |") in page
    # our ratios over llama.cpp: recorded (0.88) or computed (40 / 50, 44 / 80); its lookup against its own plain
    assert "| specrt/int4/pld | 44.0 | 2.0 | 1.000 | 1.10x (rounds 1.05-1.15) | 1.38x | 0.88x | 0.55x | - |" in page
    assert "| specrt/int4/baseline | 40.0 | 2.0 | 1.000 | 1.00x | 1.25x | 0.80x | 0.50x | - |" in page
    assert "| llama.cpp/q4_k_m/prompt_lookup | 80.0 | 1.5 | 0.800 | 2.00x | 2.50x | 1.60x | 1.00x | 0.970 |" in page
    assert any("llama.cpp (`q4_k_m`) runs the weights stage's GGUF" in line for line in page)
