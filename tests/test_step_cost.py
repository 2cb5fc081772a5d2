"""scripts/step_cost.py on a tiny artifact and onnxruntime-genai's build of the same checkpoint:
one median step per graph and cache length, the first graph the unit."""

import re

from scripts.step_cost import main, step_cost


def test_specrt_and_genai_graphs_are_timed_at_every_cache_length(tiny_qwen2, tiny_qwen2_genai, capsys):
    artifact, _ = tiny_qwen2
    got = step_cost([artifact, tiny_qwen2_genai], [5, 40], threads=1, block=2, rounds=2)
    assert list(got) == [5, 40]
    for by_folder in got.values():
        assert list(by_folder) == [str(artifact), str(tiny_qwen2_genai)]
        assert all(ms > 0 for ms in by_folder.values())

    main([str(artifact), str(tiny_qwen2_genai), "--past", "10", "--threads", "1", "--block", "1", "--rounds", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert re.fullmatch(rf"past 10: {re.escape(str(artifact))}: [\d.]+ ms \(x1\.000 of the first\)", lines[0])
    assert re.fullmatch(rf"past 10: {re.escape(str(tiny_qwen2_genai))}: [\d.]+ ms \(x[\d.]+ of the first\)", lines[1])
