"""Plain vs speculative decoding on one artifact, per provider: decode speed, and bit-exactness.

    python scripts/gpu_bench.py --artifact /tmp/tiny/qwen2/fp32 --providers cuda cuda+host cpu --out bench.json

A provider is a specrt provider with an optional cache placement: ``cuda`` (KV cache on the GPU),
``cuda+host`` (numpy cache, copied to the GPU and back every pass), ``cpu``, ``cpu+device``.
For each: greedy ``baseline`` (plain decoding), then ``pld`` chain and tree, on a few prompts that
repeat themselves (so that copying pays). A run is lossless when its tokens equal the provider's
baseline tokens for every prompt; the exit status is 1 when one is not.

The report (``--out``) holds the versions (onnxruntime, its available providers, Python) and per
provider whether the KV cache was on the device, the wall seconds, and per run (``baseline/chain``,
``pld/chain``, ``pld/tree``): decode tokens per second, ms and tokens per step, accepted drafts,
prefill ms per prompt, ``lossless``, and ``speedup`` over the provider's baseline. Used by
scripts/gpu_check.sh; runs on any provider.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Any

import onnxruntime as ort

import specrt

log = logging.getLogger("gpu_bench")

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint(fib(",
]
RUNS = (("baseline", False), ("pld", False), ("pld", True))


CACHES = {"": None, "host": False, "device": True}  # placement suffix -> specrt.load(device_cache=...)


def bench_provider(folder: Path, spec: str, *, max_new_tokens: int, rounds: int) -> dict[str, Any]:
    """Decode speed of each run of RUNS on ``spec`` (provider[+host|+device]), and whether its tokens
    equal the baseline's."""
    provider, _, cache = spec.partition("+")
    if cache not in CACHES:
        raise ValueError(f"provider {spec!r}: the cache placement after '+' must be 'host' or 'device'")
    model = specrt.load(folder, provider=provider, device_cache=CACHES[cache])
    prompts = [model.encode(p) for p in PROMPTS]
    model.generate_ids(prompts[0], method="pld", tree=True, max_new_tokens=8)  # warm-up: sessions, allocations
    runs: dict[str, dict[str, Any]] = {}
    reference: list[list[int]] = []
    for method, tree in RUNS:
        name = f"{method}/{'tree' if tree else 'chain'}"
        decode_s, tokens, steps, accepted, prefill_s, exact = 0.0, 0, 0, 0, 0.0, True
        for _ in range(rounds):
            for i, ids in enumerate(prompts):
                model.forget_history()
                out, loop = model.generate_ids(ids, method=method, tree=tree, max_new_tokens=max_new_tokens)
                s = loop.stats
                decode_s, tokens, steps = decode_s + s.decode_s, tokens + s.decode_tokens, steps + s.steps
                accepted, prefill_s = accepted + s.accepted, prefill_s + s.prefill_s
                if method == "baseline" and len(reference) < len(prompts):
                    reference.append(out.tolist())
                exact = exact and out.tolist() == reference[i]
        runs[name] = {
            "decode_tokens_per_s": round(tokens / decode_s, 2) if decode_s else 0.0,
            "ms_per_step": round(1000 * decode_s / steps, 4) if steps else 0.0,
            "tokens_per_step": round(tokens / steps, 4) if steps else 0.0,
            "accepted": accepted,
            "prefill_ms": round(1000 * prefill_s / (rounds * len(prompts)), 3),
            "lossless": exact,
        }
        log.info("%s %s: %s", spec, name, runs[name])
    base = runs["baseline/chain"]["decode_tokens_per_s"]
    for r in runs.values():
        r["speedup"] = round(r["decode_tokens_per_s"] / base, 3) if base else 0.0
    return {"device_cache": model.graph.device is not None, "runs": runs,
            "lossless": all(r["lossless"] for r in runs.values())}


def bench(folder: Path, providers: list[str], *, max_new_tokens: int, rounds: int) -> dict[str, Any]:
    report: dict[str, Any] = {
        "artifact": str(folder),
        "onnxruntime": ort.__version__,
        "available_providers": ort.get_available_providers(),
        "python": platform.python_version(),
        "max_new_tokens": max_new_tokens,
        "rounds": rounds,
        "providers": {},
    }
    for provider in providers:
        t0 = time.perf_counter()
        report["providers"][provider] = bench_provider(folder, provider, max_new_tokens=max_new_tokens,
                                                       rounds=rounds)
        report["providers"][provider]["wall_s"] = round(time.perf_counter() - t0, 2)
    report["lossless"] = all(p["lossless"] for p in report["providers"].values())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, required=True, help="artifact folder (manifest.json, decoder.onnx)")
    parser.add_argument("--providers", nargs="+", default=["cuda", "cpu"],
                        help="specrt providers to compare, each optionally +host or +device (KV cache placement)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the prompts per run")
    parser.add_argument("--out", type=Path, required=True, help="report JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    report = bench(args.artifact, args.providers, max_new_tokens=args.max_new_tokens, rounds=args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    log.info("wrote %s (lossless: %s)", args.out, report["lossless"])
    return 0 if report["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
