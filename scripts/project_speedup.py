"""Projected decode speedup per Spec-Bench task, free of timing noise: record plain greedy answers
once, replay them through each method (specrt.simulate) with and without the back-off, and price
every verify window with a measured cost curve.

    python scripts/window_cost.py artifacts/M/int8 --past 300 --sizes 1 2 4 8 16 --threads 2
    python -m scripts.project_speedup artifacts/M/int8 --hf artifacts/M/hf \\
        --prompts ../shared/data/specbench/question.jsonl --per-task 6 --max-new-tokens 128 --threads 2 \\
        --records /tmp/records.json --cost 1:38.5 2:45.6 4:52.5 8:71.1 16:106.4 --methods pld suffix_decoding

Prompts are the benchmark stage's first turns (chat template, a long prompt keeps its last
``--max-prompt-tokens``). ``--records``: a JSON file of the recorded answers, written on the first
run and read on later ones (recording is the only part that runs the model). ``--cost``: window
size : milliseconds of one pass, as ``window_cost.py`` prints them, the single step (1:MS) among
them; sizes not given are read off the least-squares line through the given ones
(``specrt.cost.VerifyCostModel``). A method's projection per task is its
tokens over the summed cost of its windows in single steps; it leaves out drafting and
bookkeeping time, which the benchmark stage's measured speedups include. Methods replay in the
order of the records with one env each (global histories carry over, as in a served model), and
the back-off's estimate carries from one record to the next, as in ``SpecModel``.

Output: a progress line per recorded answer, then a markdown table with one row per method, chain
or tree, with or without the back-off (``pld/tree/no-backoff``): the projected speedup per task
and over all tasks (decode tokens over the summed cost of their windows, in single steps),
tokens per step, and the steps the back-off held back from drafting. The last rows are ceilings
of drafters that copy from the request's own text (scripts/copy_ceiling.py): an oracle that knows
how far the answer can be copied at each position (from anywhere, or from after an earlier
occurrence of the last m tokens, ``--anchors``) and picks the cheapest windows.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

import specrt
from pipeline.benchmark import chat_renderer
from pipeline.lib.specbench import TASKS, read_questions
from scripts.copy_ceiling import copy_ceiling
from specrt.backoff import Backoff
from specrt.cost import VerifyCostModel
from specrt.drafters import METHODS, NEEDS_DRAFT, DrafterEnv
from specrt.drafters.indexes.datastore import STATE_KEY as DATASTORE_STATE_KEY
from specrt.simulate import Record, record_generation, simulate

# Methods whose drafters read the verify pass's logits or hidden states (Feedback), which a replay
# does not have (specrt.simulate): they cannot be projected.
NEEDS_TARGET_OUTPUTS = frozenset({"lookahead", "token_recycling", "pld_plus", "adapld"})


def parse_cost(pairs: list[str]) -> VerifyCostModel:
    """The ``--cost`` curve: SIZE:MS pairs, the single step (1:MS) among them."""
    cost = VerifyCostModel()
    sizes = set()
    for pair in pairs:
        try:
            size, ms = pair.split(":")
            cost.record(int(size), float(ms) / 1000)
            sizes.add(int(size))
        except ValueError:
            raise SystemExit(f"--cost: expected SIZE:MILLISECONDS pairs such as 4:52.5, got {pair!r}") from None
    if 1 not in sizes or cost.estimate(1) <= 0:
        raise SystemExit("--cost: the curve needs the single-step time (1:MS, above 0)")
    return cost


def record(model: specrt.SpecModel, args: argparse.Namespace) -> list[tuple[str, Record]]:
    render = chat_renderer(args.hf)
    questions = read_questions(args.prompts)
    records = []
    for task in TASKS:
        for q in [q for q in questions if q.task == task][: args.per_task]:
            ids = model.encode(render([{"role": "user", "content": q.turns[0]}]))[-args.max_prompt_tokens :]
            records.append((task, record_generation(model, ids, args.max_new_tokens)))
            print(f"recorded {task} question {q.question_id}: {len(ids)} prompt tokens, "
                  f"{len(records[-1][1].output_ids)} new", flush=True)
    return records


def save(records: list[tuple[str, Record]], path: Path) -> None:
    rows = [{"task": t, "prompt_ids": r.prompt_ids.tolist(), "output_ids": r.output_ids.tolist(),
             "max_new_tokens": r.max_new_tokens} for t, r in records]
    path.write_text(json.dumps(rows) + "\n")


def load(path: Path) -> list[tuple[str, Record]]:
    return [(row["task"], Record(np.array(row["prompt_ids"], np.int64), np.array(row["output_ids"], np.int64),
                                 int(row["max_new_tokens"]))) for row in json.loads(path.read_text())]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--hf", type=Path, help="the HF checkpoint folder (chat template)")
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--datastore", type=Path, help="retrieval corpus folder, for rest / sam / asam methods")
    parser.add_argument("--per-task", type=int, default=6)
    parser.add_argument("--max-prompt-tokens", type=int, default=2048)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--records", type=Path, help="recorded answers: read if the file exists, else written")
    parser.add_argument("--cost", nargs="+", required=True, help="window cost curve, SIZE:MS pairs")
    parser.add_argument("--methods", nargs="+", default=["pld", "suffix_decoding"])
    parser.add_argument("--budget", type=int, default=8, help="draft nodes per step (params: draft_budget)")
    parser.add_argument("--anchors", type=int, nargs="*", default=[0, 1, 2, 3],
                        help="copy-oracle ceilings to print: 0 copies from anywhere in the context, m from "
                             "right after an earlier occurrence of its last m tokens (scripts/copy_ceiling.py)")
    args = parser.parse_args(argv)
    replayable = sorted(set(METHODS) - NEEDS_TARGET_OUTPUTS - NEEDS_DRAFT - {"baseline"})
    for method in args.methods:
        if method not in replayable:
            parser.error(f"--methods: {method!r} cannot be replayed; model-free methods that need no target "
                         f"outputs: {', '.join(replayable)}")
    cost = parse_cost(args.cost)
    model = specrt.load(args.artifact, threads=args.threads, datastore=args.datastore)
    if args.records is not None and args.records.exists():
        records = load(args.records)
    else:
        records = record(model, args)
        if args.records is not None:
            save(records, args.records)
    ratio = lambda s: cost.estimate(s) / cost.estimate(1)  # noqa: E731
    datastores: dict = {}  # loaded once, shared by every run
    tokenizer = model.manifest.files[model.manifest.tokenizer].sha256
    tasks = list(dict.fromkeys(t for t, _ in records))
    print(f"| run | {' | '.join(tasks)} | all | tokens/step | held back |")
    print(f"|---|{'---|' * len(tasks)}---|---|---|")
    for method in args.methods:
        for tree in (False, True):
            for with_backoff in (True, False):
                # a private state per run (its global history comes from its own replay only); drafters
                # that size drafts from the verify cost read the same curve as the projection
                env = DrafterEnv(vocab=model.manifest.dims.vocab, tree=tree, state={DATASTORE_STATE_KEY: datastores},
                                 datastore=model.datastore, verify_cost=cost.estimate, tokenizer_sha256=tokenizer)
                backoff = Backoff(cost) if with_backoff else None
                tokens: dict[str, float] = defaultdict(float)
                spent: dict[str, float] = defaultdict(float)
                steps = held = 0
                for task, rec in records:
                    if len(rec.output_ids) < 2:
                        continue
                    result = simulate(METHODS[method].make, rec.prompt_ids, rec.output_ids,
                                      args.budget, max_new_tokens=rec.max_new_tokens, env=env, backoff=backoff)
                    tokens[task] += result.decode_tokens
                    spent[task] += result.verify_cost(ratio)
                    steps, held = steps + result.steps, held + result.held_back
                    backoff = backoff.carried_over() if backoff is not None else None
                cells = [f"{tokens[t] / spent[t]:.2f}x" if spent[t] else "-" for t in tasks]
                name = f"{method}/{'tree' if tree else 'chain'}{'' if with_backoff else '/no-backoff'}"
                print(f"| {name} | {' | '.join(cells)} | {sum(tokens.values()) / sum(spent.values()):.2f}x | "
                      f"{sum(tokens.values()) / steps:.2f} | {held} |", flush=True)
    # the ceilings of drafting by copying from the request's own text (scripts/copy_ceiling.py)
    for anchor in args.anchors:
        tokens, spent = defaultdict(float), defaultdict(float)
        for task, rec in records:
            n, c = copy_ceiling(rec.prompt_ids, rec.output_ids, ratio, args.budget, anchor)
            tokens[task] += n
            spent[task] += c
        cells = [f"{tokens[t] / spent[t]:.2f}x" if spent[t] else "-" for t in tasks]
        name = "copy oracle, anywhere" if anchor == 0 else f"copy oracle, after the last {anchor}"
        print(f"| {name} (ceiling) | {' | '.join(cells)} | {sum(tokens.values()) / sum(spent.values()):.2f}x | - | - |")


if __name__ == "__main__":
    main()
