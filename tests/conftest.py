from __future__ import annotations

import pytest

from tests.tiny import ARCHS, build_tiny_artifact


@pytest.fixture(scope="session", params=ARCHS)
def tiny_artifact(request, tmp_path_factory):
    """(artifact folder, torch model) of a tiny random model, one per architecture."""
    root = tmp_path_factory.mktemp(f"tiny-{request.param}")
    return build_tiny_artifact(request.param, root / "fp32")


@pytest.fixture(scope="session", params=ARCHS)
def portable_artifact(request, tmp_path_factory):
    """(artifact folder, torch model) of the same tiny models, exported with ``attention="portable"``
    (standard and com.microsoft operators only, no SpecAttention)."""
    root = tmp_path_factory.mktemp(f"tiny-portable-{request.param}")
    return build_tiny_artifact(request.param, root / "fp32", attention="portable")
