"""``pld``: prompt lookup decoding (Saxena, 2023).

The longest suffix of the context (``max_ngram`` down to ``min_ngram`` tokens) that occurred
earlier in the context is looked up, and the tokens that followed that earlier occurrence are the
draft. The context is the whole sequence so far: prompt and generation. Among several earlier
occurrences the most recent comes first. Chain mode drafts from that one; tree mode merges the
continuations of up to ``max_branches`` distinct occurrences (longest n-gram first, then most
recent) into one trie, so shared prefixes cost one node; each branch is at most half the budget
deep, so the best match leaves room for the others.
"""

from __future__ import annotations

import numpy as np

from specrt.drafters.base import DrafterEnv, Feedback
from specrt.tree import DraftTree


def ngram_matches(context: np.ndarray, n: int) -> np.ndarray:
    """Start indices i (most recent first) with context[i:i+n] == context[-n:], i + n < len(context)."""
    t = len(context)
    if n < 1 or t <= n:
        return np.zeros(0, np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)  # [t - n, n]
    hits = np.flatnonzero((windows == context[-n:]).all(axis=1))
    return hits[::-1].astype(np.int64)


def continuations(context: np.ndarray, max_ngram: int, min_ngram: int, length: int, limit: int) -> list[np.ndarray]:
    """Up to ``limit`` distinct continuations of ``length`` tokens at most, best first: longer
    n-gram, then more recent occurrence."""
    seen: set[tuple[int, ...]] = set()
    found: list[np.ndarray] = []
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        if add_distinct(found, seen, context, ngram_matches(context, n) + n, length, limit):
            break
    return found


def add_distinct(
    found: list[np.ndarray],
    seen: set[tuple[int, ...]],
    context: np.ndarray,
    starts: np.ndarray,  # [m] start index of each continuation, in order of preference
    length: int,
    limit: int,
) -> bool:
    """Append ``context[s : s + length]`` for each start s (in order) unless empty or already seen;
    True once ``found`` holds ``limit`` continuations."""
    for start in starts:
        cont = context[start : start + length]
        key = tuple(cont.tolist())
        if len(cont) and key not in seen:
            seen.add(key)
            found.append(cont)
            if len(found) == limit:
                return True
    return False


def build_trie(paths: list[np.ndarray], budget: int) -> DraftTree:
    """Merge token paths into one tree (shared prefixes become shared nodes), ``budget`` nodes at most."""
    token_ids: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for path in paths:
        node = -1
        for token in path.tolist():
            child = index.get((node, token))
            if child is None:
                if len(token_ids) == budget:
                    break
                child = len(token_ids)
                index[(node, token)] = child
                token_ids.append(token)
                parents.append(node)
            node = child
        if len(token_ids) == budget:
            break
    return DraftTree(np.array(token_ids, np.int64), np.array(parents, np.int64))


class PromptLookup:
    def __init__(self, tree: bool = False, max_ngram: int = 3, min_ngram: int = 1, max_branches: int = 4):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"pld: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_branches < 1:
            raise ValueError(f"pld: max_branches must be >= 1, got {max_branches}")
        self.tree = tree
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_branches = max_branches if self.tree else 1

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        if budget < 1:
            return DraftTree.empty()
        depth = max(1, (budget + 1) // 2) if self.tree else budget
        found = continuations(context, self.max_ngram, self.min_ngram, depth, self.max_branches)
        return build_trie(found, budget)

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        pass

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        pass


def make(env: DrafterEnv) -> PromptLookup:
    return PromptLookup(tree=env.tree)
