"""Measured cost of a verify pass by window size and cached length, for drafters that size drafts from it.

The engine records the wall time of every decode-phase forward pass under its window size s
(root + draft nodes) and the positions cached before it (``past``) into running means per size
(the first passes averaged, then exponential), of the seconds and of ``past`` alike.
``estimate(s, past)`` answers from those means made non-decreasing in s (isotonic regression,
each mean weighted by its passes): a window never costs less than a smaller one, so a mean above a
bigger window's is noise and is pooled with it. Sizes not measured get a straight line fitted
through the measured ones (or through the one measured size, scaled by ``DEFAULT_SLOPE``: on CPU
one verify pass over 4-8 positions cost 1.1-2.5x a single step), held between the nearest measured
sizes.

Attention reads every cached position once per window row, so a pass costs more after a long
context, and a window's extra rows cost more there than after a short one (the 0.5B int4 decoder
on a 2-core AVX2 machine: 1.1 ms an extra row of a 4-row window after 200 positions, 2.2 ms after
1,000; ``scripts/window_cost.py --past``). A size's mean holds at the cached length its passes
had; an estimate for another length shifts it by ``(first + further * (s - 1)) * (past - its
mean past)``, the attention slopes (seconds per cached position of a window's first row and of
each further row) fitted by least squares over every pass's deviation from its size's means, with
a slow exponential forgetting. So a request after a long document does not price its windows at
the short chats before it, and the other way round. Without ``past`` (None) an estimate is the
size's mean as it stands.

The curve is fitted once per ``record`` and cached length, not per ``estimate``: the back-off
and ``asd_verify`` ask for every window size they weigh, up to 2 x budget times a step, and
``numpy.polyfit`` took ~80 us a call (0.5-1.3 ms a step at budget 8 on a 2-core machine, against
a ~15 ms int4 step).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_SLOPE = 0.15  # extra cost per extra position, relative to s = 1, before anything is measured
SLOPE_DECAY = 0.995  # the attention slopes' forgetting per pass: they weigh the last ~200 passes
# a shift for another cached length leaves at least this share of a size's mean (slopes fitted on
# noisy passes must not make a window nearly free)
MIN_SHIFTED_SHARE = 0.25


def default_cost_ratio(s: Any) -> Any:
    """c(s) / c(1) before anything is measured (and under seeded sampling, which decides from counts):
    1 + DEFAULT_SLOPE (s - 1), for a window size or an array of them."""
    return 1.0 + DEFAULT_SLOPE * (s - 1)


class CostCurve(Protocol):
    """What the back-off reads: seconds of one verify pass over ``s`` positions (0.0: not measured)."""

    def estimate(self, s: int) -> float: ...


class VerifyCostModel:
    def __init__(self, decay: float = 0.9, slope_decay: float = SLOPE_DECAY):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if not 0.0 <= slope_decay < 1.0:
            raise ValueError(f"slope_decay must be in [0, 1), got {slope_decay}")
        self.decay = decay  # weight of the old mean in the running mean
        self.slope_decay = slope_decay  # weight of the old moments in the attention slopes' fit
        self._mean: dict[int, float] = {}  # window size -> seconds
        self._past: dict[int, float] = {}  # window size -> cached positions, mean over the same passes
        self._count: dict[int, int] = {}  # window size -> passes recorded
        # decayed sums over passes of the deviations from their size's means: with dp = past - mean
        # past, dq = (s - 1) dp and dt = seconds - mean seconds, [dp dp, dp dq, dq dq, dp dt, dq dt]
        self._moments = [0.0] * 5
        self._fit: _Fit | None = None  # of the means as they stand, at ``_fit_past``; None: refit
        self._fit_past: int | None = None

    def record(self, s: int, seconds: float, past: int = 0) -> None:
        """Enter one pass over ``s`` positions after ``past`` cached ones: the first 1 / (1 - decay)
        passes at a size are averaged (a slow first pass weighs no more than the next ones), later
        ones enter an exponential mean."""
        mean_past = self._past.get(s)
        if mean_past is not None:  # its deviation from the size's means, before they move
            dp = past - mean_past
            dq, dt = (s - 1) * dp, seconds - self._mean[s]
            keep = self.slope_decay
            self._moments = [keep * m + x for m, x in zip(self._moments, (dp * dp, dp * dq, dq * dq, dp * dt, dq * dt),
                                                          strict=True)]
        count = self._count.get(s, 0) + 1
        weight = max(1.0 - self.decay, 1.0 / count)  # of the new pass
        self._mean[s] = (1.0 - weight) * self._mean.get(s, 0.0) + weight * seconds
        self._past[s] = (1.0 - weight) * (mean_past or 0.0) + weight * past
        self._count[s] = count
        self._fit = None

    def attention_slopes(self) -> tuple[float, float]:
        """(first, further): seconds per cached position of a window's first row and of each
        further row, least squares over the recorded deviations, never negative. Passes of one
        window size only: every row alike. No spread in cached length yet: (0, 0)."""
        pp, pq, qq, pt, qt = self._moments
        if pp <= 0.0:
            return 0.0, 0.0
        det = pp * qq - pq * pq
        if qq > 0.0 and det > 1e-6 * pp * qq:  # the two slopes are told apart by passes of several sizes
            first, further = (pt * qq - qt * pq) / det, (qt * pp - pt * pq) / det
        else:
            first = further = (pt + qt) / (pp + 2 * pq + qq)  # one slope for every row: dt ~ slope (dp + dq)
        return max(first, 0.0), max(further, 0.0)

    def estimate(self, s: int, past: int | None = None) -> float:
        """Seconds of one verify pass over ``s`` positions after ``past`` cached ones (None: at the
        cached lengths measured); 0.0 when nothing has been measured yet."""
        if not self._mean:
            return 0.0
        if self._fit is None or self._fit_past != past:
            self._fit, self._fit_past = self._refit(past), past
        return self._fit.at(s)

    def _refit(self, past: int | None) -> _Fit:
        sizes = sorted(self._mean)
        cap = 1.0 / (1.0 - self.decay)  # a running mean weighs about this many recent passes
        weights = [min(float(self._count[k]), cap) for k in sizes]
        means = [self._mean[k] for k in sizes]
        if past is not None:
            first, further = self.attention_slopes()
            means = [max(m + (first + further * (k - 1)) * (past - self._past[k]), MIN_SHIFTED_SHARE * m)
                     for k, m in zip(sizes, means, strict=True)]
        return _Fit.of(sizes, nondecreasing(means, weights))


class AtContext:
    """One request's view of a shared :class:`VerifyCostModel`: every estimate at ``past``, the
    cached length of the request, which its loop sets before each step (the back-off and the
    drafters ask for a bare ``estimate(s)``). It holds a number, not the request's cache: a view
    kept with a method's estimate for the next request keeps no KV cache alive."""

    def __init__(self, model: VerifyCostModel, past: int = 0):
        self.model = model
        self.past = past

    def estimate(self, s: int) -> float:
        return self.model.estimate(s, self.past)


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
