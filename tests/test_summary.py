"""pipeline.summary: the stage wall times it reads from the stage reports."""

import json
import os

from pipeline import summary


def _report(path, body, mtime):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    os.utime(path, (mtime, mtime))


def test_stage_times_lists_reports_with_stage_s_in_the_order_they_ran(tmp_path):
    _report(tmp_path / "m" / "export.json", {"stage_s": 120.5}, 100)
    _report(tmp_path / "m" / "weights.json", {"stage_s": 60.0}, 50)
    _report(tmp_path / "m" / "full" / "benchmark-int4.json", {"stage_s": 3600}, 300)
    _report(tmp_path / "pair" / "bench-int4.json", {"stage_s": 90.0}, 200)
    _report(tmp_path / "m" / "old.json", {"seconds": 5}, 60)  # no stage_s: not a timed stage report
    _report(tmp_path / "m" / "plot.json", [{"stage_s": 1}], 70)  # a list: a plot, not a report
    (tmp_path / "m" / "broken.json").write_text("{")
    assert summary.stage_times(tmp_path) == [
        ("m/weights.json", 60.0), ("m/export.json", 120.5), ("pair/bench-int4.json", 90.0),
        ("m/full/benchmark-int4.json", 3600.0),
    ]


def test_time_lines_give_minutes_and_the_sum():
    assert summary.time_lines([("m/weights.json", 60.0), ("m/export.json", 150.0)]) == [
        "m/weights.json    1.0 min",
        "m/export.json     2.5 min",
        "total             3.5 min",
    ]
