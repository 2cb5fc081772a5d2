"""specrt's kernel library: onnxruntime custom operators built with the package (runtime/kernels/).

    SpecAttention (domain ai.specrt, version 1)   a decoder layer's whole attention, exact by
                                                  construction (docs/kernels.md)
    SwiGLU (ai.specrt, 1)                         an MLP's silu(gate) * up on its packed rows
    MatMulQ4 (ai.specrt, 1)                       x W for 4-bit W (blocks of 32, int8 activations),
                                                  a row's bits independent of the window
    MatMulW8A8 (ai.specrt, 1)                     x W for int8 W (per column) and int8 activations
                                                  per token: integer sums, the bits of a row alone

``pip install .`` compiles the library into this package as ``_kernels*.so``. Every onnxruntime
InferenceSession specrt makes registers it (:func:`register`), so a graph that uses its operators
loads like any other; a graph without them is unaffected. The library runs on onnxruntime's CPU provider only.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import onnxruntime as ort

from specrt.errors import ArtifactError

DOMAIN = "ai.specrt"
OPSET = 1
ATTENTION_OP = "SpecAttention"
SWIGLU_OP = "SwiGLU"
MATMUL_Q4_OP = "MatMulQ4"
MATMUL_W8A8_OP = "MatMulW8A8"
HEAD_DIM_MULTIPLE = 16  # SpecAttention's head_dim: a multiple of 16 (one canonical 16-lane vector) ...
MAX_HEAD_DIM = 1024  # ... up to this
_INSTALL_HINT = (
    "reinstall specrt with its kernel library: `bash runtime/kernels/fetch_ort_headers.sh && pip install .` "
    "from the specrt checkout (it needs g++ and onnxruntime's C API headers; see the README)"
)


class KernelLibraryError(ArtifactError):
    """The kernel library that a decoder graph needs is missing or cannot load into this onnxruntime."""


def library_path() -> Path | None:
    """The built library inside the installed package, or None when the package was installed without it."""
    here = Path(__file__).parent
    for pattern in ("_kernels*.so", "_kernels*.pyd", "_kernels*.dylib"):
        found = sorted(here.glob(pattern))
        if found:
            return found[0]
    return None


def onnxruntime_api_version() -> int:
    """The newest C API version the installed onnxruntime serves (onnxruntime 1.N serves N)."""
    major, minor = (int(part) for part in ort.__version__.split(".")[:2])
    return minor if major == 1 else 10**6


@functools.cache
def _library(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))


def describe() -> dict[str, object]:
    """What the library is: its path, the C API version it was built against and the instruction set
    its kernels choose on this CPU (or why it cannot be used)."""
    path = library_path()
    if path is None:
        return {"path": None, "error": "not built"}
    library = _library(path)
    library.specrt_kernels_isa.restype = ctypes.c_char_p
    return {
        "path": str(path),
        "api_version": int(library.specrt_kernels_api_version()),
        "onnxruntime_api_version": onnxruntime_api_version(),
        "isa": library.specrt_kernels_isa().decode(),
    }


def require() -> Path:
    """The library's path, or KernelLibraryError saying how to get a usable one."""
    path = library_path()
    if path is None:
        raise KernelLibraryError(f"specrt's kernel library is not installed: {_INSTALL_HINT}")
    built_for = int(_library(path).specrt_kernels_api_version())
    serves = onnxruntime_api_version()
    if built_for > serves:
        raise KernelLibraryError(
            f"{path}: built against onnxruntime C API {built_for}, but onnxruntime {ort.__version__} serves up to "
            f"{serves}: `pip install 'onnxruntime>=1.{built_for}'`, or rebuild specrt against older headers "
            "(ORT_INCLUDE_DIR)"
        )
    return path


def register(options: ort.SessionOptions, *, required: bool = False) -> bool:
    """Register the library with ``options``; returns whether it was. ``required``: raise
    KernelLibraryError when it cannot be (else a graph that needs it fails to load, see
    :func:`explain_load_error`)."""
    try:
        path = require()
    except KernelLibraryError:
        if required:
            raise
        return False
    options.register_custom_ops_library(str(path))
    return True


def explain_load_error(path: Path, error: Exception) -> str | None:
    """A message naming the fix when onnxruntime failed to load ``path`` for want of this library's
    operators, else None."""
    text = str(error)
    if DOMAIN not in text and not any(op in text for op in (ATTENTION_OP, SWIGLU_OP, MATMUL_Q4_OP, MATMUL_W8A8_OP)):
        return None
    if MATMUL_Q4_OP in text and "tensor(float)" in text and "scales" in text:
        return (f"{path}: its {MATMUL_Q4_OP} nodes carry float32 scales, which this kernel library reads as float16 "
                "(half the scale bytes a step streams); quantize the artifact again with this version's pipeline "
                "(`dvc repro`, or `python -m pipeline.quantize --variant int4 ...`)")
    try:
        require()
    except KernelLibraryError as e:
        return f"{path}: the graph uses specrt's {DOMAIN} operators: {e}"
    return f"{path}: the graph uses {DOMAIN} operators this kernel library does not provide ({text})"
