"""``adapld``: PLD+ with a semantic fallback and branched trees.

The n-gram candidates are ``pld_plus``'s (longest suffix n-gram first, occurrences ranked by
hidden-state similarity). When they are fewer than wanted (chain mode: none at all), the
*semantic fallback* fills in: the earlier position whose hidden state is most similar to the
current one is taken as a match of unknown length, and what followed it is drafted.

Alignment (see ``pld_plus``): the store holds ``h[0] .. h[t-2]``, the query is ``h[t-2]``. A
position ``p`` with ``h[p]`` close to ``h[t-2]`` predicted a token in a context like the one that
predicted ``c[t-1]``; ``c[p+1]`` plays the part of ``c[t-1]``, so the draft is ``c[p+2 : ...]``::

    context   ... c[p]  c[p+1]  c[p+2] c[p+3] ...    c[t-2]  c[t-1] | draft
    hidden    ... h[p]                               h[t-2]
                  ^ most similar to the query        ^ query

Candidates ``p`` range over the ``semantic_window`` positions before ``t-2`` (``p <= t-3``, so
every draft has at least one token), most similar first, most recent among equals; positions
whose similarity is below ``min_similarity`` are not used.

Chain mode: the best n-gram continuation, else the best semantic one. Tree mode: up to
``max_branches`` continuations, n-gram ones first and semantic ones after, merged with
``build_trie`` (each branch at most half the budget deep).
"""

from __future__ import annotations

import numpy as np

from specrt.drafters.base import DrafterEnv
from specrt.drafters.pld_plus import PromptLookupPlus


class AdaptivePromptLookup(PromptLookupPlus):
    """PLD+ that falls back to the most similar hidden state when no n-gram matches.

    tree, max_ngram, min_ngram, max_branches, max_occurrences: as ``PromptLookupPlus`` (chain;
        3..1; 4 branches; 128 occurrences).
    semantic_window: how many earlier positions the fallback compares (default 1024: one
        [1024, hidden] @ [hidden] product per step at most).
    min_similarity: the least cosine similarity a fallback position needs (default 0.0).
    """

    name = "adapld"

    def __init__(
        self,
        tree: bool = False,
        max_ngram: int = 3,
        min_ngram: int = 1,
        max_branches: int = 4,
        max_occurrences: int = 128,
        semantic_window: int = 1024,
        min_similarity: float = 0.0,
    ):
        super().__init__(tree, max_ngram, min_ngram, max_branches, max_occurrences)
        if semantic_window < 1:
            raise ValueError(f"{self.name}: semantic_window must be >= 1, got {semantic_window}")
        if not -1.0 <= min_similarity <= 1.0:
            raise ValueError(f"{self.name}: min_similarity must lie in [-1, 1], got {min_similarity}")
        self.semantic_window = semantic_window
        self.min_similarity = min_similarity

    def semantic_candidates(
        self, context: np.ndarray, length: int, limit: int, seen: set[tuple[int, ...]]
    ) -> list[np.ndarray]:
        """Up to ``limit`` continuations ``c[p+2 : p+2+length]`` not in ``seen``, most similar ``h[p]`` first."""
        t = len(context)
        if limit < 1 or t < 3 or not self.aligned(context):
            return []
        assert self.store is not None
        rows = self.store.rows  # [t - 1, hidden]
        q = t - 2
        lo = max(0, q - self.semantic_window)
        sims = (rows[lo:q] @ rows[q])[::-1]  # [q - lo], positions q-1 down to lo: most recent first
        found: list[np.ndarray] = []
        for j in np.argsort(-sims, kind="stable"):
            if sims[j] < self.min_similarity:
                break
            p = q - 1 - int(j)
            cont = context[p + 2 : p + 2 + length]
            key = tuple(cont.tolist())
            if key not in seen:
                seen.add(key)
                found.append(cont)
                if len(found) == limit:
                    break
        return found

    def candidates(self, context: np.ndarray, length: int, limit: int) -> list[np.ndarray]:
        found = super().candidates(context, length, limit)
        seen = {tuple(c.tolist()) for c in found}
        return found + self.semantic_candidates(context, length, limit - len(found), seen)


def make(env: DrafterEnv) -> AdaptivePromptLookup:
    return AdaptivePromptLookup(tree=env.tree)
