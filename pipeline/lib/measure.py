"""Decode speed of drafting methods against plain decoding of the same artifact, side by side.

    python -m pipeline.lib.measure --model artifacts/M/fp32 --datastore artifacts/M/datastore \\
        --prompts ../shared/data/specbench/question.jsonl --per-task 1 --max-new-tokens 64 \\
        --methods pld,suffix_decoding --modes chain,tree --temperatures 0 --out bench.json

The measuring core of the benchmark stages (``pipeline.pair_bench``) and a CLI for quick looks.
The machines are shared and noisy, so for every prompt and temperature plain decoding (``baseline``)
runs first, the methods after it, on the same prompt with the same seed, and the baseline once more
after every ``baseline_every`` method runs and at the end: a method's speedup is its decode tokens/s
over the mean of the two baseline runs that bracket it (summed tokens over summed seconds across
prompts), and every run reports ``baseline_drift``, the largest change of the baseline's speed
between those two runs over the prompts: how far the machine moved while the methods ran. The
machine's speed wanders over seconds, not only from run to run: 40 plain 32-token runs in a row on
one prompt (2-core AVX-512 EPYC, int4) had a lag-1 autocorrelation of 0.42-0.60, and the mean of two
baseline runs with 31 runs between them missed those by 6.7-10.8% on average, of two with 1-3
between them by 2.8-4.5% (docs/benchmark.md). Prefill time is reported apart: the
baseline's cold prefill of each prompt, for every run. The stages load the model with a prefix cache
(``PREFIX_CACHE_MB``), so every method run reuses the baseline's prompt KV instead of running the
same prefill passes again (bit for bit the same rows: specrt.engine.prefix_cache). Greedy runs are compared
with the baseline token for token; sampled runs are lossless in distribution, which the statistical
tests check, not this benchmark.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import specrt
from specrt.engine.loop import LoopStats

from .specbench import first_per_task, read_questions

log = logging.getLogger(__name__)

# host memory for prompts' KV when a stage loads a model: a few prompts of <= 1k tokens per run
# (the 1.5B's rows: 57 KiB per token); measure() clears it before every prompt's baseline
PREFIX_CACHE_MB = 512


@dataclass(frozen=True)
class Prompt:
    task: str
    ids: np.ndarray  # [n] int64, chat template applied


@dataclass(frozen=True)
class Run:
    """One configuration to measure; ``baseline`` runs are the reference of their temperature."""

    method: str
    tree: bool
    temperature: float
    backoff: bool | None = None  # None: the runtime's default (specrt.backoff)

    @property
    def name(self) -> str:
        suffix = {None: "", True: "/backoff", False: "/no-backoff"}[self.backoff]
        return f"{self.method}/{'tree' if self.tree else 'chain'}/t{self.temperature:g}{suffix}"


@dataclass(frozen=True)
class Baseline:
    """Plain decoding of one prompt: the reference of the method runs between two of its runs."""

    tokens: int  # decode tokens of one run (every run emits the same tokens)
    seconds: float  # decode seconds, the mean of the runs
    prefill_s: float  # the prompt's first (cold) prefill
    drift: float  # the largest change of decode tok/s from one run to the next, as a fraction

    @classmethod
    def over(cls, runs: list[LoopStats], prefill_s: float) -> Baseline:
        """The runs in the order they ran (a bracket: the one before and the one after)."""
        speeds = [r.decode_tokens_per_s for r in runs]
        drifts = [b / a - 1 if a else 0.0 for a, b in zip(speeds[:-1], speeds[1:], strict=True)]
        return cls(runs[0].decode_tokens, sum(r.decode_s for r in runs) / len(runs), prefill_s,
                   max(drifts, key=abs, default=0.0))


@dataclass
class Tally:
    """Sums over the prompts of one run (or one run and one task)."""

    tokens: int = 0  # decode tokens (all new tokens but the prefill's)
    seconds: float = 0.0  # decode seconds
    prefill_s: float = 0.0  # the baseline's cold prefill of the same prompts (a method's own may be a cache hit)
    draft_s: float = 0.0
    verify_s: float = 0.0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    base_tokens: int = 0  # the baseline runs that bracket this run's, on the same prompts
    base_seconds: float = 0.0
    drifts: list[float] = field(default_factory=list)  # per prompt: the change between the bracketing baselines
    matched: int = 0  # greedy: tokens equal to the baseline's before the first divergence
    compared: int = 0
    prompt_tokens_per_s: list[float] = field(default_factory=list)  # decode tok/s per prompt
    # per prompt: (decode tokens, decode seconds, its baseline's tokens, seconds): the resampling units
    per_prompt: list[tuple[int, float, int, float]] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)  # per verify step

    def add(self, stats: LoopStats, base: Baseline, match: tuple[int, int] | None) -> None:
        self.tokens += stats.decode_tokens
        self.seconds += stats.decode_s
        self.prefill_s += base.prefill_s
        self.draft_s += stats.draft_s
        self.verify_s += stats.verify_s
        self.steps += stats.steps
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.base_tokens += base.tokens
        self.base_seconds += base.seconds
        self.drifts.append(base.drift)
        if match is not None:
            self.matched += match[0]
            self.compared += match[1]
        if stats.decode_s > 0:
            self.prompt_tokens_per_s.append(stats.decode_tokens / stats.decode_s)
        self.per_prompt.append((stats.decode_tokens, stats.decode_s, base.tokens, base.seconds))
        self.accepted_lengths.extend(stats.accepted_lengths)

    def summary(self) -> dict[str, Any]:
        tps = self.tokens / self.seconds if self.seconds else 0.0
        base_tps = self.base_tokens / self.base_seconds if self.base_seconds else 0.0
        per_prompt = self.prompt_tokens_per_s
        return {
            "decode_tokens": self.tokens,
            "steps": self.steps,
            "decode_tokens_per_s": round(tps, 3),
            "decode_tokens_per_s_std": round(statistics.stdev(per_prompt), 3) if len(per_prompt) > 1 else 0.0,
            "baseline_decode_tokens_per_s": round(base_tps, 3),
            "speedup": round(tps / base_tps, 3) if base_tps else 0.0,
            "speedup_ci95": speedup_interval(self.per_prompt),
            "baseline_drift": round(max(self.drifts, key=abs), 4) if self.drifts else 0.0,
            "mean_tokens_per_step": round(self.tokens / self.steps, 3) if self.steps else 0.0,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            "token_match": round(self.matched / self.compared, 6) if self.compared else None,
            "prefill_s": round(self.prefill_s, 3),
            # share of the decode time: drafting, verify passes, and the rest (accept rule, bookkeeping)
            "draft_share": round(self.draft_s / self.seconds, 4) if self.seconds else 0.0,
            "verify_share": round(self.verify_s / self.seconds, 4) if self.seconds else 0.0,
            "overhead_share": round(1 - (self.draft_s + self.verify_s) / self.seconds, 4) if self.seconds else 0.0,
        }


BOOTSTRAP_RESAMPLES = 2000


def speedup_interval(per_prompt: list[tuple[int, float, int, float]]) -> list[float] | None:
    """95% percentile-bootstrap interval of the speedup (summed tokens over summed seconds, over the
    baseline's the same way) when the prompts are resampled with replacement; None for fewer than
    two prompts. Fixed seed: the same runs give the same interval."""
    if len(per_prompt) < 2:
        return None
    rows = np.array(per_prompt, dtype=np.float64)  # [prompts, 4]
    picks = np.random.default_rng(0).integers(0, len(rows), size=(BOOTSTRAP_RESAMPLES, len(rows)))
    sums = rows[picks].sum(axis=1)  # [resamples, 4]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (sums[:, 0] / sums[:, 1]) / (sums[:, 2] / sums[:, 3])
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return None
    low, high = np.percentile(ratios, [2.5, 97.5])
    return [round(float(low), 3), round(float(high), 3)]


def matched_prefix(ids: np.ndarray, ref: np.ndarray) -> tuple[int, int]:
    """(tokens of ``ids`` equal to ``ref`` before the first difference, len(ref)); a shorter or
    longer output counts as a difference at its end."""
    n = min(len(ids), len(ref))
    diff = np.flatnonzero(ids[:n] != ref[:n])
    return (int(diff[0]) if len(diff) else n), len(ref)


def _plain_again(model: specrt.SpecModel, prompt: Prompt, base: np.ndarray,
                 options: dict[str, Any]) -> tuple[LoopStats, tuple[int, int] | None]:
    """Plain decoding of ``prompt`` once more: its loop stats, and its token match with the first
    run ``base`` (greedy only)."""
    again, loop = model.generate_ids(prompt.ids, method="baseline", **options)
    if not np.array_equal(again, base):  # same prompt, same seed: plain decoding must repeat itself
        log.warning("baseline on prompt %d did not repeat itself (t=%g)", options["seed"], options["temperature"])
    return loop.stats, matched_prefix(again, base) if options["temperature"] == 0 else None


def measure(
    model: specrt.SpecModel,
    prompts: list[Prompt],
    runs: list[Run],
    *,
    max_new_tokens: int,
    draft_budget: int = 8,
    baseline_every: int | None = None,
) -> dict[str, dict[str, Tally]]:
    """Tallies per run name, per task and over ``"all"`` tasks; baselines are reported as runs
    ``baseline/chain/t<T>`` (their own reference: speedup 1). Seed = prompt index.

    ``baseline_every``: plain decoding runs again after every that many method runs (None: only
    after the last), so that each method is measured against the two baseline runs nearest to it."""
    if baseline_every is not None and baseline_every < 1:
        raise ValueError(f"baseline_every must be >= 1 or None, got {baseline_every}")
    tallies: dict[str, dict[str, Tally]] = {}
    temperatures = sorted({r.temperature for r in runs})
    for seed, prompt in enumerate(prompts):
        for temperature in temperatures:
            options = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                           draft_budget=draft_budget)
            if model.prefix_cache is not None:  # the baseline's prefill runs cold: the prefill every run reports
                model.prefix_cache.clear()
            base, base_loop = model.generate_ids(prompt.ids, method="baseline", **options)
            cold = base_loop.stats.prefill_s
            baselines = [(base_loop.stats, (len(base), len(base)) if temperature == 0 else None)]  # in run order
            done = []  # (run, its loop stats, token match with the baseline, its reference)
            pending = []  # method runs since the last baseline run
            chosen = [r for r in runs if r.temperature == temperature and r.method != "baseline"]
            for k, run in enumerate(chosen):
                model.forget_history()  # cold start per run: no method profits from another's history
                ids, loop = model.generate_ids(prompt.ids, method=run.method, tree=run.tree, backoff=run.backoff,
                                               **options)
                match = matched_prefix(ids, base) if temperature == 0 else None
                if match is not None and match[0] != match[1]:
                    log.warning("%s differs from baseline on prompt %d at token %d", run.name, seed, match[0])
                pending.append((run, loop.stats, match))
                if k < len(chosen) - 1 and (baseline_every is None or len(pending) < baseline_every):
                    continue
                baselines.append(_plain_again(model, prompt, base, options))
                bracket = Baseline.over([baselines[-2][0], baselines[-1][0]], cold)
                done += [(r, st, m, bracket) for r, st, m in pending]
                pending = []
            if not chosen:  # no method at this temperature: the baseline still runs twice
                baselines.append(_plain_again(model, prompt, base, options))
            # every baseline run counts in its row (speedup 1.0), the prompt's prefill once, with the first
            plain, overall = Run("baseline", False, temperature), Baseline.over([st for st, _ in baselines], cold)
            done += [(plain, st, m, overall if i == 0 else dataclasses.replace(overall, prefill_s=0.0))
                     for i, (st, m) in enumerate(baselines)]
            for run, stats, match, ref in done:
                for task in (prompt.task, "all"):
                    tallies.setdefault(run.name, {}).setdefault(task, Tally()).add(stats, ref, match)
    return tallies


def summarize(tallies: dict[str, dict[str, Tally]]) -> dict[str, dict[str, dict[str, Any]]]:
    return {name: {task: t.summary() for task, t in by_task.items()} for name, by_task in tallies.items()}


def markdown(results: dict[str, dict[str, dict[str, Any]]], task: str = "all") -> str:
    lines = ["| run | decode tok/s | baseline tok/s (same prompts, just before) | speedup | tokens/step | "
             "acceptance | token match | prefill s |",
             "|---|---|---|---|---|---|---|---|"]
    rows = [(name, by_task[task]) for name, by_task in results.items() if task in by_task]
    for name, r in sorted(rows, key=lambda kv: -kv[1]["speedup"]):
        match = "-" if r["token_match"] is None else f"{r['token_match']:.3f}"
        lines.append(f"| {name} | {r['decode_tokens_per_s']:.2f} | {r['baseline_decode_tokens_per_s']:.2f} | "
                     f"{r['speedup']:.2f}x | {r['mean_tokens_per_step']:.2f} | {r['acceptance_rate']:.2f} | "
                     f"{match} | {r['prefill_s']:.2f} |")
    return "\n".join(lines)


def specbench_prompts(model: specrt.SpecModel, path: Path, per_task: int, max_prompt_tokens: int) -> list[Prompt]:
    """First turns of the first ``per_task`` Spec-Bench questions of every task, in the model's
    chat template when it has one, cut at ``max_prompt_tokens``."""
    chat = model.manifest.chat is not None
    return [Prompt(q.task, model.encode(q.turns[0], chat=chat)[:max_prompt_tokens])
            for q in first_per_task(read_questions(path), per_task)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--datastore", type=Path)
    parser.add_argument("--draft", type=Path, help="draft model artifact for sd, hsd, hsd_capped")
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-budget", type=int, default=8)
    parser.add_argument("--baseline-every", type=int, help="plain decoding again after every N method runs")
    parser.add_argument("--methods", default="pld", help="comma-separated; baseline runs before them anyway")
    parser.add_argument("--modes", default="chain,tree")
    parser.add_argument("--temperatures", default="0", help="comma-separated, e.g. 0,1")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    model = specrt.load(args.model, threads=args.threads, datastore=args.datastore, draft=args.draft,
                        prefix_cache_mb=PREFIX_CACHE_MB)
    prompts = specbench_prompts(model, args.prompts, args.per_task, args.max_prompt_tokens)
    runs = [Run(m, {"chain": False, "tree": True}[mode], float(t)) for t in args.temperatures.split(",")
            for m in args.methods.split(",") for mode in args.modes.split(",")]
    results = summarize(measure(model, prompts, runs, max_new_tokens=args.max_new_tokens,
                                draft_budget=args.draft_budget, baseline_every=args.baseline_every))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                                    "results": results}, indent=2) + "\n")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
