"""Milliseconds per token of plain greedy decoding: onnxruntime-genai's loop, its graph driven from
Python with its shared K/V buffers, and specrt's graph (its raw forward passes, and its loop).

    python -m scripts.decode_loop_cost artifacts/M/int4 /tmp/peers/int4 --threads 2 --rounds 3   # from the repo root

Each subject runs in its own process (several graphs in one process disturb each other's
timing on a 2-core machine, see scripts/step_cost.py), in turn, ``--rounds`` times; each process
decodes ``--new`` tokens after a ``--prompt-tokens`` prompt of random ids, ``--repeats`` times,
and reports the median ms per token after the first:

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
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SUBJECTS = ("genai", "genai_graph", "specrt_forward", "specrt_loop")


def _genai(folder: Path, prompt: np.ndarray, new: int, threads: int | None, repeats: int) -> list[float]:
    import onnxruntime_genai as og

    from pipeline.peers import genai_model

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
    from specrt.backend import make_session

    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    session = make_session(folder / decoder["filename"], "cpu", threads)
    layers, kv, d = decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]
    capacity = len(prompt) + new
    rng = np.random.default_rng(0)
    buffers = [rng.random((1, kv, capacity, d), dtype=np.float32) for _ in range(2 * layers)]  # a prefilled past
    binding = session.io_binding()
    for i, buf in enumerate(buffers):
        layer, kind = divmod(i, 2)
        name = ("key", "value")[kind]
        binding.bind_input(f"past_key_values.{layer}.{name}", "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
        binding.bind_output(f"present.{layer}.{name}", "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
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
    from specrt.engine import prefill
    from specrt.tree import causal_bias

    model = specrt.load(folder, threads=threads)
    if loop:
        runs = [model.generate_ids(prompt, method="baseline", max_new_tokens=new)[1] for _ in range(repeats)]
        return [run.stats.decode_s / (run.stats.new_tokens - 1) for run in runs]
    decoder = model.generate_ids(prompt, method="baseline", max_new_tokens=new)[1].decoder  # warmed up
    out = []
    for _ in range(repeats):  # a raw decoder: prefill, then one forward + commit per token
        decoder.reset(len(prompt) + new)
        *_, last = prefill(decoder, prompt, len(prompt), last_logits_only=True)
        token = int(last.logits[-1].argmax())
        t0 = time.perf_counter()
        for _ in range(1, new):
            past = decoder.past
            step = decoder.forward(np.array([token]), np.array([past]), causal_bias(past, 1))
            decoder.commit(np.array([0]))
            token = int(step.logits[0].argmax())
        out.append((time.perf_counter() - t0) / (new - 1))
    return out


def _one(args: argparse.Namespace) -> None:
    prompt = np.random.default_rng(1).integers(1000, 20000, args.prompt_tokens).astype(np.int64)
    if args.one.startswith("genai"):
        run = _genai if args.one == "genai" else _genai_graph
        seconds = run(args.genai, prompt, args.new, args.threads, args.repeats)
    else:
        seconds = _specrt(args.artifact, prompt, args.new, args.threads, args.repeats, args.one == "specrt_loop")
    print(json.dumps(seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact", type=Path, help="specrt artifact folder")
    parser.add_argument("genai", type=Path, help="onnxruntime-genai model folder of the same checkpoint and precision")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=SUBJECTS, help=argparse.SUPPRESS)  # a worker process
    args = parser.parse_args()
    if args.one:
        _one(args)
        return
    forwarded = [str(args.artifact), str(args.genai), "--prompt-tokens", str(args.prompt_tokens),
                 "--new", str(args.new), "--repeats", str(args.repeats)]
    if args.threads is not None:
        forwarded += ["--threads", str(args.threads)]
    for r in range(args.rounds):
        cells = []
        for subject in SUBJECTS:
            done = subprocess.run([sys.executable, "-m", "scripts.decode_loop_cost", *forwarded, "--one", subject],
                                  capture_output=True, text=True, check=True)
            ms = 1000 * float(np.median(json.loads(done.stdout.strip().splitlines()[-1])))
            cells.append(f"{subject} {ms:.2f}")
        print(f"round {r + 1}: " + ", ".join(cells) + " ms/token", flush=True)


if __name__ == "__main__":
    main()
