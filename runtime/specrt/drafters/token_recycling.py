"""``token_recycling``: Token Recycling (Luo et al., 2024).

Every verify pass computes logits for every window slot; their runners-up are usually thrown
away. Token Recycling keeps them in an *adjacency matrix*: token -> its ``top_k`` next-token
candidates, best first, as last seen in the verifier's logits. After each step, for every window
slot, the top-k of that slot's logits replace the row of that slot's input token (root and every
drafted node, accepted or not). Here the matrix is a dict of the rows seen so far (``[top_k]``
int64 each), never a vocab-sized table.

Drafting expands the matrix breadth-first from the last context token along a *static tree*: the
tree template is a list of rank paths (``(0, 1)`` = the 2nd candidate of the root's 1st
candidate), parents before children. A node whose parent token has no row yet is dropped with
its subtree. The default template is the ``budget`` paths with the highest product of
``rank_probs`` (an estimate of how often the target takes a row's i-th candidate), which makes
an imbalanced tree like the paper's: deep along the top-1 chain, wide near the root::

    rank_probs = (0.5, 0.15, 0.08, ...), budget 8:
    root ─ [0] ─ [0,0] ─ [0,0,0] ─ [0,0,0,0]
       │     └─ [0,1]
       ├ [1] ─ [1,0]
       └ [2]

Chain mode follows the top-1 candidate (the template's ``(0,)``, ``(0, 0)``, ... spine).
The matrix may outlive the request (the paper's hot start): ``make`` keeps it in
``env.state["token_recycling"]``, so later requests on the same model start with it.
"""

from __future__ import annotations

import heapq

import numpy as np

from specrt.drafters.base import DrafterEnv, Feedback
from specrt.drafters.indexes.topk import top_k
from specrt.tree import DraftTree

DEFAULT_RANK_PROBS = (0.5, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02)  # per candidate rank, k = 8 as in the paper


def tree_template(size: int, rank_probs: tuple[float, ...]) -> list[tuple[int, ...]]:
    """The ``size`` rank paths with the highest product of ``rank_probs``, in that order.

    Best-first enumeration: popping a path pushes its first child and its next sibling, both no
    more likely than it, so each path comes after its parent. Ties go to the smaller path.
    """
    heap: list[tuple[float, tuple[int, ...]]] = [(-rank_probs[0], (0,))]
    out: list[tuple[int, ...]] = []
    while heap and len(out) < size:
        neg, path = heapq.heappop(heap)
        out.append(path)
        heapq.heappush(heap, (neg * rank_probs[0], (*path, 0)))
        if path[-1] + 1 < len(rank_probs):
            heapq.heappush(heap, (neg / rank_probs[path[-1]] * rank_probs[path[-1] + 1], (*path[:-1], path[-1] + 1)))
    return out


class TokenRecycling:
    """Token Recycling: draft from the verifier's recycled top-k candidates.

    tree: expand the static tree template (True) or follow the top-1 candidate (False).
    top_k: candidates kept per token (default 8).
    rank_probs: per-rank weights that shape the default template (default DEFAULT_RANK_PROBS;
        non-increasing, in (0, 1); the first ``top_k`` are used).
    template: a fixed tree template (rank paths, parents first) instead of the rank_probs one;
        ``budget`` cuts it to its first ``budget`` paths.
    table: the adjacency rows to start from and update (default: a new empty dict).
    """

    def __init__(
        self,
        tree: bool = False,
        top_k: int = 8,
        rank_probs: tuple[float, ...] = DEFAULT_RANK_PROBS,
        template: list[tuple[int, ...]] | None = None,
        table: dict[int, np.ndarray] | None = None,
    ):
        if top_k < 1:
            raise ValueError(f"token_recycling: top_k must be >= 1, got {top_k}")
        probs = tuple(float(p) for p in rank_probs[:top_k])
        increasing = any(probs[i] < probs[i + 1] for i in range(len(probs) - 1))
        if not probs or increasing or any(not 0.0 < p < 1.0 for p in probs):
            raise ValueError(f"token_recycling: rank_probs must be non-increasing values in (0, 1), got {rank_probs}")
        if template is not None:
            seen: set[tuple[int, ...]] = set()
            for path in template:
                path = tuple(path)
                if not path or path in seen or (len(path) > 1 and path[:-1] not in seen):
                    raise ValueError(f"token_recycling: template path {path} repeats or comes before its parent")
                if any(not 0 <= r < top_k for r in path):
                    raise ValueError(f"token_recycling: template path {path} has a rank outside [0, {top_k})")
                seen.add(path)
        self.tree = tree
        self.top_k = top_k
        self.rank_probs = probs
        self.template = [tuple(p) for p in template] if template is not None else None
        self.table: dict[int, np.ndarray] = {} if table is None else table  # token -> [<= top_k] int64
        self._templates: dict[int, list[tuple[int, ...]]] = {}  # budget -> template
        self._root: int | None = None  # the next window's slot 0: the context's last token

    def shape(self, budget: int) -> list[tuple[int, ...]]:
        """The static tree template for ``budget`` nodes."""
        if self.template is not None:
            return self.template[:budget]
        if budget not in self._templates:
            self._templates[budget] = tree_template(budget, self.rank_probs)
        return self._templates[budget]

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        pass

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        if len(context) == 0:
            return DraftTree.empty()
        self._root = root = int(context[-1])
        if budget < 1:
            return DraftTree.empty()
        if not self.tree:
            ids, token = [], root
            while len(ids) < budget and (row := self.table.get(token)) is not None:
                token = int(row[0])
                ids.append(token)
            return DraftTree.chain(ids)
        token_ids: list[int] = []
        parents: list[int] = []
        node_of: dict[tuple[int, ...], int] = {(): -1}  # rank path -> node (-1 = root)
        for path in self.shape(budget):
            parent = node_of.get(path[:-1])
            if parent is None:  # the parent was dropped
                continue
            row = self.table.get(root if parent < 0 else token_ids[parent])
            if row is None or path[-1] >= len(row):
                continue
            node_of[path] = len(token_ids)
            token_ids.append(int(row[path[-1]]))
            parents.append(parent)
        return DraftTree(np.array(token_ids, np.int64), np.array(parents, np.int64))

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        # the window's root is the token before ``emitted``: known from the last propose, or from
        # the last observe when the engine skipped propose (no budget)
        root, self._root = self._root, (int(emitted[-1]) if len(emitted) else None)
        if root is None:
            return
        logits = feedback.logits  # [n + 1, vocab]
        top = top_k(logits, min(self.top_k, logits.shape[-1]))  # [n + 1, k], best first
        for slot, token in enumerate([root, *feedback.tree.token_ids.tolist()]):
            self.table[int(token)] = top[slot]


def make(env: DrafterEnv) -> TokenRecycling:
    table = env.state.setdefault("token_recycling", {})
    return TokenRecycling(tree=env.tree, table=table)
