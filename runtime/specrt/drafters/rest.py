"""``rest``: retrieval-based speculative decoding (He et al., 2023, "REST").

The longest suffix of the context (``max_suffix`` down to ``min_suffix`` tokens) that occurs in the
static datastore is found by binary search on its suffix array. The continuations of up to
``max_occurrences`` of its occurrences (evenly spaced over its suffix-array rows, which are in
lexicographic order of what follows) are merged into a trie whose nodes count the continuations
through them. Tree mode drafts the ``budget`` most frequent trie nodes (a node is never more
frequent than its parent, so they form a tree); chain mode follows the most frequent child from
the root. No match of ``min_suffix`` tokens: nothing to propose.
"""

from __future__ import annotations

import numpy as np

from specrt.drafters.base import Drafter, DrafterEnv, Feedback, datastore_for
from specrt.drafters.indexes.datastore import Datastore
from specrt.tree import DraftTree


def frequency_tree(paths: list[np.ndarray], budget: int, tree: bool) -> DraftTree:
    """Merge ``paths`` into a trie counting the paths through each node; draft the ``budget`` most
    frequent nodes (ties: shallower, then first seen) in tree mode, or the chain of most frequent
    children (ties: first seen) otherwise."""
    if budget < 1 or not paths:
        return DraftTree.empty()
    tokens: list[int] = []  # [nodes] trie node -> token
    parents: list[int] = []  # [nodes] trie node -> parent node, -1 = root
    depth: list[int] = []  # [nodes]
    count: list[int] = []  # [nodes] paths through the node
    children: dict[int, dict[int, int]] = {-1: {}}  # node -> token -> child, in insertion order
    for path in paths:
        node = -1
        for token in path.tolist():
            child = children[node].get(token)
            if child is None:
                child = children[node][token] = len(tokens)
                children[child] = {}
                tokens.append(token)
                parents.append(node)
                depth.append(depth[node] + 1 if node >= 0 else 1)
                count.append(0)
            count[child] += 1
            node = child
    if not tree:
        chain: list[int] = []
        node = -1
        while len(chain) < budget and children[node]:
            node = max(children[node].values(), key=lambda i: (count[i], -i))
            chain.append(tokens[node])
        return DraftTree.chain(chain)
    # a parent has count >= and depth < each child's: it always comes first
    chosen = sorted(range(len(tokens)), key=lambda i: (-count[i], depth[i], i))[:budget]
    chosen.sort(key=lambda i: (depth[i], -count[i], i))  # breadth first, most frequent first
    renumber = {-1: -1} | {old: new for new, old in enumerate(chosen)}
    return DraftTree(
        np.array([tokens[i] for i in chosen], np.int64), np.array([renumber[parents[i]] for i in chosen], np.int64)
    )


class Rest:
    def __init__(
        self,
        datastore: Datastore,
        tree: bool = False,
        max_suffix: int = 16,
        min_suffix: int = 2,
        max_occurrences: int = 64,
    ):
        if not 1 <= min_suffix <= max_suffix:
            raise ValueError(f"rest: need 1 <= min_suffix <= max_suffix, got {min_suffix}, {max_suffix}")
        if max_occurrences < 1:
            raise ValueError(f"rest: max_occurrences must be >= 1, got {max_occurrences}")
        self.datastore = datastore
        self.tree = tree
        self.max_suffix = max_suffix
        self.min_suffix = min_suffix
        self.max_occurrences = max_occurrences

    def retrieve(self, context: np.ndarray, length: int) -> list[np.ndarray]:
        """Continuations (up to ``length`` tokens each, non-empty) of the occurrences of the
        context's longest matching suffix, in suffix-array order."""
        m, lo, hi = self.datastore.longest_suffix_match(context, self.max_suffix, self.min_suffix)
        if m == 0:
            return []
        k = min(hi - lo, self.max_occurrences)
        rows = lo + (np.arange(k) * (hi - lo)) // k  # [k] evenly spaced over the matching rows
        found = []
        for start in self.datastore.suffix_array[rows].tolist():
            cont = self.datastore.continuation(start + m, length)
            if len(cont):
                found.append(cont)
        return found

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        if budget < 1:
            return DraftTree.empty()
        return frequency_tree(self.retrieve(context, budget), budget, self.tree)

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        pass

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        pass


def make(env: DrafterEnv) -> Drafter:
    return Rest(datastore_for(env, "rest"), tree=env.tree)
