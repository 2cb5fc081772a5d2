"""Draft trees and their flattening into one verify window.

A draft tree is two parallel arrays: ``token_ids[n]`` and ``parents[n]`` with ``-1`` for a child of
the root and ``parents[i] < i`` otherwise. A chain is the tree with ``parents = [-1, 0, 1, ...]``.
The root itself is not a node: it is the last emitted token, whose KV is not cached yet.

Flattened verify window (slot 0 is the root, slot ``i + 1`` is node ``i``)::

        root            slot 0, position past
       /    \\
     n0      n1         slots 1, 2, position past + 1
     |
     n2                 slot 3, position past + 2

Each slot attends to every cached position and to its own ancestors-or-self in the window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .contract import MASK_VALUE


@dataclass(frozen=True, eq=False)
class DraftTree:
    token_ids: np.ndarray  # [n] int64
    parents: np.ndarray  # [n] int64, -1 = child of the root, parents[i] < i
    # [n, vocab] q of each node's token position (the distribution it was drawn from); None for
    # deterministic drafts. Siblings share their parent's row and are drawn without replacement
    # in node order (see specrt.rejection).
    draft_probs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.token_ids.ndim != 1 or self.parents.shape != self.token_ids.shape:
            raise ValueError(
                f"DraftTree: token_ids {self.token_ids.shape} and parents {self.parents.shape} "
                "must be 1-D arrays of the same length"
            )
        n = len(self.parents)
        if n and (np.any(self.parents < -1) or np.any(self.parents >= np.arange(n))):
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

    def depths(self) -> np.ndarray:  # [n] int64, 1 for children of the root
        depth = np.zeros(len(self), np.int64)
        for i, p in enumerate(self.parents):
            depth[i] = 1 if p < 0 else depth[p] + 1
        return depth

    def is_chain(self) -> bool:
        return bool(np.array_equal(self.parents, np.arange(len(self)) - 1))

    def first(self, n: int) -> DraftTree:
        """Nodes 0..n-1 (a tree: parents precede children), indices unchanged."""
        probs = self.draft_probs[:n] if self.draft_probs is not None else None
        return DraftTree(self.token_ids[:n], self.parents[:n], probs)

    def truncated(self, depth: int) -> DraftTree:
        """The nodes at depth <= ``depth`` (node order kept, parents renumbered)."""
        keep = np.flatnonzero(self.depths() <= depth)
        if len(keep) == len(self):
            return self
        renumber = np.full(len(self), -1, np.int64)
        renumber[keep] = np.arange(len(keep))
        parents = np.where(self.parents[keep] < 0, -1, renumber[self.parents[keep]])
        probs = self.draft_probs[keep] if self.draft_probs is not None else None
        return DraftTree(self.token_ids[keep], parents, probs)

    def children(self, node: int) -> np.ndarray:
        """Indices of the children of ``node`` (``-1`` = root), in node order."""
        return np.flatnonzero(self.parents == node)


# The portable graph's attention (pipeline/grouped_attention.py) runs on onnxruntime's CPU SGEMM,
# which sums over the keys in blocks of 128 cache slots (fused multiply-adds inside a block, one
# rounding more where blocks meet). A chain window keeps every key at the slot a single step gives
# it; a branching tree moves a path's keys to other slots, so a row rounds like its single step
# only while the window's nodes share one block. SpecAttention graphs sum over each row's list of
# visible keys, wherever they sit, and need no block (DecoderSession.key_block is None for them).
KEY_BLOCK = 128


def fit_window(tree: DraftTree, past: int, key_block: int | None = KEY_BLOCK) -> DraftTree:
    """``tree`` as it may be verified after ``past`` cached slots (the root takes slot ``past``):
    a branching tree keeps its first nodes up to the end of the ``key_block`` of slot ``past + 1``
    (at most once per ``key_block`` positions a tree is cut); chains are never cut, and nothing is
    when ``key_block`` is None."""
    if not len(tree) or tree.is_chain() or key_block is None:
        return tree
    room = key_block - (past + 1) % key_block
    return tree if len(tree) <= room else tree.first(room)


@dataclass(frozen=True, eq=False)
class VerifyWindow:
    input_ids: np.ndarray  # [s] int64, s = n + 1; slot 0 is the root
    position_ids: np.ndarray  # [s] int64
    attention_bias: np.ndarray  # [s, past + s] float32


def ancestor_mask(parents: np.ndarray) -> np.ndarray:
    """[s, s] bool over window slots: ``m[q, k]`` is True when slot k is q itself or one of its ancestors."""
    s = len(parents) + 1
    mask = np.zeros((s, s), dtype=bool)
    mask[0, 0] = True
    for i, p in enumerate(parents):
        mask[i + 1] = mask[p + 1]  # parent slot (root = 0) holds the ancestors
        mask[i + 1, i + 1] = True
    return mask


def causal_bias(past: int, s: int) -> np.ndarray:
    """[s, past + s] float32 bias of a plain causal chunk after ``past`` cached positions."""
    bias = np.zeros((s, past + s), dtype=np.float32)
    bias[:, past:][np.triu(np.ones((s, s), dtype=bool), k=1)] = MASK_VALUE
    return bias


def flatten(root: int, tree: DraftTree, past: int) -> VerifyWindow:
    """The verify window for ``root`` followed by ``tree``, after ``past`` cached positions."""
    input_ids = np.concatenate([np.array([root], np.int64), tree.token_ids.astype(np.int64)])
    position_ids = past + np.concatenate([np.zeros(1, np.int64), tree.depths()])
    bias = np.zeros((len(input_ids), past + len(input_ids)), dtype=np.float32)
    bias[:, past:][~ancestor_mask(tree.parents)] = MASK_VALUE
    return VerifyWindow(input_ids, position_ids, bias)
