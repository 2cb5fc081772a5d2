"""Time to first token with and without the prefix cache, and that the output does not change.

    python -m scripts.prefix_cache_bench artifacts/qwen2.5-coder-0.5b-instruct/int8 \\
        --prompts ../shared/data/specbench/question.jsonl --threads 2        # from the repo root

Three cases per Spec-Bench question (first turns of the first ``--questions``), each behind the
same long system prompt (the first ``--system-tokens`` tokens of runtime/specrt/engine/loop.py, as an
assistant that answers about a code base would send):

    cold     a model without the cache
    shared   the cache holds another question behind the same system prompt: whole prefill
             chunks (``--prefill-chunk`` positions) of the system prompt are reused
    repeat   the cache holds this very prompt: no prefill pass runs

Prints one line per cached case (prompt tokens, how many came from the cache, prefill seconds),
then the median prefill seconds of each case over the questions, and whether every case emitted
the cold run's tokens (greedy, ``--method``): the cache must not change the output. Exit status 1
when one did not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

import specrt
from pipeline.lib.specbench import read_questions

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--system-tokens", type=int, default=1024)
    parser.add_argument("--method", default="suffix_decoding")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--prefill-chunk", type=int, default=256,
                        help="prompt positions per prefill pass (the runtime's default); the cache shares whole passes")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(argv)

    cold = specrt.load(args.model, threads=args.threads)
    cached = specrt.load(args.model, threads=args.threads, prefix_cache_mb=1024)
    system = cold.encode((REPO / "runtime/specrt/engine/loop.py").read_text())[: args.system_tokens]
    questions = read_questions(args.prompts)[: args.questions + 1]
    prompts = [np.concatenate([system, cold.encode(q.turns[0], chat=cold.manifest.chat is not None)])
               for q in questions]
    options = dict(method=args.method, max_new_tokens=args.max_new_tokens, prefill_chunk=args.prefill_chunk)
    times: dict[str, list[float]] = {"cold": [], "shared": [], "repeat": []}
    same = True
    for before, prompt in zip(prompts, prompts[1:], strict=False):
        want, loop = cold.generate_ids(prompt, **options)
        times["cold"].append(loop.stats.prefill_s)
        cached.prefix_cache.clear()
        cached.generate_ids(before, **options)  # another question behind the same system prompt
        for case in ("shared", "repeat"):
            got, loop = cached.generate_ids(prompt, **options)
            times[case].append(loop.stats.prefill_s)
            same &= bool(np.array_equal(got, want))
            print(f"{case:6s} {len(prompt)} prompt tokens, {loop.stats.cached_prompt_tokens} from the cache, "
                  f"prefill {loop.stats.prefill_s:.3f} s", flush=True)
    for case, seconds in times.items():
        print(f"{case:6s} median prefill {statistics.median(seconds):.3f} s over {len(seconds)} prompts")
    print(f"outputs equal to the cold runs: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
