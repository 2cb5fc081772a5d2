"""Measured cost of a verify pass by window size, for drafters that size drafts from it.

The engine records the wall time of every decode-phase forward pass under its window size s
(root + draft nodes). ``estimate(s)`` answers with the running mean at s when measured, else a
straight line fitted through the measured sizes (or through the one measured size, scaled by
``DEFAULT_SLOPE``: on CPU one verify pass over 4-8 positions cost 1.1-2.5x a single step).

The line is fitted once per ``record``, not per ``estimate``: the back-off and ``asd_verify`` ask
for every window size they weigh, up to 2 x budget times a step, and ``numpy.polyfit`` took ~80 us a
call (0.5-1.3 ms a step at budget 8 on a 2-core machine, against a ~15 ms int4 step).
"""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_SLOPE = 0.15  # extra cost per extra position, relative to s = 1, before anything is measured


def default_cost_ratio(s: Any) -> Any:
    """c(s) / c(1) before anything is measured (and under seeded sampling, which decides from counts):
    1 + DEFAULT_SLOPE (s - 1), for a window size or an array of them."""
    return 1.0 + DEFAULT_SLOPE * (s - 1)


class VerifyCostModel:
    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay  # weight of the old mean in the running mean
        self._mean: dict[int, float] = {}  # window size -> seconds
        self._line: tuple[float, float, float] | None = None  # (intercept, slope, floor) of the means; None: refit

    def record(self, s: int, seconds: float) -> None:
        old = self._mean.get(s)
        self._mean[s] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds
        self._line = None

    def estimate(self, s: int) -> float:
        """Seconds of one verify pass over ``s`` positions; 0.0 when nothing has been measured yet."""
        if s in self._mean:
            return self._mean[s]
        if not self._mean:
            return 0.0
        if self._line is None:
            self._line = self._fit()
        intercept, slope, floor = self._line
        return max(intercept + slope * s, floor)

    def _fit(self) -> tuple[float, float, float]:
        """(intercept, slope, floor): the least-squares line through the running means by size,
        never below the cheapest measured pass; with one measured size, the line through it with
        ``DEFAULT_SLOPE`` (relative to s = 1), floored at 0."""
        sizes = np.array(sorted(self._mean), np.float64)  # [m]
        times = np.array([self._mean[int(k)] for k in sizes])  # [m] seconds
        floor = float(times.min())
        if len(sizes) == 1:
            slope = float(times[0] * DEFAULT_SLOPE / (1 + DEFAULT_SLOPE * (sizes[0] - 1)))
            return float(times[0] - slope * sizes[0]), slope, 0.0
        dx = sizes - sizes.mean()
        slope = float(dx @ (times - times.mean()) / (dx @ dx))
        return float(times.mean() - slope * sizes.mean()), slope, floor
