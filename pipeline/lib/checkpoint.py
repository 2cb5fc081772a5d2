"""A Hugging Face checkpoint folder whose weights may stay in the GGUF they come from.

The weights stage writes `artifacts/M/hf` as config, generation config and tokenizer files plus
`gguf.json`, a pointer to the assembled GGUF; it does not write the float32 weights again
(2.4 GB for the 0.5B model, 6.7 GB for the 1.5B, beside the GGUF and the float32 ONNX export).
Every stage loads the model through this module:

    hf/                                     hf/ (a full checkpoint: tests, users' own models)
      config.json  tokenizer.json ...         config.json  tokenizer.json ...
      gguf.json -> ../gguf/M.gguf             model.safetensors
         | load_causal_lm                        | load_causal_lm
         v                                       v
      transformers, gguf_file= (dequantized float32; the GGUF quantizer dropped)

`full_checkpoint` gives tools that read safetensors themselves (onnxruntime-genai's builder) a
temporary full checkpoint, removed when they are done.

GGUF reads go through :func:`plain_gguf_reader`: gguf's reader parses the metadata (a 152k-token
vocabulary and its merges: ~900k values) through ``numpy.memmap`` slices, and the memmap subclass's
per-slice bookkeeping took half of a Qwen2.5-0.5B load (106 s -> 58 s without it, same tensors).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GGUF_POINTER = "gguf.json"
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


@dataclass(frozen=True)
class GGUFSource:
    """Where a checkpoint folder's weights are: ``path`` (resolved), its sha256 and size."""

    path: Path
    sha256: str
    bytes: int


def has_weights(hf_dir: Path) -> bool:
    """True when ``hf_dir`` holds weight files of its own (safetensors or a torch state dict)."""
    return any(any(Path(hf_dir).glob(pattern)) for pattern in WEIGHT_PATTERNS)


def write_pointer(hf_dir: Path, gguf_path: Path, sha256: str) -> Path:
    """Record in ``hf_dir/gguf.json`` that its weights are ``gguf_path`` (stored relative to
    ``hf_dir``, so that the artifacts folder can move as a whole)."""
    hf_dir, gguf_path = Path(hf_dir).resolve(), Path(gguf_path).resolve()
    relative = Path(os.path.relpath(gguf_path, hf_dir))
    pointer = hf_dir / GGUF_POINTER
    pointer.write_text(json.dumps({"file": relative.as_posix(), "sha256": sha256,
                                   "bytes": gguf_path.stat().st_size}, indent=2) + "\n")
    return pointer


def gguf_source(hf_dir: Path) -> GGUFSource:
    """Read and check ``hf_dir/gguf.json``: the GGUF it names must exist with the recorded size."""
    pointer = Path(hf_dir) / GGUF_POINTER
    try:
        raw = json.loads(pointer.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{hf_dir} holds neither weights ({', '.join(WEIGHT_PATTERNS)}) nor {GGUF_POINTER}; "
            f"expected a checkpoint folder written by `python -m pipeline.weights` or save_pretrained"
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{pointer}: not JSON ({e})") from None
    missing = [k for k in ("file", "sha256", "bytes") if not isinstance(raw, dict) or k not in raw]
    if missing:
        raise ValueError(f"{pointer}: expected an object with keys file, sha256, bytes; missing {missing}")
    path = (Path(hf_dir) / raw["file"]).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{pointer} names {raw['file']} ({path}), which does not exist; "
                                f"rerun the weights stage (dvc repro)")
    if path.stat().st_size != raw["bytes"]:
        raise ValueError(f"{path} has {path.stat().st_size} bytes, {pointer} records {raw['bytes']}; "
                         f"the GGUF changed after the checkpoint was written: rerun the weights stage")
    return GGUFSource(path=path, sha256=str(raw["sha256"]), bytes=int(raw["bytes"]))


@contextlib.contextmanager
def plain_gguf_reader() -> Iterator[None]:
    """While open, ``gguf.GGUFReader`` (which transformers imports when it reads a GGUF) parses
    through a plain ndarray view of its memory map: the same bytes, the same fields and tensors,
    without ``numpy.memmap``'s per-slice ``__array_finalize__``/``__getitem__``."""
    import gguf
    import numpy as np

    original = gguf.GGUFReader

    class PlainGGUFReader(original):  # type: ignore[misc, valid-type]
        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: str | None = None) -> Any:
            plain = self.__dict__.get("_plain")
            if plain is None:  # the memmap's bytes as a base ndarray (still backed by the file)
                plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
            count = int(count)
            arr = plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    gguf.GGUFReader = PlainGGUFReader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def load_gguf(gguf_path: Path) -> Any:
    """Float32 causal LM of a GGUF (transformers dequantizes it), in eval mode, with the GGUF
    quantizer dropped: the weights are plain floats, and a model with the quantizer refuses
    ``save_pretrained``."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf_path = Path(gguf_path)
    with plain_gguf_reader():
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype=torch.float32)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # (its own undo: config, method and the is_quantized flag that .float() refuses)
        quantizer.remove_quantization_config(model)
    model.hf_quantizer = None
    return model.eval()


def load_causal_lm(hf_dir: Path) -> Any:
    """Float32 causal LM of ``hf_dir``, in eval mode: its own weights, or the GGUF it points to."""
    import torch
    from transformers import AutoModelForCausalLM

    if has_weights(hf_dir):
        return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    source = gguf_source(hf_dir)
    log.info("loading %s (the weights of %s)", source.path, hf_dir)
    return load_gguf(source.path)


@contextlib.contextmanager
def full_checkpoint(hf_dir: Path, scratch: Path | None = None, model: Any = None) -> Iterator[Path]:
    """Yield a folder with ``hf_dir``'s files and its weights as safetensors: ``hf_dir`` itself
    when it has weights, else a temporary folder under ``scratch`` (default: the system's), which
    is removed on exit. ``model``: ``hf_dir``'s model as :func:`load_causal_lm` gives it, when the
    caller has it loaded already (spares a second load)."""
    hf_dir = Path(hf_dir)
    if has_weights(hf_dir):
        yield hf_dir
        return
    if model is None:
        model = load_causal_lm(hf_dir)
    with tempfile.TemporaryDirectory(prefix="specrt-checkpoint-", dir=scratch) as tmp:
        out = Path(tmp)
        for f in sorted(hf_dir.iterdir()):
            if f.is_file() and f.name != GGUF_POINTER:
                shutil.copy2(f, out / f.name)
        model.save_pretrained(out)
        del model
        log.info("temporary full checkpoint of %s in %s", hf_dir, out)
        yield out
