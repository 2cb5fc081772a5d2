"""Where a plain decode step's time goes, per operator type: specrt's graph against
onnxruntime-genai's graph of the same checkpoint and precision, both driven from Python.

    python -m scripts.op_profile artifacts/M/int4 /tmp/peers/int4 --threads 2 --top 20   # from the repo root

Each graph runs in its own process with onnxruntime's profiler on (``enable_profiling``): a
prompt of ``--prompt-tokens`` random ids, then ``--new`` single-token steps (specrt: forward +
commit; genai: its model.onnx on K/V buffers bound once as past and present, as
scripts/decode_loop_cost.py's genai_graph). From the profile's events of the decode steps only
(the prompt's pass and the first ``--skip`` steps dropped) it prints a table, one column per
graph, whose first rows are

    run_ms      ms per step of the whole ``model_run`` event
    kernels_ms  ms per step summed over the node events (``*_kernel_time``), i.e. inside the kernels
    gaps_ms     run - kernels: onnxruntime's own work between kernels (dispatch, allocation, the
                executor's bookkeeping), the part a graph with more, smaller nodes pays per node
    nodes       node events per step

then the ``--top`` operator types by ms per step, largest first, and the rest summed. The profiler
itself costs several microseconds per node (a real step may take half as long again with it on),
so read where the two graphs differ, not the absolute figures of the small operators.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
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

SUBJECTS = ("specrt", "genai")


def _profiled_session(path: Path, threads: int | None, prefix: str):  # -> ort.InferenceSession
    import onnxruntime as ort

    from specrt.backend import kernels

    options = ort.SessionOptions()
    kernels.register(options)  # SpecAttention graphs
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_profiling = True
    options.profile_file_prefix = prefix
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def _run_specrt(folder: Path, prompt: np.ndarray, new: int, threads: int | None, prefix: str) -> str:
    import specrt
    import specrt.backend.session

    specrt.backend.session.make_session = lambda path, provider, t: _profiled_session(path, t, prefix)
    model = specrt.load(folder, threads=threads)
    decoder = model.generate_ids(prompt, method="baseline", max_new_tokens=1)[1].decoder
    token = raw_prefill(decoder, prompt, len(prompt) + new + 1)
    for _ in range(new):
        token = raw_step(decoder, token)
    return model.graph.session.end_profiling()


def _run_genai(folder: Path, prompt: np.ndarray, new: int, threads: int | None, prefix: str) -> str:
    session = _profiled_session(genai_decoder_file(folder), threads, prefix)
    binding, _buffers = bind_genai_kv(session, folder, len(prompt) + new + 1)
    vocab = session.get_outputs()[0].shape[-1]
    logits = np.empty((1, len(prompt), vocab), np.float32)
    binding.bind_output("logits", "cpu", 0, np.float32, [1, len(prompt), vocab], logits.ctypes.data)
    binding.bind_cpu_input("input_ids", prompt[None].astype(np.int64))
    binding.bind_cpu_input("attention_mask", np.ones((1, len(prompt)), np.int64))
    session.run_with_iobinding(binding)  # the prompt
    token = int(logits[0, -1].argmax())
    binding.bind_output("logits", "cpu", 0, np.float32, [1, 1, vocab], logits.ctypes.data)
    for i in range(new):
        binding.bind_cpu_input("input_ids", np.array([[token]], np.int64))
        binding.bind_cpu_input("attention_mask", np.ones((1, len(prompt) + i + 1), np.int64))
        session.run_with_iobinding(binding)
        token = int(logits[0, 0].argmax())
    return session.end_profiling()


def summarise(events: list[dict], skip: int, lead: int = 1) -> dict:
    """Per decode step: whole-run and in-kernel ms, node count, ms per op type, over the runs after
    the ``lead`` prompt passes and ``skip`` more."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    kept = runs[lead + skip:]
    if not kept:
        raise ValueError(f"the profile holds {len(runs)} runs; nothing left after {lead} prompt pass(es) "
                         f"and {skip} skipped")
    spans = [(r["ts"], r["ts"] + r["dur"]) for r in kept]
    start = spans[0][0]
    by_op: dict[str, float] = defaultdict(float)
    kernels, nodes = 0.0, 0
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or e["ts"] < start:
            continue
        if not any(a <= e["ts"] <= b for a, b in spans):
            continue
        by_op[e["args"]["op_name"]] += e["dur"]
        kernels += e["dur"]
        nodes += 1
    n = len(kept)
    run_us = sum(r["dur"] for r in kept)
    return {
        "steps": n,
        "run_ms": run_us / n / 1000,
        "kernels_ms": kernels / n / 1000,
        "gaps_ms": (run_us - kernels) / n / 1000,
        "nodes": nodes / n,
        "by_op_ms": {op: us / n / 1000 for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])},
    }


def _one(args: argparse.Namespace) -> None:
    prompt = random_prompt(args)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / args.one)
        run = _run_specrt if args.one == "specrt" else _run_genai
        folder = args.artifact if args.one == "specrt" else args.genai
        path = run(folder, prompt, args.new, args.threads, prefix)
        events = json.loads(Path(path).read_text())
    # specrt's profile opens with the warm-up request's prompt pass, then the timed prompt's
    print(json.dumps(summarise(events, args.skip, lead=2 if args.one == "specrt" else 1)))


def profile_pair(args: argparse.Namespace) -> dict[str, dict]:
    """{"specrt": summary, "genai": summary} (:func:`summarise`), each from its own worker process."""
    return {subject: run_worker("scripts.op_profile", args, subject, ["--skip", str(args.skip)])
            for subject in SUBJECTS}


def format_table(result: dict[str, dict], top: int) -> list[str]:
    ours, theirs = result["specrt"], result["genai"]
    lines = [f"{'':28s} {'specrt':>9s} {'genai':>9s}"]
    for key in ("run_ms", "kernels_ms", "gaps_ms", "nodes"):
        lines.append(f"{key:28s} {ours[key]:9.2f} {theirs[key]:9.2f}")
    ops = sorted(set(ours["by_op_ms"]) | set(theirs["by_op_ms"]),
                 key=lambda op: -max(ours["by_op_ms"].get(op, 0), theirs["by_op_ms"].get(op, 0)))
    for op in ops[:top]:
        lines.append(f"{op:28s} {ours['by_op_ms'].get(op, 0):9.3f} {theirs['by_op_ms'].get(op, 0):9.3f}")
    rest = ops[top:]
    lines.append(f"{'(other ops)':28s} {sum(ours['by_op_ms'].get(o, 0) for o in rest):9.3f} "
                 f"{sum(theirs['by_op_ms'].get(o, 0) for o in rest):9.3f}")
    return lines


def make_parser() -> argparse.ArgumentParser:
    parser = pair_parser(__doc__.split("\n")[0], SUBJECTS)
    parser.add_argument("--skip", type=int, default=8, help="decode steps left out at the start (warm-up)")
    parser.add_argument("--top", type=int, default=12)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    if args.one:
        _one(args)
        return
    print("\n".join(format_table(profile_pair(args), args.top)))


if __name__ == "__main__":
    main()
