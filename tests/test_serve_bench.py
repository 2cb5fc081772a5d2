"""scripts/serve_bench.py on a tiny artifact: a line per (method, clients), answers equal to baseline."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from scripts.serve_bench import main  # noqa: E402
from tests.helpers import specbench_questions, with_chat  # noqa: E402

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"  # the tiny model continues the user's text


def test_serve_bench_reports_each_method_and_client_count(tiny_chat_artifact, tmp_path, capsys):
    folder = with_chat(tiny_chat_artifact, tmp_path / "fp32", TEMPLATE)
    status = main([str(folder), "--prompts", str(specbench_questions(tmp_path / "question.jsonl")),
                   "--methods", "baseline,pld:tree", "--clients", "1,2", "--requests", "4", "--max-tokens", "16",
                   "--threads", "1", "--json", str(tmp_path / "rows.json")])
    out = capsys.readouterr().out
    assert status == 0 and out.strip().endswith("answers equal to baseline: True")
    lines = re.findall(r"^(baseline|pld tree) +(\d) clients: TTFT [\d.]+ s, decode [\d.]+ tok/s per request, "
                       r"[\d.]+ tok/s in all \(4 requests\)$", out, re.M)
    assert lines == [("baseline", "1"), ("baseline", "2"), ("pld tree", "1"), ("pld tree", "2")]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [(r["method"], r["clients"]) for r in rows] == [("baseline", 1), ("baseline", 2), ("pld tree", 1),
                                                           ("pld tree", 2)]
    assert all(r["median_ttft_s"] > 0 and r["aggregate_tokens_per_s"] > 0 for r in rows)


def test_serve_bench_needs_baseline_first(tmp_path):
    with pytest.raises(SystemExit):
        main(["m", "--prompts", "q.jsonl", "--methods", "pld"])


@pytest.mark.parametrize("keep", [False, True])
def test_serve_bench_starts_every_row_cold_unless_asked_to_keep_history(tiny_chat_artifact, tmp_path, monkeypatch,
                                                                        keep):
    import specrt

    forgotten = []
    monkeypatch.setattr(specrt.SpecModel, "forget_history", lambda self: forgotten.append(1))
    folder = with_chat(tiny_chat_artifact, tmp_path / "fp32", TEMPLATE)
    status = main([str(folder), "--prompts", str(specbench_questions(tmp_path / "question.jsonl")),
                   "--methods", "baseline,suffix_decoding", "--clients", "1,2", "--requests", "2",
                   "--max-tokens", "8", "--threads", "1"] + (["--keep-history"] if keep else []))
    assert status == 0
    assert len(forgotten) == (0 if keep else 4)  # before each (method, clients) row
