"""SmolVLM / Idefics3 image preprocessing without torch or transformers, one image at a time.

The reference is transformers' ``SmolVLMImageProcessorPil`` (whose arithmetic ``Idefics3ImageProcessorPil``
shares) and ``SmolVLMProcessor``; every step below names the step it copies::

    image ──convert_to_rgb──> RGB ──resize: longest edge = longest_edge──> (h, w)
        │ do_image_splitting                          │ not splitting
        v                                             v
    resize_for_vision_encoder: h, w multiples of S    resize to S x S, rows = cols = 0
        │
        ├── rows x cols tiles of S x S, row by row ──┐
        └── global image resized to S x S (last) ────┴─> frames [n, 3, S, S] uint8
                                                            │ rescale (float64 product, then float32)
                                                            │ normalize (float32)
                                                            v
                                                         pixel_values [n, 3, S, S] float32

(S = ``max_image_size``.) Every frame of one image is S x S, so the processor's padding never pads a
single image: its ``pixel_attention_mask`` is all ones (:attr:`PreparedImage.pixel_attention_mask`).

Pillow is imported lazily: importing this module needs numpy only.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specrt.errors import ArtifactError, InvalidRequestError, MissingDependencyError
from specrt.files import read_json_object

if TYPE_CHECKING:
    from PIL import Image as PILImage

PROCESSOR_CONFIG = "processor_config.json"        # transformers >= 5: image processor nested as "image_processor"
PREPROCESSOR_CONFIG = "preprocessor_config.json"  # older layout: the image processor's own file
TOKENIZER_CONFIG = "tokenizer_config.json"

# transformers' image_processing_*_smolvlm.MAX_IMAGE_SIZE: no resized side exceeds it (4k).
MAX_IMAGE_SIZE = 4096

# PIL.Image.Resampling ids: NEAREST, LANCZOS, BILINEAR, BICUBIC, BOX, HAMMING.
_PIL_FILTERS = (0, 1, 2, 3, 4, 5)

_IMAGE_PROCESSOR_TYPES = ("SmolVLMImageProcessor", "Idefics3ImageProcessor")


def _pil_image():
    """The ``PIL.Image`` module, or MissingDependencyError naming the install."""
    try:
        from PIL import Image
    except ImportError as e:
        raise MissingDependencyError(
            f"image input needs Pillow: pip install pillow (or the extra: pip install 'specrt[vlm]') ({e})"
        ) from None
    return Image


# ---------------------------------------------------------------------------------------------------------------
# Configuration: what the processor's config says
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImagePreprocess:
    """The image processor's settings (``preprocessor_config.json`` of a SmolVLM / Idefics3 folder)."""

    longest_edge: int                          # size["longest_edge"]: the resized image's longest side
    max_image_size: int                        # max_image_size["longest_edge"]: the vision encoder's square side
    do_resize: bool
    do_image_splitting: bool
    do_rescale: bool
    rescale_factor: float                      # 1/255 for SmolVLM
    do_normalize: bool
    image_mean: tuple[float, float, float]     # per RGB channel
    image_std: tuple[float, float, float]
    resample: int                              # PIL filter id (1 = LANCZOS for SmolVLM)
    do_convert_rgb: bool

    @classmethod
    def from_hf(cls, folder: Path) -> ImagePreprocess:
        """Read a Hugging Face folder as transformers does: ``processor_config.json``'s nested
        ``image_processor`` object if there is one, else ``preprocessor_config.json``. Every field this
        class holds must be present (no class defaults are guessed); ArtifactError names the file and field."""
        raw, where = _hf_image_processor_dict(Path(folder))
        kind = raw.get("image_processor_type")
        if kind is not None and (not isinstance(kind, str) or _strip_backend(kind) not in _IMAGE_PROCESSOR_TYPES):
            raise ArtifactError(f"{where}: image_processor_type must be one of {list(_IMAGE_PROCESSOR_TYPES)} "
                                f"(optionally with a Fast/Pil suffix), got {kind!r}")
        return cls._parse(
            {
                "longest_edge": _edge(raw, "size", where),
                "max_image_size": _edge(raw, "max_image_size", where),
                **{name: _require(raw, name, where) for name in (
                    "do_resize", "do_image_splitting", "do_rescale", "rescale_factor", "do_normalize", "image_mean",
                    "image_std", "resample", "do_convert_rgb")},
            },
            where,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (for the artifact manifest); :meth:`from_dict` reads it back."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["image_mean"], out["image_std"] = list(self.image_mean), list(self.image_std)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> ImagePreprocess:
        """Inverse of :meth:`to_dict`; ArtifactError naming ``where`` and the field on a missing, unknown
        or ill-typed field."""
        return cls._parse(_exact_keys(raw, cls, where), where)

    @classmethod
    def _parse(cls, raw: Mapping[str, Any], where: str) -> ImagePreprocess:
        resample = _int(raw["resample"], "resample", where, minimum=0)
        if resample not in _PIL_FILTERS:
            raise ArtifactError(f"{where}: resample must be a PIL filter id {list(_PIL_FILTERS)}, got {resample}")
        std = _triple(raw["image_std"], "image_std", where)
        if 0.0 in std:
            raise ArtifactError(f"{where}: image_std must not contain 0, got {list(std)}")
        return cls(
            longest_edge=_int(raw["longest_edge"], "longest_edge", where, minimum=1),
            max_image_size=_int(raw["max_image_size"], "max_image_size", where, minimum=1),
            do_resize=_bool(raw["do_resize"], "do_resize", where),
            do_image_splitting=_bool(raw["do_image_splitting"], "do_image_splitting", where),
            do_rescale=_bool(raw["do_rescale"], "do_rescale", where),
            rescale_factor=_float(raw["rescale_factor"], "rescale_factor", where),
            do_normalize=_bool(raw["do_normalize"], "do_normalize", where),
            image_mean=_triple(raw["image_mean"], "image_mean", where),
            image_std=std,
            resample=resample,
            do_convert_rgb=_bool(raw["do_convert_rgb"], "do_convert_rgb", where),
        )


@dataclass(frozen=True)
class ImageTokens:
    """The prompt side of ``SmolVLMProcessor``: which tokens stand for an image and how many per frame."""

    image_token: str               # the placeholder in prompts, repeated image_seq_len times per frame
    fake_token_around_image: str
    global_image_token: str
    image_seq_len: int             # tokens per frame after the connector's pixel shuffle (64 for SmolVLM-256M)

    def prompt_string(self, rows: int, cols: int) -> str:
        """Exactly transformers' ``get_image_prompt_string``: a ``<row_r_col_c>`` block per tile, a line
        per row, then the global image; ``rows == cols == 0`` (not split) is the global image alone."""
        rows = _check_count("rows", rows)
        cols = _check_count("cols", cols)
        if (rows == 0) != (cols == 0):
            raise InvalidRequestError(f"rows and cols must both be 0 (not split) or both > 0, got {rows}, {cols}")
        frame = self.image_token * self.image_seq_len
        global_image = f"{self.fake_token_around_image}{self.global_image_token}{frame}{self.fake_token_around_image}"
        if rows == 0:
            return global_image
        lines = "".join(
            "".join(f"{self.fake_token_around_image}<row_{r + 1}_col_{c + 1}>{frame}" for c in range(cols)) + "\n"
            for r in range(rows)
        )
        return f"{lines}\n{global_image}"

    @classmethod
    def from_hf(cls, folder: Path) -> ImageTokens:
        """Tokens as ``SmolVLMProcessor`` takes them from its tokenizer (``tokenizer_config.json``: a top-level
        ``image_token`` / ``fake_image_token`` / ``global_image_token``, or the same keys in an
        ``extra_special_tokens`` object; transformers' defaults when absent or when there is no such file);
        ``image_seq_len`` from ``processor_config.json``, required (a wrong default would garble every prompt)."""
        folder = Path(folder)
        processor_path = folder / PROCESSOR_CONFIG
        if not processor_path.is_file():
            raise ArtifactError(f"{processor_path}: missing (needed for the field 'image_seq_len')")
        processor = read_json_object(processor_path)
        tokenizer_path = folder / TOKENIZER_CONFIG
        tokenizer = read_json_object(tokenizer_path) if tokenizer_path.is_file() else {}
        return cls(
            image_token=_token(tokenizer, "image_token", "<image>", tokenizer_path),
            fake_token_around_image=_token(tokenizer, "fake_image_token", "<fake_token_around_image>", tokenizer_path),
            global_image_token=_token(tokenizer, "global_image_token", "<global-img>", tokenizer_path),
            image_seq_len=_int(_require(processor, "image_seq_len", str(processor_path)), "image_seq_len",
                               str(processor_path), minimum=1),
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> ImageTokens:
        raw = _exact_keys(raw, cls, where)
        tokens = {}
        for name in ("image_token", "fake_token_around_image", "global_image_token"):
            if not isinstance(raw[name], str) or not raw[name]:
                raise ArtifactError(f"{where}: {name} must be a non-empty string, got {raw[name]!r}")
            tokens[name] = raw[name]
        return cls(**tokens, image_seq_len=_int(raw["image_seq_len"], "image_seq_len", where, minimum=1))


# ---------------------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreparedImage:
    """One image as the vision encoder takes it."""

    pixel_values: np.ndarray   # [frames, 3, side, side] float32; frames = rows*cols + 1 (global last), or 1
    rows: int                  # tiles down; 0 when not split (as the processor reports)
    cols: int                  # tiles across; 0 when not split

    @property
    def pixel_attention_mask(self) -> np.ndarray:
        """[frames, side, side] bool, all True: one image's frames all have the full side, so the
        processor's padding (to the largest frame of a batch) leaves nothing to mask."""
        frames, _, height, width = self.pixel_values.shape
        return np.ones((frames, height, width), dtype=bool)


def load_image(source: str | Path | bytes | np.ndarray | PILImage.Image, name: str = "image") -> PILImage.Image:
    """A PIL image from ``source``:

    - a path (``str`` or ``Path``; URLs are not fetched) or encoded bytes: decoded with Pillow, then, as
      transformers' ``load_image`` does for a path, EXIF-rotated and converted to RGB (an alpha channel is
      dropped, not composited on white);
    - an ``[height, width, 3]`` uint8 array (RGB);
    - a PIL image: returned as it is (:func:`prepare_image` converts it to RGB as the processor does).

    InvalidRequestError names the path (or ``name``, e.g. ``"image[1]"``) and what was expected."""
    Image = _pil_image()
    if isinstance(source, Image.Image):
        return source
    if isinstance(source, np.ndarray):
        if source.dtype != np.uint8 or source.ndim != 3 or source.shape[2] != 3 or 0 in source.shape:
            raise InvalidRequestError(f"{name}: expected a [height, width, 3] uint8 RGB array, "
                                      f"got shape {list(source.shape)} dtype {source.dtype}")
        return Image.fromarray(np.ascontiguousarray(source))
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _decode(io.BytesIO(bytes(source)), f"{name} ({len(source)} bytes)")
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise InvalidRequestError(f"{name}: no image file at {str(path)!r}")
        return _decode(path, str(path))
    raise InvalidRequestError(f"{name}: expected a path, encoded bytes, a [height, width, 3] uint8 array or a "
                              f"PIL image, got {type(source).__name__}")


def _decode(file: Path | io.BytesIO, where: str) -> PILImage.Image:
    Image = _pil_image()
    from PIL import ImageOps
    try:
        with Image.open(file) as opened:
            image = ImageOps.exif_transpose(opened)
            return image.convert("RGB")   # forces the full decode inside the try
    except Exception as e:  # Pillow's decoders raise OSError, SyntaxError, ValueError, EOFError, ...
        raise InvalidRequestError(f"{where}: not a readable image ({type(e).__name__}: {e}); expected a file Pillow "
                                  "can decode (PNG, JPEG, WebP, ...)") from None


def prepare_image(image: Any, config: ImagePreprocess, name: str = "image") -> PreparedImage:
    """``SmolVLMImageProcessorPil`` on one image: its ``pixel_values[0]``, ``rows[0][0]``, ``cols[0][0]``.
    ``image`` is anything :func:`load_image` takes."""
    rgb = _to_rgb(load_image(image, name), config.do_convert_rgb, name)
    side = config.max_image_size
    if config.do_resize:
        rgb = _resize(rgb, _longest_edge_size(rgb.height, rgb.width, config.longest_edge), config.resample)
    if config.do_image_splitting:
        rgb = _resize(rgb, _vision_encoder_size(rgb.height, rgb.width, side), config.resample)
        frames, rows, cols = _split(rgb, side, config.resample)
    else:
        frames, rows, cols = [np.asarray(_resize(rgb, (side, side), config.resample))], 0, 0
    pixels = np.stack(frames).transpose(0, 3, 1, 2)  # [frames, 3, side, side] uint8
    return PreparedImage(pixel_values=_rescale_normalize(pixels, config), rows=rows, cols=cols)


def _to_rgb(image: PILImage.Image, do_convert_rgb: bool, name: str) -> PILImage.Image:
    """transformers' ``convert_to_rgb``: transparency is composited on a white background."""
    Image = _pil_image()
    if not do_convert_rgb:
        if image.mode != "RGB":
            raise InvalidRequestError(f"{name}: mode {image.mode!r} is not RGB and the config has do_convert_rgb off")
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _resize(image: PILImage.Image, size: tuple[int, int], resample: int) -> PILImage.Image:
    height, width = size
    return image.resize((width, height), resample=resample)


def _longest_edge_size(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """(height, width) with the longest side = ``longest_edge``, the other side truncated then rounded up to
    even, at least 1, then scaled below MAX_IMAGE_SIZE (transformers' ``get_resize_output_image_size``)."""
    aspect_ratio = width / height
    if width >= height:
        width = longest_edge
        height = int(width / aspect_ratio)
        height += height % 2
    else:
        height = longest_edge
        width = int(height * aspect_ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    # _resize_output_size_scale_below_upper_bound
    aspect_ratio = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width = MAX_IMAGE_SIZE
        height = int(width / aspect_ratio)
    elif height > width and height > MAX_IMAGE_SIZE:
        height = MAX_IMAGE_SIZE
        width = int(height * aspect_ratio)
    return max(height, 1), max(width, 1)


def _vision_encoder_size(height: int, width: int, side: int) -> tuple[int, int]:
    """(height, width) rounded up to multiples of ``side``, the shorter side from the aspect ratio
    (transformers' ``resize_for_vision_encoder``)."""
    aspect_ratio = width / height
    if width >= height:
        width = math.ceil(width / side) * side
        height = math.ceil(int(width / aspect_ratio) / side) * side
    else:
        height = math.ceil(height / side) * side
        width = math.ceil(int(height * aspect_ratio) / side) * side
    return height, width


def _split(image: PILImage.Image, side: int, resample: int) -> tuple[list[np.ndarray], int, int]:
    """Tiles of ``side`` x ``side`` row by row, then the whole image resized to ``side`` x ``side``
    (transformers' ``split_images``); an image of exactly one tile is kept alone, rows = cols = 0."""
    pixels = np.asarray(image)  # [height, width, 3] uint8, both multiples of side
    height, width = pixels.shape[:2]
    if height <= side and width <= side:
        return [pixels], 0, 0
    rows, cols = (height - side) // side + 1, (width - side) // side + 1
    tiles = [pixels[r * side:(r + 1) * side, c * side:(c + 1) * side] for r in range(rows) for c in range(cols)]
    tiles.append(np.asarray(_resize(image, (side, side), resample)))
    return tiles, rows, cols


def _rescale_normalize(pixels: np.ndarray, config: ImagePreprocess) -> np.ndarray:
    """[frames, 3, side, side] uint8 -> float32, with transformers' dtypes: the rescale multiplies in float64
    and stores float32; the normalization runs in float32."""
    values = pixels
    if config.do_rescale:
        values = (values.astype(np.float64) * config.rescale_factor).astype(np.float32)
    if config.do_normalize:
        values = values.astype(np.float32, copy=False)
        mean = np.array(config.image_mean, dtype=np.float32)[:, None, None]  # [3, 1, 1]
        std = np.array(config.image_std, dtype=np.float32)[:, None, None]
        values = (values - mean) / std
    return values.astype(np.float32, copy=False)


# ---------------------------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------------------------


def expand_prompt(prompt: str, images: Sequence[PreparedImage], tokens: ImageTokens) -> str:
    """``prompt`` with its i-th ``tokens.image_token`` replaced by image i's :meth:`ImageTokens.prompt_string`,
    as ``SmolVLMProcessor`` expands text.

    One deliberate difference: a prompt with no image token and at least one image gets all the images'
    strings, in order, at its start (transformers refuses that case). Any other count mismatch is an
    InvalidRequestError giving both counts."""
    parts = prompt.split(tokens.image_token)
    placeholders = len(parts) - 1
    strings = [tokens.prompt_string(image.rows, image.cols) for image in images]
    if placeholders == 0:
        return "".join(strings) + prompt
    if placeholders != len(strings):
        raise InvalidRequestError(f"prompt has {placeholders} {tokens.image_token} placeholder(s) "
                                  f"but {len(strings)} image(s) were given")
    return parts[0] + "".join(s + part for s, part in zip(strings, parts[1:], strict=True))


# ---------------------------------------------------------------------------------------------------------------
# Field readers: ArtifactError names the file (``where``) and the field
# ---------------------------------------------------------------------------------------------------------------


def _hf_image_processor_dict(folder: Path) -> tuple[dict[str, Any], str]:
    processor_path, preprocessor_path = folder / PROCESSOR_CONFIG, folder / PREPROCESSOR_CONFIG
    if processor_path.is_file():
        nested = read_json_object(processor_path).get("image_processor")
        if nested is not None:
            if not isinstance(nested, dict):
                raise ArtifactError(f"{processor_path}: image_processor must be a JSON object")
            return nested, f"{processor_path} (image_processor)"
    if preprocessor_path.is_file():
        return read_json_object(preprocessor_path), str(preprocessor_path)
    raise ArtifactError(f"{folder}: no image processor config ({PREPROCESSOR_CONFIG}, or {PROCESSOR_CONFIG} "
                        "with an 'image_processor' object)")


def _strip_backend(kind: str) -> str:
    for suffix in ("Fast", "Pil"):
        kind = kind.removesuffix(suffix)
    return kind


def _require(raw: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in raw:
        raise ArtifactError(f"{where}: missing field {key!r}")
    return raw[key]


def _edge(raw: Mapping[str, Any], key: str, where: str) -> int:
    """``raw[key]["longest_edge"]`` (HF's size dicts) as an int >= 1."""
    value = _require(raw, key, where)
    if not isinstance(value, dict) or "longest_edge" not in value:
        raise ArtifactError(f"{where}: {key} must be an object with 'longest_edge', got {value!r}")
    return _int(value["longest_edge"], f"{key}.longest_edge", where, minimum=1)


def _exact_keys(raw: Mapping[str, Any], cls: type, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ArtifactError(f"{where}: expected an object, got {type(raw).__name__}")
    names = [f.name for f in fields(cls)]
    missing = [n for n in names if n not in raw]
    unknown = sorted(set(raw) - set(names))
    if missing or unknown:
        raise ArtifactError(f"{where}: {cls.__name__} fields missing {missing}, unknown {unknown}")
    return raw


def _bool(value: Any, field: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise ArtifactError(f"{where}: {field} must be true or false, got {value!r}")
    return value


def _int(value: Any, field: str, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArtifactError(f"{where}: {field} must be an integer >= {minimum}, got {value!r}")
    return value


def _float(value: Any, field: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ArtifactError(f"{where}: {field} must be a finite number, got {value!r}")
    return float(value)


def _triple(value: Any, field: str, where: str) -> tuple[float, float, float]:
    """Three per-channel numbers; one number means the same for each channel (as transformers reads it)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value] * 3
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ArtifactError(f"{where}: {field} must be a list of 3 numbers (R, G, B), got {value!r}")
    a, b, c = (_float(v, field, where) for v in value)
    return a, b, c


def _token(raw: Mapping[str, Any], key: str, default: str, where: Path) -> str:
    value = raw.get(key)
    if value is None and isinstance(raw.get("extra_special_tokens"), dict):
        value = raw["extra_special_tokens"].get(key)
    if value is None:
        return default
    if isinstance(value, dict):  # a serialized AddedToken
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise ArtifactError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidRequestError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)
