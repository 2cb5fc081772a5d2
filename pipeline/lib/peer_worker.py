"""One peer in its own process, serving one greedy generation per request (pipeline/peers.py).

The peers stage interleaves its runs prompt by prompt: for each prompt, every run in turn. Each
model lives in its own worker process, so no two onnxruntime sessions (or a session and torch)
share a process: several sessions in one process do not time alike (``scripts/step_cost.py``
docstring). Only one worker computes at a time; the others wait on their pipe.

    parent ──config (argv)──► worker: loads the model, warms it up, answers {"ready": ...}
    parent ──request (line)──► worker ──result (line)──► parent      (repeated)
    parent closes stdin ──► worker exits

A request: ``{"prompt": [ids], "max_new_tokens": n, "options": {...}}`` where the options are the
run's: ``{"method": "pld", "cold": bool}`` (specrt), ``{"speculative": {...} | null}`` (onnxruntime-genai;
llama.cpp: ``{"max_ngram_size", "num_pred_tokens"}`` of its prompt lookup), ``{"prompt_lookup": N | null}``
(transformers). A result: ``{"ids": [new ids], "prefill_s",
"decode_s", "first_tokens", "stats"}`` (the per-prompt tuple of ``peers._tally``), or
``{"error": "..."}``. Lines are JSON on the worker's original stdout; anything a library prints
goes to its stderr, which is the parent's (the stage's log).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

KINDS = ("specrt", "specrt_hf", "genai", "hf", "llama_cpp")
# (prompt ids [t] int64, max_new_tokens, run options) -> (new ids [k], prefill_s, decode_s, first_tokens, stats)
Generate = Callable[[np.ndarray, int, dict[str, Any]], tuple[np.ndarray, float, float, int, dict[str, Any]]]


@dataclass(frozen=True)
class WorkerConfig:
    kind: str  # one of KINDS
    # specrt artifact folder, genai model folder, HF checkpoint folder (hf, specrt_hf), or GGUF file (llama_cpp)
    path: str
    threads: int | None
    eos_token_ids: tuple[int, ...]
    warmup_prompt: tuple[int, ...]  # generated untimed (warmup_tokens new tokens) once per options entry
    warmup_tokens: int
    warmup_options: tuple[dict[str, Any], ...] = field(default=({},))
    datastore: str | None = None  # specrt: the retrieval datastore folder (rest, sam_decoding, asam*)
    package: str | None = None  # llama_cpp: the folder holding the llama_cpp package (pipeline.llama_build)
    n_ctx: int | None = None  # llama_cpp: context tokens (prompt + new tokens + one round of drafts)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"peer worker kind must be one of {KINDS}, got {self.kind!r}")
        if self.datastore is not None and self.kind != "specrt":
            raise ValueError(f"peer worker {self.kind!r}: only specrt takes a datastore")
        if self.kind == "llama_cpp" and (self.package is None or self.n_ctx is None):
            raise ValueError("peer worker 'llama_cpp' needs package (the llama_cpp stage's folder) and n_ctx")
        if self.kind != "llama_cpp" and (self.package is not None or self.n_ctx is not None):
            raise ValueError(f"peer worker {self.kind!r}: only llama_cpp takes package and n_ctx")


def _specrt_loader(config: WorkerConfig) -> Generate:
    """specrt with the benchmark stage's prefix cache: a request with ``"cold": true`` in its
    options empties it first and prefills cold; the runs of the same prompt that follow reuse its
    KV rows (bit for bit what their own prefill would compute; ``stats["cached_prompt_tokens"]``)."""
    import specrt

    from .measure import PREFIX_CACHE_MB

    model = specrt.load(config.path, threads=config.threads, datastore=config.datastore,
                        prefix_cache_mb=PREFIX_CACHE_MB)

    def generate(prompt: np.ndarray, n: int, options: dict[str, Any]) -> tuple[np.ndarray, float, float, int, dict]:
        if options.get("cold"):
            model.prefix_cache.clear()  # the prompt's first run here: it prefills cold
        model.forget_history()  # no method learns from another prompt
        ids, loop = model.generate_ids(prompt, method=options.get("method", "baseline"), max_new_tokens=n)
        stats = loop.stats
        return ids, stats.prefill_s, stats.decode_s, 1, {"steps": stats.steps, "accepted": stats.accepted,
                                                         "cached_prompt_tokens": stats.cached_prompt_tokens}

    return generate


def _specrt_hf_loader(config: WorkerConfig) -> Generate:
    """specrt's engine and drafters on the transformers backend (``load(backend="hf")``): the same
    torch model as the ``hf`` peer, so the two compare verifiers, not kernels."""
    import torch

    import specrt

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    model = specrt.load(config.path, backend="hf")

    def generate(prompt: np.ndarray, n: int, options: dict[str, Any]) -> tuple[np.ndarray, float, float, int, dict]:
        model.forget_history()  # no method learns from another prompt
        ids, loop = model.generate_ids(prompt, method=options.get("method", "baseline"), max_new_tokens=n)
        stats = loop.stats
        return ids, stats.prefill_s, stats.decode_s, 1, {"steps": stats.steps, "accepted": stats.accepted}

    return generate


def _genai_loader(config: WorkerConfig) -> Generate:
    import onnxruntime_genai as og

    from .genai_peer import genai_generate, genai_model

    model = genai_model(Path(config.path), config.threads, config.eos_token_ids)
    eos = frozenset(config.eos_token_ids)

    def generate(prompt: np.ndarray, n: int, options: dict[str, Any]) -> tuple[np.ndarray, float, float, int, dict]:
        ids, prefill_s, decode_s, stats = genai_generate(og, model, prompt, n, options.get("speculative"), eos)
        return ids, prefill_s, decode_s, 1, stats

    return generate


def _hf_loader(config: WorkerConfig) -> Generate:
    from .checkpoint import load_causal_lm
    from .hf_peer import hf_generator

    model = load_causal_lm(Path(config.path))
    by_lookup: dict[int | None, Callable] = {}

    def generate(prompt: np.ndarray, n: int, options: dict[str, Any]) -> tuple[np.ndarray, float, float, int, dict]:
        lookup = options.get("prompt_lookup")
        if lookup not in by_lookup:
            by_lookup[lookup] = hf_generator(model, config.threads, lookup, config.eos_token_ids)
        return (*by_lookup[lookup](prompt, n), {})

    return generate


def _llama_cpp_loader(config: WorkerConfig) -> Generate:
    """One ``Llama`` per distinct ``speculative`` option (plain; prompt lookup), made on first use."""
    from .llama_peer import import_llama_cpp, llama_generate, llama_model

    llama_cpp = import_llama_cpp(config.package)
    eos = frozenset(config.eos_token_ids)
    models: dict[str, tuple[Any, Any]] = {}

    def generate(prompt: np.ndarray, n: int, options: dict[str, Any]) -> tuple[np.ndarray, float, float, int, dict]:
        lookup = options.get("speculative")
        key = json.dumps(lookup, sort_keys=True)
        if key not in models:
            models[key] = llama_model(llama_cpp, Path(config.path), config.threads, config.n_ctx, lookup)
        ids, prefill_s, decode_s, stats = llama_generate(*models[key], prompt, n, eos)
        return ids, prefill_s, decode_s, 1, stats

    return generate


LOADERS: dict[str, Callable[[WorkerConfig], Generate]] = {
    "specrt": _specrt_loader, "specrt_hf": _specrt_hf_loader, "genai": _genai_loader, "hf": _hf_loader,
    "llama_cpp": _llama_cpp_loader,
}


def serve(config: WorkerConfig, requests: TextIO, replies: TextIO) -> None:
    """Load the model, warm it up, answer ``ready``, then one result line per request line."""
    generate = LOADERS[config.kind](config)
    for options in config.warmup_options:
        generate(np.asarray(config.warmup_prompt, np.int64), config.warmup_tokens, options)
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        try:
            ids, prefill_s, decode_s, first, stats = generate(
                np.asarray(request["prompt"], np.int64), int(request["max_new_tokens"]), request.get("options", {}))
            reply = {"ids": [int(t) for t in ids], "prefill_s": prefill_s, "decode_s": decode_s,
                     "first_tokens": int(first), "stats": stats}
        except Exception as e:  # reported to the parent, which names the peer and stops the stage
            reply = {"error": f"{type(e).__name__}: {e}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


class PeerWorker:
    """The parent's side: a worker process for one model; :meth:`generate` sends one request."""

    def __init__(self, name: str, config: WorkerConfig):
        self.name = name
        payload = json.dumps(asdict(config))  # tuples become lists; main() turns them back
        self._process = subprocess.Popen(
            [sys.executable, "-m", "pipeline.lib.peer_worker", payload], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, cwd=Path(__file__).resolve().parents[2])
        self._read()  # {"ready": true}: loaded and warmed up

    def _read(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            self._process.wait()
            raise RuntimeError(f"peer worker {self.name!r} exited with status {self._process.returncode} "
                               "(its messages are in the log above)")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"peer worker {self.name!r}: {reply['error']}")
        return reply

    def generate(self, prompt: np.ndarray, max_new_tokens: int,
                 options: dict[str, Any]) -> tuple[np.ndarray, float, float, int, dict[str, Any]]:
        """(new ids [k] int64, prefill_s, decode_s, tokens known when the prefill ended, stats)."""
        assert self._process.stdin is not None
        request = {"prompt": [int(t) for t in prompt], "max_new_tokens": int(max_new_tokens), "options": options}
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        reply = self._read()
        return (np.asarray(reply["ids"], np.int64), float(reply["prefill_s"]), float(reply["decode_s"]),
                int(reply["first_tokens"]), reply["stats"])

    def close(self) -> None:
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def __enter__(self) -> PeerWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    raw = json.loads((sys.argv[1:] if argv is None else list(argv))[0])
    config = WorkerConfig(**{**raw, "eos_token_ids": tuple(raw["eos_token_ids"]),
                             "warmup_prompt": tuple(raw["warmup_prompt"]),
                             "warmup_options": tuple(raw["warmup_options"])})
    # results go to the original stdout; whatever the libraries print (C level included) to stderr
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(config, sys.stdin, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
