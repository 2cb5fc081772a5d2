"""A vision-language artifact's way from a prompt and its images to the decoder's inputs.

    images ──► load_image, prepare_image (frames) ──► VisionEncoder ──► rows [n, hidden]
    prompt ──► expand_prompt (each image's placeholder text) ──► tokenizer ──► ids, n image tokens

The k-th image token of the ids takes row k - 1 (specrt.backend.contract); :meth:`ImageInputs.check`
holds a request to that before any work.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specrt.backend.manifest import MANIFEST_NAME, Manifest
from specrt.backend.prefill import PromptImages
from specrt.errors import InvalidRequestError
from specrt.vision.encoder import VisionEncoder
from specrt.vision.preprocess import ImagePreprocess, ImageTokens, expand_prompt, load_image, prepare_image


class ImageInputs:
    """The image side of a loaded vision-language artifact (``manifest.vision``): its preprocessing,
    its placeholder text and its encoder session."""

    def __init__(self, folder: Path, manifest: Manifest, *, provider: str = "cpu", threads: int | None = None):
        spec = manifest.vision
        if spec is None:
            raise ValueError(f"{folder}: not a vision-language artifact")
        where = folder / MANIFEST_NAME
        self.token_id = spec.image_token_id
        self.hidden = manifest.dims.hidden
        self.preprocess = ImagePreprocess.from_dict(spec.preprocess, f"{where}: vision.preprocess")
        self.tokens = ImageTokens.from_dict(spec.prompt, f"{where}: vision.prompt")
        self.encoder = VisionEncoder(folder / spec.encoder, manifest.dims.hidden, provider=provider, threads=threads)

    def prepare(self, prompt: str, images: Sequence[Any]) -> tuple[str, np.ndarray]:
        """``prompt`` with each image's placeholder text, and the images' rows [n, hidden] in order."""
        prepared = [prepare_image(load_image(image, name=f"images[{i}]"), self.preprocess)
                    for i, image in enumerate(images)]
        text = expand_prompt(prompt, prepared, self.tokens)
        rows = [self.encoder.rows(p.pixel_values) for p in prepared]
        return text, np.concatenate(rows) if rows else np.zeros((0, self.hidden), np.float32)

    def prompt_images(self, ids: np.ndarray, rows: np.ndarray) -> PromptImages:
        images = PromptImages(self.token_id, rows)
        self.check(ids, images)
        return images

    def check(self, ids: np.ndarray, images: PromptImages) -> None:
        """InvalidRequestError unless ``images`` gives one [hidden] float32 row per image token of ids ([t])."""
        if not isinstance(images, PromptImages):
            raise InvalidRequestError(f"images must be a specrt PromptImages (SpecModel.encode_images), got "
                                      f"{type(images).__name__}")
        if images.token_id != self.token_id:
            raise InvalidRequestError(f"images.token_id is {images.token_id}, the artifact's image token is "
                                      f"{self.token_id}")
        rows = images.embeds
        if not isinstance(rows, np.ndarray) or rows.dtype != np.float32 or rows.ndim != 2 \
                or rows.shape[1] != self.hidden:
            raise InvalidRequestError(f"images.embeds must be float32 [n, {self.hidden}], got "
                                      f"{getattr(rows, 'dtype', type(rows).__name__)} {list(np.shape(rows))}")
        placeholders = int(np.count_nonzero(ids == self.token_id))
        if placeholders != len(rows):
            raise InvalidRequestError(f"the prompt holds {placeholders} image tokens (id {self.token_id}) and the "
                                      f"images give {len(rows)} rows: each image token needs one row")
