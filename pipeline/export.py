"""Stage ``export``: a Hugging Face checkpoint -> an fp32 specrt artifact folder, checked against torch.

    python -m pipeline.export --hf artifacts/M/hf --out artifacts/M/fp32 --name M \\
        --parity-text ../shared/data/specbench/question.jsonl --params params.yaml

Writes ``decoder.onnx`` (+ ``decoder.onnx.data``), ``tokenizer.json`` and ``manifest.json`` into
``--out``; fails (exit 1) if the ONNX logits differ from torch's beyond the tolerance, on a prompt
longer than any sliding window, for a chain and for a tree verify window.

A SmolVLM / Idefics3 folder (pipeline/vlm/dvc.yaml) gives a vision-language artifact: its text decoder
with the contract's image_embeds input, its vision encoder as ``vision.onnx``, the processor's settings
in the manifest, and a parity check on an image prompt too (pipeline.lib.vision_graph).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specrt.backend import contract
from specrt.backend.manifest import MANIFEST_NAME, Manifest
from specrt.backend.session import OrtDecoder
from specrt.engine.spec_gate import gate_from_params
from specrt.files import file_entry
from specrt.vision.encoder import VisionEncoder

from .lib.atomic import staged_dir, write_text_atomic
from .lib.chat_template import chat_template, write_chat_template
from .lib.checkpoint import load_causal_lm
from .lib.decoder_graph import export_onnx, model_dims
from .lib.params import gated, stage_params
from .lib.parity import check_parity
from .lib.provenance import graph_op_types, producer_versions
from .lib.specbench import calibration_prompts
from .lib.vision_graph import (
    VisionSource,
    export_vision_onnx,
    image_parity,
    is_vlm_folder,
    load_vlm,
    text_decoder_of,
    vision_source,
)

log = logging.getLogger(__name__)

DECODER_FILE = "decoder.onnx"
VISION_FILE = "vision.onnx"  # a vision-language model's encoder
VISION_CHECK_PROMPT = "Describe this image."  # the parity check's prompt, after its image (vision_graph.check_image)
TOKENIZER_FILE = "tokenizer.json"


class ParityError(RuntimeError):
    pass


def eos_token_ids(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, stop_tokens: tuple[str, ...] = ()
) -> tuple[int, ...]:
    """Union of the generation config's, the model config's and the tokenizer's EOS ids, and the
    ids of ``stop_tokens`` (token strings, e.g. "<|endoftext|>")."""
    ids: list[int] = []
    for token in stop_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"stop token {token!r} is not in the tokenizer's vocabulary")
        if token_id not in ids:
            ids.append(int(token_id))
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if token is not None and int(token) not in ids:
                ids.append(int(token))
    if not ids:
        raise ValueError("no EOS token id in the generation config, model config or tokenizer")
    return tuple(ids)


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, tokenizer_json: Path, samples: list[str]) -> None:
    """The runtime encodes with ``tokenizers`` alone: it must give the same ids as transformers."""
    from tokenizers import Tokenizer

    fast = Tokenizer.from_file(str(tokenizer_json))
    for text in samples:
        want = tokenizer(text)["input_ids"]
        got = fast.encode(text).ids
        if got != want:
            raise ValueError(f"{tokenizer_json}: encodes {text[:40]!r} as {got[:8]}..., transformers as {want[:8]}...")


def parity_ids(tokenizer: PreTrainedTokenizerBase, jsonl: Path, n_tokens: int) -> np.ndarray:
    """The first ``n_tokens`` tokens of the Spec-Bench turns, concatenated in file order."""
    ids: list[int] = []
    with open(jsonl) as f:
        for line in f:
            for turn in json.loads(line)["turns"]:
                ids += tokenizer(turn + "\n\n")["input_ids"]
            if len(ids) >= n_tokens:
                return np.array(ids[:n_tokens], np.int64)
    raise ValueError(f"{jsonl}: only {len(ids)} tokens, parity needs {n_tokens}")


def build_artifact(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tokenizer_json: Path, out: Path, **options: Any
) -> Manifest:
    """Export, copy the tokenizer, check parity and write the manifest (options: see
    :func:`_write_artifact`) into a folder beside ``out``, renamed onto ``out`` once complete
    (pipeline.lib.atomic): ``out`` never holds a half-written artifact, and an interrupted run leaves an
    old ``out`` as it was. A failed parity check still publishes the folder, with
    ``parity_failed.json`` and without a manifest (the runtime refuses it), then raises ParityError."""
    with staged_dir(out) as stage:
        manifest = _write_artifact(model, tokenizer, tokenizer_json, stage, **options)
    parity = manifest.checks["parity"]
    if not parity["ok"]:
        raise ParityError(f"{out}: ONNX logits differ from torch beyond {parity['tolerance']}: {parity}")
    return manifest


def _write_artifact(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    tokenizer_json: Path,
    out: Path,
    *,
    name: str,
    max_context: int,
    opset: int,
    check_ids: np.ndarray,
    tolerance: float,
    prefill_chunk: int,
    stop_tokens: tuple[str, ...] = (),
    variant: str = "fp32",
    attention: str = "specrt",
    gate_prompts: list[np.ndarray] | None = None,
    gate: dict[str, Any] | None = None,
    vision: VisionSource | None = None,
) -> Manifest:
    """Export, copy the tokenizer, check parity and run the spec-safety gate (specrt.engine.spec_gate)
    into the empty folder ``out``, then write the manifest, or ``parity_failed.json`` instead when
    parity is off (``checks["parity"]["ok"]``). The gate runs on ``gate_prompts`` with ``gate``
    settings (params.yaml: gate); by default on the first half of ``check_ids``, briefly. Where
    ``gate`` names its ``variants`` without ``variant``, no gate runs: the manifest records no verdict,
    and the runtime runs its self-check before the first speculative request (specrt.backend.verdict).
    ``vision``: ``model`` is a vision-language model's text decoder (pipeline.lib.vision_graph); its
    encoder goes beside it and the parity check covers a prompt with an image too."""
    model = model.float().eval()
    max_context = min(max_context, getattr(model.config, "max_position_embeddings", max_context))
    dims = model_dims(model, max_context)
    t0 = time.perf_counter()
    export_onnx(model, dims, out / DECODER_FILE, opset, attention, vision.image_token_id if vision else None)
    if vision is not None:
        export_vision_onnx(vision.vlm, out / VISION_FILE, opset)
    export_s = time.perf_counter() - t0
    shutil.copyfile(tokenizer_json, out / TOKENIZER_FILE)
    check_tokenizer(tokenizer, out / TOKENIZER_FILE, ["def add(a, b):\n    return a + b", "Hello, world! héllo"])
    template = write_chat_template(tokenizer, out)

    t0 = time.perf_counter()
    decoder = OrtDecoder(out / DECODER_FILE, dims, threads=None)
    parity = check_parity(model, decoder, check_ids, chunk=prefill_chunk, tolerance=tolerance)
    if vision is not None:
        image = image_parity(vision, VisionEncoder(out / VISION_FILE, dims.hidden), decoder, prefill_chunk)
        parity["image"] = image
        parity["ok"] = parity["ok"] and image["encoder_max_abs_diff"] <= tolerance \
            and image["decoder"]["max_abs_diff"] <= tolerance and image["decoder"]["argmax_flips"] == 0
    parity["seconds"] = round(time.perf_counter() - t0, 2)
    log.info("parity: %s", parity)
    gate = gate or {"new_tokens": 16, "widths": [4], "prefill_chunk": prefill_chunk}
    checks: dict[str, Any] = {"parity": parity}
    if gated(gate, variant):
        checks["gate"] = gate_from_params(decoder, gate_prompts or [check_ids[: max(len(check_ids) // 2, 1)]],
                                          gate, op_types=graph_op_types(out / DECODER_FILE))
        log.info("gate: spec_safe=%s, %d disagreements in %d positions", checks["gate"]["spec_safe"],
                 checks["gate"]["disagreements"], checks["gate"]["positions"])
    else:
        log.info("gate: not run on %s (its section's variants: %s)", variant, gate["variants"])

    inputs, outputs = contract.io_table(dims.num_layers, dims.kv_heads, dims.head_dim, dims.hidden, dims.vocab,
                                        image_embeds=vision is not None, logits_index=True)
    files = {p.name: file_entry(p) for p in sorted(out.iterdir()) if p.name != MANIFEST_NAME}
    manifest = Manifest(
        name=name,
        variant=variant,
        arch=model.config.model_type,
        dims=dims,
        decoder=DECODER_FILE,
        tokenizer=TOKENIZER_FILE,
        eos_token_ids=eos_token_ids(model, tokenizer, stop_tokens),
        files=files,
        io={"inputs": [asdict(t) for t in inputs], "outputs": [asdict(t) for t in outputs]},
        producers=producer_versions(),
        chat=chat_template(tokenizer),
        chat_template=template,
        spec_safe=bool(checks["gate"]["spec_safe"]) if "gate" in checks else True,
        attention=attention,
        checks={**checks, "export_s": round(export_s, 2)},
        vision=vision.spec(VISION_FILE) if vision is not None else None,
    )
    if not parity["ok"]:
        (out / "parity_failed.json").write_text(json.dumps(parity, indent=2))
        return manifest
    (out / MANIFEST_NAME).write_text(manifest.to_json())  # last: a folder without it is refused
    return manifest


def run(
    hf_dir: Path,
    out: Path,
    name: str,
    parity_text: Path,
    params: dict[str, Any],
    stop_tokens: tuple[str, ...],
    gate: dict[str, Any],
    parity_tokens: int | None = None,
) -> dict[str, Any]:
    """Worker of the stage: returns the report written next to the artifact. ``parity_tokens``
    overrides ``params["parity_tokens"]``."""
    torch.manual_seed(0)
    t0 = time.perf_counter()
    vlm = load_vlm(hf_dir) if is_vlm_folder(hf_dir) else None
    model = text_decoder_of(vlm) if vlm is not None else load_causal_lm(hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    load_s = time.perf_counter() - t0
    chat = chat_template(tokenizer)
    wrap = (lambda text: chat.prefix + text + chat.suffix) if chat else (lambda text: text)
    vision = None
    if vlm is not None:
        vision = vision_source(vlm, hf_dir, lambda text: tokenizer(wrap(text))["input_ids"], VISION_CHECK_PROMPT)
    gate_prompts = calibration_prompts(
        parity_text,
        lambda text: np.array(tokenizer(wrap(text))["input_ids"], np.int64),
        gate["prompts_per_task"],
        gate["max_prompt_tokens"],
    )
    manifest = build_artifact(
        model,
        tokenizer,
        hf_dir / TOKENIZER_FILE,
        out,
        name=name,
        max_context=params["max_context"],
        opset=params["opset"],
        check_ids=parity_ids(tokenizer, parity_text, parity_tokens or params["parity_tokens"]),
        tolerance=params["parity_tolerance"],
        prefill_chunk=params["prefill_chunk"],
        attention=params["attention"],
        stop_tokens=stop_tokens,
        gate_prompts=gate_prompts,
        gate=gate,
        vision=vision,
    )
    return {
        "model": name,
        "variant": manifest.variant,
        "load_s": round(load_s, 2),
        "bytes": sum(f.bytes for f in manifest.files.values()),
        "spec_safe": manifest.spec_safe if "gate" in manifest.checks else None,  # None: not gated
        "attention": manifest.attention,
        **manifest.checks,
    }


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the stage's wall time goes into its report (stage_s)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hf", type=Path, required=True,
                        help="Hugging Face checkpoint folder (weights stage; its weights may be the GGUF "
                        "its gguf.json points to)")
    parser.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    parser.add_argument("--name", required=True, help="model name (a key of params.yaml's catalog)")
    parser.add_argument("--parity-text", type=Path, required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--report", type=Path, help="JSON report (default: <out>/../export.json)")
    parser.add_argument("--gate-section", default="gate",
                        help="params.yaml's section of spec-safety gate settings (gate_target: the pair's target)")
    parser.add_argument("--parity-tokens", type=int,
                        help="tokens of the parity check (default: params.yaml's export.parity_tokens)")
    args = parser.parse_args(argv)
    if args.parity_tokens is not None and args.parity_tokens < 2:
        parser.error(f"--parity-tokens {args.parity_tokens}: expected at least 2 tokens")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    all_params = yaml.safe_load(args.params.read_text())
    catalog, vlm = all_params.get("catalog", {}), all_params.get("vlm") or {}
    if args.name in catalog:
        stop_tokens = tuple(catalog[args.name].get("stop_tokens", ()))
    elif args.name == vlm.get("name"):
        stop_tokens = tuple(vlm.get("stop_tokens", ()))
    else:
        parser.error(f"--name {args.name!r} is not a key of {args.params}'s catalog, nor its vlm.name")
    if not (args.hf / "config.json").is_file():
        parser.error(f"--hf {args.hf}: not a Hugging Face folder (no config.json); for the vision-language path, "
                     f"set vlm.hf in {args.params} to a local SmolVLM / Idefics3 folder")
    gate = stage_params(args.params, args.gate_section)
    try:
        report = run(args.hf, args.out, args.name, args.parity_text, all_params["export"], stop_tokens, gate,
                     args.parity_tokens)
    except ParityError as e:
        log.error("%s", e)
        return 1
    report_path = args.report or args.out.parent / "export.json"
    report["stage_s"] = round(time.perf_counter() - started, 1)
    write_text_atomic(report_path, json.dumps(report, indent=2) + "\n")
    log.info("wrote %s", report_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
