"""The torch lane's fixtures: tiny models built in-process by the pipeline's own export
(tests/tiny.py, imported inside the fixtures so that the runtime lane, tests/runtime, collects
without torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import ARCHS, EOS, QWEN25_CHAT_TEMPLATE


@pytest.fixture(scope="session", params=ARCHS)
def tiny_artifact(request, tmp_path_factory):
    """(artifact folder, torch model) of a tiny random model, one per architecture."""
    from tests.tiny import build_tiny_artifact

    root = tmp_path_factory.mktemp(f"tiny-{request.param}")
    return build_tiny_artifact(request.param, root / "fp32")


@pytest.fixture(scope="session", params=ARCHS)
def portable_artifact(request, tmp_path_factory):
    """(artifact folder, torch model) of the same tiny models, exported with ``attention="portable"``
    (standard and com.microsoft operators only, no SpecAttention)."""
    from tests.tiny import build_tiny_artifact

    root = tmp_path_factory.mktemp(f"tiny-portable-{request.param}")
    return build_tiny_artifact(request.param, root / "fp32", attention="portable")


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> tuple[Path, Path]:
    """(specrt artifact folder, Hugging Face checkpoint folder) of one tiny random Qwen2 (head size
    16, as onnxruntime-genai's CPU rotary needs): what the measurement tools in scripts/ run on."""
    from transformers import PreTrainedTokenizerFast

    from tests.tiny import build_tiny_artifact

    root = tmp_path_factory.mktemp("tiny-qwen2-tools")
    artifact, model = build_tiny_artifact("qwen2", root / "fp32")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(root / "qwen2-tokenizer.json"), eos_token=EOS)
    model.save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    return artifact, root / "hf"


@pytest.fixture(scope="session")
def tiny_qwen2_genai(tiny_qwen2, tmp_path_factory) -> Path:
    """onnxruntime-genai's fp32 model folder of :func:`tiny_qwen2`'s checkpoint."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    from pipeline.lib import genai_peer

    out = tmp_path_factory.mktemp("tiny-qwen2-genai") / "fp32"
    genai_peer.build_genai(tiny_qwen2[1], out, "fp32")
    return out


@pytest.fixture(scope="session")
def tiny_chat_artifact(tmp_path_factory) -> Path:
    """A tiny Qwen2 artifact exported with Qwen2.5's chat template (tests/data, the default model's)."""
    from tests.tiny import build_tiny_artifact

    root = tmp_path_factory.mktemp("tiny-chat")
    folder, _ = build_tiny_artifact("qwen2", root / "fp32", chat_template=QWEN25_CHAT_TEMPLATE.read_text())
    return folder

