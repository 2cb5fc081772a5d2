"""dvc.yaml's stages declare what their commands read: DVC reruns a stage only when a dependency
changes, so a file read but not listed goes stale silently."""

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SPECBENCH = "../shared/data/specbench/question.jsonl"


def _stages() -> dict[str, dict]:
    """Every stage of dvc.yaml, foreach/matrix templates as written (their ``do`` body)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    return {name: stage.get("do", stage) for name, stage in stages.items()}


@pytest.mark.parametrize("name", sorted(_stages()))
def test_a_stage_lists_its_module_and_the_spec_bench_file_when_its_command_reads_them(name):
    stage = _stages()[name]
    cmd, deps = stage["cmd"].split(), stage.get("deps", [])
    module = cmd[cmd.index("-m") + 1]  # python -m pipeline.<stage>
    assert f"{module.replace('.', '/')}.py" in deps, f"{name}: its script {module} is not in deps"
    if SPECBENCH in cmd:
        assert SPECBENCH in deps, f"{name}: reads {SPECBENCH} but does not list it in deps"

