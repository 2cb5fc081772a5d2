"""The vision-language path on a tiny random Idefics3 (tests/tiny_vlm.py), the whole chain: export
(vision encoder + decoder with image rows) with parity against torch, quantize and gate, the
runtime's generation with an image equal to transformers' ``generate`` token for token, every
method chain and tree equal to plain decoding with images, and the errors of bad image input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from tokenizers import Tokenizer

pytest.importorskip("PIL")

import specrt  # noqa: E402
from pipeline.export import VISION_FILE  # noqa: E402
from pipeline.export import run as export_run  # noqa: E402
from pipeline.lib.check_image import check_image as make_image  # noqa: E402
from pipeline.lib.quantize_graph import QuantConfig  # noqa: E402
from pipeline.lib.vision_graph import text_decoder_of  # noqa: E402
from pipeline.quantize import quantize_artifact  # noqa: E402
from specrt.backend import contract  # noqa: E402
from specrt.backend.prefill import PromptImages  # noqa: E402
from specrt.drafters import METHODS  # noqa: E402
from specrt.drafters.indexes.datastore import write_datastore  # noqa: E402
from specrt.errors import InvalidRequestError  # noqa: E402
from specrt.files import sha256_file  # noqa: E402
from tests.helpers import PROMPTS, TRAINING_TEXT, committed_artifact, specbench_questions  # noqa: E402
from tests.tiny_vlm import tiny_vlm_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = PROMPTS[0]  # the start of a text the model memorised: drafts get accepted
NEW = 24
UNDER_TEST = sorted(name for name, m in METHODS.items() if not m.needs_draft and name != "baseline")
EXPORT = dict(opset=20, max_context=256, parity_tokens=40, parity_tolerance=1e-3, prefill_chunk=16, attention="specrt")
GATE = dict(prompts_per_task=1, max_prompt_tokens=40, new_tokens=8, widths=[4], prefill_chunk=16)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    return tiny_vlm_folder(tmp_path_factory.mktemp("tiny-vlm") / "hf")


@pytest.fixture(scope="module")
def exported(hf_folder, tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("tiny-vlm-artifacts")
    questions = specbench_questions(root / "question.jsonl")
    report = export_run(hf_folder, root / "fp32", "tiny-vlm", questions, EXPORT, ("<eos>",), GATE)
    return root / "fp32", report


@pytest.fixture(scope="module")
def model(exported, tmp_path_factory) -> specrt.SpecModel:
    """The fp32 artifact with a datastore of the tokenizer's training text (for the retrieval methods)."""
    tokenizer_json = exported[0] / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    documents = [np.array(e.ids, np.int32) for e in tokenizer.encode_batch(TRAINING_TEXT, add_special_tokens=False)]
    store = tmp_path_factory.mktemp("tiny-vlm-datastore")
    write_datastore(store, [("train", "tests.helpers.TRAINING_TEXT", documents)], sha256_file(tokenizer_json))
    return specrt.load(exported[0], datastore=store)


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return make_image()


@pytest.fixture(scope="module")
def baseline(model, image) -> specrt.GenerationResult:
    return model.generate(PROMPT, images=[image], method="baseline", max_new_tokens=NEW)


def test_export_checks_the_image_path_against_torch(exported):
    folder, report = exported
    parity = report["parity"]
    assert parity["ok"]
    image = parity["image"]
    assert image["image_tokens"] == 40  # the check image: 3 x 3 tiles and the global image, 4 rows each
    assert image["encoder_max_abs_diff"] < 1e-5
    assert image["decoder"]["max_abs_diff"] < 1e-5 and image["decoder"]["argmax_flips"] == 0
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [t["name"] for t in manifest["io"]["inputs"][:4]] == [
        contract.INPUT_IDS, contract.POSITION_IDS, contract.ATTENTION_BIAS, contract.IMAGE_EMBEDS]
    vision = manifest["vision"]
    assert vision["encoder"] == VISION_FILE and vision["image_seq_len"] == 4
    assert {VISION_FILE, VISION_FILE + ".data"} <= set(manifest["files"])
    assert vision["prompt"]["image_token"] == "<image>"


def test_generation_with_an_image_equals_transformers(hf_folder, model, image, baseline):
    """The processor's ids and the model's own greedy generate, token for token."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(hf_folder)
    reference = AutoModelForImageTextToText.from_pretrained(hf_folder, dtype=torch.float32).eval()
    inputs = processor(text="<image>" + PROMPT, images=[Image.fromarray(image)], return_tensors="pt")
    assert list(baseline.prompt_token_ids) == inputs["input_ids"][0].tolist()
    with torch.no_grad():
        out = reference.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    assert list(baseline.token_ids) == out[0, inputs["input_ids"].shape[1]:].tolist()


def logprobs(result: specrt.GenerationResult) -> list[float]:
    return [t.logprob for t in result.logprobs]


def test_the_image_changes_the_output(model, image):
    """The memorised model's greedy text follows its prompt's text; the image moves its probabilities."""
    kwargs = dict(method="baseline", max_new_tokens=NEW, logprobs=0)
    mine = model.generate(PROMPT, images=[image], **kwargs)
    other = model.generate(PROMPT, images=[make_image(seed=5)[::-1].copy()], **kwargs)
    again = model.generate(PROMPT, images=[image], **kwargs)
    assert logprobs(again) == logprobs(mine) != logprobs(other)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("method", UNDER_TEST)
def test_every_method_equals_plain_decoding_with_an_image(model, image, baseline, method, tree):
    spec = model.generate(PROMPT, images=[image], method=method, tree=tree, max_new_tokens=NEW, backoff=False)
    assert (spec.token_ids, spec.text, spec.finish_reason) == (baseline.token_ids, baseline.text,
                                                               baseline.finish_reason)


def test_image_rows_across_prefill_chunks(model, image, baseline):
    """40 image tokens over chunks of 8: each pass takes its own rows."""
    chunked = model.generate(PROMPT, images=[image], method="baseline", max_new_tokens=NEW, prefill_chunk=8)
    assert chunked.token_ids == baseline.token_ids


def test_two_images_and_placeholders(model, image):
    second = make_image(40, 90, seed=3)
    both = model.generate("<image>and<image>", images=[image, second], method="baseline", max_new_tokens=8)
    swapped = model.generate("<image>and<image>", images=[second, image], method="baseline", max_new_tokens=8)
    assert both.prompt_token_ids != swapped.prompt_token_ids  # other shapes, other tile counts
    spec = model.generate("<image>and<image>", images=[image, second], method="pld", tree=True, max_new_tokens=8)
    assert spec.token_ids == both.token_ids


def test_the_prefix_cache_never_serves_another_image(exported, image):
    """Same text, other image: the placeholder ids are equal, the KV rows are not."""
    cached = specrt.load(exported[0], prefix_cache_mb=16)
    other = make_image(seed=9)
    kwargs = dict(method="baseline", max_new_tokens=NEW, logprobs=0)
    first = cached.generate(PROMPT, images=[image], **kwargs)
    second = cached.generate(PROMPT, images=[other], **kwargs)
    fresh = specrt.load(exported[0]).generate(PROMPT, images=[other], **kwargs)
    assert logprobs(second) == logprobs(fresh) != logprobs(first)
    assert second.stats["cached_prompt_tokens"] == 0


@pytest.fixture(scope="module")
def int4(exported, tmp_path_factory) -> Path:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())["quantize"]["variants"]["int4"]
    out = tmp_path_factory.mktemp("tiny-vlm-int4") / "int4"
    model = specrt.load(exported[0])
    prompts = [model.encode("The quick brown fox jumps over the lazy dog, again and again.")]
    report = quantize_artifact(exported[0], out, "int4", QuantConfig(**params), prompts, GATE, bench_steps=2)
    assert report["spec_safe"] is True and report["gate_disagreements"] == 0
    return out


@pytest.mark.parametrize("method", ["pld", "suffix_decoding", "auto"])
def test_the_quantized_variant_keeps_the_image_path(int4, image, method):
    model = specrt.load(int4)
    assert model.manifest.vision is not None and (int4 / VISION_FILE).is_file()
    plain = model.generate(PROMPT, images=[image], method="baseline", max_new_tokens=NEW)
    for tree in (False, True):
        spec = model.generate(PROMPT, images=[image], method=method, tree=tree, max_new_tokens=NEW)
        assert spec.token_ids == plain.token_ids


def test_bad_images_get_clear_errors(model, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    with pytest.raises(InvalidRequestError, match="broken.png"):
        model.generate(PROMPT, images=[broken])
    with pytest.raises(InvalidRequestError, match="missing.png"):
        model.generate(PROMPT, images=[tmp_path / "missing.png"])
    with pytest.raises(InvalidRequestError, match="images must be a list"):
        model.generate(PROMPT, images=str(broken))
    with pytest.raises(InvalidRequestError, match=r"images\[0\]"):
        model.generate(PROMPT, images=[np.zeros((4, 4), np.float64)])
    with pytest.raises(InvalidRequestError, match="placeholder|image token"):
        model.generate("<image><image>", images=[make_image()])


def test_image_rows_must_match_the_placeholders(model, image):
    ids, images = model.encode_images(PROMPT, [image])
    with pytest.raises(InvalidRequestError, match="40 image tokens .* 39 rows"):
        model.stream_ids(ids, images=PromptImages(images.token_id, images.embeds[:-1]))
    with pytest.raises(InvalidRequestError, match="float32"):
        model.stream_ids(ids, images=PromptImages(images.token_id, images.embeds.astype(np.float64)))


def test_a_text_artifact_takes_no_images(tmp_path, image):
    text_model = specrt.load(committed_artifact("llama", tmp_path / "fp32"))
    with pytest.raises(InvalidRequestError, match="takes no images"):
        text_model.generate(PROMPT, images=[image])


def test_the_exporter_refuses_a_text_model():
    from tests.tiny import tiny_model

    with pytest.raises(ValueError, match="llama: the vision-language exporter takes"):
        text_decoder_of(tiny_model("llama", 64, 0))


@pytest.mark.parametrize("method", ["pld", "suffix_decoding"])
def test_copied_drafts_get_accepted_after_an_image(model, image, method):
    """The comparisons above are not vacuous: the memorised model repeats its prompt's text."""
    spec = model.generate(PROMPT, images=[image], method=method, max_new_tokens=NEW, backoff=False)
    assert spec.stats["accepted"] >= 5


def test_the_cli_takes_images(exported, model, image, baseline, tmp_path, capsys):
    from PIL import Image

    from specrt.cli import main

    png = tmp_path / "picture.png"
    Image.fromarray(image).save(png)
    args = ["generate", "--model", str(exported[0]), "--image", str(png), "--method", "pld",
            "--max-new-tokens", str(NEW), "--json", PROMPT]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert tuple(result["token_ids"]) == baseline.token_ids  # PNG is lossless: the same pixels as the array
    (tmp_path / "notes.txt").write_text("not an image")
    assert main(["generate", "--model", str(exported[0]), "--image", str(tmp_path / "notes.txt"), PROMPT]) == 2
    assert "notes.txt" in capsys.readouterr().err


def test_the_lossless_stage_checks_image_prompts(exported, tmp_path):
    from pipeline.lossless import run as lossless_run

    questions = specbench_questions(tmp_path / "question.jsonl")
    params = dict(prompts_per_task=1, max_prompt_tokens=24, max_new_tokens=12, draft_budget=8, threads=None)
    report = lossless_run(exported[0], questions, params, datastore=None)
    assert report["image_prompts"] == 6 and report["prompts"] == 12  # each question also after the check image
    assert report["lossless"] and all(r["token_match"] == 1.0 for r in report["runs"].values())
