"""``baseline``: proposes nothing, so every step decodes exactly one token (plain decoding)."""

from __future__ import annotations

import numpy as np

from ..tree import DraftTree


class NoDraft:
    def __init__(self, tree: bool = False):
        del tree  # plain decoding is the same in chain and tree mode

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        return DraftTree.empty()

    def observe(self, emitted: np.ndarray) -> None:
        pass
