"""The image the vision-language path is checked on (export parity, the lossless stage): made by
numpy, so that every machine checks the same pixels without an image file in the repository."""

from __future__ import annotations

import numpy as np


def check_image(height: int = 240, width: int = 180, seed: int = 0) -> np.ndarray:
    """[height, width, 3] uint8: the export's check image (the defaults), a deterministic gradient
    with noise (its tiles differ from each other, so a frame order mistake shows)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([255 * y / height, 255 * x / width, 128 + 0 * x], -1) + rng.normal(0, 20, (height, width, 3))
    return np.clip(image, 0, 255).astype(np.uint8)
