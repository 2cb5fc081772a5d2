"""The most any drafter that copies from the request's own text can get out of a verify-cost
curve: an oracle bound on a recorded plain answer.

A copy drafter (prompt lookup, PLD+, suffix decoding's per-request tree, SAM over the context)
proposes tokens that occur in the context: the prompt and the answer so far. At answer position
i the longest it can get right is

    L_i = max { l : answer[i : i + l] occurs in prompt + answer[:i] }

A step that verifies j drafted tokens (a window of 1 + j positions, cost c(1 + j) single steps)
emits j + 1 tokens at most, with j <= L_i. The oracle knows every L_i and picks each step's j to
minimise the summed cost of the whole answer (a shortest path over positions):

    best[n] = 0,   best[i] = min over 0 <= j <= min(L_i, max_draft, n - 1 - i) of c(1 + j) + best[i + 1 + j]

Anchored (``anchor`` m >= 1), the oracle may copy only what follows an earlier occurrence of the
context's last m tokens: the ceiling of a suffix-matching drafter (prompt lookup with m-grams, a
suffix tree) that always ranks the right occurrence first, however many there are.

The answer's first token comes from the prefill, so the decode tokens are n - 1 and their plain
cost is n - 1 single steps; the bound is (n - 1) / best[1]. Drafting and bookkeeping are free here,
so no real copy drafter reaches it; drafters that do not copy from the context (token recycling,
lookahead, a datastore, a draft model) are not bound by it.

No command line of its own: scripts/project_speedup.py prints these ceilings per Spec-Bench task
under the same cost curve as its projections.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def copy_lengths(prompt_ids: np.ndarray, output_ids: np.ndarray, anchor: int = 0) -> np.ndarray:
    """[n] L_i: the longest prefix of output_ids[i:] that can be copied from prompt_ids + output_ids[:i].

    anchor 0: from anywhere in that context; anchor m >= 1: only from right after an earlier
    occurrence of the context's last m tokens (what a drafter matching an m-token suffix can find;
    0 where the context is shorter than m + 1)."""
    if anchor < 0:
        raise ValueError(f"anchor must be >= 0, got {anchor}")
    text = np.concatenate([np.asarray(prompt_ids, np.int64), np.asarray(output_ids, np.int64)])
    t, n = len(prompt_ids), len(output_ids)
    lengths = np.zeros(n, np.int64)
    for i in range(n):
        end = t + i  # the context is text[:end]; the copy starts at a context position c < end
        if anchor == 0:
            starts = np.flatnonzero(text[:end] == text[end])
        elif end > anchor:
            suffix = text[end - anchor : end]
            first = np.flatnonzero(text[: end - anchor] == suffix[0])  # occurrences ending before the suffix
            starts = [s + anchor for s in first if np.array_equal(text[s : s + anchor], suffix)]
        else:
            starts = []
        best = 0
        for c in starts:
            limit = min(end - c, len(text) - end)  # inside the context, and no further than the answer
            m = 0
            while m < limit and text[c + m] == text[end + m]:
                m += 1
            best = max(best, m)
        lengths[i] = best
    return lengths


def copy_ceiling(
    prompt_ids: np.ndarray, output_ids: np.ndarray, cost_ratio: Callable[[int], float], max_draft: int,
    anchor: int = 0,
) -> tuple[int, float]:
    """(decode tokens, least summed cost in single steps) of the oracle copy drafter on one recorded
    answer; ``cost_ratio(s)``: a window of s positions over a single step; ``max_draft``: drafted
    tokens per step at most (the draft budget); ``anchor``: as in :func:`copy_lengths`."""
    if max_draft < 0:
        raise ValueError(f"max_draft must be >= 0, got {max_draft}")
    n = len(output_ids)
    if n < 2:
        return 0, 0.0
    lengths = copy_lengths(prompt_ids, output_ids, anchor)
    ratios = [cost_ratio(1 + j) for j in range(max_draft + 1)]
    best = np.zeros(n + 1)
    for i in range(n - 1, 0, -1):
        top = min(int(lengths[i]), max_draft, n - 1 - i)
        best[i] = min(ratios[j] + best[i + 1 + j] for j in range(top + 1))
    return n - 1, float(best[1])
