"""The verify window of a draft tree, as the decoder contract takes it: input ids, position ids and
an attention bias over the cache and the window, and the cut a backend imposes on a tree.

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

from specrt.backend.contract import MASK_VALUE
from specrt.tree import DraftTree

# The portable graph's attention (pipeline/lib/grouped_attention.py) runs on onnxruntime's CPU SGEMM,
# which sums over the keys in blocks of 128 cache slots (fused multiply-adds inside a block, one
# rounding more where blocks meet). A chain window keeps every key at the slot a single step gives
# it; a branching tree moves a path's keys to other slots, so a row rounds like its single step
# only while the window's nodes share one block. SpecAttention graphs sum over each row's list of
# visible keys, wherever they sit, and need no block (DecoderSession.key_block is None for them).
KEY_BLOCK = 128


def fit_window(tree: DraftTree, past: int, key_block: int | None) -> DraftTree:
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
