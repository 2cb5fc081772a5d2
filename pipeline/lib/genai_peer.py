"""onnxruntime-genai as a peer: its model builder on a HF checkpoint, and one greedy generation.

The builder turns the checkpoint into its own ONNX model (``python -m onnxruntime_genai.models.builder
-i HF -o OUT -p int4|int8|fp32 -e cpu``) with the options that match our recipe of the same precision
(:data:`GENAI_OPTIONS`); a folder built by the same command, builder version and checkpoint files is
reused. :func:`genai_generate` times one generation as specrt's ``LoopStats`` do: ``append_tokens``
and the first ``generate_next_token`` are the prefill. Used by the peers stage and by its worker
processes (:mod:`pipeline.lib.peer_worker`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import staged_dir, write_text_atomic
from .checkpoint import full_checkpoint

log = logging.getLogger(__name__)

BUILD_RECORD = "peers_build.json"  # written into every genai build folder: the command, time, size

# onnxruntime-genai builder options giving our int4 recipe (params.yaml quantize.variants.int4):
# MatMulNBits 4-bit, block 32, symmetric, accuracy_level 4 (int8 activations, also the builder's
# CPU default), lm_head (a MatMul) and the embedding (Gather -> GatherBlockQuantized) 4-bit.
GENAI_INT4_OPTIONS = {
    "accuracy_level": "4",
    "block_size": "32",
    "is_symmetric": "true",
    "op_types_to_quantize": "MatMul/Gather",
}
# The builder's 8-bit peer of our W8A8 int8 (params.yaml quantize.variants.int8: int8 weights, int8
# activations, lm_head 8-bit, the embedding fp32): MatMulNBits 8-bit, block 32, symmetric,
# accuracy_level 4 (int8 activations per block), every MatMul (lm_head included), no Gather.
GENAI_INT8_OPTIONS = {
    "accuracy_level": "4",
    "block_size": "32",
    "is_symmetric": "true",
    "op_types_to_quantize": "MatMul",
}
GENAI_OPTIONS: dict[str, dict[str, str]] = {"fp32": {}, "int4": GENAI_INT4_OPTIONS, "int8": GENAI_INT8_OPTIONS}
GENAI_PRECISIONS = tuple(GENAI_OPTIONS)

# n-gram settings of the ort-genai speculative run: the starting point its docs recommend
# (docs/speculative_decoding.md, "Tuning": ngram_size 3 or 4, max_draft_tokens 4), fixed width.
GENAI_NGRAM = {"ngram_size": 3, "max_draft_tokens": 4}


def builder_command(hf_dir: Path, out_dir: Path, precision: str, extra_options: dict[str, str],
                    cache_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out_dir),
           "-p", precision, "-e", "cpu", "-c", str(cache_dir)]
    if extra_options:
        cmd += ["--extra_options", *(f"{k}={v}" for k, v in extra_options.items())]
    return cmd


def genai_options(precision: str, extra_options: dict[str, str] | None = None) -> dict[str, str]:
    """``extra_options``, or the builder options of ``precision`` (:data:`GENAI_OPTIONS`)."""
    if precision not in GENAI_OPTIONS:
        raise ValueError(f"onnxruntime-genai precision must be one of {GENAI_PRECISIONS}, got {precision!r}")
    return dict(GENAI_OPTIONS[precision]) if extra_options is None else extra_options


def _source_files(hf_dir: Path) -> dict[str, list[int]]:
    """The checkpoint folder's files: name -> [bytes, mtime_ns]; a change means a rebuild."""
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(hf_dir.iterdir()) if p.is_file()}


def reusable_build(
    hf_dir: Path, out_dir: Path, precision: str, extra_options: dict[str, str] | None = None
) -> dict[str, Any] | None:
    """The build record of ``out_dir`` if :func:`build_genai` would keep it (built by the same
    command, builder version and checkpoint files), else None."""
    import onnxruntime_genai as og

    extra_options = genai_options(precision, extra_options)
    hf_dir, out_dir = Path(hf_dir).resolve(), Path(out_dir).resolve()
    record_path = out_dir / BUILD_RECORD
    if not record_path.exists():
        return None
    record = json.loads(record_path.read_text())
    shown = builder_command(hf_dir, out_dir, precision, extra_options, Path("<tmp>"))
    same = (record.get("command"), record.get("source"), record.get("onnxruntime_genai")) == (
        shown[1:], _source_files(hf_dir), og.__version__)
    return record if same else None


def build_genai(
    hf_dir: Path, out_dir: Path, precision: str, extra_options: dict[str, str] | None = None, *, reuse: bool = True,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Build ``hf_dir`` with onnxruntime-genai's model builder into ``out_dir`` (written whole or
    not at all), and return the build record: the command, seconds, bytes of the folder.

    ``extra_options`` default: :data:`GENAI_OPTIONS` of ``precision`` (none for fp32). With ``reuse``,
    a folder built by the same command, builder version and checkpoint files (sizes, mtimes) is
    kept (its record comes back with ``reused``). ``checkpoint``: ``hf_dir`` with its weights as
    safetensors, which the builder reads (default: a temporary one from
    :func:`pipeline.lib.checkpoint.full_checkpoint`, or ``hf_dir`` itself when it has them)."""
    extra_options = genai_options(precision, extra_options)
    import onnxruntime_genai as og

    hf_dir, out_dir = Path(hf_dir).resolve(), Path(out_dir).resolve()
    shown = builder_command(hf_dir, out_dir, precision, extra_options, Path("<tmp>"))
    if reuse and (record := reusable_build(hf_dir, out_dir, precision, extra_options)) is not None:
        log.info("reusing %s (built by the same command from the same checkpoint files)", out_dir)
        return {**record, "reused": True}
    source = _source_files(hf_dir)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if checkpoint is None:
            checkpoint = stack.enter_context(full_checkpoint(hf_dir, scratch=out_dir.parent))
        stage = stack.enter_context(staged_dir(out_dir))
        cache = stack.enter_context(tempfile.TemporaryDirectory(dir=out_dir.parent))
        cmd = builder_command(Path(checkpoint).resolve(), stage, precision, extra_options, Path(cache))
        log.info("building: %s", shlex.join(shown))
        t0 = time.perf_counter()
        with open(stage / "build.log", "w", encoding="utf-8") as build_log:
            done = subprocess.run(cmd, stdout=build_log, stderr=subprocess.STDOUT, check=False)
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            tail = (stage / "build.log").read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RuntimeError(f"onnxruntime-genai builder exited {done.returncode}:\n{tail}")
        record = {
            "precision": precision,
            "extra_options": extra_options,
            "command": shown[1:],  # without the interpreter path
            "command_line": shlex.join(["python", *shown[1:]]),
            "source": source,  # the checkpoint's files: [bytes, mtime_ns]; a change means a rebuild
            "onnxruntime_genai": og.__version__,
            "build_s": round(seconds, 1),
            "bytes": sum(p.stat().st_size for p in stage.iterdir() if p.is_file()),
        }
        write_text_atomic(stage / BUILD_RECORD, json.dumps(record, indent=2) + "\n")
    return {**record, "reused": False}


def genai_model(model_dir: Path, threads: int | None, eos_token_ids: Sequence[int] | None) -> Any:
    import onnxruntime_genai as og

    config = og.Config(str(model_dir))
    overlay: dict[str, Any] = {}
    if threads is not None:
        overlay["decoder"] = {"session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1}}
    if eos_token_ids is not None:
        overlay["eos_token_id"] = [int(t) for t in eos_token_ids]
    if overlay:
        config.overlay(json.dumps({"model": overlay}))
    return og.Model(config)


def genai_eos(model_dir: Path, eos_token_ids: Sequence[int] | None) -> frozenset[int]:
    if eos_token_ids is None:
        eos = json.loads((Path(model_dir) / "genai_config.json").read_text())["model"]["eos_token_id"]
        eos_token_ids = eos if isinstance(eos, list) else [eos]
    return frozenset(int(t) for t in eos_token_ids)


def genai_generate(og: Any, model: Any, prompt: np.ndarray, max_new_tokens: int,
                    speculative: dict[str, Any] | None, eos: frozenset[int]) -> tuple[np.ndarray, float, float, dict]:
    """(new ids [k] int64, prefill_s, decode_s, speculative stats) of one greedy generation."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + max_new_tokens, do_sample=False)
    if speculative:
        params.set_speculative_options(**speculative)
    generator = og.Generator(model, params)
    t0 = time.perf_counter()
    generator.append_tokens(np.asarray(prompt, np.int32)[None])
    generator.generate_next_token()
    t1 = time.perf_counter()
    while not generator.is_done():
        generator.generate_next_token()
    t2 = time.perf_counter()
    ids = np.asarray(generator.get_sequence(0), np.int64)[len(prompt):]
    last = int(generator.get_next_tokens()[0])
    if len(ids) < max_new_tokens and last in eos:  # genai leaves the EOS out of the sequence; specrt keeps it
        ids = np.append(ids, last)
    stats = dict(generator.get_speculative_stats()) if speculative else {}
    return ids, t1 - t0, t2 - t1, stats
