"""``anpd``: Adaptive N-gram Parallel Decoding (Ou et al., 2024).

The *N-gram module* is the request's own context (prompt and generation), queried with the
*multi-level N-gram* (MLN) rule: the longest suffix n-gram that occurred earlier wins, from
``max_ngram`` down to the current level ``ngram``. Two knobs adapt to what the verifier accepts,
per request (the state lives in the instance):

    draft_len   full acceptance (the walk reached a leaf)  -> draft_len + 1   (up to max_draft)
                early rejection (nothing accepted)         -> draft_len // 2  (down to min_draft)
    ngram       full acceptance                            -> ngram - 1       (down to min_ngram)
                early rejection                            -> ngram + 1       (up to max_ngram)
                a step without a draft                     -> ngram - 1

so the draft grows while it keeps being accepted and the match requirement tightens while
drafts keep being rejected (short n-grams are the unreliable ones); a step with no match relaxes
it again. A partial acceptance changes nothing.

Chain mode drafts ``draft_len`` tokens from the best match. Tree mode merges up to
``max_branches`` continuations (longest n-gram first, then most recent), each at most
``min(draft_len, ceil(budget / 2))`` deep, into a trie; the adaptation is the same.
"""

from __future__ import annotations

import numpy as np

from specrt.drafters.base import DrafterEnv, Feedback
from specrt.drafters.pld import NgramIndex, build_trie, continuations
from specrt.tree import DraftTree


class AdaptiveNgram:
    """ANPD: n-gram lookup whose match level and draft length follow acceptance.

    tree: merge several continuations into a trie (True) or draft one chain (False).
    max_ngram, min_ngram: the MLN levels (default 4 down to 1); the current level starts at min_ngram.
    max_draft, min_draft, init_draft: bounds and start of the draft length (default 8, 1, 4).
    max_branches: continuations merged in tree mode (default 4; 1 in chain mode).
    """

    def __init__(
        self,
        tree: bool = False,
        max_ngram: int = 4,
        min_ngram: int = 1,
        max_draft: int = 8,
        min_draft: int = 1,
        init_draft: int = 4,
        max_branches: int = 4,
    ):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"anpd: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if not 1 <= min_draft <= init_draft <= max_draft:
            raise ValueError(
                f"anpd: need 1 <= min_draft <= init_draft <= max_draft, got {min_draft}, {init_draft}, {max_draft}"
            )
        if max_branches < 1:
            raise ValueError(f"anpd: max_branches must be >= 1, got {max_branches}")
        self.tree = tree
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.max_draft, self.min_draft = max_draft, min_draft
        self.max_branches = max_branches if tree else 1
        self.ngram = min_ngram  # current MLN level: the shortest n-gram allowed to match
        self.draft_len = init_draft  # current draft length (branch depth in tree mode)
        self.index = NgramIndex(min_ngram, max_ngram)  # the context's n-grams at every level

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        self.index = NgramIndex(self.min_ngram, self.max_ngram)
        self.index.sync(np.asarray(prompt, np.int64))

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        if budget < 1:
            return DraftTree.empty()
        depth = min(self.draft_len, max(1, (budget + 1) // 2) if self.tree else budget)
        found = continuations(context, self.max_ngram, self.ngram, depth, self.max_branches,
                              self.index.continuation_starts)
        return build_trie(found, budget)

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        tree, path = feedback.tree, feedback.path
        if len(tree) == 0:  # no match at the current level: relax it
            self.ngram = max(self.min_ngram, self.ngram - 1)
        elif len(path) == 0:  # early rejection
            self.draft_len = max(self.min_draft, self.draft_len // 2)
            self.ngram = min(self.max_ngram, self.ngram + 1)
        elif len(tree.children(int(path[-1]))) == 0:  # full acceptance: the walk reached a leaf
            self.draft_len = min(self.max_draft, self.draft_len + 1)
            self.ngram = max(self.min_ngram, self.ngram - 1)


def make(env: DrafterEnv) -> AdaptiveNgram:
    return AdaptiveNgram(tree=env.tree)
