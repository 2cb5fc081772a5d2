"""The spec-safety verdict travels with the artifact: its basis, and the self-check where it does not reach."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

import specrt
from specrt.backend import verdict
from specrt.engine import spec_gate


def test_a_graph_without_row_dependent_kernels_is_exact_by_construction_on_the_cpu_only():
    exact = verdict.basis({"MatMulQ4", "SpecAttention", "SwiGLU", "GatherBlockQuantized", "Add"}, "cpu")
    assert exact["exactness"] == "by_construction" and exact["row_dependent_ops"] == []
    assert exact["provider"] == "cpu" and exact["cpu_features"] == list(verdict.cpu_features())
    measured = verdict.basis({"MatMulNBits", "MatMul", "SpecAttention"}, "cpu")
    assert measured["exactness"] == "measured" and measured["row_dependent_ops"] == ["MatMul", "MatMulNBits"]
    assert verdict.basis({"MatMulQ4"}, "cuda")["exactness"] == "measured"


def test_covers_by_construction_on_any_cpu_and_a_measurement_only_where_it_was_taken():
    exact = verdict.basis({"MatMulQ4"}, "cpu") | {"cpu_features": ["avx512f"], "onnxruntime": "0.1"}
    assert verdict.covers(exact, "cpu") and not verdict.covers(exact, "cuda")
    measured = verdict.basis({"MatMul"}, "cpu")
    assert verdict.covers(measured, "cpu")
    assert not verdict.covers(measured | {"cpu_features": ["avx512f", "avx512bw"]}, "cpu")
    assert not verdict.covers(measured | {"onnxruntime": "1.0.0"}, "cpu")
    assert not verdict.covers(measured | {"kernel_isa": "scalar" if measured["kernel_isa"] != "scalar" else "avx2"},
                              "cpu")
    assert not verdict.covers(None, "cpu") and not verdict.covers({}, "cpu")


def test_the_export_records_the_basis_of_its_gate(runtime_artifact):
    gate = specrt.load(runtime_artifact).manifest.checks["gate"]
    assert gate["basis"]["exactness"] == "measured" and "MatMul" in gate["basis"]["row_dependent_ops"]  # fp32 weights
    # covered on the machine that exported it (tests/test_export.py); these committed copies were exported elsewhere


def _moved(folder, tmp_path, basis):
    """A copy of the artifact whose gate basis says it was measured elsewhere (``basis``)."""
    copy = tmp_path / "moved"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["checks"]["gate"]["basis"] = basis
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def _measured_here(folder, tmp_path):
    """A copy of the artifact whose gate basis says it was measured on this machine, as a fresh export's."""
    return _moved(folder, tmp_path, verdict.basis({"MatMul"}, "cpu"))


def test_an_artifact_measured_elsewhere_is_self_checked_once_per_machine(runtime_artifact, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "cache"))
    elsewhere = verdict.basis({"MatMul"}, "cpu") | {"cpu_features": ["avx512f", "avx512bw"]}
    model = specrt.load(_moved(runtime_artifact, tmp_path, elsewhere))
    calls = []
    real = spec_gate.run_gate
    monkeypatch.setattr(spec_gate, "run_gate", lambda *a, **k: calls.append(1) or real(*a, **k))
    result = model.spec_safety()
    assert result.source == "self-check" and result.spec_safe  # the tiny fp32 graph is exact here
    assert result.report["positions"] > 0 and result.report["max_logit_diff"] == 0.0
    assert model.spec_safety() is result and len(calls) == 1
    again = specrt.load(model.folder).spec_safety()  # another process on this machine: from the cache
    assert again.spec_safe and again.report == result.report and len(calls) == 1
    assert len(list((tmp_path / "cache" / "selfcheck").iterdir())) == 1


def test_a_self_check_that_finds_disagreements_makes_speculation_warn(runtime_artifact, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "cache"))
    model = specrt.load(_moved(runtime_artifact, tmp_path, verdict.basis({"MatMul"}, "cuda")))
    report = {"spec_safe": False, "positions": 30, "disagreements": 2, "max_logit_diff": 0.5}
    monkeypatch.setattr(spec_gate, "run_gate", lambda *a, **k: dict(report))
    with caplog.at_level(logging.WARNING, logger="specrt.model"):
        model.generate("def add(a, b):", max_new_tokens=4, method="pld")
    assert not model.spec_safety().spec_safe
    assert "not spec-safe on this machine (self-check: 2 disagreements in 30 positions)" in caplog.text


def test_a_covered_manifest_verdict_is_used_without_a_self_check(runtime_artifact, tmp_path, monkeypatch):
    monkeypatch.setattr(spec_gate, "run_gate", lambda *a, **k: pytest.fail("self-check ran"))
    result = specrt.load(_measured_here(runtime_artifact, tmp_path)).spec_safety()
    assert result.source == "manifest" and result.spec_safe and result.report == {}


def test_cli_check_prints_the_verdict_and_exits_by_it(runtime_artifact, tmp_path, monkeypatch, capsys):
    from specrt.cli import main

    assert main(["check", "--model", str(_measured_here(runtime_artifact, tmp_path / "here"))]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["spec_safe"] and printed["source"] == "manifest" and printed["basis"]["exactness"] == "measured"
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "cache"))
    moved = _moved(runtime_artifact, tmp_path, verdict.basis({"MatMul"}, "cuda"))
    monkeypatch.setattr(spec_gate, "run_gate", lambda *a, **k: {"spec_safe": False, "positions": 30,
                                                                 "disagreements": 2, "max_logit_diff": 0.5})
    assert main(["check", "--model", str(moved)]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["source"] == "self-check" and printed["report"]["disagreements"] == 2
