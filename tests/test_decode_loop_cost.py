"""scripts/decode_loop_cost.py on a tiny artifact and onnxruntime-genai's build of the same
checkpoint: every subject runs in its own worker process and reports ms per token."""

import re

from scripts.decode_loop_cost import SUBJECTS, loop_costs, main, make_parser


def test_every_subject_reports_seconds_per_token_of_each_repeat(tiny_qwen2, tiny_qwen2_genai, capsys):
    artifact, _ = tiny_qwen2
    argv = [str(artifact), str(tiny_qwen2_genai), "--threads", "1", "--prompt-tokens", "8", "--new", "12",
            "--repeats", "2", "--rounds", "1"]
    got = loop_costs(make_parser().parse_args(argv))
    assert list(got) == list(SUBJECTS)
    for subject, seconds in got.items():
        assert len(seconds) == 2 and all(0 < s < 1 for s in seconds), (subject, seconds)

    main(argv)
    line = capsys.readouterr().out.strip()
    cells = ", ".join(rf"{subject} [\d.]+" for subject in SUBJECTS)
    assert re.fullmatch(rf"round 1: {cells} ms/token", line), line
