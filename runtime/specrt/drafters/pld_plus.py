"""``pld_plus``: PLD+ (Somasundaram et al., 2024), prompt lookup reranked by hidden states.

Like ``pld``, the longest suffix n-gram of the context (``max_ngram`` down to ``min_ngram`` tokens)
is looked up among earlier positions. Where ``pld`` takes the most recent occurrence, PLD+ ranks
the occurrences of one n-gram by how alike the verifier's hidden states are: the occurrence whose
preceding position is most similar (cosine) to the current one comes first; ties (and occurrences
without a hidden state) keep ``pld``'s recency order. Longer n-grams still come before shorter.
Only the ``max_occurrences`` most recent occurrences of an n-gram are reranked (a bound on the
states gathered per step).

Alignment. ``h[j]`` is the final-norm hidden state of input position ``j`` (computed when
``c[j]`` was fed to the verifier; it predicts ``c[j + 1]``). When ``propose`` runs, the last
context token ``c[t-1]`` is the next root and has not been through the verifier, so the store
holds exactly ``h[0] .. h[t-2]`` (``len(store) == len(context) - 1``)::

    context   c[0] ... c[i] .. c[i+n-2]  c[i+n-1] | c[i+n] ...   c[t-n] .. c[t-2]  c[t-1]
    hidden    h[0] ... h[i] .. h[i+n-2]  h[i+n-1] | ...          ...       h[t-2]  (none yet)
                               ^ key of the occurrence at i                ^ query

The query is ``h[t-2]``, the state of the token before the last one (the most recent state
there is), and the occurrence of the suffix n-gram at ``i`` is scored by
``cos(h[i+n-2], h[t-2])``: both states sit one position before the n-gram's end and both
predicted the same token (the n-gram's last one), as in the paper. An occurrence with
``i + n - 2 < 0`` (a 1-gram at position 0) has no such state and ranks after the others.

Store updates: ``begin`` stores the prompt's states (positions ``0 .. t0-1``; the context of the
first ``propose`` is the prompt plus the prefill's token). ``observe(emitted [k], feedback)``
appends ``feedback.hidden_states[feedback.accepted_slots[:k]]``: the root (the previous
context's last token) and the first ``k - 1`` accepted nodes, which are the input positions of the
``k`` new tokens shifted by one, so the store again ends one short of the context.

Without aligned hidden states (no ``begin``, or a store of another length than
``len(context) - 1``) occurrences keep the recency order: the proposal is ``pld``'s.
Chain mode drafts from the best occurrence; tree mode merges up to ``max_branches`` distinct
continuations (longest n-gram first, then most similar) into a trie, each at most half the budget
deep, like ``pld``.
"""

from __future__ import annotations

import numpy as np

from specrt.drafters.base import DrafterEnv, Feedback
from specrt.drafters.pld import add_distinct, build_trie, continuations, ngram_matches
from specrt.tree import DraftTree


class HiddenStore:
    """Unit-norm hidden states aligned with the context: row ``j`` is ``h[j] / |h[j]|``.

    Rows are appended into a buffer that doubles when full, so ``extend`` is amortised O(k).
    """

    def __init__(self) -> None:
        self._buf = np.zeros((0, 0), np.float32)  # [capacity, hidden]
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def rows(self) -> np.ndarray:  # [n, hidden] float32, unit norm (zero rows stay zero)
        return self._buf[: self._n]

    def extend(self, hidden_states: np.ndarray) -> None:
        """Append ``hidden_states`` ([k, hidden])."""
        h = np.asarray(hidden_states, np.float32)
        if h.ndim != 2:
            raise ValueError(f"HiddenStore: hidden states must be [k, hidden], got shape {h.shape}")
        k, width = h.shape
        if self._n and width != self._buf.shape[1]:
            raise ValueError(f"HiddenStore: hidden size {width} differs from the stored {self._buf.shape[1]}")
        if self._n + k > len(self._buf) or width != self._buf.shape[1]:
            grown = np.zeros((max(64, 2 * (self._n + k)), width), np.float32)
            if self._n:
                grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        norms = np.linalg.norm(h, axis=1, keepdims=True)  # [k, 1]
        self._buf[self._n : self._n + k] = h / np.maximum(norms, 1e-12)
        self._n += k


class PromptLookupPlus:
    """PLD+: prompt lookup whose occurrences are ranked by hidden-state similarity.

    tree: merge several continuations into a trie (True) or draft one chain (False).
    max_ngram, min_ngram: suffix n-gram lengths looked up, longest first (default 3 down to 1).
    max_branches: continuations merged in tree mode (default 4; 1 in chain mode).
    max_occurrences: the most recent occurrences of one n-gram that are reranked (default 128,
        which bounds the rows gathered per step to 128 x hidden).
    """

    name = "pld_plus"

    def __init__(
        self, tree: bool = False, max_ngram: int = 3, min_ngram: int = 1, max_branches: int = 4,
        max_occurrences: int = 128,
    ):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"{self.name}: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_branches < 1:
            raise ValueError(f"{self.name}: max_branches must be >= 1, got {max_branches}")
        if max_occurrences < 1:
            raise ValueError(f"{self.name}: max_occurrences must be >= 1, got {max_occurrences}")
        self.tree = tree
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_branches = max_branches if tree else 1
        self.max_occurrences = max_occurrences
        self.store: HiddenStore | None = None

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        if hidden_states.ndim != 2 or len(hidden_states) != len(prompt):
            raise ValueError(
                f"{self.name}: begin needs one hidden state per prompt token: prompt has {len(prompt)} tokens, "
                f"hidden states have shape {hidden_states.shape}"
            )
        self.store = HiddenStore()
        self.store.extend(hidden_states)

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        if self.store is not None:
            # input positions of the new tokens, shifted by one: the root, then accepted nodes
            self.store.extend(feedback.hidden_states[feedback.accepted_slots[: len(emitted)]])

    def aligned(self, context: np.ndarray) -> bool:
        """Whether the store holds exactly ``h[0] .. h[t-2]`` for this context (t >= 2)."""
        return self.store is not None and len(context) >= 2 and len(self.store) == len(context) - 1

    def candidates(self, context: np.ndarray, length: int, limit: int) -> list[np.ndarray]:
        """Up to ``limit`` distinct continuations of ``length`` tokens at most, best first:
        longer n-gram, then more similar hidden state, then more recent occurrence."""
        if not self.aligned(context):
            return continuations(context, self.max_ngram, self.min_ngram, length, limit)
        assert self.store is not None
        rows = self.store.rows  # [t - 1, hidden]
        query = rows[len(context) - 2]  # [hidden] h[t-2]
        seen: set[tuple[int, ...]] = set()
        found: list[np.ndarray] = []
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            starts = ngram_matches(context, n)[: self.max_occurrences]  # [m], most recent first
            if not len(starts):
                continue
            keys = starts + n - 2  # [m] position before each occurrence's last token
            scores = np.full(len(starts), -np.inf, np.float32)  # [m]
            scores[keys >= 0] = rows[keys[keys >= 0]] @ query
            if add_distinct(found, seen, context, starts[np.argsort(-scores, kind="stable")] + n, length, limit):
                break
        return found

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        if budget < 1:
            return DraftTree.empty()
        depth = max(1, (budget + 1) // 2) if self.tree else budget
        return build_trie(self.candidates(context, depth, self.max_branches), budget)


def make(env: DrafterEnv) -> PromptLookupPlus:
    return PromptLookupPlus(tree=env.tree)
