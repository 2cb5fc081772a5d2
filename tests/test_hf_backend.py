"""The transformers backend (specrt.backend.hf): Hugging Face folders run without an export through
the same engine and drafters. Greedy: every method, chain and tree, equals plain decoding of the
same model on this backend, token for token (the draft-model methods with a draft folder of the same
tokenizer); sampling follows the target's law; bad folders and options get clear errors."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

import specrt
from specrt.drafters import METHODS
from specrt.drafters.indexes.datastore import write_datastore
from specrt.errors import ArtifactError, InvalidRequestError
from specrt.files import sha256_file
from specrt.sampling import SamplingParams, target_probs
from tests.helpers import ARCHS, EOS, PROMPTS, QWEN25_CHAT_TEMPLATE, TRAINING_TEXT, chi2_pvalue
from tests.tiny import memorize, tiny_gguf, tiny_model, tiny_tokenizer

MAX_NEW_TOKENS = 24


def hf_folder(arch: str, out: Path, *, seed: int = 0, chat_template: str | None = None,
              jinja_file: bool = True) -> Path:
    """A tiny ``arch`` model that memorised the training text, saved as a Hugging Face folder (its chat
    template in chat_template.jinja, or with ``jinja_file`` False in tokenizer_config.json)."""
    out.mkdir(parents=True)
    tokenizer_json = tiny_tokenizer(out.parent / f"{out.name}-tokenizer.json")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token=EOS)
    tokenizer.chat_template = chat_template
    model = memorize(tiny_model(arch, tokenizer.vocab_size, tokenizer.eos_token_id, seed=seed), tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out, save_jinja_files=jinja_file)
    return out


@pytest.fixture(scope="module", params=ARCHS)
def hf_model(request, tmp_path_factory) -> specrt.SpecModel:
    root = tmp_path_factory.mktemp(f"hf-{request.param}")
    folder = hf_folder(request.param, root / "model")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    documents = [np.array(e.ids, np.int32) for e in tokenizer.encode_batch(TRAINING_TEXT, add_special_tokens=False)]
    write_datastore(root / "store", [("train", "tests.helpers.TRAINING_TEXT", documents)],
                    sha256_file(folder / "tokenizer.json"))  # fmt: skip
    return specrt.load(folder, backend="hf", datastore=root / "store")


@pytest.fixture(scope="module")
def baselines(hf_model) -> dict[str, specrt.GenerationResult]:
    return {p: hf_model.generate(p, method="baseline", max_new_tokens=MAX_NEW_TOKENS) for p in PROMPTS}


def test_the_folder_becomes_a_manifest(hf_model):
    m = hf_model.manifest
    assert (m.variant, m.attention, m.eos_token_ids) == ("hf", "torch", (hf_model.tokenizer.token_to_id(EOS),))
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(m.files)
    assert m.dims.num_layers == 2 and m.dims.hidden == 64
    assert hf_model.graph.provider == "torch" and hf_model.graph.key_block is None


def test_plain_decoding_equals_transformers_generate(hf_model, baselines):
    # the backend's own masks (Gemma 3's sliding layers included: its tiny window is 8 positions,
    # the prompts are longer) give transformers' greedy tokens
    model = hf_model.graph.model
    for prompt, base in baselines.items():
        ids = torch.from_numpy(hf_model.encode(prompt))[None]
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 eos_token_id=list(hf_model.manifest.eos_token_ids), pad_token_id=0)  # fmt: skip
        assert list(base.token_ids) == out[0, ids.shape[1]:].tolist(), prompt


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("method", sorted(m for m, e in METHODS.items() if not e.needs_draft and m != "baseline"))
def test_every_method_equals_plain_decoding_on_this_backend(hf_model, baselines, method, tree):
    hf_model.forget_history()
    accepted = 0
    for prompt, base in baselines.items():
        spec = hf_model.generate(prompt, method=method, tree=tree, max_new_tokens=MAX_NEW_TOKENS, backoff=False)
        assert (spec.token_ids, spec.finish_reason) == (base.token_ids, base.finish_reason), prompt
        accepted += spec.stats["accepted"]
    assert accepted > 0 or method == "auto", method  # auto's choices follow measured times


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory) -> specrt.SpecModel:
    root = tmp_path_factory.mktemp("hf-pair")
    target, draft = hf_folder("qwen2", root / "target", seed=0), hf_folder("qwen2", root / "draft", seed=1)
    return specrt.load(target, backend="hf", draft=draft)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("method", ["sd", "hsd", "hsd_capped", "auto"])
def test_draft_model_methods_with_a_draft_folder_equal_plain_decoding(hf_pair, method, tree):
    for prompt in PROMPTS[:4]:
        base = hf_pair.generate(prompt, method="baseline", max_new_tokens=MAX_NEW_TOKENS)
        spec = hf_pair.generate(prompt, method=method, tree=tree, max_new_tokens=MAX_NEW_TOKENS)
        assert spec.token_ids == base.token_ids, prompt


SAMPLING = SamplingParams(temperature=1.0, top_k=3)


def test_sampling_follows_the_target_distribution(hf_pair):
    # the first two tokens after the prompt, drawn with sd (a draft model's sampled chains) against
    # the target's law by enumeration of its own logits
    model = hf_pair.graph.model
    prompt_ids = hf_pair.encode(PROMPTS[3])

    def probs(prefix: list[int]) -> np.ndarray:
        with torch.inference_mode():
            logits = model(torch.tensor([[*prompt_ids.tolist(), *prefix]])).logits[0, -1:].float().numpy()
        return target_probs(logits, SAMPLING)[0]

    law = {}
    first = probs([])
    for a in np.flatnonzero(first):
        second = probs([int(a)])
        for b in np.flatnonzero(second):
            law[(int(a), int(b))] = float(first[a] * second[b])
    counts: Counter = Counter()
    for seed in range(200):
        ids, _ = hf_pair.generate_ids(prompt_ids, method="sd", max_new_tokens=3, temperature=1.0, top_k=3, seed=seed)
        counts[tuple(ids[:2].tolist())] += 1
    assert chi2_pvalue(counts, law) > 1e-3, (counts.most_common(6), sorted(law.items(), key=lambda kv: -kv[1])[:6])


@pytest.mark.parametrize("jinja_file, where", [(True, "chat_template.jinja"), (False, "tokenizer_config.json")])
def test_chat_messages_through_the_folder_s_template(tmp_path, jinja_file, where):
    folder = hf_folder("qwen2", tmp_path / "chat", chat_template=QWEN25_CHAT_TEMPLATE.read_text(),
                       jinja_file=jinja_file)
    model = specrt.load(folder, backend="hf")
    assert model.manifest.chat_template is not None and model.manifest.chat_template.file == where
    assert where in model.manifest.files
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    ids = model.encode_chat(messages)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    assert ids.tolist() == tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                         return_dict=False)
    assert model.tokenizer.decode(ids.tolist(), skip_special_tokens=False).endswith("assistant\n")
    assert model.encode("hello", chat=True).tolist() == model.encode_chat(messages[1:]).tolist()


def test_bad_folders_and_options_get_clear_errors(tmp_path, hf_pair):
    with pytest.raises(ArtifactError, match="no config.json"):
        specrt.load(tmp_path, backend="hf")
    not_lm = tmp_path / "encoder"
    not_lm.mkdir()
    (not_lm / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    (not_lm / "tokenizer.json").write_text("{}")
    with pytest.raises(ArtifactError, match="not a causal language model"):
        specrt.load(not_lm, backend="hf")
    with pytest.raises(InvalidRequestError, match="backend must be one of"):
        specrt.load(tmp_path, backend="torch")
    folder = hf_pair.folder
    with pytest.raises(InvalidRequestError, match="device must be one of"):
        specrt.load(folder, backend="hf", device="tpu")
    with pytest.raises(InvalidRequestError, match="takes device= only"):
        specrt.load(folder, backend="hf", prefix_cache_mb=16)


def test_cli_generates_from_a_hugging_face_folder(hf_pair, capsys):
    from specrt.cli import main

    prompt = PROMPTS[0]
    assert main(["generate", "--model", str(hf_pair.folder), "--backend", "hf", "--method", "pld",
                 "--max-new-tokens", "12", prompt]) == 0  # fmt: skip
    want = hf_pair.generate(prompt, method="baseline", max_new_tokens=12).text
    assert capsys.readouterr().out.rstrip("\n") == want


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(a folder as the weights stage writes it: config, tokenizer and gguf.json naming a float32 GGUF
    of a tiny memorised Qwen2, the same model saved with safetensors)."""
    from pipeline import weights

    root = tmp_path_factory.mktemp("hf-gguf")
    safetensors = hf_folder("qwen2", root / "safetensors")
    model = specrt.load(safetensors, backend="hf").graph.model
    (root / "gguf").mkdir()
    gguf_path = tiny_gguf(model, safetensors / "tokenizer.json", root / "gguf" / "tiny.gguf")
    weights.convert(gguf_path, sha256_file(gguf_path), root / "hf", PROMPTS[0], 4)
    return root / "hf", safetensors


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_a_folder_whose_weights_are_a_gguf_file_runs_as_its_safetensors_twin(gguf_pair, tree):
    pointer_folder, safetensors = gguf_pair
    model, twin = specrt.load(pointer_folder, backend="hf"), specrt.load(safetensors, backend="hf")
    assert "gguf.json" in model.manifest.files and not any(n.endswith(".safetensors") for n in model.manifest.files)
    accepted = 0
    for prompt in PROMPTS[:4]:
        base = model.generate(prompt, method="baseline", max_new_tokens=MAX_NEW_TOKENS)
        # the same weights: the same tokens from the same prompt ids (the folder's tokenizer is the one
        # rebuilt from the GGUF's vocabulary, which may split a text differently from the original)
        ids = model.encode(prompt)
        twin_ids, _ = twin.generate_ids(ids, method="baseline", max_new_tokens=MAX_NEW_TOKENS)
        assert base.token_ids == tuple(twin_ids.tolist()), prompt
        for method in ("pld", "suffix_decoding"):
            spec = model.generate(prompt, method=method, tree=tree, max_new_tokens=MAX_NEW_TOKENS, backoff=False)
            assert spec.token_ids == base.token_ids, (prompt, method)
            accepted += spec.stats["accepted"]
    assert accepted > 0


def test_a_pointer_to_a_missing_or_changed_gguf_is_named(gguf_pair, tmp_path):
    import shutil

    pointer_folder, _ = gguf_pair
    moved = shutil.copytree(pointer_folder, tmp_path / "hf")  # without the ../gguf folder beside it
    with pytest.raises(ArtifactError, match=r"gguf\.json names \.\./gguf/tiny\.gguf .* which does not exist"):
        specrt.load(moved, backend="hf")
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "tiny.gguf").write_bytes(b"GGUF")
    with pytest.raises(ArtifactError, match=r"has 4 bytes, .*gguf\.json records \d+"):
        specrt.load(moved, backend="hf")
    (moved / "gguf.json").unlink()
    with pytest.raises(ArtifactError, match=r"no weights \(\*\.safetensors, or gguf\.json naming a GGUF file\)"):
        specrt.load(moved, backend="hf")
