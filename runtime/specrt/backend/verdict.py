"""Where a spec-safety verdict holds: what the gate's verdict rests on, and the self-check that
replaces it on a machine it does not reach.

The gate (specrt.engine.spec_gate) runs where the artifact is built and records, beside its verdict
(manifest ``checks.gate.basis``), what the verdict rests on:

    by_construction   no operator of the graph may round a row differently in a window: each one
                      computes a row alone, with the same code on every CPU (specrt's SpecAttention,
                      MatMulQ4 and MatMulW8A8, integer MatMulInteger, row-wise norms and element-wise ops), so
                      the verdict holds on any CPU with the CPU provider
    measured          the graph has operators whose kernels pick a path by the number of rows
                      (ROW_DEPENDENT_OPS: float MatMul, MatMulNBits, onnxruntime's attentions): the
                      verdict holds only for the provider, CPU features, kernel instruction set and
                      onnxruntime it was measured with

Before a model's first speculative request the runtime compares the basis with this machine
(:func:`covers`). Where it does not cover it, a short self-check runs instead
(:func:`specrt.engine.spec_gate.self_check`): the gate on two built-in prompts (16 tokens, windows of 4,
chain and tree; seconds), cached per decoder and machine in ``$SPECRT_CACHE_DIR`` (default
``~/.cache/specrt``) under ``selfcheck/``.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from specrt.backend import kernels

# Operators whose onnxruntime kernels choose their code path by the number of rows (GEMV vs GEMM,
# one-row activation blocks, attention tiling): a window's row may round differently from a single step.
ROW_DEPENDENT_OPS = frozenset({
    "MatMul", "Gemm", "FusedMatMul", "MatMulNBits", "Attention", "MultiHeadAttention", "GroupQueryAttention",
    "QAttention", "Conv", "FusedGemm",
})
# The x86 / Arm features onnxruntime's MLAS and specrt's kernels dispatch on.
DISPATCH_FEATURES = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512_bf16",
                     "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "sve", "i8mm")
SELF_CHECK_PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Explain in two sentences why the sky is blue.",
)
SELF_CHECK = {"new_tokens": 16, "widths": (4,), "chunk": 64}


def cpu_features() -> tuple[str, ...]:
    """The dispatch features of this CPU (Linux /proc/cpuinfo; elsewhere none are known)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return tuple(f for f in DISPATCH_FEATURES if f in flags)


def machine(provider: str) -> dict[str, Any]:
    """What a measured verdict depends on, here."""
    return {
        "provider": provider,
        "cpu_features": list(cpu_features()),
        "machine": platform.machine(),
        "kernel_isa": kernels.describe().get("isa") if kernels.library_path() else None,
        "onnxruntime": ort.__version__,
    }


def basis(op_types: set[str], provider: str) -> dict[str, Any]:
    """The basis of a verdict measured on a graph with ``op_types``, here, with ``provider``."""
    row_dependent = sorted(op_types & ROW_DEPENDENT_OPS)
    exact = not row_dependent and provider == "cpu"
    return {"exactness": "by_construction" if exact else "measured", "row_dependent_ops": row_dependent,
            **machine(provider)}


def covers(recorded: dict[str, Any] | None, provider: str) -> bool:
    """Whether a verdict with basis ``recorded`` holds here with ``provider``."""
    if not recorded:
        return False
    if recorded.get("exactness") == "by_construction":
        return provider == "cpu"
    here = machine(provider)
    return all(recorded.get(key) == here[key] for key in here)


@dataclass(frozen=True)
class Verdict:
    spec_safe: bool
    source: str  # "manifest" (the gate's verdict covers this machine) or "self-check"
    basis: dict[str, Any]  # the manifest's basis, or this machine's for a self-check
    report: dict[str, Any]  # the self-check's gate report ({} for "manifest")
