"""scripts/project_speedup.py on a tiny artifact: answers recorded once and replayed from the
records file to the same table, and the copy oracle's ceilings above what a copy drafter got."""

import re

import pytest

from scripts.project_speedup import main
from tests.helpers import specbench_questions

COST = ["1:10", "2:11", "4:13", "8:18"]  # ms by window size: a window of 5 costs 1.25 single steps


def _table(out: str) -> dict[str, list[str]]:
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| run ")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)}


def test_records_replay_to_the_same_table_and_the_oracle_bounds_the_copy_drafter(tiny_qwen2, tmp_path, capsys):
    artifact, _ = tiny_qwen2
    records = tmp_path / "records.json"
    argv = [str(artifact), "--prompts", str(specbench_questions(tmp_path / "question.jsonl")), "--per-task", "1",
            "--max-new-tokens", "24", "--threads", "1", "--records", str(records), "--cost", *COST,
            "--methods", "pld", "--budget", "4", "--anchors", "0", "1"]
    main(argv)
    first = capsys.readouterr().out
    assert len(re.findall(r"^recorded \w+ question \d+: \d+ prompt tokens, \d+ new$", first, re.M)) == 6
    assert records.exists()
    main(argv)  # the records exist now: nothing runs the model
    again = capsys.readouterr().out
    assert "recorded" not in again
    table = _table(first)
    assert table == _table(again)
    assert list(table) == ["pld/chain", "pld/chain/no-backoff", "pld/tree", "pld/tree/no-backoff",
                           "copy oracle, anywhere (ceiling)", "copy oracle, after the last 1 (ceiling)"]
    overall = {name: float(cells[-3].rstrip("x")) for name, cells in table.items()}  # the "all" column
    # the oracle may copy from anywhere: no copy drafter with the same budget and costs beats it
    for name in ("pld/chain", "pld/chain/no-backoff", "pld/tree", "pld/tree/no-backoff",
                 "copy oracle, after the last 1 (ceiling)"):
        assert overall[name] <= overall["copy oracle, anywhere (ceiling)"], name
    assert overall["copy oracle, anywhere (ceiling)"] >= 1.0  # plain decoding is always a path


def test_a_cost_curve_without_the_single_step_is_refused(tmp_path):
    artifact = tmp_path / "artifact"  # never loaded: the curve is read first
    with pytest.raises(SystemExit, match="needs the single-step time"):
        main([str(artifact), "--prompts", str(tmp_path / "q.jsonl"), "--cost", "2:11", "4:13"])
    with pytest.raises(SystemExit, match="expected SIZE:MILLISECONDS pairs such as 4:52.5, got '4=13'"):
        main([str(artifact), "--prompts", str(tmp_path / "q.jsonl"), "--cost", "1:10", "4=13"])
