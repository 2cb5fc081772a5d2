"""A tiny target / draft pair for draft-model speculative decoding, exported by the pipeline's code.

target: ``tests.tiny``'s qwen2 (2 layers, hidden 64, seed 0, 120 memorising steps), built by
``build_tiny_artifact``. draft: a smaller qwen2 (1 layer, hidden 32, seed 1) trained for
``DRAFT_STEPS`` steps on the same text: it agrees with the target on much of the memorised text,
not everywhere. Both share tests.tiny's tokenizer (vocabulary 320).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from pipeline.export import build_artifact
from tests.helpers import EOS, tiny_tokenizer
from tests.tiny import build_tiny_artifact, memorize

DRAFT_STEPS = 60


def tiny_draft_model(vocab: int, eos_id: int, seed: int = 1) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, eos_token_id=eos_id, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


def build_tiny_pair(root: Path) -> tuple[Path, Path]:
    """fp32 artifact folders (target, draft) under ``root``."""
    target, _ = build_tiny_artifact("qwen2", root / "target" / "fp32")
    draft = root / "draft" / "fp32"
    draft.parent.mkdir(parents=True, exist_ok=True)
    tokenizer_json = tiny_tokenizer(draft.parent / "tokenizer.json")
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token=EOS)
    model = memorize(tiny_draft_model(hf_tok.vocab_size, hf_tok.eos_token_id), hf_tok, steps=DRAFT_STEPS)
    check_ids = np.random.default_rng(0).integers(0, hf_tok.vocab_size, 40)
    build_artifact(
        model, hf_tok, tokenizer_json, draft, name="tiny-qwen2-draft", max_context=256, opset=20,
        check_ids=check_ids, tolerance=1e-3, prefill_chunk=16,
    )  # fmt: skip
    return target, draft
