"""Measured cost of a verify pass by window size, for drafters that size drafts from it.

The engine records the wall time of every decode-phase forward pass under its window size s
(root + draft nodes) into a running mean per size (the first passes averaged, then exponential).
``estimate(s)`` answers from those means made non-decreasing in s (isotonic regression, each mean
weighted by its passes): a window never costs less than a smaller one, so a mean above a bigger
window's is noise and is pooled with it. Sizes not measured get a straight line fitted through the
measured ones (or through the one measured size, scaled by ``DEFAULT_SLOPE``: on CPU one verify pass
over 4-8 positions cost 1.1-2.5x a single step), held between the nearest measured sizes.

The curve is fitted once per ``record``, not per ``estimate``: the back-off and ``asd_verify`` ask
for every window size they weigh, up to 2 x budget times a step, and ``numpy.polyfit`` took ~80 us a
call (0.5-1.3 ms a step at budget 8 on a 2-core machine, against a ~15 ms int4 step).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

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
        self._count: dict[int, int] = {}  # window size -> passes recorded
        self._fit: _Fit | None = None  # of the means as they stand; None: refit at the next estimate

    def record(self, s: int, seconds: float) -> None:
        """Enter one pass: the first 1 / (1 - decay) passes at a size are averaged (a slow first pass
        weighs no more than the next ones), later ones enter an exponential mean."""
        count = self._count.get(s, 0) + 1
        weight = max(1.0 - self.decay, 1.0 / count)  # of the new pass
        self._mean[s] = (1.0 - weight) * self._mean.get(s, 0.0) + weight * seconds
        self._count[s] = count
        self._fit = None

    def estimate(self, s: int) -> float:
        """Seconds of one verify pass over ``s`` positions; 0.0 when nothing has been measured yet."""
        if not self._mean:
            return 0.0
        if self._fit is None:
            self._fit = self._refit()
        return self._fit.at(s)

    def _refit(self) -> _Fit:
        sizes = sorted(self._mean)
        cap = 1.0 / (1.0 - self.decay)  # a running mean weighs about this many recent passes
        weights = [min(float(self._count[k]), cap) for k in sizes]
        return _Fit.of(sizes, nondecreasing([self._mean[k] for k in sizes], weights))


def nondecreasing(values: list[float], weights: list[float]) -> list[float]:
    """The weighted least-squares non-decreasing fit of ``values`` (isotonic regression, pool adjacent
    violators): a run of values that decreases is replaced by its weighted mean."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(int(n))]


@dataclass(frozen=True)
class _Fit:
    """A cost curve from the measured sizes' means made non-decreasing (``fitted``): a bigger window
    does more work, so a size measured dearer than a bigger one is timing noise (a pass slowed by
    another process), which would otherwise keep that size from being chosen, and so re-measured,
    for the rest of the model's life. Unmeasured sizes: the least-squares line through the fitted
    points (one point: its line of ``DEFAULT_SLOPE``), held between the nearest measured sizes, and
    below the smallest at the cheapest pass (one point: at 0)."""

    sizes: tuple[int, ...]  # measured window sizes, ascending
    fitted: tuple[float, ...]  # [len(sizes)] seconds, non-decreasing
    intercept: float
    slope: float
    floor: float  # seconds: the least estimate below the smallest measured size

    @staticmethod
    def of(sizes: list[int], fitted: list[float]) -> _Fit:
        """sizes: [m] ascending; fitted: [m] seconds. Python floats, not numpy: m is a few dozen at
        most, and the fit runs once per verify pass (numpy's per-call overhead made it ~50 us)."""
        m = len(sizes)
        if m == 1:
            slope = fitted[0] * DEFAULT_SLOPE / (1 + DEFAULT_SLOPE * (sizes[0] - 1))
            mean_x, mean_y = float(sizes[0]), fitted[0]
        else:
            mean_x, mean_y = sum(sizes) / m, sum(fitted) / m
            dx = [x - mean_x for x in sizes]
            slope = sum(d * (y - mean_y) for d, y in zip(dx, fitted, strict=True)) / sum(d * d for d in dx)
        floor = fitted[0] if m > 1 else 0.0
        return _Fit(tuple(sizes), tuple(float(y) for y in fitted), float(mean_y - slope * mean_x), float(slope),
                    float(floor))

    def at(self, s: int) -> float:
        i = bisect.bisect_left(self.sizes, s)
        if i < len(self.sizes) and self.sizes[i] == s:
            return self.fitted[i]
        line = self.intercept + self.slope * s
        below = self.fitted[i - 1] if i > 0 else self.floor  # no cheaper than a smaller measured window
        above = self.fitted[i] if i < len(self.sizes) else float("inf")  # no dearer than a bigger one
        return min(max(line, below), above)
