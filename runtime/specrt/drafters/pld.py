"""``pld``: prompt lookup decoding (Saxena, 2023).

The longest suffix of the context (``max_ngram`` down to ``min_ngram`` tokens) that occurred
earlier in the context is looked up, and the tokens that followed that earlier occurrence are the
draft. The context is the whole sequence so far: prompt and generation. Among several earlier
occurrences the most recent comes first. Chain mode drafts from that one; tree mode merges the
continuations of up to ``max_branches`` distinct occurrences (longest n-gram first, then most
recent) into one trie, so shared prefixes cost one node; each branch is at most half the budget
deep, so the best match leaves room for the others.

The occurrences come from an index of the context's n-grams (:class:`NgramIndex`) that grows with
the context, so a step looks up the suffix instead of scanning the whole sequence (a scan of
~1,500 tokens for n = 3, 2, 1 cost 0.2-0.3 ms a step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

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


def scanned_continuation_starts(context: np.ndarray, n: int) -> Iterable[int]:
    """Where the tokens after each earlier occurrence of the last n tokens start, most recent
    first (a scan of the whole context)."""
    return ngram_matches(context, n) + n


class NgramIndex:
    """The end positions of every n-gram (n in [lo, hi]) of a token sequence that grows at its end:
    ``continuation_starts(context, n)`` gives what :func:`scanned_continuation_starts` gives, from
    a dictionary lookup. Each call indexes the tokens ``context`` added since the last one; a
    context that does not extend the one indexed (a new request) is indexed afresh."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> ends e (context[e - n : e]), ascending
        self.indexed = np.zeros(0, np.int64)  # [k] the tokens indexed: every n-gram within them

    def sync(self, context: np.ndarray) -> None:
        """Index the n-grams of ``context[:-1]`` (an occurrence must be followed by a token)."""
        t, k = len(context), len(self.indexed)
        if k > t - 1 or not np.array_equal(context[:k], self.indexed):
            self.ends.clear()
            k = 0
        elif k == t - 1:
            return  # indexed already (a step looks up several n in the same context)
        base = max(0, k - self.hi)  # the new n-grams reach back hi - 1 tokens before position k
        tokens = context[base : t - 1].tolist()
        for end in range(k + 1, t):  # n-grams ending at `end` (exclusive), new since the last call
            for n in range(self.lo, min(self.hi, end) + 1):
                self.ends.setdefault(tuple(tokens[end - n - base : end - base]), []).append(end)
        self.indexed = np.array(context[: max(t - 1, 0)], np.int64)

    def continuation_starts(self, context: np.ndarray, n: int) -> Iterable[int]:
        self.sync(context)
        if n < 1 or len(context) <= n:
            return ()
        return reversed(self.ends.get(tuple(context[-n:].tolist()), ()))


def continuations(context: np.ndarray, max_ngram: int, min_ngram: int, length: int, limit: int,
                  starts: Callable[[np.ndarray, int], Iterable[int]] = scanned_continuation_starts) -> list[np.ndarray]:
    """Up to ``limit`` distinct continuations of ``length`` tokens at most, best first: longer
    n-gram, then more recent occurrence. ``starts(context, n)``: where the continuations of the
    last n tokens' earlier occurrences start, most recent first."""
    seen: set[tuple[int, ...]] = set()
    found: list[np.ndarray] = []
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        if add_distinct(found, seen, context, starts(context, n), length, limit):
            break
    return found


def add_distinct(
    found: list[np.ndarray],
    seen: set[tuple[int, ...]],
    context: np.ndarray,
    starts: Iterable[int],  # start index of each continuation, in order of preference
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
        self.index = NgramIndex(min_ngram, max_ngram)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        if budget < 1:
            return DraftTree.empty()
        depth = max(1, (budget + 1) // 2) if self.tree else budget
        found = continuations(context, self.max_ngram, self.min_ngram, depth, self.max_branches,
                              self.index.continuation_starts)
        return build_trie(found, budget)

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        # the prompt is indexed here, with the prefill, rather than in the first step's proposal
        self.index = NgramIndex(self.min_ngram, self.max_ngram)
        self.index.sync(np.asarray(prompt, np.int64))

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        pass


def make(env: DrafterEnv) -> PromptLookup:
    return PromptLookup(tree=env.tree)
