"""Milliseconds of one plain decoding step (one new token after ``past`` cached positions) of
specrt artifacts and onnxruntime-genai model folders: the graphs alone, with no decoding loop.

    for i in 1 2 3; do for f in artifacts/M/int4 /tmp/peers/int4; do
        python scripts/step_cost.py $f --past 100 300 --threads 2; done; done

Each graph gets the same kind of inputs (random K/V of ``past`` positions, one token) and runs in
blocks of ``--block`` passes for ``--rounds`` rounds, after three warm-up passes; folders given
together take turns, each leading a round in turn. onnxruntime-genai folders (``genai_config.json``)
run their ``model.onnx`` with specrt's session options (the graph alone: genai's own loop also
shares the K/V buffers between steps, which this does not). One line per cache length and folder:

    past 100: artifacts/M/int4: MS ms (xRATIO of the first)

the median pass, and its ratio to the first folder's. Compare graphs in separate processes,
alternating, as above: several graphs in one onnxruntime process disturb each other's timing on a
2-core machine (the graph loaded last tends to run fastest, whatever it is).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specrt.backend.manifest import read_manifest
from specrt.backend.session import make_session


def _feeds(session: ort.InferenceSession, past: int, kv_heads: int, head_dim: int, genai: bool) -> dict:
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for i in session.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = np.array([[100]], np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.array([[past]], np.int64)
        elif i.name == "attention_bias":
            feeds[i.name] = np.zeros((1, 1, 1, past + 1), np.float32)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, past + 1), np.int64)
        elif i.name == "logits_index":  # specrt graphs that compute the logits of the rows asked for
            feeds[i.name] = np.zeros(1, np.int64)
        else:  # past K/V: genai [1, kv, past, d], specrt [1, past, kv, d]
            shape = (1, kv_heads, past, head_dim) if genai else (1, past, kv_heads, head_dim)
            feeds[i.name] = rng.random(shape, np.float32)
    return feeds


def _load(folder: Path, threads: int | None):
    """(session, kv_heads, head_dim, genai?) of a specrt artifact or a genai folder."""
    config = folder / "genai_config.json"
    if config.exists():
        decoder = json.loads(config.read_text())["model"]["decoder"]
        session = make_session(folder / decoder["filename"], "cpu", threads)
        return session, decoder["num_key_value_heads"], decoder["head_size"], True
    manifest = read_manifest(folder, check_hashes=False)
    session = make_session(folder / manifest.decoder, "cpu", threads)
    return session, manifest.dims.kv_heads, manifest.dims.head_dim, False


def step_cost(
    folders: list[Path], pasts: list[int], *, threads: int | None = None, block: int = 10, rounds: int = 15
) -> dict[int, dict[str, float]]:
    """{past: {folder: median ms of one plain step}} of specrt artifacts and genai folders."""
    graphs = [(folder, *_load(folder, threads)) for folder in folders]
    result: dict[int, dict[str, float]] = {}
    for past in pasts:
        runs = []
        for _, session, kv, d, genai in graphs:
            logits = [o.name for o in session.get_outputs() if o.name == "logits"]
            runs.append((session, logits, _feeds(session, past, kv, d, genai)))
            for _ in range(3):  # warm-up: prepacking, allocations
                session.run(logits, runs[-1][2])
        times: list[list[float]] = [[] for _ in runs]
        for r in range(rounds):
            for k in np.roll(np.arange(len(runs)), -r):  # each graph leads a round in turn
                session, logits, feeds = runs[k]
                for _ in range(block):
                    t0 = time.perf_counter()
                    session.run(logits, feeds)
                    times[k].append(time.perf_counter() - t0)
        result[past] = {str(folder): 1000 * float(np.median(t)) for (folder, *_), t in zip(graphs, times, strict=True)}
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="specrt artifacts or onnxruntime-genai model folders")
    parser.add_argument("--past", type=int, nargs="+", default=[300])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    for past, by_folder in step_cost(args.folders, args.past, threads=args.threads, block=args.block,
                                     rounds=args.rounds).items():
        first = next(iter(by_folder.values()))
        for folder, ms in by_folder.items():
            print(f"past {past}: {folder}: {ms:.2f} ms (x{ms / first:.3f} of the first)")


if __name__ == "__main__":
    main()
