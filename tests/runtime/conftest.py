"""The runtime lane's fixtures: copies of the tiny artifacts committed under tests/data/tiny
(written by ``python -m tests.tiny tests/data/tiny``), so that these tests need no torch."""

from __future__ import annotations

from pathlib import Path

import pytest

import specrt
from tests.helpers import ARCHS, COMMITTED_CHAT, committed_artifact


@pytest.fixture(scope="session", params=ARCHS)
def runtime_artifact(request, tmp_path_factory) -> Path:
    """A tiny random model's artifact folder, one per architecture."""
    return committed_artifact(request.param, tmp_path_factory.mktemp(f"runtime-{request.param}") / "fp32")


@pytest.fixture(scope="session")
def runtime_qwen2(tmp_path_factory) -> Path:
    """The tiny Qwen2 artifact alone."""
    return committed_artifact("qwen2", tmp_path_factory.mktemp("runtime-qwen2") / "fp32")


@pytest.fixture(scope="session")
def runtime_chat_artifact(tmp_path_factory) -> Path:
    """The tiny Qwen2 artifact exported with Qwen2.5's chat template (tests/data, the default model's)."""
    return committed_artifact(COMMITTED_CHAT, tmp_path_factory.mktemp("runtime-chat") / "fp32")


@pytest.fixture(scope="module")
def model(runtime_artifact) -> specrt.SpecModel:
    """The runtime artifact loaded once per test module (a module that needs other options defines its own)."""
    return specrt.load(runtime_artifact)
