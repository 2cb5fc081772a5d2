"""``lookahead``: the n-gram pool of Lookahead decoding (Fu et al., 2024), without the Jacobi branch.

The *n-gram pool* maps a key token to at most ``pool_size`` (G in the paper) continuations of up
to ``ngram - 1`` tokens (N - 1) that followed it. The *verification branch* looks up the last
context token and drafts the pool's continuations for it. The pool is filled from:

* the context (prompt and generation): every position ``i`` adds ``c[i] -> c[i+1 : i+N]``; the
  last ``N - 2`` positions add what follows them so far and are completed as tokens arrive;
* the verifier (in place of the lookahead branch's Jacobi trajectories): at every window slot
  the target's argmax is the token that follows the slot's input, so each slot gives a verified
  2-gram ``input -> argmax``, extended while a drafted child agrees with the argmax::

        root:5 ─ n0:6 ─ n1:9      argmax per slot: root 6, n0 7, n1 3
                                  slot 0: 5 -> (6, 7)   (n0 = 6 agrees with the argmax 6)
                                  slot 1: 6 -> (7,)     slot 2: 9 -> (3,)

  Rejected nodes thus leave what the target would have said after them.

Within a key, a continuation that is a prefix of another one is dropped (the longer one is
refreshed instead) and the least recently refreshed is evicted first. Candidates rank longest
first, then most recently refreshed. Chain mode drafts the best candidate; tree mode merges the
candidates best first into a trie until the budget is spent. The pool belongs to the request.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from specrt.drafters.base import DrafterEnv, Feedback
from specrt.drafters.pld import build_trie
from specrt.tree import DraftTree


class LookaheadPool:
    """Lookahead decoding's n-gram pool as a drafter.

    tree: merge the key's candidates into a trie (True) or draft the best one (False).
    ngram: N, the pool's n-gram size; continuations have up to N - 1 tokens (default 5).
    pool_size: G, continuations kept per key token (default 8).
    learn_from_verifier: add the verifier's argmax n-grams of every window slot (default True).
    """

    def __init__(self, tree: bool = False, ngram: int = 5, pool_size: int = 8, learn_from_verifier: bool = True):
        if ngram < 2:
            raise ValueError(f"lookahead: ngram must be >= 2, got {ngram}")
        if pool_size < 1:
            raise ValueError(f"lookahead: pool_size must be >= 1, got {pool_size}")
        self.tree = tree
        self.ngram = ngram
        self.pool_size = pool_size
        self.learn_from_verifier = learn_from_verifier
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}  # key token -> continuations, LRU first
        self._indexed = 0  # context positions whose full continuation is in the pool
        self._root: int | None = None  # the next window's slot 0: the context's last token

    def add(self, key: int, gram: tuple[int, ...]) -> None:
        """Put ``key -> gram`` in the pool as the most recent entry of ``key``."""
        grams = self.pool.setdefault(key, OrderedDict())
        for old in list(grams):  # no entry is a prefix of another, so at most one of these holds
            if old[: len(gram)] == gram:  # already known (maybe as a longer one): refresh it
                grams.move_to_end(old)
                return
            if gram[: len(old)] == old:  # gram supersedes a shorter entry
                del grams[old]
        grams[gram] = None
        if len(grams) > self.pool_size:
            grams.popitem(last=False)

    def index(self, context: np.ndarray) -> None:
        """Add the context's n-grams not added yet (the context grows between calls)."""
        m, t = self.ngram - 1, len(context)
        start = min(self._indexed, max(t - 1, 0))
        tokens = context[start:].tolist()
        for i in range(start, t - 1):  # position i: c[i] -> c[i+1 : i+1+m] (shorter at the end)
            self.add(tokens[i - start], tuple(tokens[i - start + 1 : i - start + 1 + m]))
        self._indexed = max(self._indexed, t - m)

    def candidates(self, key: int) -> list[tuple[int, ...]]:
        """The key's continuations, longest first, then most recently refreshed."""
        grams = self.pool.get(key)
        return sorted(reversed(grams), key=len, reverse=True) if grams else []

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        self.index(prompt)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        if len(context) == 0:
            return DraftTree.empty()
        self.index(context)
        self._root = int(context[-1])
        if budget < 1:
            return DraftTree.empty()
        found = self.candidates(self._root)[: None if self.tree else 1]
        return build_trie([np.array(g, np.int64) for g in found], budget)

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        # the window's root is the token before ``emitted``: known from the last propose, or from
        # the last observe when the engine skipped propose (no budget)
        root, self._root = self._root, (int(emitted[-1]) if len(emitted) else None)
        if self.learn_from_verifier and root is not None:
            self.learn(root, feedback)

    def learn(self, root: int, feedback: Feedback) -> None:
        """Add the verifier's argmax n-grams of every window slot (``root`` = slot 0's input)."""
        tree = feedback.tree
        target = np.argmax(feedback.logits, axis=-1).tolist()  # [n + 1] argmax per window slot
        inputs = [root, *tree.token_ids.tolist()]  # [n + 1] input token per window slot
        children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        for i, (p, tok) in enumerate(zip(tree.parents.tolist(), tree.token_ids.tolist(), strict=True)):
            children.setdefault((p, tok), i)
        for slot in range(len(inputs)):
            gram, node = [target[slot]], slot - 1
            while len(gram) < self.ngram - 1:
                child = children.get((node, gram[-1]))
                if child is None:
                    break
                gram.append(target[child + 1])
                node = child
            self.add(inputs[slot], tuple(gram))


def make(env: DrafterEnv) -> LookaheadPool:
    return LookaheadPool(tree=env.tree)
