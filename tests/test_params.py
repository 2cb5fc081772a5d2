"""pipeline.lib.params: the section of params.yaml a stage run reads, and its errors."""

import pytest
import yaml

from pipeline.lib.params import stage_params


def test_stage_params_gives_the_named_section(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"benchmark": {"max_new_tokens": 64}, "benchmark_full": {"max_new_tokens": 128}}))
    assert stage_params(path, "benchmark") == {"max_new_tokens": 64}
    assert stage_params(path, "benchmark_full") == {"max_new_tokens": 128}


@pytest.mark.parametrize("text, words", [
    ("benchmark: {a: 1}\nmodels: [x]\n", ["params.yaml", "'peers_full'", "sections: benchmark"]),
    ("peers_full: 3\n", ["'peers_full'", "sections: "]),  # not a mapping
    ("[1, 2]\n", ["'peers_full'", "sections: none"]),
    ("a: [\n", ["cannot read"]),
])
def test_a_missing_or_malformed_section_is_named(tmp_path, text, words):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as info:
        stage_params(path, "peers_full")
    assert all(w in str(info.value) for w in words), str(info.value)


def test_the_repository_params_have_every_section_the_pipelines_read():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for section in ("benchmark", "benchmark_full", "peers", "peers_full", "lossless", "lossless_full"):
        assert isinstance(stage_params(root / "params.yaml", section), dict)
    assert stage_params(root / "params.yaml", "benchmark")["max_new_tokens"] >= 64  # the quick run's floor
