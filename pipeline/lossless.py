"""Stage ``lossless``: speculative output must equal plain decoding of the same artifact, token for token.

    python -m pipeline.lossless --model artifacts/M/fp32 --prompts ../shared/data/specbench/question.jsonl \\
        --params params.yaml --out artifacts/M/lossless.json

The regression stage: runs ``baseline`` and every other registered method (the retrieval ones
when ``--datastore`` is given), chain and tree, greedy, on a few Spec-Bench prompts per task
(first turns, in the model's chat template when it has one) on one artifact variant (fp32, int8,
int4, ...); on a vision-language artifact, each of those questions also after an image (the export's
check image, pipeline.lib.check_image). The report gives per method the token match, the first divergence and the mean
tokens per verify step. Exit 1 if a variant whose manifest says ``spec_safe: true`` diverges
(a variant the spec-safety gate flagged is reported, not failed: its divergences are expected).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import specrt
from specrt.backend.prefill import PromptImages
from specrt.drafters import NEEDS_DATASTORE, NEEDS_DRAFT
from specrt.model import SpecModel

from .lib.atomic import write_text_atomic
from .lib.check_image import check_image
from .lib.measure import PREFIX_CACHE_MB
from .lib.params import stage_params
from .lib.specbench import first_per_task, read_questions
from .lib.verdict import exit_code

log = logging.getLogger(__name__)

PLOT_FIELDS = ("token_match", "mean_tokens_per_step", "speedup")


def first_divergence(a: np.ndarray, b: np.ndarray) -> int | None:
    """Index of the first differing token (a length difference counts), or None if equal."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    if len(diff):
        return int(diff[0])
    return None if len(a) == len(b) else n


def compare_methods(
    model: SpecModel, prompts: list[np.ndarray], methods: list[str], *, max_new_tokens: int, draft_budget: int,
    images: list[PromptImages | None] | None = None,
) -> dict[str, Any]:
    """Greedy output of every method (chain and tree) vs baseline on token-id prompts, with the
    decode speed of each (same process, side by side: speedup = method tok/s / baseline tok/s).
    ``images``: per prompt, the rows of its image tokens (a vision-language artifact) or None."""
    images = images or [None] * len(prompts)
    reference, base_tokens, base_s = [], 0, 0.0
    for p, rows in zip(prompts, images, strict=True):
        ids, loop = model.generate_ids(p, method="baseline", max_new_tokens=max_new_tokens, images=rows)
        reference.append(ids)
        base_tokens += loop.stats.decode_tokens
        base_s += loop.stats.decode_s
    base_tps = base_tokens / base_s if base_s else 0.0
    runs: dict[str, Any] = {}
    for method in methods:
        for tree in (False, True):
            model.forget_history()  # every run starts cold: no method profits from an earlier run
            matched = total = steps = emitted = 0
            seconds = 0.0
            divergences = []
            for i, (prompt, ref, rows) in enumerate(zip(prompts, reference, images, strict=True)):
                # backoff=False: verify every draft the method proposes (a held draft checks nothing)
                ids, loop = model.generate_ids(
                    prompt, method=method, tree=tree, max_new_tokens=max_new_tokens, draft_budget=draft_budget,
                    backoff=False, images=rows,
                )
                at = first_divergence(ids, ref)
                matched += len(ref) if at is None else at
                total += len(ref)
                steps += loop.stats.steps
                emitted += loop.stats.decode_tokens
                seconds += loop.stats.decode_s
                if at is not None:
                    divergences.append({"prompt": i, "position": at})
            runs[f"{method}/{'tree' if tree else 'chain'}"] = {
                "token_match": round(matched / total, 6) if total else 1.0,
                "identical": not divergences,
                "divergences": divergences,
                "mean_tokens_per_step": round(emitted / steps, 4) if steps else 0.0,
                "decode_tokens_per_s": round(emitted / seconds, 3) if seconds else 0.0,
                "speedup": round(emitted / seconds / base_tps, 3) if seconds and base_tps else 0.0,
            }
    return {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "baseline_decode_tokens_per_s": round(base_tps, 3),
        "runs": runs,
        "lossless": all(r["identical"] for r in runs.values()),
    }


def run(
    artifact: Path, questions_path: Path, params: dict[str, Any], datastore: Path | None, draft: Path | None = None
) -> dict[str, Any]:
    # every method run of a prompt reuses the baseline's prompt KV (bit for bit the rows a prefill computes)
    model = specrt.load(artifact, threads=params.get("threads"), datastore=datastore, draft=draft,
                        prefix_cache_mb=PREFIX_CACHE_MB)
    questions = first_per_task(read_questions(questions_path), params["prompts_per_task"])
    chat = model.manifest.chat is not None
    prompts = [model.encode(q.turns[0], chat=chat)[: params["max_prompt_tokens"]] for q in questions]
    images: list[PromptImages | None] = [None] * len(prompts)
    if model.manifest.vision is not None:  # a vision-language artifact: the same questions about an image too
        for q in questions:  # the question cut to max_prompt_tokens as text: the image tokens stay whole
            text = model.tokenizer.decode(model.encode(q.turns[0]).tolist()[: params["max_prompt_tokens"]])
            ids, rows = model.encode_images(text, [check_image()], chat=chat)
            prompts.append(ids)
            images.append(rows)
    methods = [m for m in sorted(specrt.METHODS) if m != "baseline" and (datastore or m not in NEEDS_DATASTORE)
               and (draft or m not in NEEDS_DRAFT)]
    t0 = time.perf_counter()
    report = compare_methods(
        model, prompts, methods, max_new_tokens=params["max_new_tokens"], draft_budget=params["draft_budget"],
        images=images,
    )
    report.update(model=model.manifest.name, variant=model.manifest.variant, chat=chat,
                  spec_safe=model.manifest.spec_safe, seconds=round(time.perf_counter() - t0, 1),
                  image_prompts=sum(rows is not None for rows in images))
    return report


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the stage's wall time goes into its report (stage_s)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="artifact folder")
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--section", default="lossless",
                        help="the params.yaml section with this run's settings (e.g. lossless_full: the full run)")
    parser.add_argument("--out", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--plot", type=Path, help="plot JSON to write: one record per method run")
    parser.add_argument("--datastore", type=Path, help="retrieval datastore (corpora stage); without it the "
                        f"retrieval methods ({', '.join(sorted(NEEDS_DATASTORE))}) are left out")
    parser.add_argument("--draft", type=Path, help="draft model artifact (same tokenizer); without it the "
                        f"draft-model methods ({', '.join(sorted(NEEDS_DRAFT))}) are left out")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    report = run(args.model, args.prompts, stage_params(args.params, args.section), args.datastore,
                 args.draft)
    report["stage_s"] = round(time.perf_counter() - started, 1)
    write_text_atomic(args.out, json.dumps(report, indent=2) + "\n")
    if args.plot:
        rows = [{"run": name, "variant": report["variant"], **{k: r[k] for k in PLOT_FIELDS}}
                for name, r in report["runs"].items()]
        write_text_atomic(args.plot, json.dumps(rows, indent=2) + "\n")
    for name, r in report["runs"].items():
        log.info("%-22s identical=%s match=%.4f tokens/step=%.2f speedup=%.2fx", name, r["identical"],
                 r["token_match"], r["mean_tokens_per_step"], r["speedup"])
    return exit_code(report["lossless"], report["spec_safe"], report["variant"], args.out)

if __name__ == "__main__":
    sys.exit(main())
