"""Tiny random models of each supported architecture, exported by the pipeline's own code (the
torch lane's builders; the texts and tokenizer they share with the runtime lane are in tests/helpers.py).

Vocabulary: a byte-level BPE of 320 tokens trained in-process; models: 2 layers, hidden 64.
Gemma 3 gets a sliding window of 8 so that every test prompt is longer than the window.

    python -m tests.tiny tests/data/tiny

writes the tiny artifacts the runtime lane (tests/runtime) runs on, which needs no torch: one per
architecture and a Qwen2 one with Qwen2.5's chat template. tests/test_tiny_committed.py checks
that they are still what this module exports (contract, dims, operators).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from pipeline.export import build_artifact
from tests.helpers import (
    ARCHS,
    COMMITTED_CHAT,
    EOS,
    GEMMA_WINDOW,
    QWEN25_CHAT_TEMPLATE,
    TRAINING_TEXT,
    tiny_tokenizer,
)


def tiny_model(arch: str, vocab: int, eos_id: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=eos_id,
    )
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "gemma3":
        config = Gemma3TextConfig(
            **common, head_dim=16, sliding_window=GEMMA_WINDOW, layer_types=["sliding_attention", "full_attention"]
        )
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(arch)
    return model.eval()


def memorize(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, steps: int = 120) -> torch.nn.Module:
    """A few Adam steps on TRAINING_TEXT, so greedy output repeats text seen before (drafts get accepted)."""
    batch = [torch.tensor(tokenizer(t + EOS)["input_ids"]) for t in TRAINING_TEXT]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        ids = batch[step % len(batch)][None]
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def build_tiny_artifact(
    arch: str, out: Path, attention: str = "specrt", chat_template: str | None = None
) -> tuple[Path, torch.nn.Module]:
    """An fp32 artifact folder for a tiny ``arch`` model, through pipeline.export.build_artifact
    (``attention``: export.attention, "specrt" or "portable"; ``chat_template``: the tokenizer's
    Jinja chat template, none by default)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer_json = tiny_tokenizer(out.parent / f"{arch}-tokenizer.json")
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token=EOS)
    hf_tok.chat_template = chat_template
    model = memorize(tiny_model(arch, hf_tok.vocab_size, hf_tok.eos_token_id), hf_tok)
    check_ids = np.random.default_rng(0).integers(0, hf_tok.vocab_size, 40)
    build_artifact(
        model, hf_tok, tokenizer_json, out, name=f"tiny-{arch}", max_context=256, opset=20,
        check_ids=check_ids, tolerance=1e-3, prefill_chunk=16, attention=attention,
    )
    return out, model


# Hugging Face Qwen2 parameter names -> GGUF tensor names (llama.cpp's convention).
GGUF_QWEN2_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
GGUF_QWEN2_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def tiny_gguf(model: torch.nn.Module, tokenizer_json: Path, path: Path) -> Path:
    """Write a Qwen2 ``model`` (float32 tensors) and its byte-level BPE ``tokenizer_json`` as a GGUF
    that transformers loads back (``gguf_file=``) to the same logits and token ids."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    bpe = json.loads(Path(tokenizer_json).read_text())["model"]
    tokens = sorted(bpe["vocab"], key=bpe["vocab"].get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t == EOS else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]])
    writer.add_eos_token_id(bpe["vocab"][EOS])
    writer.add_add_bos_token(False)
    for name, tensor in model.state_dict().items():
        module, kind = name.rsplit(".", 1)
        if module == "lm_head" and config.tie_word_embeddings:
            continue
        if module.startswith("model.layers."):
            layer, sub = module[len("model.layers."):].split(".", 1)
            gguf_name = f"blk.{layer}.{GGUF_QWEN2_LAYER_NAMES[sub]}.{kind}"
        else:
            gguf_name = f"{GGUF_QWEN2_NAMES[module]}.{kind}"
        writer.add_tensor(gguf_name, tensor.detach().float().numpy().copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_committed(out: Path) -> list[Path]:
    """The runtime lane's tiny artifacts under ``out``: one folder per arch of ARCHS, and
    COMMITTED_CHAT (Qwen2 with Qwen2.5's chat template). Each is replaced whole."""
    builds = [(arch, arch, None) for arch in ARCHS] + [(COMMITTED_CHAT, "qwen2", QWEN25_CHAT_TEMPLATE.read_text())]
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, arch, template in builds:
            folder, _ = build_tiny_artifact(arch, Path(tmp) / name / "fp32", chat_template=template)
            shutil.rmtree(out / name, ignore_errors=True)
            written.append(Path(shutil.copytree(folder, out / name)))
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.tiny OUT_FOLDER (tests/data/tiny: the runtime lane's artifacts)")
    for folder in write_committed(Path(sys.argv[1])):
        print(folder)
