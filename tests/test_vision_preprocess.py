"""specrt.vision.preprocess against transformers' SmolVLMImageProcessorPil and SmolVLMProcessor: the same
pixel values (frame order included), rows/cols and expanded prompt, for one image at a time."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("transformers")

from PIL import Image  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from transformers.models.smolvlm import processing_smolvlm  # noqa: E402
from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil  # noqa: E402

from specrt.errors import ArtifactError, InvalidRequestError, MissingDependencyError  # noqa: E402
from specrt.vision import (  # noqa: E402
    ImagePreprocess,
    ImageTokens,
    PreparedImage,
    expand_prompt,
    load_image,
    prepare_image,
)

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"size": {"longest_edge": 4 * 64}, "max_image_size": {"longest_edge": 64}}
SEQ_LEN = 3  # image tokens per frame in the small processor


def _rng_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _gradient(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], -1).astype(np.uint8)


def _config(processor: SmolVLMImageProcessorPil) -> ImagePreprocess:
    """Our config from the processor's own to_dict (the fields a saved preprocessor_config.json holds)."""
    raw = json.loads(processor.to_json_string())
    return ImagePreprocess.from_dict({
        "longest_edge": raw["size"]["longest_edge"], "max_image_size": raw["max_image_size"]["longest_edge"],
        **{k: raw[k] for k in ("do_resize", "do_image_splitting", "do_rescale", "rescale_factor", "do_normalize",
                               "image_mean", "image_std", "resample", "do_convert_rgb")},
    }, "test")


def _reference(processor: SmolVLMImageProcessorPil, image) -> tuple[np.ndarray, np.ndarray, int, int]:
    out = processor(images=[[image]], return_tensors="np", return_row_col_info=True)
    return out["pixel_values"][0], out["pixel_attention_mask"][0], out["rows"][0][0], out["cols"][0][0]


def _assert_same(ours: PreparedImage, processor: SmolVLMImageProcessorPil, reference_input) -> None:
    pixels, mask, rows, cols = _reference(processor, reference_input)
    assert (ours.rows, ours.cols) == (rows, cols)
    assert ours.pixel_values.dtype == np.float32
    assert ours.pixel_values.shape == pixels.shape
    np.testing.assert_allclose(ours.pixel_values, pixels, rtol=0, atol=1e-6)
    assert mask.all()                                   # one image is never padded...
    assert np.array_equal(ours.pixel_attention_mask, mask.astype(bool))   # ...and our mask says so


@pytest.fixture(scope="module")
def small() -> SmolVLMImageProcessorPil:
    return SmolVLMImageProcessorPil(**SMALL)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE with no merges (any text encodes, one id per byte) plus SmolVLM's special tokens."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    rows_cols = [f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)]
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, additional_special_tokens=["<end_of_utterance>", *rows_cols],
        extra_special_tokens={"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                              "global_image_token": "<global-img>"},
    )


class _Processor(processing_smolvlm.SmolVLMProcessor):
    """SmolVLMProcessor without its video processor (which needs torchvision, absent here)."""

    @classmethod
    def get_attributes(cls):
        return ["image_processor", "tokenizer"]


@pytest.fixture(scope="module")
def make_processor(tokenizer):
    patch = pytest.MonkeyPatch()
    patch.setattr(processing_smolvlm, "num2words", str)  # only its video prompts use num2words (not installed)

    def make(**image_kwargs) -> _Processor:
        return _Processor(SmolVLMImageProcessorPil(**image_kwargs), tokenizer, None, image_seq_len=SEQ_LEN)

    yield make
    patch.undo()


# --- pixel values -------------------------------------------------------------------------------------------------

ARRAYS = {
    "portrait-random": _rng_image(100, 70, seed=1),
    "landscape-gradient": _gradient(70, 100),
    "square-random": _rng_image(90, 90, seed=2),
    "tiny-10x7": _rng_image(10, 7, seed=3),
    "larger-than-longest-edge": _gradient(300, 620),
    "exact-tile-multiple": _rng_image(128, 192, seed=4),
    "exact-longest-edge": _gradient(256, 256),
    "one-tile": _rng_image(64, 64, seed=5),
    "sliver-2x600": _rng_image(2, 600, seed=6),   # the short side truncates to 0, then is raised to 1
    "sliver-600x2": _rng_image(600, 2, seed=16),
    "single-pixel": _rng_image(1, 1, seed=7),
}


@pytest.mark.parametrize("name", list(ARRAYS))
@pytest.mark.parametrize("split", [True, False], ids=["split", "no-split"])
def test_arrays_match_processor(name, split):
    processor = SmolVLMImageProcessorPil(**SMALL, do_image_splitting=split)
    array = ARRAYS[name]
    # transformers guesses the channel axis of an array; a height of 1, 3 or 4 reads as channels-first
    reference_input = Image.fromarray(array) if array.shape[0] in (1, 3, 4) else array
    _assert_same(prepare_image(array, _config(processor)), processor, reference_input)


def test_split_frame_order_is_rows_then_global(small):
    # a 3 x 4 grid of flat 64-pixel cells, already at the longest edge (256): the resizes keep it, so tile i
    # is cell (i // 4, i % 4), row by row, and the global image comes last
    colours = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20 + 10
    array = np.repeat(np.repeat(colours, 64, axis=0), 64, axis=1)[:, :, None].repeat(3, axis=2)  # [192, 256, 3]
    prepared = prepare_image(array, _config(small))
    assert (prepared.rows, prepared.cols) == (3, 4)
    assert prepared.pixel_values.shape == (13, 3, 64, 64)
    expected = (colours.reshape(12, 1, 1, 1) / 255 - 0.5) / 0.5
    np.testing.assert_allclose(prepared.pixel_values[:12], np.broadcast_to(expected, (12, 3, 64, 64)), atol=1e-6)
    _assert_same(prepared, small, array)


@pytest.mark.parametrize("mode", ["RGBA", "LA", "L", "P-transparency", "CMYK"])
def test_pil_modes_match_processor(small, mode):
    rgba = Image.fromarray(np.concatenate([_rng_image(80, 50, seed=8), _rng_image(80, 50, seed=9)[:, :, :1]], -1))
    if mode == "P-transparency":
        image = Image.fromarray(_rng_image(80, 50, seed=10)).convert("P")
        image.info["transparency"] = 0
    else:
        image = rgba.convert(mode)
    _assert_same(prepare_image(image, _config(small)), small, image)


def test_real_smolvlm_defaults(make_processor):
    processor = SmolVLMImageProcessorPil()
    assert (processor.size["longest_edge"], processor.max_image_size["longest_edge"]) == (4 * 364, 364)
    assert processor.resample == Image.Resampling.LANCZOS
    array = _rng_image(380, 500, seed=11)
    prepared = prepare_image(array, _config(processor))
    assert prepared.pixel_values.shape == (4 * 4 + 1, 3, 364, 364)
    _assert_same(prepared, processor, array)


@pytest.mark.parametrize("rescale,normalize", [(False, False), (False, True), (True, False)])
def test_rescale_and_normalize_switches(rescale, normalize):
    processor = SmolVLMImageProcessorPil(**SMALL, do_rescale=rescale, do_normalize=normalize, do_resize=False)
    array = _rng_image(150, 100, seed=12)
    _assert_same(prepare_image(array, _config(processor)), processor, array)


@pytest.mark.parametrize("shape,frames", [((40, 30), 1), ((64, 64), 1), ((64, 65), 5), ((33, 65), 3), ((65, 33), 3)])
def test_without_resize(shape, frames):
    # a small image rounds up to one 64 x 64 tile, kept alone (rows = cols = 0); 33 x 65 rounds to 64 x 128, not
    # 128 x 128: the short side is truncated (64.98 -> 64) before rounding up to a multiple of 64
    processor = SmolVLMImageProcessorPil(**SMALL, do_resize=False)
    array = _rng_image(*shape, seed=15)
    prepared = prepare_image(array, _config(processor))
    assert prepared.pixel_values.shape[0] == frames
    _assert_same(prepared, processor, array)


def test_other_resample_and_mean(small):
    processor = SmolVLMImageProcessorPil(**SMALL, resample=Image.Resampling.BICUBIC,
                                         image_mean=[0.48, 0.45, 0.40], image_std=[0.27, 0.26, 0.28])
    array = _gradient(90, 130)
    _assert_same(prepare_image(array, _config(processor)), processor, array)


# --- files: by path and by bytes, as transformers loads a path ----------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_files_by_path_and_bytes(small, tmp_path, fmt):
    path = tmp_path / f"image.{fmt.lower()}"
    Image.fromarray(_gradient(120, 90)).save(path, format=fmt)
    config = _config(small)
    by_path = prepare_image(path, config)
    _assert_same(by_path, small, str(path))   # the processor loads the path itself
    by_bytes = prepare_image(path.read_bytes(), config)
    assert np.array_equal(by_bytes.pixel_values, by_path.pixel_values)
    assert np.array_equal(prepare_image(str(path), config).pixel_values, by_path.pixel_values)


def test_file_exif_rotation_and_alpha_as_transformers_loads_a_path(small, tmp_path):
    jpeg = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees
    Image.fromarray(_gradient(60, 110)).save(jpeg, exif=exif)
    assert load_image(jpeg).size == (60, 110)
    _assert_same(prepare_image(jpeg, _config(small)), small, str(jpeg))

    png = tmp_path / "alpha.png"
    rgba = np.concatenate([_rng_image(70, 40, seed=13), _rng_image(70, 40, seed=14)[:, :, :1]], -1)
    Image.fromarray(rgba).save(png)
    # a path's alpha is dropped (load_image's convert("RGB")), a PIL image's is composited on white
    _assert_same(prepare_image(png, _config(small)), small, str(png))
    _assert_same(prepare_image(Image.open(png), _config(small)), small, Image.open(png))


# --- prompts ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows,cols", [(0, 0), (1, 1), (2, 3), (4, 4), (3, 1)])
def test_prompt_string_is_transformers(rows, cols):
    tokens = ImageTokens("<image>", "<fake_token_around_image>", "<global-img>", image_seq_len=5)
    assert tokens.prompt_string(rows, cols) == processing_smolvlm.get_image_prompt_string(
        rows, cols, 5, fake_token_around_image="<fake_token_around_image>", image_token="<image>",
        global_image_token="<global-img>")


@pytest.mark.parametrize("split", [True, False], ids=["split", "no-split"])
@pytest.mark.parametrize("prompt,arrays", [
    ("User:<image>What is this?<end_of_utterance>\nAssistant:", [ARRAYS["portrait-random"]]),
    ("<image> and <image>: same?", [ARRAYS["landscape-gradient"], ARRAYS["one-tile"]]),
], ids=["one-image", "two-images"])
def test_expand_prompt_matches_processor(make_processor, tokenizer, split, prompt, arrays):
    processor = make_processor(**SMALL, do_image_splitting=split)
    tokens = ImageTokens("<image>", "<fake_token_around_image>", "<global-img>", image_seq_len=SEQ_LEN)
    config = _config(processor.image_processor)
    prepared = [prepare_image(a, config) for a in arrays]
    expanded = expand_prompt(prompt, prepared, tokens)
    reference = processor(text=[prompt], images=[arrays], return_tensors="np")
    assert reference["input_ids"][0].tolist() == tokenizer(expanded)["input_ids"]
    assert np.allclose(np.concatenate([p.pixel_values for p in prepared]), reference["pixel_values"][0], atol=1e-6)


def test_expand_prompt_without_placeholder_puts_images_first():
    tokens = ImageTokens("<image>", "<f>", "<g>", image_seq_len=2)
    images = [PreparedImage(np.zeros((1, 3, 4, 4), np.float32), 0, 0),
              PreparedImage(np.zeros((5, 3, 4, 4), np.float32), 2, 2)]
    assert expand_prompt("Describe.", images, tokens) == (
        tokens.prompt_string(0, 0) + tokens.prompt_string(2, 2) + "Describe.")
    assert expand_prompt("no images", [], tokens) == "no images"


def test_expand_prompt_count_mismatch():
    tokens = ImageTokens("<image>", "<f>", "<g>", image_seq_len=2)
    image = PreparedImage(np.zeros((1, 3, 4, 4), np.float32), 0, 0)
    with pytest.raises(InvalidRequestError, match=r"2 <image> placeholder\(s\) but 1 image"):
        expand_prompt("<image><image>", [image], tokens)
    with pytest.raises(InvalidRequestError, match=r"1 <image> placeholder\(s\) but 0 image"):
        expand_prompt("<image>", [], tokens)


# --- configs ------------------------------------------------------------------------------------------------------


def test_from_hf_reads_processor_save_pretrained(make_processor, tmp_path):
    processor = make_processor(**SMALL, do_image_splitting=False, resample=Image.Resampling.BICUBIC)
    processor.save_pretrained(tmp_path)
    assert not (tmp_path / "preprocessor_config.json").exists()  # nested in processor_config.json
    config = ImagePreprocess.from_hf(tmp_path)
    assert config == _config(processor.image_processor)
    assert (config.longest_edge, config.max_image_size, config.do_image_splitting, config.resample) == (
        256, 64, False, 3)
    assert ImageTokens.from_hf(tmp_path) == ImageTokens(
        "<image>", "<fake_token_around_image>", "<global-img>", image_seq_len=SEQ_LEN)


def test_from_hf_reads_the_older_layout(small, tmp_path):
    # preprocessor_config.json (the image processor's own file), processor_config.json with image_seq_len only,
    # the tokens in tokenizer_config.json's extra_special_tokens object
    small.save_pretrained(tmp_path)
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_len": 64}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"extra_special_tokens": {"image_token": "<img>", "global_image_token": {"content": "<g>"}}}))
    assert ImagePreprocess.from_hf(tmp_path) == _config(small)
    assert ImageTokens.from_hf(tmp_path) == ImageTokens("<img>", "<fake_token_around_image>", "<g>", 64)


@pytest.mark.parametrize("edit,field", [
    (lambda raw: raw.pop("do_image_splitting"), "do_image_splitting"),
    (lambda raw: raw.update(size={"height": 10, "width": 10}), "size"),
    (lambda raw: raw.update(max_image_size={"longest_edge": "64"}), "max_image_size.longest_edge"),
    (lambda raw: raw.update(do_rescale="yes"), "do_rescale"),
    (lambda raw: raw.update(image_mean=[0.5, 0.5]), "image_mean"),
    (lambda raw: raw.update(resample=9), "resample"),
    (lambda raw: raw.update(image_processor_type="CLIPImageProcessor"), "image_processor_type"),
])
def test_from_hf_bad_config_names_file_and_field(small, tmp_path, edit, field):
    small.save_pretrained(tmp_path)
    path = tmp_path / "preprocessor_config.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match="preprocessor_config.json") as caught:
        ImagePreprocess.from_hf(tmp_path)
    assert field in str(caught.value)


def test_from_hf_missing_files(tmp_path):
    with pytest.raises(ArtifactError, match="preprocessor_config.json"):
        ImagePreprocess.from_hf(tmp_path)
    with pytest.raises(ArtifactError, match="processor_config.json.*image_seq_len"):
        ImageTokens.from_hf(tmp_path)
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_len": 0}))
    with pytest.raises(ArtifactError, match="image_seq_len must be an integer >= 1"):
        ImageTokens.from_hf(tmp_path)


def test_dict_round_trip(small):
    config = _config(small)
    assert ImagePreprocess.from_dict(json.loads(json.dumps(config.to_dict())), "m") == config
    tokens = ImageTokens("<image>", "<fake_token_around_image>", "<global-img>", 64)
    assert ImageTokens.from_dict(json.loads(json.dumps(tokens.to_dict())), "m") == tokens
    with pytest.raises(ArtifactError, match=r"manifest.json: vision.*missing \['resample'\]"):
        ImagePreprocess.from_dict({k: v for k, v in config.to_dict().items() if k != "resample"},
                                  "manifest.json: vision")
    with pytest.raises(ArtifactError, match=r"unknown \['extra'\]"):
        ImageTokens.from_dict({**tokens.to_dict(), "extra": 1}, "m")
    with pytest.raises(ArtifactError, match="m: image_seq_len"):
        ImageTokens.from_dict({**tokens.to_dict(), "image_seq_len": 2.0}, "m")
    with pytest.raises(ArtifactError, match="m: rescale_factor"):
        ImagePreprocess.from_dict({**config.to_dict(), "rescale_factor": None}, "m")


# --- bad input ----------------------------------------------------------------------------------------------------


def test_bad_images_name_path_or_field(tmp_path):
    missing = tmp_path / "missing.png"
    with pytest.raises(InvalidRequestError, match="missing.png"):
        load_image(missing)
    png = io.BytesIO()
    Image.fromarray(_gradient(40, 40)).save(png, format="PNG")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(png.getvalue()[: len(png.getvalue()) // 2])
    with pytest.raises(InvalidRequestError, match="truncated.png: not a readable image"):
        load_image(truncated)
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    with pytest.raises(InvalidRequestError, match="notes.txt: not a readable image"):
        load_image(text)
    with pytest.raises(InvalidRequestError, match=r"image\[2\] \(5 bytes\): not a readable image"):
        load_image(b"\x89PNG\r", name="image[2]")
    with pytest.raises(InvalidRequestError, match=r"image\[1\]: expected a \[height, width, 3\] uint8.*float64"):
        load_image(np.zeros((8, 8)), name="image[1]")
    with pytest.raises(InvalidRequestError, match="got int"):
        load_image(3)
    with pytest.raises(InvalidRequestError, match="do_convert_rgb"):
        config = ImagePreprocess(256, 64, True, True, True, 1 / 255, True, (0.5,) * 3, (0.5,) * 3, 1, False)
        prepare_image(Image.new("L", (8, 8)), config)


# --- dependencies -------------------------------------------------------------------------------------------------


def test_module_imports_neither_torch_transformers_nor_pillow():
    code = ("import sys, specrt.vision.preprocess; "
            "print(sorted(m for m in ('torch', 'transformers', 'PIL') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_pillow_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(MissingDependencyError, match=r"pip install pillow.*specrt\[vlm\]"):
        load_image(np.zeros((4, 4, 3), np.uint8))
