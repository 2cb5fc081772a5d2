"""The vision encoder of a vision-language artifact: an image's frames -> the decoder's image rows.

    pixel_values [frames, 3, side, side] ──► encoder graph, one frame a pass ──► rows [frames * seq, hidden]

The rows go to the decoder's ``image_embeds`` input in prompt order (specrt.backend.contract): the
k-th image placeholder of the prompt takes row k - 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.backend import contract
from specrt.backend.session import make_session
from specrt.errors import ArtifactError, InvalidRequestError, SpecrtError


class VisionEncoder:
    """The encoder graph loaded in onnxruntime (``provider``, ``threads`` as the decoder's session).
    Holds no state between calls: any number of requests may use it, from any threads."""

    def __init__(self, path: Path, hidden: int, *, provider: str = "cpu", threads: int | None = None):
        self.path = path
        self.hidden = hidden
        self.session = make_session(path, provider, threads)
        inputs = {i.name: i.shape for i in self.session.get_inputs()}
        outputs = [o.name for o in self.session.get_outputs()]
        if list(inputs) != [contract.PIXEL_VALUES] or outputs != [contract.IMAGE_EMBEDS]:
            raise ArtifactError(f"{path}: expected a vision encoder graph {contract.PIXEL_VALUES} -> "
                                f"{contract.IMAGE_EMBEDS}, got inputs {list(inputs)} and outputs {outputs}")
        self.frame_shape = tuple(inputs[contract.PIXEL_VALUES][1:])  # (3, side, side)

    def rows(self, pixel_values: np.ndarray) -> np.ndarray:
        """[frames * seq, hidden] float32: the decoder rows of pixel_values [frames, 3, side, side]."""
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != self.frame_shape:
            raise InvalidRequestError(f"pixel_values must be [frames, {', '.join(map(str, self.frame_shape))}], got "
                                      f"{list(pixel_values.shape)}")
        frames = np.ascontiguousarray(pixel_values, np.float32)
        out = []
        for frame in frames:
            try:
                (rows,) = self.session.run([contract.IMAGE_EMBEDS], {contract.PIXEL_VALUES: frame[None]})
            except Exception as e:  # onnxruntime's own exception types; should not happen on checked input
                raise SpecrtError(f"{self.path}: vision encoder failed: {type(e).__name__}: {e}") from None
            out.append(rows[0])  # [seq, hidden]
        stacked = np.concatenate(out)
        if stacked.shape[1] != self.hidden:
            raise ArtifactError(f"{self.path}: the encoder gives rows of {stacked.shape[1]}, the decoder takes "
                                f"{self.hidden}")
        return stacked
