"""Stage ``quantize``: an fp32 specrt artifact -> an int8 or int4 artifact, gated and measured.

    python -m pipeline.quantize --src artifacts/M/fp32 --out artifacts/M/int4 --variant int4 \\
        --prompts ../shared/data/specbench/question.jsonl --params params.yaml --report artifacts/M/int4.json

1. quantize the decoder graph (``params.yaml: quantize.variants.<variant>``, see quantize_graph);
2. the spec-safety gate (specrt.engine.spec_gate) on Spec-Bench calibration prompts: the manifest's
   ``spec_safe`` is its verdict, and the runtime warns when a user speculates on an unsafe variant
   (not run where the gate section's ``variants`` leave the variant out: the runtime self-checks);
3. fidelity against the fp32 source (top-1 agreement, KL; pipeline.lib.fidelity);
4. a short side-by-side decode benchmark, fp32 vs variant (a benchmark: the stage does not fail on it).
The folder is written beside ``--out`` and renamed into place when complete (pipeline.lib.atomic).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tokenizers import Tokenizer

from specrt.backend.manifest import MANIFEST_NAME, Manifest, read_manifest
from specrt.backend.prefill import prefill
from specrt.backend.session import OrtDecoder
from specrt.backend.window import causal_bias
from specrt.engine import spec_gate
from specrt.files import file_entry
from specrt.model import load

from .lib import fidelity
from .lib.atomic import staged_dir, write_text_atomic
from .lib.params import gated, stage_params
from .lib.provenance import graph_op_types, producer_versions
from .lib.quantize_graph import QuantConfig, load_model, quantize_model, save_model
from .lib.specbench import calibration_prompts

log = logging.getLogger(__name__)


def decode_ms_per_token(decoders: dict[str, OrtDecoder], prompt: np.ndarray, steps: int, rounds: int) -> dict:
    """Median milliseconds of one single-token step per decoder, measured in interleaved rounds."""
    times: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(rounds):
        for name, decoder in decoders.items():
            decoder.reset(len(prompt) + steps + 1)
            logits = [out.logits[-1] for out in prefill(decoder, prompt, 256)][-1]
            for _ in range(steps):
                past = decoder.past
                token = np.array([int(np.argmax(logits))], np.int64)
                t = time.perf_counter()
                logits = decoder.forward(token, np.array([past]), causal_bias(past, 1)).logits[0]
                times[name].append(time.perf_counter() - t)
                decoder.commit(np.array([0]))
    return {name: round(float(np.median(t)) * 1000, 2) for name, t in times.items()}


def build_variant(src: Path, base: Manifest, out: Path, variant: str, config: QuantConfig) -> Manifest:
    """Quantize the decoder of ``src`` (verified manifest ``base``) into ``out`` (decoder and
    tokenizer, chat template, a vision encoder as it is; the manifest comes later). A graph exported
    with portable attention is for providers without specrt's kernels: its ``specrt_q4`` variant is
    made with onnxruntime's MatMulNBits instead, and its ``specrt_w8a8`` one with onnxruntime's
    MatMulInteger (``w8a8``) and 7-bit weights, which its AVX2 kernel needs (``reduce_range``)."""
    if config.method == "specrt_q4" and base.attention == "portable":
        log.info("%s: portable graph, so the int4 MatMuls are onnxruntime's MatMulNBits, not specrt's MatMulQ4", src)
        config = replace(config, method="matmul_nbits")
    if config.method == "specrt_w8a8" and base.attention == "portable":
        log.info("%s: portable graph, so the int8 MatMuls are onnxruntime's MatMulInteger, not specrt's "
                 "MatMulW8A8", src)
        config = replace(config, method="w8a8", reduce_range=True)
    t0 = time.perf_counter()
    model = quantize_model(load_model(src / base.decoder), config)
    quantize_s = time.perf_counter() - t0
    save_model(model, out / base.decoder)
    shutil.copyfile(src / base.tokenizer, out / base.tokenizer)
    if base.chat_template is not None:
        shutil.copyfile(src / base.chat_template.file, out / base.chat_template.file)
    if base.vision is not None:  # the vision encoder runs once per image frame: kept in float32
        for name in base.vision.encoder_files(base.files):
            shutil.copyfile(src / name, out / name)
    return replace(
        base,
        variant=variant,
        files={},
        producers=producer_versions(),
        checks={"quantization": {**asdict(config), "seconds": round(quantize_s, 1), "source": base.variant}},
    )


def quantize_artifact(
    src: Path,
    out: Path,
    variant: str,
    config: QuantConfig,
    prompts: list[np.ndarray],
    gate_params: dict[str, Any],
    *,
    bench_steps: int = 16,
    threads: int | None = None,
) -> dict[str, Any]:
    """Quantize, gate (on ``prompts``, [t] int64 each), measure and write the artifact ``out``;
    returns the stage report."""
    source = load(src)
    with staged_dir(out) as stage:
        manifest = build_variant(src, source.manifest, stage, variant, config)
        decoder = OrtDecoder(stage / manifest.decoder, manifest.dims, threads=threads)
        checks = dict(manifest.checks)
        if gated(gate_params, variant):
            checks["gate"] = spec_gate.gate_from_params(decoder, prompts, gate_params,
                                                        op_types=graph_op_types(stage / manifest.decoder))
            log.info("gate: spec_safe=%s, %d disagreements in %d positions", checks["gate"]["spec_safe"],
                     checks["gate"]["disagreements"], checks["gate"]["positions"])
        else:
            log.info("gate: not run on %s (its section's variants: %s)", variant, gate_params["variants"])
        gate = checks.get("gate", {})
        reference = OrtDecoder.on(source.graph)
        chunk, n = gate_params["prefill_chunk"], gate_params["new_tokens"]
        sequences = [np.concatenate([p, spec_gate.reference_run(reference, p, n, chunk).tokens]) for p in prompts]
        quality = fidelity.compare(reference, decoder, sequences, chunk)
        log.info("fidelity vs %s: %s", source.manifest.variant, quality)
        speed = decode_ms_per_token({source.manifest.variant: reference, variant: decoder}, prompts[0],
                                    steps=bench_steps, rounds=2)
        log.info("decode ms/token (side by side): %s", speed)
        files = {p.name: file_entry(p) for p in sorted(stage.iterdir()) if p.name != MANIFEST_NAME}
        manifest = replace(manifest, files=files, spec_safe=bool(gate.get("spec_safe", True)),
                           checks={**checks, "fidelity": quality})
        (stage / MANIFEST_NAME).write_text(manifest.to_json())  # last: a folder without it is refused
    size = sum(f.bytes for f in manifest.files.values())
    return {
        "model": manifest.name,
        "variant": variant,
        "bytes": size,
        "size_vs_source": round(size / sum(f.bytes for f in source.manifest.files.values()), 4),
        "spec_safe": manifest.spec_safe if gate else None,  # None: not gated
        "gate_disagreements": gate.get("disagreements"),
        "gate_positions": gate.get("positions"),
        "top1_agreement": quality["top1_agreement"],
        "mean_kl": quality["mean_kl"],
        "decode_ms_per_token": speed[variant],
        "source_decode_ms_per_token": speed[source.manifest.variant],
        "speedup_vs_source": round(speed[source.manifest.variant] / speed[variant], 3),
        "quantization": manifest.checks["quantization"],
    }


def run(
    src: Path, out: Path, variant: str, questions: Path, params: dict[str, Any], gate_params: dict[str, Any]
) -> dict[str, Any]:
    """Worker of the stage: calibration prompts from Spec-Bench, then :func:`quantize_artifact`."""
    source = read_manifest(src, check_hashes=False)
    tokenizer = Tokenizer.from_file(str(src / source.tokenizer))
    chat = source.chat

    def encode(text: str) -> np.ndarray:
        return np.array(tokenizer.encode(chat.prefix + text + chat.suffix if chat else text).ids, np.int64)

    prompts = calibration_prompts(questions, encode, gate_params["prompts_per_task"], gate_params["max_prompt_tokens"])
    return quantize_artifact(src, out, variant, QuantConfig(**params["variants"][variant]), prompts, gate_params,
                             bench_steps=params["bench_steps"], threads=params.get("threads"))


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the stage's wall time goes into its report (stage_s)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", type=Path, required=True, help="fp32 artifact folder (export stage)")
    parser.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    parser.add_argument("--variant", required=True, help="a key of params.yaml's quantize.variants")
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench question.jsonl (calibration)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--report", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--plot", type=Path, help="plot JSON to write (one record: this variant's figures)")
    parser.add_argument("--gate-section", default="gate",
                        help="params.yaml's section of spec-safety gate settings (gate_target: the pair's target)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one setting of the variant (YAML value), e.g. --set accuracy_level=4")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("onnxruntime").setLevel(logging.WARNING)
    all_params = yaml.safe_load(args.params.read_text())
    params = all_params["quantize"]
    if args.variant not in params["variants"]:
        parser.error(f"--variant {args.variant!r} is not a key of {args.params}'s quantize.variants "
                     f"({', '.join(params['variants'])})")
    for item in args.set:
        key, sep, value = item.partition("=")
        fields = QuantConfig.__dataclass_fields__
        if not sep or key not in fields:
            parser.error(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(fields)}")
        params["variants"][args.variant][key] = yaml.safe_load(value)
    report = run(args.src, args.out, args.variant, args.prompts, params, stage_params(args.params, args.gate_section))
    report["stage_s"] = round(time.perf_counter() - started, 1)
    write_text_atomic(args.report, json.dumps(report, indent=2) + "\n")
    if args.plot:
        row = {k: v for k, v in report.items() if not isinstance(v, dict)}
        write_text_atomic(args.plot, json.dumps([row], indent=2) + "\n")
    log.info("wrote %s", args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
