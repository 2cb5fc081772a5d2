"""The weights stage's checkpoint folder: config and tokenizer beside a pointer to the GGUF that
keeps the weights (pipeline/lib/checkpoint.py), on a tiny Qwen2 written as a float32 GGUF."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from pipeline import weights
from pipeline.lib import checkpoint
from tests.helpers import EOS, PROMPTS, tiny_tokenizer
from tests.tiny import tiny_gguf, tiny_model

CHECK_TOKENS = 6


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module, PreTrainedTokenizerFast]:
    """``root/gguf/tiny.gguf`` of a random tiny Qwen2, the model itself and its tokenizer."""
    root = tmp_path_factory.mktemp("ckpt")
    tokenizer_json = tiny_tokenizer(root / "tokenizer.json")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token=EOS)
    model = tiny_model("qwen2", tokenizer.vocab_size, tokenizer.eos_token_id)
    (root / "gguf").mkdir()
    return tiny_gguf(model, tokenizer_json, root / "gguf" / "tiny.gguf"), model, tokenizer


@pytest.fixture(scope="module")
def converted(tiny_source, tmp_path_factory) -> tuple[Path, dict]:
    """The weights stage's folder for the tiny GGUF, and its report."""
    gguf_path, _, _ = tiny_source
    out = gguf_path.parent.parent / "hf"
    report = weights.convert(gguf_path, weights.sha256_file(gguf_path), out, PROMPTS[0], CHECK_TOKENS)
    return out, report


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]  # [t, vocab]


def test_converted_folder_has_no_weights_and_points_to_the_gguf(tiny_source, converted):
    gguf_path, _, _ = tiny_source
    out, report = converted
    assert not checkpoint.has_weights(out)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "gguf.json", "tokenizer.json", "tokenizer_config.json"
    ]
    assert json.loads((out / "gguf.json").read_text()) == {
        "file": "../gguf/tiny.gguf", "sha256": weights.sha256_file(gguf_path), "bytes": gguf_path.stat().st_size,
    }
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert report["check"]["weights"] == "gguf.json -> tiny.gguf"
    assert len(report["check"]["greedy_tokens"]) == CHECK_TOKENS


def test_load_causal_lm_gives_the_models_exact_logits_and_tokens(tiny_source, converted):
    _, model, tokenizer = tiny_source
    out, report = converted
    loaded = checkpoint.load_causal_lm(out)
    ids = tokenizer(PROMPTS[1])["input_ids"]
    assert torch.equal(logits(loaded, ids), logits(model, ids))
    assert AutoTokenizer.from_pretrained(out)(PROMPTS[1])["input_ids"] == ids
    ref, _ = weights.greedy(model, torch.tensor([tokenizer(PROMPTS[0])["input_ids"]]), CHECK_TOKENS)
    assert report["check"]["greedy_tokens"] == ref


def test_the_pointer_is_relative_so_the_artifacts_folder_can_move(tiny_source, converted, tmp_path):
    gguf_path, model, tokenizer = tiny_source
    out, _ = converted
    moved = tmp_path / "moved"
    shutil.copytree(out, moved / "hf")
    shutil.copytree(gguf_path.parent, moved / "gguf")
    assert checkpoint.gguf_source(moved / "hf").path == (moved / "gguf" / "tiny.gguf").resolve()
    ids = tokenizer(PROMPTS[2])["input_ids"]
    assert torch.equal(logits(checkpoint.load_causal_lm(moved / "hf"), ids), logits(model, ids))


def test_full_checkpoint_is_temporary_and_loads_like_the_gguf(tiny_source, converted, tmp_path):
    _, model, tokenizer = tiny_source
    out, _ = converted
    ids = tokenizer(PROMPTS[3])["input_ids"]
    with checkpoint.full_checkpoint(out, scratch=tmp_path) as full:
        assert full.parent == tmp_path and checkpoint.has_weights(full)
        assert not (full / checkpoint.GGUF_POINTER).exists()
        assert (full / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
        reloaded = AutoModelForCausalLM.from_pretrained(full, dtype=torch.float32).eval()
        assert torch.equal(logits(reloaded, ids), logits(model, ids))
    assert not full.exists() and list(tmp_path.iterdir()) == []


def test_full_checkpoint_of_a_folder_with_weights_is_that_folder(tiny_source, tmp_path):
    _, model, tokenizer = tiny_source
    model.save_pretrained(tmp_path / "hf")
    with checkpoint.full_checkpoint(tmp_path / "hf", scratch=tmp_path / "scratch") as full:
        assert full == tmp_path / "hf"
    assert not (tmp_path / "scratch").exists()


def write_pointer_raw(folder: Path, raw: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / checkpoint.GGUF_POINTER).write_text(json.dumps(raw))
    return folder


X = {"file": "../gguf/x.gguf", "sha256": "0" * 64}


@pytest.mark.parametrize("raw, error, words", [
    (None, FileNotFoundError, ["holds neither weights", "gguf.json"]),
    ([1, 2], ValueError, ["expected an object with keys file, sha256, bytes"]),
    (X, ValueError, ["missing ['bytes']"]),
    ({**X, "bytes": 3}, FileNotFoundError, ["../gguf/x.gguf", "does not exist"]),  # (no GGUF written)
    ({**X, "bytes": 4}, ValueError, ["has 3 bytes", "records 4"]),  # (a 3-byte GGUF written)
])
def test_bad_folders_and_pointers_are_named_in_the_error(tmp_path, raw, error, words):
    hf = tmp_path / "hf"
    hf.mkdir()
    if raw is not None:
        write_pointer_raw(hf, raw)
    if raw and isinstance(raw, dict) and raw.get("bytes") == 4:
        (tmp_path / "gguf").mkdir()
        (tmp_path / "gguf" / "x.gguf").write_bytes(b"abc")
    with pytest.raises(error) as info:
        checkpoint.load_causal_lm(hf)
    assert str(hf) in str(info.value) or str(tmp_path / "gguf" / "x.gguf") in str(info.value)
    for w in words:
        assert w in str(info.value)


def test_a_pointer_that_is_not_json_is_named(tmp_path):
    (tmp_path / checkpoint.GGUF_POINTER).write_text("{not json")
    with pytest.raises(ValueError, match=r"gguf.json: not JSON"):
        checkpoint.gguf_source(tmp_path)


def test_a_gguf_loaded_model_is_a_plain_float_model(converted):
    out, _ = converted
    model = checkpoint.load_causal_lm(out)
    assert model.hf_quantizer is None and not getattr(model, "is_quantized", False)
    assert not hasattr(model.config, "quantization_config")
    assert model.float() is model  # the export stage calls .float(); a GGUF-quantized model refuses it


def test_plain_gguf_reader_reads_the_same_fields_and_tensors_and_restores_gguf(tiny_source):
    import gguf
    import numpy as np

    gguf_path, _, _ = tiny_source
    original = gguf.GGUFReader
    memmapped = original(gguf_path)
    with checkpoint.plain_gguf_reader():
        assert gguf.GGUFReader is not original
        plain = gguf.GGUFReader(gguf_path)
    assert gguf.GGUFReader is original
    assert list(plain.fields) == list(memmapped.fields)
    for name, field in memmapped.fields.items():
        got = plain.fields[name]
        assert got.types == field.types and got.data == field.data, name
        assert all(np.array_equal(a, b) for a, b in zip(got.parts, field.parts, strict=True)), name
    assert [t.name for t in plain.tensors] == [t.name for t in memmapped.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(plain.tensors, memmapped.tensors, strict=True))
