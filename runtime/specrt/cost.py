"""Measured cost of a verify pass by window size, for drafters that size drafts from it.

The engine records the wall time of every decode-phase forward pass under its window size s
(root + draft nodes). ``estimate(s)`` answers with the running mean at s when measured, else a
straight line fitted through the measured sizes (or through the one measured size, scaled by
``DEFAULT_SLOPE``: on CPU one verify pass over 4-8 positions cost 1.1-2.5x a single step).
"""

from __future__ import annotations

import numpy as np

DEFAULT_SLOPE = 0.15  # extra cost per extra position, relative to s = 1, before anything is measured


class VerifyCostModel:
    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay  # weight of the old mean in the running mean
        self._mean: dict[int, float] = {}  # window size -> seconds

    def record(self, s: int, seconds: float) -> None:
        old = self._mean.get(s)
        self._mean[s] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds

    def estimate(self, s: int) -> float:
        """Seconds of one verify pass over ``s`` positions; 0.0 when nothing has been measured yet."""
        if s in self._mean:
            return self._mean[s]
        if not self._mean:
            return 0.0
        sizes = np.array(sorted(self._mean), np.float64)
        times = np.array([self._mean[int(k)] for k in sizes])
        if len(sizes) == 1:
            return float(times[0] * (1 + DEFAULT_SLOPE * (s - 1)) / (1 + DEFAULT_SLOPE * (sizes[0] - 1)))
        slope, intercept = np.polyfit(sizes, times, 1)
        return float(max(intercept + slope * s, times.min()))
