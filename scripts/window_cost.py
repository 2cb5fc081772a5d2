"""Milliseconds of one decoder pass by window size, several artifacts side by side.

    python scripts/window_cost.py artifacts/M/int4 artifacts/M/fp32 --past 300 --sizes 1 2 4 8 16

For each size s the artifacts run in turn on the same random inputs (``past`` cached positions, a
causal bias); each figure is the best of ``rounds`` means over ``repeats`` passes. Verify windows
pay when c(s) / c(1) stays below 1 + the tokens a draft gets accepted: this prints both.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from specrt.backend import DecoderSession, OrtDecoder
from specrt.manifest import read_manifest
from specrt.tree import causal_bias


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifacts", type=Path, nargs="+")
    parser.add_argument("--past", type=int, default=300)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    decoders = {}
    for folder in args.artifacts:
        manifest = read_manifest(folder, check_hashes=False)
        session = DecoderSession(folder / manifest.decoder, manifest.dims, threads=args.threads)
        decoder = OrtDecoder.on(session)
        decoder.reset(args.past + max(args.sizes) + 1)
        ids = rng.integers(0, manifest.dims.vocab, args.past)
        decoder.forward(ids, np.arange(args.past), causal_bias(0, args.past))
        decoder.commit(np.arange(args.past))
        decoders[str(folder)] = decoder
    best: dict[str, dict[int, float]] = {name: {} for name in decoders}
    for _ in range(args.rounds):
        for s in args.sizes:
            ids, pos, bias = np.full(s, 1000, np.int64), np.arange(args.past, args.past + s), causal_bias(args.past, s)
            for name, decoder in decoders.items():
                decoder.forward(ids, pos, bias)  # warm-up; nothing is committed, the cache stays at `past`
                t0 = time.perf_counter()
                for _ in range(args.repeats):
                    decoder.forward(ids, pos, bias)
                ms = (time.perf_counter() - t0) / args.repeats * 1000
                best[name][s] = min(best[name].get(s, ms), ms)
    for name, by_size in best.items():
        one = by_size.get(1)
        cells = [f"s={s}: {ms:.1f} ms" + (f" ({ms / one:.2f}x)" if one else "") for s, ms in by_size.items()]
        print(f"{name}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
