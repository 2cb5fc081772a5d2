"""Milliseconds per token of plain greedy decoding: onnxruntime-genai's loop, its graph driven from
Python with its shared K/V buffers, and specrt's graph (its raw forward passes, and its loop).

    python -m scripts.decode_loop_cost artifacts/M/int4 /tmp/peers/int4 --threads 2 --rounds 3   # from the repo root

Each subject runs in its own process (several graphs in one process disturb each other's
timing on a 2-core machine, see scripts/step_cost.py), in turn, ``--rounds`` times; each process
decodes ``--new`` tokens after a ``--prompt-tokens`` prompt of random ids, ``--repeats`` times.
Per round one line, the median ms per token after the first of each subject:

    round R: genai MS, genai_graph MS, specrt_forward MS, specrt_loop MS ms/token

Subjects:

    genai          og.Generator, one token per generate_next_token (genai's own C++ loop)
    genai_graph    the genai folder's model.onnx on a specrt session, its K/V buffers
                   ([1, kv, capacity, d], past_present_share_buffer) bound once as past and
                   present, input_ids and attention_mask bound per step, argmax in numpy
    specrt_forward specrt's OrtDecoder.forward + commit per token (no drafter, no loop)
    specrt_loop    SpecModel.generate_ids(method="baseline"): decode seconds / (tokens - 1)

genai_graph against specrt_forward compares the two graphs with no loop around them;
genai against genai_graph and specrt_loop against specrt_forward show what each loop adds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from scripts.graph_pair import (
    bind_genai_kv,
    genai_decoder_file,
    pair_parser,
    random_prompt,
    raw_prefill,
    raw_step,
    run_worker,
)

SUBJECTS = ("genai", "genai_graph", "specrt_forward", "specrt_loop")


def _genai(folder: Path, prompt: np.ndarray, new: int, threads: int | None, repeats: int) -> list[float]:
    import onnxruntime_genai as og

    from pipeline.lib.genai_peer import genai_model

    model = genai_model(folder, threads, None)
    out = []
    for _ in range(repeats):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + new, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt[None])
        generator.generate_next_token()  # the prompt's pass and the first token
        t0, n = time.perf_counter(), 0
        while not generator.is_done():
            generator.generate_next_token()
            n += 1
        out.append((time.perf_counter() - t0) / n)
    return out


def _genai_graph(folder: Path, prompt: np.ndarray, new: int, threads: int | None, repeats: int) -> list[float]:
    from specrt.backend.session import make_session

    session = make_session(genai_decoder_file(folder), "cpu", threads)
    capacity = len(prompt) + new
    binding, _buffers = bind_genai_kv(session, folder, capacity, np.random.default_rng(0))  # a prefilled past
    vocab = session.get_outputs()[0].shape[-1]
    logits = np.empty((1, 1, vocab), np.float32)
    binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
    masks = [np.ones((1, len(prompt) + i + 1), np.int64) for i in range(new)]  # [1, past + 1]
    out = []
    for _ in range(repeats):
        token = np.array([[int(prompt[-1])]], np.int64)
        t0 = time.perf_counter()
        for i in range(1, new):
            binding.bind_cpu_input("input_ids", token)
            binding.bind_cpu_input("attention_mask", masks[i])
            session.run_with_iobinding(binding)
            token = np.array([[int(logits[0, 0].argmax())]], np.int64)
        out.append((time.perf_counter() - t0) / (new - 1))
    return out


def _specrt(folder: Path, prompt: np.ndarray, new: int, threads: int | None, repeats: int, loop: bool) -> list[float]:
    import specrt

    model = specrt.load(folder, threads=threads)
    if loop:
        runs = [model.generate_ids(prompt, method="baseline", max_new_tokens=new)[1] for _ in range(repeats)]
        return [run.stats.decode_s / (run.stats.new_tokens - 1) for run in runs]
    decoder = model.generate_ids(prompt, method="baseline", max_new_tokens=new)[1].decoder  # warmed up
    out = []
    for _ in range(repeats):  # a raw decoder: prefill, then one forward + commit per token
        token = raw_prefill(decoder, prompt, len(prompt) + new)
        t0 = time.perf_counter()
        for _ in range(1, new):
            token = raw_step(decoder, token)
        out.append((time.perf_counter() - t0) / (new - 1))
    return out


def _one(args: argparse.Namespace) -> None:
    prompt = random_prompt(args)
    if args.one.startswith("genai"):
        run = _genai if args.one == "genai" else _genai_graph
        seconds = run(args.genai, prompt, args.new, args.threads, args.repeats)
    else:
        seconds = _specrt(args.artifact, prompt, args.new, args.threads, args.repeats, args.one == "specrt_loop")
    print(json.dumps(seconds))


def loop_costs(args: argparse.Namespace) -> dict[str, list[float]]:
    """{subject: its worker's seconds per token, one per repeat} of one round."""
    return {subject: run_worker("scripts.decode_loop_cost", args, subject, ["--repeats", str(args.repeats)])
            for subject in SUBJECTS}


def make_parser() -> argparse.ArgumentParser:
    parser = pair_parser(__doc__.split("\n")[0], SUBJECTS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    if args.one:
        _one(args)
        return
    for r in range(args.rounds):
        cells = [f"{subject} {1000 * float(np.median(seconds)):.2f}" for subject, seconds in loop_costs(args).items()]
        print(f"round {r + 1}: " + ", ".join(cells) + " ms/token", flush=True)


if __name__ == "__main__":
    main()
