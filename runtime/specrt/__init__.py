"""specrt: lossless speculative decoding on ONNX Runtime (torch-free runtime).

    import specrt
    model = specrt.load("artifacts/qwen2.5-coder-0.5b-instruct/fp32")
    result = model.generate("def add(a, b):", max_new_tokens=64, method="pld")
"""

from specrt.cancel import CancelToken
from specrt.drafters import METHODS
from specrt.errors import ArtifactError, DrafterError, InvalidRequestError, SpecrtError
from specrt.model import GenerationResult, SpecModel, load

__all__ = [
    "load", "SpecModel", "GenerationResult", "METHODS", "SpecrtError", "ArtifactError", "InvalidRequestError",
    "DrafterError", "CancelToken",
]
__version__ = "0.1.0"
