"""Milliseconds of one decoder pass by verify-window size, several artifacts side by side: the
verify-cost curve that decides whether drafting pays on a machine.

    python scripts/window_cost.py artifacts/M/int4 artifacts/M/int8 --past 300 --sizes 1 2 4 8 16 --threads 2

Each artifact's decoder is prefilled with ``--past`` random tokens; then, for each window size s,
a window of s new positions (a causal bias, nothing committed, so the cache stays at ``past``)
runs ``--repeats`` times after one warm-up pass, the artifacts taking turns. Each figure is the
best of ``--rounds`` such means. One line per artifact:

    artifacts/M/int4: s=1: MS ms (1.00x), s=2: MS ms (RATIO), ...

ms of one pass, and in brackets its cost c(s) / c(1) in single steps. A verify window of s
positions pays when c(s) / c(1) stays below the tokens a step emits (1 + the accepted drafts).
The ``SIZE:MS`` pairs are the ``--cost`` curve of scripts/project_speedup.py.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from specrt.backend.manifest import read_manifest
from specrt.backend.session import DecoderSession, OrtDecoder
from specrt.backend.window import causal_bias


def window_cost(
    folders: list[Path], past: int, sizes: list[int], *, repeats: int = 5, rounds: int = 3, threads: int | None = None
) -> dict[str, dict[int, float]]:
    """{artifact folder: {window size: best mean ms of one pass}} after ``past`` cached positions."""
    if past < 1 or not sizes or min(sizes) < 1:
        raise ValueError(f"past and every window size must be >= 1, got past={past}, sizes={sizes}")
    rng = np.random.default_rng(0)
    decoders = {}
    for folder in folders:
        manifest = read_manifest(folder, check_hashes=False)
        if past + max(sizes) > manifest.dims.max_context:
            raise ValueError(f"{folder}: past {past} + window {max(sizes)} exceeds its max_context "
                             f"{manifest.dims.max_context}")
        session = DecoderSession(folder / manifest.decoder, manifest.dims, threads=threads)
        decoder = OrtDecoder.on(session)
        decoder.reset(past + max(sizes) + 1)
        ids = rng.integers(0, manifest.dims.vocab, past)
        decoder.forward(ids, np.arange(past), causal_bias(0, past))
        decoder.commit(np.arange(past))
        decoders[str(folder)] = (decoder, min(1000, manifest.dims.vocab - 1))
    best: dict[str, dict[int, float]] = {name: {} for name in decoders}
    for _ in range(rounds):
        for s in sizes:
            pos, bias = np.arange(past, past + s), causal_bias(past, s)
            for name, (decoder, token) in decoders.items():
                ids = np.full(s, token, np.int64)
                decoder.forward(ids, pos, bias)  # warm-up; nothing is committed, the cache stays at `past`
                t0 = time.perf_counter()
                for _ in range(repeats):
                    decoder.forward(ids, pos, bias)
                ms = (time.perf_counter() - t0) / repeats * 1000
                best[name][s] = min(best[name].get(s, ms), ms)
    return best


def format_line(name: str, by_size: dict[int, float]) -> str:
    one = by_size.get(1)
    cells = [f"s={s}: {ms:.1f} ms" + (f" ({ms / one:.2f}x)" if one else "") for s, ms in by_size.items()]
    return f"{name}: " + ", ".join(cells)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifacts", type=Path, nargs="+")
    parser.add_argument("--past", type=int, default=300)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        best = window_cost(args.artifacts, args.past, args.sizes, repeats=args.repeats, rounds=args.rounds,
                           threads=args.threads)
    except ValueError as e:
        parser.error(str(e))
    for name, by_size in best.items():
        print(format_line(name, by_size))


if __name__ == "__main__":
    main()
