"""scripts/prefix_cache_bench.py on a tiny artifact: a neighbour behind the same system prompt
lends whole chunks of it, a repeated prompt comes whole from the cache, and no output changes."""

import re

from scripts.prefix_cache_bench import main
from tests.helpers import specbench_questions


def test_cached_prefixes_shorten_prefill_and_leave_the_output_unchanged(tiny_qwen2, tmp_path, capsys):
    artifact, _ = tiny_qwen2
    status = main([str(artifact), "--prompts", str(specbench_questions(tmp_path / "question.jsonl")),
                   "--questions", "2", "--system-tokens", "64", "--max-new-tokens", "8", "--threads", "1",
                   "--method", "pld", "--prefill-chunk", "16"])
    out = capsys.readouterr().out
    assert status == 0
    assert out.strip().endswith("outputs equal to the cold runs: True")
    cases = re.findall(r"^(shared|repeat) +(\d+) prompt tokens, (\d+) from the cache, prefill [\d.]+ s$", out, re.M)
    assert [c[0] for c in cases] == ["shared", "repeat"] * 2  # two questions, each after its neighbour
    for (_, n_shared, shared), (_, n_repeat, repeat) in zip(cases[::2], cases[1::2], strict=True):
        assert n_shared == n_repeat
        assert int(shared) >= 64 and int(shared) % 16 == 0  # whole passes: the system prompt's 4, at least
        assert int(shared) < int(repeat) <= int(n_repeat)  # the repeated prompt: (nearly) all of it
    for case in ("cold", "shared", "repeat"):
        assert re.search(rf"^{case} +median prefill [\d.]+ s over 2 prompts$", out, re.M), case
