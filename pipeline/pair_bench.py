"""Stage ``pair_bench``: draft-model speculative decoding on the draft/target pair, against plain
decoding of the target, side by side (CPU).

    python -m pipeline.pair_bench --target artifacts/T/int4 --draft artifacts/D/int4 \\
        --prompts ../shared/data/specbench/question.jsonl --params params.yaml \\
        --out artifacts/pair/bench-int4.json --plot artifacts/pair/plots/bench-int4.json

Settings come from the params section ``--section`` (``pair_bench``, the quick run CI records;
``pair_bench_full``, the full pipeline's). For every Spec-Bench prompt (first turns,
``prompts_per_task`` per task of ``tasks``, all six when null) and every temperature, the target
decodes plainly (the cached autoregressive baseline: one token per target pass with its KV cache),
then each method of ``methods`` (sd, hsd, hsd_capped, auto) right after it with the same seed, then plain
decoding again (speedups over the mean of the two). The report gives per run decode tokens/s,
the baseline's, the speedup, the acceptance rate (accepted / drafted tokens), mean tokens per
verify step, the prefill time apart and the share of the decode time spent drafting. Note that
the speedups the papers report are often against an *uncached* baseline; ours is cached.

Greedy runs must equal the baseline token for token: exit 1 if one differs while the target
artifact is spec-safe (a flagged target is reported, not failed).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import specrt

from .lib.atomic import write_text_atomic
from .lib.measure import PREFIX_CACHE_MB, Run, markdown, measure, specbench_prompts, summarize
from .lib.params import stage_params
from .lib.specbench import TASKS
from .lib.verdict import exit_code

PLOT_FIELDS = ("decode_tokens_per_s", "speedup", "mean_tokens_per_step", "acceptance_rate")


def run(target: Path, draft: Path, questions: Path, params: dict[str, Any],
        section: str = "pair_bench") -> dict[str, Any]:
    model = specrt.load(target, threads=params.get("threads"), draft=draft, prefix_cache_mb=PREFIX_CACHE_MB)
    prompts = specbench_prompts(model, questions, params["prompts_per_task"], params["max_prompt_tokens"])
    tasks = params.get("tasks")  # None: all six
    if tasks is not None:
        unknown = sorted(set(tasks) - set(TASKS))
        if unknown:
            raise ValueError(f"{section}.tasks: unknown {unknown}; Spec-Bench tasks are {', '.join(TASKS)}")
        prompts = [p for p in prompts if p.task in tasks]
    runs = [Run(method, mode == "tree", float(t)) for t in params["temperatures"]
            for method in params["methods"] for mode in params["modes"]]
    t0 = time.perf_counter()
    results = summarize(measure(model, prompts, runs, max_new_tokens=params["max_new_tokens"],
                                draft_budget=params["draft_budget"]))
    greedy = {name: by_task["all"]["token_match"] for name, by_task in results.items()
              if by_task["all"]["token_match"] is not None}
    draft_manifest = model.draft_manifest
    assert draft_manifest is not None  # loaded with draft=
    return {
        "target": model.manifest.name,
        "draft": draft_manifest.name,
        "variant": model.manifest.variant,
        "draft_variant": draft_manifest.variant,
        "spec_safe": model.manifest.spec_safe,
        "prompts": len(prompts),
        "max_new_tokens": params["max_new_tokens"],
        "baseline": "cached autoregressive decoding of the target (one token per pass, KV cache)",
        "threads": params.get("threads"),
        "lossless_greedy": all(m == 1.0 for m in greedy.values()),
        "seconds": round(time.perf_counter() - t0, 1),
        "runs": {name: by_task["all"] for name, by_task in results.items()},
        "per_task": {name: {t: r for t, r in by_task.items() if t != "all"} for name, by_task in results.items()},
    }


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the stage's wall time goes into its report (stage_s)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="target artifact folder")
    parser.add_argument("--draft", type=Path, required=True, help="draft artifact folder (same tokenizer)")
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--section", default="pair_bench",
                        help="the params.yaml section with this run's settings (pair_bench_full: the full run)")
    parser.add_argument("--out", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--plot", type=Path, help="plot JSON to write: one record per run")
    parser.add_argument("--table", type=Path, help="markdown table to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    report = run(args.target, args.draft, args.prompts, stage_params(args.params, args.section), args.section)
    report["stage_s"] = round(time.perf_counter() - started, 1)
    write_text_atomic(args.out, json.dumps(report, indent=2) + "\n")
    table = markdown({name: {"all": r} for name, r in report["runs"].items()})
    if args.plot:
        rows = [{"run": name, "variant": report["variant"], **{k: r[k] for k in PLOT_FIELDS}}
                for name, r in report["runs"].items()]
        write_text_atomic(args.plot, json.dumps(rows, indent=2) + "\n")
    if args.table:
        write_text_atomic(args.table, table + "\n")
    print(table)
    return exit_code(report["lossless_greedy"], report["spec_safe"], report["variant"], args.out)


if __name__ == "__main__":
    sys.exit(main())
