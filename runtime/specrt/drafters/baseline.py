"""``baseline``: proposes nothing, so every step decodes exactly one token (plain decoding)."""

from __future__ import annotations

import numpy as np

from specrt.drafters.base import DrafterEnv, Feedback
from specrt.tree import DraftTree


class NoDraft:
    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        return DraftTree.empty()

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        pass

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        pass


def make(env: DrafterEnv) -> NoDraft:
    return NoDraft()
