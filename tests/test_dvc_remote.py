"""Artifacts shared through a DVC remote: a tiny DVC project whose one stage builds a specrt artifact
with the project's export (pipeline.export through tests/tiny.py), reproduced, pushed to a
local-folder remote, then cloned elsewhere and pulled. The clone must see the pipeline up to date
and its artifact must load and decode exactly as the original."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import specrt

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
pytest.importorskip("dvc", reason="dvc is not installed (pip install -e '.[build]')")

STAGE_SCRIPT = '''"""Stage: a tiny random Qwen2 through specrt's export, into the folder given."""
import sys
from pathlib import Path

from tests.tiny import build_tiny_artifact

build_tiny_artifact("qwen2", Path(sys.argv[1]) / "fp32")
'''

DVC_YAML = """stages:
  tiny:
    cmd: python build.py artifact
    deps:
      - build.py
    outs:
      - artifact
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")
    return env


def _run(cwd: Path, *cmd: str) -> str:
    if cmd[0] == "dvc":
        cmd = (sys.executable, "-m", "dvc", *cmd[1:])
    done = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed in {cwd} (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _tokens(folder: Path) -> list[list[int]]:
    model = specrt.load(folder, threads=1)
    prompts = [model.encode("def add(a, b):"), model.encode("The quick brown")]
    return [model.generate_ids(p, method="pld", max_new_tokens=12)[0].tolist() for p in prompts]


def test_an_artifact_pushed_to_a_remote_is_pulled_up_to_date_and_decodes_the_same(tmp_path):
    project, remote, clone = tmp_path / "project", tmp_path / "remote", tmp_path / "clone"
    project.mkdir()
    _run(project, "git", "init", "-q")
    _run(project, "dvc", "init", "-q")
    (project / "build.py").write_text(STAGE_SCRIPT)
    (project / "dvc.yaml").write_text(DVC_YAML)
    _run(project, "dvc", "repro")
    _run(project, "dvc", "remote", "add", "-d", "store", str(remote))
    _run(project, "git", "add", "-A")
    _run(project, "git", "commit", "-q", "-m", "tiny pipeline")
    _run(project, "dvc", "push")
    assert any(remote.rglob("*")), "dvc push left the remote empty"

    _run(tmp_path, "git", "clone", "-q", str(project), str(clone))
    assert not (clone / "artifact").exists()  # git carries the pipeline, not its outputs
    _run(clone, "dvc", "pull")
    assert json.loads(_run(clone, "dvc", "status", "--json")) == {}  # every stage up to date
    assert "Data and pipelines are up to date" in _run(clone, "dvc", "status")

    original, pulled = project / "artifact" / "fp32", clone / "artifact" / "fp32"
    assert sorted(p.name for p in pulled.iterdir()) == sorted(p.name for p in original.iterdir())
    want, got = _tokens(original), _tokens(pulled)
    assert got == want and all(len(t) > 0 for t in got)
    assert (pulled / "manifest.json").read_bytes() == (original / "manifest.json").read_bytes()
