"""scripts/window_cost.py on a tiny artifact: one figure per window size, the cost of a single step
as the unit, and windows that do not fit the artifact refused by name."""

import re

import pytest

from scripts.window_cost import main, window_cost


def test_every_size_of_every_artifact_is_timed_and_printed_against_a_single_step(tiny_qwen2, capsys):
    artifact, _ = tiny_qwen2
    best = window_cost([artifact], past=20, sizes=[1, 2, 4], repeats=2, rounds=2, threads=1)
    assert list(best) == [str(artifact)]
    assert list(best[str(artifact)]) == [1, 2, 4]
    assert all(ms > 0 for ms in best[str(artifact)].values())

    main([str(artifact), "--past", "20", "--sizes", "1", "3", "--repeats", "1", "--rounds", "1",
          "--threads", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    pattern = rf"{re.escape(str(artifact))}: s=1: [\d.]+ ms \(1\.00x\), s=3: [\d.]+ ms \(([\d.]+)x\)"
    match = re.fullmatch(pattern, lines[0])
    assert match, lines[0]
    assert float(match.group(1)) > 0


def test_a_window_beyond_the_artifacts_context_is_an_error_naming_it(tiny_qwen2):
    artifact, _ = tiny_qwen2
    with pytest.raises(ValueError, match=r"past 250 \+ window 16 exceeds its max_context 256"):
        window_cost([artifact], past=250, sizes=[1, 16])
    with pytest.raises(ValueError, match="must be >= 1"):
        window_cost([artifact], past=20, sizes=[0, 2])
