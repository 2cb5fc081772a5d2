"""The default model built by `dvc repro` (README's first command): pld == baseline on real text, on
the exported artifact and on the weights stage's Hugging Face folder (the transformers backend).

Skipped when the artifact has not been built, unless SPECRT_REQUIRE_REAL=1 (CI sets it, after
running `dvc repro`), in which case a missing artifact fails the test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import specrt

DEFAULT = Path(__file__).resolve().parents[1] / "artifacts" / "qwen2.5-coder-0.5b-instruct" / "fp32"
ARTIFACT = Path(os.environ.get("SPECRT_REAL_ARTIFACT", DEFAULT))

PROMPTS = [
    ("def add(a, b):", False),
    ("Repeat this sentence exactly: The cat sat on the mat because the mat was warm.", True),
    ("Rename the variable x to total in this code:\n\nx = 0\nfor i in range(10):\n    x += i\nprint(x)\n", True),
]


@pytest.fixture(scope="module")
def model():
    if not (ARTIFACT / "manifest.json").is_file():
        if os.environ.get("SPECRT_REQUIRE_REAL") == "1":
            pytest.fail(f"{ARTIFACT}: default artifact missing; run `dvc repro` first")
        pytest.skip(f"{ARTIFACT} not built (run `dvc repro`)")
    return specrt.load(ARTIFACT, check_hashes=False)


def test_real_model_pld_chain_and_tree_equal_baseline(model):
    accepted = 0
    for prompt, chat in PROMPTS:
        base = model.generate(prompt, chat=chat, method="baseline", max_new_tokens=32)
        assert len(base.token_ids) > 0
        for tree in (False, True):
            spec = model.generate(prompt, chat=chat, method="pld", tree=tree, max_new_tokens=32, backoff=False)
            assert spec.token_ids == base.token_ids, (prompt, tree)
            accepted += spec.stats["accepted"]
            guarded = model.generate(prompt, chat=chat, method="pld", tree=tree, max_new_tokens=32)  # back-off on
            assert guarded.token_ids == base.token_ids, (prompt, tree, "backoff")
    assert accepted > 0  # copying prompts: prompt lookup must get some drafts accepted


def test_real_model_hf_folder_on_the_transformers_backend_equals_plain_decoding():
    """The weights stage's folder (config, tokenizer, gguf.json naming the GGUF) through the hf
    backend: speculation equals plain decoding of the same torch model, chain and tree."""
    folder = ARTIFACT.parent / "hf"
    if not (folder / "config.json").is_file():
        if os.environ.get("SPECRT_REQUIRE_REAL") == "1":
            pytest.fail(f"{folder}: the weights stage's folder is missing; run `dvc repro` first")
        pytest.skip(f"{folder} not built (run `dvc repro`)")
    pytest.importorskip("torch", reason="the hf backend needs torch (the hf extra)")
    model = specrt.load(folder, backend="hf")
    prompt, chat = PROMPTS[1]
    base = model.generate(prompt, chat=chat, method="baseline", max_new_tokens=12)
    assert len(base.token_ids) > 0
    accepted = 0
    for tree in (False, True):  # (the GGUF's load takes most of this test: one method)
        spec = model.generate(prompt, chat=chat, method="pld", tree=tree, max_new_tokens=12, backoff=False)
        assert spec.token_ids == base.token_ids, tree
        accepted += spec.stats["accepted"]
    assert accepted > 0  # a copying prompt: the drafts must be taken
