"""The spec-safety gate: does a decoder give a token the same argmax in a verify window as alone?

Greedy speculation is lossless only if the target's argmax at a position does not depend on how
many positions share the forward pass (and on whether the cached K/V came from single steps or
from windows). Quantized kernels take different paths for one row and for many (GEMV vs GEMM,
activation blocks), so that can fail at near-ties. For each calibration prompt:

    reference   prefill, then greedy single steps:        y_1 .. y_n, logits per step (margins)
    chain(w)    prefill, then windows [y_k, y_k+1 .. y_k+w-1] of the reference itself (an
                oracle draft), all slots committed: the cache is built by windows as in decoding
    tree(w)     the same, plus at every depth a sibling holding the reference's runner-up token
                (the nearest tie, the hardest distractor); only the reference path is committed

Every window slot on the reference path gives an argmax to compare with the reference token that
follows it. A variant with any disagreement is not spec-safe. Recorded per mode: positions
compared, disagreements, and the reference top-2 margin (logit units) where they occurred, plus
the smallest margin seen overall (how close the prompt set came to a tie).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specrt.backend.prefill import prefill
from specrt.backend.session import OrtDecoder
from specrt.backend.verdict import SELF_CHECK, Verdict, basis, machine
from specrt.backend.window import causal_bias, fit_window, flatten
from specrt.files import cache_root, write_json_atomic
from specrt.tree import DraftTree

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Reference:
    prompt: np.ndarray  # [t] int64
    tokens: np.ndarray  # [n] int64 greedy single-step continuation (tokens[0] comes from the prefill)
    runner_up: np.ndarray  # [n] int64 second-best token at each step
    margins: np.ndarray  # [n] float32 top-1 minus top-2 logit at each step
    logits: np.ndarray  # [n, vocab] float32 the logits each step chose from


@dataclass(frozen=True)
class ModeReport:
    mode: str  # "chain" or "tree"
    width: int  # window slots on the reference path (root included)
    positions: int  # reference positions compared
    disagreements: int
    disagreement_margins: tuple[float, ...]  # reference top-2 margins where the window disagreed
    min_margin: float  # smallest reference top-2 margin among the compared positions
    max_logit_diff: float  # largest |window logit - single-step logit| over the compared positions


def _top2(logits: np.ndarray) -> tuple[int, int, float]:  # logits: [vocab]
    second, first = np.argpartition(logits, -2)[-2:]
    if logits[second] > logits[first]:
        first, second = second, first
    return int(first), int(second), float(logits[first] - logits[second])


def reference_run(decoder: OrtDecoder, prompt: np.ndarray, n: int, chunk: int) -> Reference:
    """Plain greedy decoding, one position per pass, keeping each step's runner-up and margin."""
    decoder.reset(len(prompt) + n + 1)
    logits = [out.logits[-1] for out in prefill(decoder, prompt, chunk)][-1]
    tokens, runner_up, margins, rows = [], [], [], []
    for _ in range(n):
        rows.append(logits)
        first, second, margin = _top2(logits)
        tokens.append(first)
        runner_up.append(second)
        margins.append(margin)
        if len(tokens) == n:
            break
        past = decoder.past
        out = decoder.forward(np.array([first], np.int64), np.array([past]), causal_bias(past, 1))
        decoder.commit(np.array([0]))
        logits = out.logits[0]
    return Reference(prompt, np.array(tokens, np.int64), np.array(runner_up, np.int64),
                     np.array(margins, np.float32), np.stack(rows).astype(np.float32))


def _window_tree(ref: Reference, start: int, depth: int, siblings: bool) -> tuple[DraftTree, np.ndarray]:
    """Draft tree after root ``ref.tokens[start]``: the reference path of ``depth`` nodes, each
    with its runner-up sibling when ``siblings``. Returns the tree and the path's node indices."""
    tokens, parents, path = [], [], []
    parent = -1
    for d in range(depth):
        k = start + 1 + d  # reference step whose token this node holds
        if siblings:
            tokens.append(int(ref.runner_up[k]))
            parents.append(parent)
        tokens.append(int(ref.tokens[k]))
        parents.append(parent)
        parent = len(tokens) - 1
        path.append(parent)
    return DraftTree(np.array(tokens, np.int64), np.array(parents, np.int64)), np.array(path, np.int64)


def window_run(decoder: OrtDecoder, ref: Reference, width: int, tree: bool, chunk: int) -> ModeReport:
    """Teacher-forced verify windows of ``width`` path slots over the reference continuation."""
    n = len(ref.tokens)
    decoder.reset(len(ref.prompt) + 2 * n + 2 * width)
    for _ in prefill(decoder, ref.prompt, chunk):
        pass
    compared, wrong_margins, max_diff = [], [], 0.0
    start = 0  # the root is ref.tokens[start]; its logits predict ref.tokens[start + 1]
    while start < n - 1:
        depth = min(width - 1, n - 1 - start - 1)  # path nodes; the last one predicts nothing we know
        draft, path = _window_tree(ref, start, depth, siblings=tree)
        draft = fit_window(draft, decoder.past, decoder.graph.key_block)  # the window the runtime would verify
        path = path[path < len(draft)]
        window = flatten(int(ref.tokens[start]), draft, decoder.past)
        out = decoder.forward(window.input_ids, window.position_ids, window.attention_bias)
        slots = np.concatenate([[0], path + 1])  # root and path: each predicts the next reference token
        predicted = out.logits[slots].argmax(-1)
        want = ref.tokens[start + 1 : start + 1 + len(slots)]
        single = ref.logits[start + 1 : start + 1 + len(slots)]  # the single steps' logits, same positions
        max_diff = max(max_diff, float(np.abs(out.logits[slots] - single).max()))
        for k, (got, expected) in enumerate(zip(predicted, want, strict=True)):
            compared.append(start + 1 + k)
            if got != expected:
                wrong_margins.append(float(ref.margins[start + 1 + k]))
        decoder.commit(slots)
        start += len(slots)
    margins = ref.margins[compared] if compared else np.zeros(1, np.float32)
    return ModeReport("tree" if tree else "chain", width, len(compared), len(wrong_margins),
                      tuple(round(m, 5) for m in wrong_margins), round(float(margins.min()), 5), max_diff)


def run_gate(
    decoder: OrtDecoder, prompts: list[np.ndarray], *, new_tokens: int, widths: tuple[int, ...], chunk: int
) -> dict:
    """The gate's report: per mode and width, summed over ``prompts`` ([t] int64 each)."""
    refs = [reference_run(decoder, p, new_tokens, chunk) for p in prompts]
    modes = []
    for width in widths:
        for tree in (False, True):
            parts = [window_run(decoder, r, width, tree, chunk) for r in refs]
            modes.append(ModeReport(
                parts[0].mode, width,
                positions=sum(p.positions for p in parts),
                disagreements=sum(p.disagreements for p in parts),
                disagreement_margins=tuple(m for p in parts for m in p.disagreement_margins),
                min_margin=min(p.min_margin for p in parts),
                max_logit_diff=max(p.max_logit_diff for p in parts),
            ))
    disagreements = sum(m.disagreements for m in modes)
    return {
        "spec_safe": disagreements == 0,
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "positions": sum(m.positions for m in modes),
        "disagreements": disagreements,
        "agreement": round(1 - disagreements / max(sum(m.positions for m in modes), 1), 6),
        # 0.0: every window gave every compared position the single step's logits bit for bit
        "max_logit_diff": max(m.max_logit_diff for m in modes),
        "modes": [asdict(m) for m in modes],
    }


def gate_from_params(decoder: OrtDecoder, prompts: list[np.ndarray], params: dict,
                     op_types: set[str] | None = None) -> dict:
    """:func:`run_gate` with ``params.yaml: gate`` settings, timed; with the graph's ``op_types``,
    also what the verdict rests on (``basis``, specrt.backend.verdict)."""
    t0 = time.perf_counter()
    report = run_gate(decoder, prompts, new_tokens=params["new_tokens"], widths=tuple(params["widths"]),
                      chunk=params["prefill_chunk"])
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if op_types is not None:
        report["basis"] = basis(op_types, decoder.graph.provider)
    return report


def _cache_file(decoder_sha256: str, provider: str) -> Path:
    root = cache_root()
    key = hashlib.sha256(json.dumps([decoder_sha256, machine(provider)], sort_keys=True).encode()).hexdigest()
    return root / "selfcheck" / f"{key[:32]}.json"


def self_check(decoder: Any, prompts: list[Any], decoder_sha256: str, provider: str) -> Verdict:
    """The gate on ``prompts`` with :data:`SELF_CHECK` settings, or its cached result for this
    decoder (by hash) on this machine. ``decoder``: an OrtDecoder of the graph."""
    cache = _cache_file(decoder_sha256, provider)
    here = machine(provider)
    try:
        cached = json.loads(cache.read_text())
        return Verdict(bool(cached["spec_safe"]), "self-check", here, cached)
    except (OSError, ValueError, KeyError):
        pass
    t0 = time.perf_counter()
    report = run_gate(decoder, prompts, new_tokens=SELF_CHECK["new_tokens"], widths=SELF_CHECK["widths"],
                      chunk=SELF_CHECK["chunk"])
    report = {k: v for k, v in report.items() if k != "modes"} | {"seconds": round(time.perf_counter() - t0, 2)}
    try:
        write_json_atomic(cache, report)
    except OSError as e:  # a read-only home: the check runs again next time
        log.info("self-check result not cached (%s)", e)
    return Verdict(bool(report["spec_safe"]), "self-check", here, report)
