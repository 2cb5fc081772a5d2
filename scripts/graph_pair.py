"""What the tools comparing specrt's graph with onnxruntime-genai's (scripts/op_profile.py,
scripts/decode_loop_cost.py) share: their command line, one worker process per subject, and
genai's graph bound to K/V buffers shared by past and present. Not a tool of its own."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]  # workers run as `python -m scripts.<tool>` from here


def pair_parser(description: str, subjects: tuple[str, ...]) -> argparse.ArgumentParser:
    """The common arguments; ``--one SUBJECT`` (hidden) makes the process a worker."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("artifact", type=Path, help="specrt artifact folder")
    parser.add_argument("genai", type=Path, help="onnxruntime-genai model folder of the same checkpoint and precision")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new", type=int, default=96)
    parser.add_argument("--one", choices=subjects, help=argparse.SUPPRESS)
    return parser


def random_prompt(args: argparse.Namespace) -> np.ndarray:
    """[args.prompt_tokens] int64 ids, the same in every worker: drawn from ids 1000-20000 of the
    artifact's vocabulary (clear of the special tokens at its top), or all of a smaller one."""
    from specrt.backend.manifest import read_manifest

    vocab = read_manifest(args.artifact, check_hashes=False).dims.vocab
    low, high = (1000, 20000) if vocab > 20000 else (0, vocab)
    return np.random.default_rng(1).integers(low, high, args.prompt_tokens).astype(np.int64)


def run_worker(module: str, args: argparse.Namespace, subject: str, extra: list[str]) -> Any:
    """Run ``python -m module`` from the repository root as the worker for ``subject`` with
    ``args``' common arguments and ``extra``; returns the JSON of its last line of output."""
    forwarded = [str(args.artifact.resolve()), str(args.genai.resolve()), "--prompt-tokens", str(args.prompt_tokens),
                 "--new", str(args.new), *extra]
    if args.threads is not None:
        forwarded += ["--threads", str(args.threads)]
    done = subprocess.run([sys.executable, "-m", module, *forwarded, "--one", subject],
                          capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"the {subject} worker of {module} failed (exit {done.returncode}):\n{tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bind_genai_kv(
    session: Any, folder: Path, capacity: int, past: np.random.Generator | None = None
) -> tuple[Any, list]:
    """An io_binding of genai's graph (``session``, loaded from ``folder``) with one buffer per
    layer's key and value, [1, kv, capacity, d], bound as both past and present (genai's
    past_present_share_buffer). ``past``: a generator filling them with random values (a prefilled
    past); zeros without. Returns the binding and the buffers, which must outlive it."""
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    layers, kv, d = decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]
    shape = (1, kv, capacity, d)
    buffers = [past.random(shape, dtype=np.float32) if past is not None else np.zeros(shape, np.float32)
               for _ in range(2 * layers)]
    binding = session.io_binding()
    for i, buf in enumerate(buffers):
        layer, kind = divmod(i, 2)
        name = ("key", "value")[kind]
        binding.bind_input(f"past_key_values.{layer}.{name}", "cpu", 0, np.float32, list(shape), buf.ctypes.data)
        binding.bind_output(f"present.{layer}.{name}", "cpu", 0, np.float32, list(shape), buf.ctypes.data)
    return binding, buffers


def raw_prefill(decoder: Any, prompt: np.ndarray, capacity: int) -> int:
    """Reset specrt's ``decoder`` (an OrtDecoder) to ``capacity`` positions and run ``prompt``
    through it; returns the greedy first token."""
    from specrt.backend.prefill import prefill

    decoder.reset(capacity)
    *_, last = prefill(decoder, prompt, len(prompt), last_logits_only=True)
    return int(last.logits[-1].argmax())


def raw_step(decoder: Any, token: int) -> int:
    """One plain greedy step on specrt's ``decoder`` with no loop around it: forward ``token``,
    commit it, return the next token."""
    from specrt.backend.window import causal_bias

    past = decoder.past
    step = decoder.forward(np.array([token]), np.array([past]), causal_bias(past, 1))
    decoder.commit(np.array([0]))
    return int(step.logits[0].argmax())


def genai_decoder_file(folder: Path) -> Path:
    """The ONNX file of an onnxruntime-genai model folder."""
    return folder / json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["filename"]
