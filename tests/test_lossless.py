"""Lossless tier: on tiny models of every architecture, speculative output == plain decoding."""

from __future__ import annotations

import numpy as np
import pytest

import specrt
from pipeline.lossless import compare_methods, first_divergence
from tests.helpers import PROMPTS


@pytest.fixture(scope="module")
def model(tiny_artifact):
    return specrt.load(tiny_artifact[0])


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_the_portable_export_is_bit_exact_with_baseline_too(portable_artifact, tree):
    portable = specrt.load(portable_artifact[0])
    assert portable.manifest.attention == "portable" and portable.graph.key_block == 128
    for prompt in PROMPTS:
        base = portable.generate(prompt, method="baseline", max_new_tokens=40)
        spec = portable.generate(prompt, method="pld", tree=tree, max_new_tokens=40, draft_budget=8)
        assert spec.token_ids == base.token_ids, prompt


def test_pld_accepts_drafts_on_repetitive_text(model):
    # the tiny models memorised their training text: copying from the prompt must pay off
    accepted = [model.generate(p, method="pld", max_new_tokens=40, backoff=False).stats["accepted"] for p in PROMPTS]
    assert sum(accepted) > 10


def test_regression_stage_core_reports_identical(model):
    prompts = [model.encode(p) for p in PROMPTS[:3]]
    report = compare_methods(model, prompts, ["pld"], max_new_tokens=24, draft_budget=6)
    assert report["lossless"]
    assert set(report["runs"]) == {"pld/chain", "pld/tree"}
    assert all(r["token_match"] == 1.0 for r in report["runs"].values())


def test_first_divergence():
    assert first_divergence(np.array([1, 2, 3]), np.array([1, 2, 3])) is None
    assert first_divergence(np.array([1, 5, 3]), np.array([1, 2, 3])) == 1
    assert first_divergence(np.array([1, 2]), np.array([1, 2, 3])) == 2  # shorter output diverges at its end


def test_stops_exactly_where_plain_decoding_stops(model):
    # max_new_tokens cuts an accepted draft mid-way; EOS ends early with the EOS token kept
    for prompt in PROMPTS:
        full = model.generate(prompt, method="baseline", max_new_tokens=40)
        for n in (1, 2, 5, 13):
            cut = model.generate(prompt, method="pld", tree=True, max_new_tokens=n)
            assert cut.token_ids == full.token_ids[:n]
        if full.finish_reason == "eos":
            assert full.token_ids[-1] in model.manifest.eos_token_ids
            assert model.generate(prompt, method="pld", max_new_tokens=200).token_ids == full.token_ids


def test_streaming_yields_the_same_text(model):
    for prompt in PROMPTS[:3]:
        pieces = list(model.stream(prompt, method="pld", tree=True, max_new_tokens=30))
        assert "".join(pieces) == model.generate(prompt, method="baseline", max_new_tokens=30).text


def test_long_prompt_prefilled_in_chunks_matches(model):
    prompt = " ".join(PROMPTS)  # > 100 tokens: several prefill chunks, far past Gemma's window
    ids = model.encode(prompt)
    base, _ = model.generate_ids(ids, method="baseline", max_new_tokens=20)
    spec, _ = model.generate_ids(ids, method="pld", tree=True, max_new_tokens=20, prefill_chunk=16)
    assert len(ids) > 100 and spec.tolist() == base.tolist()
