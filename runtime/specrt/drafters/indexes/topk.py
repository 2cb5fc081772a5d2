"""The k largest logits of each row, best first, without a full pass of ``argpartition``.

``numpy.argpartition`` over a 151,936-token vocabulary took ~220 us a row on a 2-core machine (plus
a negated copy of the row); a drafter that reads the top-k of every window slot each step
(``token_recycling``) spent ~1 ms a step on it. Here a row's first ``m * COLUMNS`` logits are read
as an ``[m, COLUMNS]`` matrix; the maximum of each column is one vectorised pass over contiguous
memory (~14 us a row), and only the columns whose maximum reaches T, the k-th largest column
maximum, are searched, together with the ``vocab mod COLUMNS`` ids left over:

    the k best columns each hold an element >= T, so the k-th largest value v_k >= T;
    every element x among the k largest has x >= v_k >= T, so its column is searched

Ties keep the smaller token id first, so the answer is one well-defined list, the same as a
stable sort of the whole row by descending logit would give.
"""

from __future__ import annotations

import numpy as np

COLUMNS = 1024  # groups a row is split into (ids j, j + COLUMNS, j + 2 * COLUMNS, ...)


def top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """[r, k] int64: the ids of each row's ``k`` largest values of ``logits`` ([r, v] float, v >= k
    >= 1), largest first; equal values in increasing id order."""
    rows, vocab = logits.shape
    if not 1 <= k <= vocab:
        raise ValueError(f"top_k: k must be in [1, {vocab}], got {k}")
    columns = min(COLUMNS, vocab)
    depth = vocab // columns  # m
    maxima = logits[:, : depth * columns].reshape(rows, depth, columns).max(axis=1)  # [r, columns]
    offsets = np.arange(depth)[:, None] * columns  # [m, 1]
    leftover = np.arange(depth * columns, vocab)  # [vocab mod columns], always searched
    kth = columns - min(k, columns)
    out = np.empty((rows, k), np.int64)
    for r in range(rows):
        threshold = np.partition(maxima[r], kth)[kth]  # T
        ids = np.concatenate([(offsets + np.flatnonzero(maxima[r] >= threshold)).ravel(), leftover])
        if len(ids) < k:  # NaN logits compare false: search the whole row (NaN sorts last)
            ids = np.arange(vocab)
        order = np.lexsort((ids, -logits[r][ids]))[:k]  # by value descending, then id
        out[r] = ids[order]
    return out
