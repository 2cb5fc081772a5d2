"""A SmolVLM / Idefics3-style vision-language model split for export: its vision encoder as one ONNX
graph, its text decoder as a causal LM that ``decoder_graph`` exports with the image_embeds input.

    pixel_values [1, 3, side, side] ──► vision transformer ──► connector (pixel shuffle, projection)
                                                                    └──► image_embeds [1, seq, hidden]
    image_embeds rows, in prompt order ──► the decoder's image tokens (specrt.backend.contract)

The encoder runs one frame (an image tile, or the whole image resized) per call: the model's patch
embedding builds its position ids in a Python loop over frames, which an export with a dynamic frame
count cannot trace, and a frame is the unit of the processor's split anyway.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from specrt.backend import contract
from specrt.backend.manifest import VisionSpec
from specrt.backend.prefill import PromptImages, prefill
from specrt.backend.session import OrtDecoder
from specrt.vision.encoder import VisionEncoder
from specrt.vision.preprocess import ImagePreprocess, ImageTokens, expand_prompt, load_image, prepare_image

from .check_image import check_image
from .parity import compare_logits

log = logging.getLogger(__name__)

VISION_ARCHS = ("smolvlm", "idefics3")


def check_vlm(model: Any) -> None:
    """Refuse a model that is not a SmolVLM / Idefics3 vision-language model, naming what it is."""
    kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    if kind not in VISION_ARCHS:
        raise ValueError(f"{kind}: the vision-language exporter takes {VISION_ARCHS} models")


def is_vlm_folder(hf_dir: Path) -> bool:
    """Whether the Hugging Face folder holds a vision-language model this exporter takes."""
    config = hf_dir / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("model_type") in VISION_ARCHS


def load_vlm(hf_dir: Path) -> PreTrainedModel:
    """The float32 vision-language model of a Hugging Face folder (config, weights, processor)."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(hf_dir, dtype=torch.float32).eval()


def vision_source(vlm: PreTrainedModel, hf_dir: Path, encode: Any, prompt: str) -> VisionSource:
    """The exporter's view of ``vlm`` (its folder ``hf_dir`` holds the processor's configs), checked
    on :func:`check_image` in ``prompt`` (text naming one ``<image>``) encoded by ``encode`` (str -> ids)."""
    preprocess, tokens = ImagePreprocess.from_hf(hf_dir), ImageTokens.from_hf(hf_dir)
    prepared = prepare_image(load_image(check_image()), preprocess)
    ids = np.asarray(encode(expand_prompt(prompt, [prepared], tokens)), np.int64)
    return VisionSource(vlm, preprocess.to_dict(), tokens.to_dict(), prepared.pixel_values, ids)


def text_decoder_of(vlm: PreTrainedModel) -> PreTrainedModel:
    """The vision-language model's text decoder as a causal LM sharing its modules: ``.model`` the
    text model, ``.lm_head`` its head, ``.config`` the text config (no weights are copied)."""
    check_vlm(vlm)
    with torch.device("meta"):  # every module is replaced below: allocate nothing
        causal = AutoModelForCausalLM.from_config(vlm.config.text_config)
    causal.model = vlm.model.text_model
    causal.lm_head = vlm.lm_head
    causal.generation_config = vlm.generation_config
    return causal.float().eval()


class VisionEncoderForExport(nn.Module):
    """``forward(pixel_values [1, 3, side, side]) -> image_embeds [1, seq, hidden]``: the rows one
    frame gives the decoder, as the model's ``get_image_features`` computes them for a real frame."""

    def __init__(self, vlm: PreTrainedModel):
        super().__init__()
        self.vision_model = vlm.model.vision_model
        self.connector = vlm.model.connector

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.vision_model(pixel_values=pixel_values).last_hidden_state  # [1, patches, vision_hidden]
        return self.connector(hidden)


def frame_side(vlm: PreTrainedModel) -> int:
    return int(vlm.config.vision_config.image_size)


def image_seq_len(vlm: PreTrainedModel) -> int:
    """Decoder rows per frame: (side / patch)^2 / scale_factor^2."""
    vision = vlm.config.vision_config
    return int((vision.image_size // vision.patch_size) ** 2 // vlm.config.scale_factor**2)


def export_vision_onnx(vlm: PreTrainedModel, path: Path, opset: int) -> None:
    """The vision encoder of ``vlm`` to ``path`` (+ external weights): input ``pixel_values``,
    output ``image_embeds``."""
    check_vlm(vlm)
    side = frame_side(vlm)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        program = torch.onnx.export(
            VisionEncoderForExport(vlm).eval(),
            (torch.randn(1, 3, side, side),),
            input_names=[contract.PIXEL_VALUES],
            output_names=[contract.IMAGE_EMBEDS],
            opset_version=opset,
            dynamo=True,
            optimize=True,
        )
    program.save(str(path), external_data=True)
    log.info("exported %s", path)


@torch.no_grad()
def torch_image_embeds(vlm: PreTrainedModel, pixel_values: np.ndarray) -> np.ndarray:
    """[frames * seq, hidden]: the model's own image features of pixel_values [frames, 3, side, side]."""
    features = vlm.model.get_image_features(torch.from_numpy(pixel_values)[None], return_dict=True)
    return torch.cat(list(features.pooler_output)).float().numpy()


@dataclass(frozen=True)
class VisionSource:
    """What the exporter needs of a vision-language model beyond its text decoder: the model, how
    its processor prepares images and prompts (specrt.vision's dicts), and one image prompt to
    check the export on."""

    vlm: PreTrainedModel
    preprocess: dict[str, Any]  # specrt.vision.ImagePreprocess.to_dict()
    prompt: dict[str, Any]  # specrt.vision.ImageTokens.to_dict()
    check_pixels: np.ndarray  # [frames, 3, side, side] float32: the check image's frames
    check_ids: np.ndarray  # [t] int64: a prompt holding frames * image_seq_len image tokens

    @property
    def image_token_id(self) -> int:
        return int(self.vlm.config.image_token_id)

    def spec(self, encoder: str) -> VisionSpec:
        return VisionSpec(encoder=encoder, image_token_id=self.image_token_id, image_seq_len=image_seq_len(self.vlm),
                          preprocess=self.preprocess, prompt=self.prompt)


@torch.no_grad()
def image_parity(source: VisionSource, encoder: VisionEncoder, decoder: OrtDecoder, chunk: int) -> dict[str, Any]:
    """The exported encoder against the model's image features, and the
    decoder prefilling ``source.check_ids`` with those rows against the model's own forward with the
    pixel values (every position's logits)."""
    ref_rows = torch_image_embeds(source.vlm, source.check_pixels)
    rows = encoder.rows(source.check_pixels)
    ids = source.check_ids
    if int(np.count_nonzero(ids == source.image_token_id)) != len(rows):
        raise ValueError(f"the check prompt holds {np.count_nonzero(ids == source.image_token_id)} image tokens, "
                         f"the check image {len(rows)} rows")
    ref = source.vlm(input_ids=torch.from_numpy(ids)[None], pixel_values=torch.from_numpy(source.check_pixels)[None])
    decoder.reset(len(ids) + 1)
    images = PromptImages(source.image_token_id, rows)
    logits = np.concatenate([out.logits for out in prefill(decoder, ids, chunk, images=images)])
    return {"encoder_max_abs_diff": float(np.abs(rows - ref_rows).max()),
            "decoder": compare_logits(logits, ref.logits[0].float().numpy()), "image_tokens": len(rows)}
