"""scripts/gpu_bench.py on the CPU provider (the same report gpu_check.sh takes on a GPU): every run
is timed and matches plain decoding, with the KV cache in numpy and on the device."""

import json

import pytest

from scripts.gpu_bench import bench_provider, main


def test_the_report_holds_every_run_of_every_provider_and_they_are_lossless(tiny_qwen2, tmp_path):
    artifact, _ = tiny_qwen2
    out = tmp_path / "bench.json"
    status = main(["--artifact", str(artifact), "--providers", "cpu", "cpu+device", "--max-new-tokens", "16",
                   "--rounds", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert status == 0 and report["lossless"] is True
    assert list(report["providers"]) == ["cpu", "cpu+device"]
    assert report["providers"]["cpu"]["device_cache"] is False
    assert report["providers"]["cpu+device"]["device_cache"] is True
    for provider in report["providers"].values():
        runs = provider["runs"]
        assert list(runs) == ["baseline/chain", "pld/chain", "pld/tree"]
        assert runs["baseline/chain"]["speedup"] == 1.0 and runs["baseline/chain"]["accepted"] == 0
        assert runs["baseline/chain"]["tokens_per_step"] == 1.0
        for run in runs.values():
            assert run["lossless"] is True and run["decode_tokens_per_s"] > 0 and run["tokens_per_step"] >= 1.0


def test_an_unknown_cache_placement_is_refused_by_name(tiny_qwen2):
    with pytest.raises(ValueError, match=r"provider 'cpu\+gpu': the cache placement after '\+' must be"):
        bench_provider(tiny_qwen2[0], "cpu+gpu", max_new_tokens=4, rounds=1)
