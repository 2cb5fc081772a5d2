"""Token sequences ([t] int64 arrays), as the engine's prefix cache and a draft model's cache compare them."""

from __future__ import annotations

import numpy as np


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n
