"""Decode speed of drafting methods against plain decoding, measured side by side.

    python -m pipeline.bench --model artifacts/M/fp32 --datastore artifacts/M/datastore \\
        --prompts ../shared/data/specbench/question.jsonl --per-task 1 --max-new-tokens 64 \\
        --methods baseline,pld,suffix_decoding --out artifacts/M/bench.json

Not a DVC stage yet (the Spec-Bench benchmark stage will grow from it). The machines are shared
and noisy, so every prompt runs ``baseline`` and then each method back to back, and the speedup
of a method is its decode tokens/s over the baseline's on the same prompt moments earlier (the
ratio of summed tokens to summed seconds over all prompts). Greedy; prefill time is reported apart.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import specrt

from .specbench import first_per_task, read_questions

log = logging.getLogger(__name__)


def bench(
    model: specrt.SpecModel,
    prompts: list,
    methods: list[str],
    modes: list[bool],
    max_new_tokens: int,
    temperature: float = 0.0,
) -> dict:
    """Per run name ("method/chain"): decode tokens and seconds, steps, prefill seconds, and the
    tokens and seconds of the baseline runs measured right before it on the same prompts. Greedy
    runs must equal the baseline token for token; sampled ones (seed = prompt index) are lossless
    in distribution, which the statistical tests check, not this benchmark."""
    runs: dict[str, dict[str, Any]] = {}
    for seed, prompt in enumerate(prompts):
        options = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        for method in methods:
            for tree in modes if method != "baseline" else [False]:
                model.forget_history()  # cold start per run: no method profits from another's history
                base, base_loop = model.generate_ids(prompt, method="baseline", **options)
                ids, loop = model.generate_ids(prompt, method=method, tree=tree, **options)
                if temperature == 0 and ids.tolist() != base.tolist():
                    raise RuntimeError(f"{method} (tree={tree}) differs from baseline: not lossless")
                r = runs.setdefault(f"{method}/{'tree' if tree else 'chain'}", dict.fromkeys(
                    ("tokens", "seconds", "steps", "prefill_s", "base_tokens", "base_seconds"), 0))
                r["tokens"] += loop.stats.decode_tokens
                r["seconds"] += loop.stats.decode_s
                r["steps"] += loop.stats.steps
                r["prefill_s"] += loop.stats.prefill_s
                r["base_tokens"] += base_loop.stats.decode_tokens
                r["base_seconds"] += base_loop.stats.decode_s
    return {
        name: {
            "decode_tokens_per_s": round(r["tokens"] / r["seconds"], 3),
            "baseline_decode_tokens_per_s": round(r["base_tokens"] / r["base_seconds"], 3),
            "speedup": round((r["tokens"] / r["seconds"]) / (r["base_tokens"] / r["base_seconds"]), 3),
            "mean_tokens_per_step": round(r["tokens"] / r["steps"], 3),
            "prefill_s": round(r["prefill_s"], 3),
        }
        for name, r in runs.items()
    }


def markdown(results: dict[str, dict[str, float]]) -> str:
    lines = ["| method | decode tok/s | baseline tok/s (same prompts, just before) | speedup | tokens/step |",
             "|---|---|---|---|---|"]
    for name, r in sorted(results.items(), key=lambda kv: -kv[1]["speedup"]):
        lines.append(f"| {name} | {r['decode_tokens_per_s']:.2f} | {r['baseline_decode_tokens_per_s']:.2f} | "
                     f"{r['speedup']:.2f}x | {r['mean_tokens_per_step']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--datastore", type=Path)
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--methods", default="pld", help="comma-separated; baseline runs before each anyway")
    parser.add_argument("--modes", default="chain,tree")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--draft", type=Path, help="draft model artifact for sd, hsd, hsd_capped")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    model = specrt.load(args.model, threads=args.threads, datastore=args.datastore, draft=args.draft)
    chat = model.manifest.chat is not None
    questions = first_per_task(read_questions(args.prompts), args.per_task)
    prompts = [model.encode(q.turns[0], chat=chat)[: args.max_prompt_tokens] for q in questions]
    modes = [{"chain": False, "tree": True}[m] for m in args.modes.split(",")]
    results = bench(model, prompts, args.methods.split(","), modes, args.max_new_tokens, args.temperature)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                                    "results": results}, indent=2) + "\n")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
