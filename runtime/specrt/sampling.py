"""The target distribution: logits -> probabilities under temperature, top-k and top-p."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """[n, vocab] logits -> [n, vocab] float64 probabilities of the (warped) target distribution.
    Greedy decoding (temperature 0) has no distribution: callers take the argmax instead."""
    if params.greedy:
        raise ValueError("target_probs needs temperature > 0 (greedy decoding uses the argmax)")
    z = logits.astype(np.float64) / params.temperature
    if params.top_k and params.top_k < z.shape[-1]:
        kth = np.partition(z, -params.top_k, axis=-1)[:, -params.top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop_sorted = np.cumsum(sorted_p, axis=-1) - sorted_p >= params.top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from an unnormalised non-negative vector ``p`` [vocab]."""
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(p) - 1))
