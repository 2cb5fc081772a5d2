"""The tiny artifacts committed under tests/data/tiny (the runtime lane's models) are still what the
pipeline exports: a fresh build has the same contract, dims, tokenizer, chat template and
operator graph. Their weights are not compared: tests.tiny trains each model for a few Adam steps
on the CPU, and torch's float kernels differ between machines in the last bits (an AVX2 build and
an AVX-512 build differ by up to ~1e-4 per weight), which is why the runtime lane runs on the
committed copies rather than on fresh builds.

After a change to the export, ``python -m tests.tiny tests/data/tiny`` writes them again."""

from __future__ import annotations

import json

import onnx
import pytest

from tests.helpers import ARCHS, COMMITTED, COMMITTED_CHAT, QWEN25_CHAT_TEMPLATE
from tests.tiny import build_tiny_artifact

SAME = ("format", "name", "variant", "arch", "attention", "dims", "io", "eos_token_ids", "chat", "chat_template",
        "spec_safe", "producers")  # manifest fields a fresh build must repeat


def _graph(folder):
    """(op types in order, initializer names and shapes) of a decoder graph."""
    model = onnx.load(str(folder / "decoder.onnx"), load_external_data=False)
    return ([(n.domain, n.op_type) for n in model.graph.node],
            sorted((i.name, tuple(i.dims)) for i in model.graph.initializer))


@pytest.mark.parametrize("name", [*ARCHS, COMMITTED_CHAT])
def test_the_committed_artifact_is_what_the_export_builds(name, tmp_path):
    arch, template = ("qwen2", QWEN25_CHAT_TEMPLATE.read_text()) if name == COMMITTED_CHAT else (name, None)
    fresh, _ = build_tiny_artifact(arch, tmp_path / "fp32", chat_template=template)
    committed = COMMITTED / name
    got, want = (json.loads((f / "manifest.json").read_text()) for f in (fresh, committed))
    stale = [key for key in SAME if got.get(key) != want.get(key)]
    assert not stale, f"{committed} differs from a fresh export in {stale}: run `python -m tests.tiny {COMMITTED}`"
    assert sorted(got["files"]) == sorted(want["files"])
    for file in ("tokenizer.json", *([want["chat_template"]["file"]] if want["chat_template"] else [])):
        assert got["files"][file] == want["files"][file], file
    assert _graph(fresh) == _graph(committed)
