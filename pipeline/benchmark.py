"""Stage ``benchmark``: Spec-Bench, every registered method, chain and tree, against plain decoding.

    python -m pipeline.benchmark --model artifacts/M/int4 --hf artifacts/M/hf --datastore artifacts/M/datastore \\
        --prompts ../shared/data/specbench/question.jsonl --params params.yaml \\
        --metrics artifacts/M/benchmark-int4.json --csv artifacts/M/benchmark-int4/results.csv \\
        --table artifacts/M/benchmark-int4/results.md --plots artifacts/M/plots/benchmark-int4

Prompts: the first ``benchmark.prompts_per_task`` questions of each of the 6 Spec-Bench tasks (80
per task is the full benchmark). Multi-turn rows (MT-bench) run turn by turn: turn k's prompt is
the conversation so far in the model's chat template, with the model's own greedy answers to the
earlier turns (decoded text, fed back as the assistant's messages). A prompt longer than
``max_prompt_tokens`` keeps its last tokens (the question's end and the generation prompt).

For every prompt, plain decoding of the same artifact runs first, the methods after it, and plain
decoding once more after every ``baseline_every`` methods and at the end (pipeline.lib.measure), greedy:
a method's speedup is over the mean of the two plain runs that bracket it, and ``baseline_drift``
says how far the machine moved between them. Written:

- ``--metrics`` (JSON): per run overall decode tok/s, speedup, tokens/step, token match, the per-step
  time split (draft / verify / overhead); per task speedups; the roofline of plain decoding
  (measured read bandwidth, bytes per token, how close it gets) of this artifact (from the
  baseline runs) and of each other ``--roofline`` variant (one plain pass over the same prompts);
- ``--csv``: one row per run and task (mean ± std of per-prompt decode tok/s, prefill apart);
- ``--table`` (markdown): speedup per task and run;
- ``--plots`` folder: ``speedup.json`` (speedup per task per run) and ``accepted.json``
  (accepted-length histograms per run).

Exit 1 if a greedy run differs from plain decoding while the artifact is spec-safe.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import specrt
from specrt.drafters import NEEDS_DATASTORE, NEEDS_DRAFT

from .lib.atomic import write_text_atomic
from .lib.measure import PREFIX_CACHE_MB, Prompt, Run, Tally, measure
from .lib.params import stage_params
from .lib.roofline import gathered_bytes, read_bandwidth, roofline
from .lib.specbench import TASKS, Question, first_per_task, read_questions
from .lib.verdict import exit_code

log = logging.getLogger(__name__)

Render = Callable[[list[dict[str, str]]], str]  # chat messages -> prompt text ending in the generation prompt


def chat_renderer(hf_dir: Path | None) -> Render:
    """The model's chat template from its Hugging Face tokenizer, or plain turns joined by blank lines."""
    if hf_dir is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(hf_dir)
        if getattr(tokenizer, "chat_template", None):
            return lambda messages: tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return lambda messages: "\n\n".join(m["content"] for m in messages)


def conversation_prompts(
    model: specrt.SpecModel, render: Render, question: Question, *, max_prompt_tokens: int, max_new_tokens: int
) -> list[Prompt]:
    """One prompt per turn of ``question``; later turns hold the model's own greedy answers."""
    messages: list[dict[str, str]] = []
    prompts = []
    for k, turn in enumerate(question.turns):
        messages.append({"role": "user", "content": turn})
        ids = model.encode(render(messages))[-max_prompt_tokens:]
        prompts.append(Prompt(question.task, ids))
        if k + 1 < len(question.turns):
            answer, _ = model.generate_ids(ids, method="baseline", max_new_tokens=max_new_tokens)
            messages.append({"role": "assistant", "content": model.tokenizer.decode(answer.tolist(),
                                                                                    skip_special_tokens=True)})
    return prompts


def methods_to_run(requested: list[str] | str, *, datastore: bool, draft: bool) -> list[str]:
    """``"all"``: every registered method this artifact can run (retrieval ones need a datastore,
    draft-model ones a draft); a list is checked against the registry."""
    if requested == "all":
        return [m for m in sorted(specrt.METHODS) if m != "baseline" and (datastore or m not in NEEDS_DATASTORE)
                and (draft or m not in NEEDS_DRAFT)]
    unknown = [m for m in requested if m not in specrt.METHODS]
    if unknown:
        raise ValueError(f"benchmark.methods: unknown {unknown}; valid: {', '.join(sorted(specrt.METHODS))}")
    return list(requested)


def histogram(lengths: list[int]) -> dict[int, int]:
    return dict(sorted(Counter(lengths).items()))


def report_tables(tallies: dict[str, dict[str, Tally]]) -> tuple[str, str, list[dict], list[dict]]:
    """(CSV, markdown, speedup plot rows, accepted-length plot rows) of the tallies."""
    tasks = [t for t in (*TASKS, "all") if any(t in by_task for by_task in tallies.values())]
    buf = io.StringIO()
    fields = ["run", "task", "decode_tokens_per_s", "decode_tokens_per_s_std", "baseline_decode_tokens_per_s",
              "speedup", "baseline_drift", "mean_tokens_per_step", "acceptance_rate", "token_match", "prefill_s",
              "draft_share",
              "verify_share", "overhead_share", "decode_tokens", "steps"]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    speedups, accepted = [], []
    order = sorted(tallies, key=lambda name: -tallies[name]["all"].summary()["speedup"])
    lines = ["| run | " + " | ".join(tasks) + " | tokens/step | token match |",
             "|---|" + "---|" * (len(tasks) + 2)]
    for name in order:
        by_task = tallies[name]
        cells = []
        for task in tasks:
            if task not in by_task:
                cells.append("-")
                continue
            s = by_task[task].summary()
            writer.writerow({"run": name, "task": task, **{k: s[k] for k in fields[2:]}})
            cells.append(f"{s['speedup']:.2f}x")
            if task != "all":
                speedups.append({"run_task": f"{name} | {task}", "run": name, "task": task, "speedup": s["speedup"]})
        overall = by_task["all"].summary()
        match = "-" if overall["token_match"] is None else f"{overall['token_match']:.3f}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {overall['mean_tokens_per_step']:.2f} | {match} |")
        accepted += [{"run_length": f"{name} | {k}", "run": name, "accepted_length": k, "steps": n}
                     for k, n in histogram(by_task["all"].accepted_lengths).items()]
    return buf.getvalue(), "\n".join(lines) + "\n", speedups, accepted


def plain_speed(model: specrt.SpecModel, prompts: list[Prompt], max_new_tokens: int) -> tuple[float, float]:
    """(plain decode tokens/s, mean context length) of ``model`` on ``prompts``."""
    tokens, seconds, context = 0, 0.0, 0.0
    for p in prompts:
        _, loop = model.generate_ids(p.ids, method="baseline", max_new_tokens=max_new_tokens)
        tokens += loop.stats.decode_tokens
        seconds += loop.stats.decode_s
        context += len(p.ids) + loop.stats.new_tokens / 2
    return tokens / seconds, context / len(prompts)


def baseline_speed(plain: Tally, prompts: list[Prompt]) -> tuple[float, float]:
    """(plain decode tokens/s, mean context length) from the baseline runs of :func:`measure`
    (two per prompt), as :func:`plain_speed` measures them on another variant."""
    runs = 2 * len(prompts)
    new_tokens = plain.tokens / runs + 1  # the prefill's token is not a decode token
    return plain.tokens / plain.seconds, sum(len(p.ids) for p in prompts) / len(prompts) + new_tokens / 2


def run(args: argparse.Namespace, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Tally]]]:
    threads = params.get("threads")
    model = specrt.load(args.model, threads=threads, datastore=args.datastore, draft=args.draft,
                        prefix_cache_mb=PREFIX_CACHE_MB)
    render = chat_renderer(args.hf)
    prompts = [p for q in first_per_task(read_questions(args.prompts), params["prompts_per_task"])
               for p in conversation_prompts(model, render, q, max_prompt_tokens=params["max_prompt_tokens"],
                                             max_new_tokens=params["max_new_tokens"])]
    methods = methods_to_run(params["methods"], datastore=args.datastore is not None, draft=args.draft is not None)
    runs = [Run(m, mode == "tree", 0.0) for m in methods for mode in params["modes"]]
    # the same methods with the back-off off: what it saves where drafts do not pay (translation)
    unguarded = methods_to_run(params.get("without_backoff", []), datastore=args.datastore is not None,
                               draft=args.draft is not None)
    runs += [Run(m, mode == "tree", 0.0, backoff=False) for m in unguarded for mode in params["modes"]]
    # the read bandwidth, probed before and after the timed runs: the shared machine's speed wanders
    # (CI's two stages read 28.7 and 47.3 GB/s minutes apart), and a probe in a slow moment put fp32's
    # plain decoding above its ceiling (fraction 1.09); the best probe is the ceiling
    probes = [read_bandwidth(threads)]
    t0 = time.perf_counter()
    tallies = measure(model, prompts, runs, max_new_tokens=params["max_new_tokens"],
                      draft_budget=params["draft_budget"], baseline_every=params.get("baseline_every"))
    seconds = time.perf_counter() - t0
    # this artifact's plain decoding is the benchmark's baseline runs; other variants run it once
    tps, context = baseline_speed(tallies[Run("baseline", False, 0.0).name]["all"], prompts)
    plain = [(model.manifest, tps, context, gathered_bytes(args.model / model.manifest.decoder))]
    for folder in args.roofline:
        if folder.resolve() == args.model.resolve():
            continue
        variant = specrt.load(folder, threads=threads)
        tps, context = plain_speed(variant, prompts, params["max_new_tokens"])
        plain.append((variant.manifest, tps, context, gathered_bytes(folder / variant.manifest.decoder)))
    probes.append(read_bandwidth(threads))
    bandwidth = max(probes)
    log.info("read bandwidth %s GB/s (probes before and after the timed runs)",
             " / ".join(f"{b / 1e9:.1f}" for b in probes))
    rooflines = {manifest.variant: vars(roofline(manifest, bandwidth, context, tps, gathered))
                 for manifest, tps, context, gathered in plain}
    for variant, r in rooflines.items():
        if r["fraction"] > 1:
            log.warning("%s plain decoding read faster than every bandwidth probe (fraction %.2f): "
                        "the machine's speed moved between them", variant, r["fraction"])
    overall = {name: by_task["all"].summary() for name, by_task in tallies.items()}
    greedy_match = [r["token_match"] for r in overall.values()]
    report = {
        "model": model.manifest.name,
        "variant": model.manifest.variant,
        "spec_safe": model.manifest.spec_safe,
        "prompts": len(prompts),
        "tasks": {task: sum(p.task == task for p in prompts) for task in TASKS},
        "max_new_tokens": params["max_new_tokens"],
        "threads": threads,
        "seconds": round(seconds, 1),
        "lossless": all(m == 1.0 for m in greedy_match),
        "best": max((n for n in overall if not n.startswith("baseline")), key=lambda n: overall[n]["speedup"],
                    default=None),
        "runs": overall,
        "speedup_per_task": {name: {t: s.summary()["speedup"] for t, s in by_task.items() if t != "all"}
                             for name, by_task in tallies.items()},
        "roofline": rooflines,
    }
    return report, tallies


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the stage's wall time goes into its report (stage_s)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="artifact folder to benchmark")
    parser.add_argument("--hf", type=Path, help="HF checkpoint: its chat template renders multi-turn rows")
    parser.add_argument("--datastore", type=Path, help="retrieval datastore (else no retrieval methods)")
    parser.add_argument("--draft", type=Path, help="draft artifact; without it sd, hsd, hsd_capped are left out")
    parser.add_argument("--roofline", type=Path, nargs="*", default=[],
                        help="other artifact folders whose plain decoding is set against the memory roofline "
                             "(the benchmarked artifact always is)")
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--section", default="benchmark",
                        help="the params.yaml section with this run's settings (e.g. benchmark_full: the full run)")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--csv", type=Path, required=True, help="CSV to write: one row per run and task")
    parser.add_argument("--table", type=Path, required=True, help="markdown table to write")
    parser.add_argument("--plots", type=Path, required=True, help="folder for the plot JSONs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    report, tallies = run(args, stage_params(args.params, args.section))
    table_csv, table_md, speedups, accepted = report_tables(tallies)
    write_text_atomic(args.csv, table_csv)
    write_text_atomic(args.table, table_md)
    write_text_atomic(args.plots / "speedup.json", json.dumps(speedups, indent=2) + "\n")
    write_text_atomic(args.plots / "accepted.json", json.dumps(accepted, indent=2) + "\n")
    report["stage_s"] = round(time.perf_counter() - started, 1)
    write_text_atomic(args.metrics, json.dumps(report, indent=2) + "\n")
    print(table_md)
    return exit_code(report["lossless"], report["spec_safe"], report["variant"], args.metrics)


if __name__ == "__main__":
    sys.exit(main())
