"""Draft trees: what drafters propose and the verifier walks (specrt.backend.window flattens one
into the verify window a decoder runs).

A draft tree is two parallel arrays: ``token_ids[n]`` and ``parents[n]`` with ``-1`` for a child of
the root and ``parents[i] < i`` otherwise. A chain is the tree with ``parents = [-1, 0, 1, ...]``.
The root itself is not a node: it is the last emitted token, whose KV is not cached yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class DraftTree:
    token_ids: np.ndarray  # [n] int64
    parents: np.ndarray  # [n] int64, -1 = child of the root, parents[i] < i
    # [n, vocab] q of each node's token position (the distribution it was drawn from); None for
    # deterministic drafts. Siblings share their parent's row and are drawn without replacement
    # in node order (see specrt.engine.accept).
    draft_probs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.token_ids.ndim != 1 or self.parents.shape != self.token_ids.shape:
            raise ValueError(
                f"DraftTree: token_ids {self.token_ids.shape} and parents {self.parents.shape} "
                "must be 1-D arrays of the same length"
            )
        n = len(self.parents)
        # Python ints: drafters build a tree or two a step, of a few dozen nodes at most, where
        # numpy's two comparisons cost ~10 us
        if n and not all(-1 <= p < i for i, p in enumerate(self.parents.tolist())):
            raise ValueError(f"DraftTree: parents must satisfy -1 <= parents[i] < i, got {self.parents.tolist()}")
        if self.draft_probs is not None and (self.draft_probs.ndim != 2 or len(self.draft_probs) != n):
            raise ValueError(f"DraftTree: draft_probs {self.draft_probs.shape} must be [n, vocab] with n = {n}")

    @staticmethod
    def empty() -> DraftTree:
        return DraftTree(np.zeros(0, np.int64), np.zeros(0, np.int64))

    @staticmethod
    def chain(token_ids: np.ndarray | list[int]) -> DraftTree:
        ids = np.asarray(token_ids, dtype=np.int64)
        return DraftTree(ids, np.arange(len(ids), dtype=np.int64) - 1)

    def __len__(self) -> int:
        return len(self.token_ids)

    def depths(self) -> np.ndarray:  # [n] int64, 1 for children of the root; read-only
        """Each node's depth, computed once per tree: the engine, the back-off and ``auto`` ask
        for it several times a step."""
        depth = self.__dict__.get("_depths")
        if depth is None:
            levels: list[int] = []
            for p in self.parents.tolist():  # Python ints: a numpy scalar per node costs ~10x more
                levels.append(1 if p < 0 else levels[p] + 1)
            depth = np.array(levels, np.int64)
            depth.setflags(write=False)
            object.__setattr__(self, "_depths", depth)  # frozen: a cache, not a field
        return depth

    def is_chain(self) -> bool:
        return bool(np.array_equal(self.parents, np.arange(len(self)) - 1))

    def first(self, n: int) -> DraftTree:
        """Nodes 0..n-1 (a tree: parents precede children), indices unchanged."""
        probs = self.draft_probs[:n] if self.draft_probs is not None else None
        return DraftTree(self.token_ids[:n], self.parents[:n], probs)

    def truncated(self, depth: int) -> DraftTree:
        """The nodes at depth <= ``depth`` (node order kept, parents renumbered)."""
        depths = self.depths().tolist()
        kept = sum(d <= depth for d in depths)
        if kept == len(self):
            return self
        if all(d <= depth for d in depths[:kept]):  # a prefix of the node order (a chain's cut): indices unchanged
            return self.first(kept)
        keep = np.flatnonzero(self.depths() <= depth)
        renumber = np.full(len(self), -1, np.int64)
        renumber[keep] = np.arange(len(keep))
        parents = np.where(self.parents[keep] < 0, -1, renumber[self.parents[keep]])
        probs = self.draft_probs[keep] if self.draft_probs is not None else None
        return DraftTree(self.token_ids[keep], parents, probs)

    def children(self, node: int) -> np.ndarray:
        """Indices of the children of ``node`` (``-1`` = root), in node order."""
        return np.flatnonzero(self.parents == node)
