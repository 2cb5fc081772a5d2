"""scripts/op_profile.py's reading of an onnxruntime profile (per decode step, the prompt's pass and
the warm-up steps left out, node events outside the kept runs ignored), and a real profile of a
tiny artifact beside onnxruntime-genai's build of the same checkpoint."""

import pytest

from scripts.op_profile import main, make_parser, profile_pair, summarise


def _run(ts: int, dur: int) -> dict:
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}


def _node(ts: int, dur: int, op: str) -> dict:
    return {"cat": "Node", "name": f"n_{op}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_per_step_figures_leave_out_the_prompt_and_warm_up():
    events = [
        _run(0, 1000), _node(10, 900, "MatMulNBits"),  # the prompt's pass
        _run(2000, 500), _node(2010, 400, "MatMulNBits"),  # warm-up step, skipped
        _run(3000, 100), _node(3010, 60, "MatMulNBits"), _node(3080, 10, "Reshape"),
        {"cat": "Node", "name": "n_Reshape_fence_before", "ts": 3070, "dur": 0, "args": {"op_name": "Reshape"}},
        _run(4000, 140), _node(4010, 80, "MatMulNBits"), _node(4100, 20, "Reshape"),
        _node(5000, 999, "Add"),  # between runs (e.g. a session-level event): not a decode step's
    ]
    got = summarise(events, skip=1)
    assert got["steps"] == 2
    assert got["run_ms"] == pytest.approx(0.120)  # (100 + 140) / 2 us
    assert got["kernels_ms"] == pytest.approx(0.085)  # (60 + 10 + 80 + 20) / 2
    assert got["gaps_ms"] == pytest.approx(0.035)
    assert got["nodes"] == 2.0
    assert got["by_op_ms"] == pytest.approx({"MatMulNBits": 0.070, "Reshape": 0.015})
    assert list(got["by_op_ms"]) == ["MatMulNBits", "Reshape"]  # largest first


def test_more_than_one_prompt_pass_is_left_out_when_asked():
    events = [_run(0, 1000), _run(2000, 900), _run(3000, 100), _node(3010, 60, "MatMulNBits")]
    got = summarise(events, skip=0, lead=2)
    assert (got["steps"], got["run_ms"], got["kernels_ms"]) == (1, pytest.approx(0.1), pytest.approx(0.06))


def test_nothing_left_after_skipping_is_an_error_naming_the_counts():
    with pytest.raises(ValueError, match=r"holds 2 runs; nothing left after 1 prompt pass\(es\) and 1 skipped"):
        summarise([_run(0, 10), _run(20, 10)], skip=1)


def test_a_real_profile_of_both_graphs_counts_the_decode_steps_only(tiny_qwen2, tiny_qwen2_genai, capsys):
    # each graph in its own worker process: a prompt, 10 steps, the first 3 left out
    artifact, _ = tiny_qwen2
    argv = [str(artifact), str(tiny_qwen2_genai), "--threads", "1", "--prompt-tokens", "8", "--new", "10",
            "--skip", "3"]
    result = profile_pair(make_parser().parse_args(argv))
    for subject in ("specrt", "genai"):
        got = result[subject]
        assert got["steps"] == 7, subject  # the prompt pass(es) and the skipped steps are not steps
        assert got["nodes"] > 0 and 0 < got["kernels_ms"] <= got["run_ms"]
        assert got["gaps_ms"] == pytest.approx(got["run_ms"] - got["kernels_ms"])
        assert sum(got["by_op_ms"].values()) == pytest.approx(got["kernels_ms"])
    assert "MatMul" in result["specrt"]["by_op_ms"]

    main([*argv, "--top", "2"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["specrt", "genai"]
    assert [line.split()[0] for line in lines[1:5]] == ["run_ms", "kernels_ms", "gaps_ms", "nodes"]
    assert len(lines) == 1 + 4 + 2 + 1 and lines[-1].startswith("(other ops)")
