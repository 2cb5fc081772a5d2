"""Back-off that never lets a model-free drafter lose to plain decoding.

A verify pass over s positions costs c(s) (``VerifyCostModel``, measured per window size) and
emits 1 + a tokens, a = accepted draft tokens; a plain step costs c(1) and emits one. A draft of
n nodes is worth verifying iff

    (1 + E[a]) / c(n + 1)  >  1 / c(1)

E[a] is an exponential mean over every draft the drafter proposed in this request, verified or
held back. A held-back draft is scored against the tokens plain decoding emitted after it
("shadow" verification): under greedy decoding the verifier would have accepted exactly the
longest tree path that the next tokens spell; under sampling a deterministic draft token is
accepted with the probability that plain sampling emits it, so the match has the same law.
Backing off therefore costs nothing to keep learning: no probe steps, and speculation resumes
as soon as the held-back drafts would have paid. The estimate starts at 0 (pessimistic), so a
request verifies nothing until drafts were seen to match. Output is unchanged either way: a
plain step is exact, so the loop stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost import DEFAULT_SLOPE, VerifyCostModel
from .tree import DraftTree


def matched_length(tree: DraftTree, following: np.ndarray) -> int:
    """Nodes the greedy walk would accept if the target emitted ``following`` ([k] int64) next:
    the depth of the deepest tree path that spells a prefix of ``following``."""
    depth = tree.depths()
    matched = np.zeros(len(tree), bool)
    best = 0
    for i, (token, parent) in enumerate(zip(tree.token_ids, tree.parents, strict=True)):
        d = int(depth[i])
        if d <= len(following) and token == following[d - 1] and (parent < 0 or matched[parent]):
            matched[i] = True
            best = max(best, d)
    return best


@dataclass
class _Held:
    tree: DraftTree
    start: int  # context length when it was proposed: following tokens begin there
    depth: int  # deepest node


class Backoff:
    """Per request: ``admit`` a proposed draft or hold it back; ``verified`` / ``observe_context``
    feed the acceptance estimate."""

    def __init__(self, cost: VerifyCostModel, decay: float = 0.7):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.cost = cost
        self.decay = decay  # weight of the old mean
        self.expected_accepted = 0.0  # E[a] per proposed draft
        self.held_back = 0  # drafts not verified (counted per request)
        self._held: list[_Held] = []

    def _update(self, accepted: int) -> None:
        self.expected_accepted = self.decay * self.expected_accepted + (1 - self.decay) * accepted

    def cost_ratio(self, s: int) -> float:
        """c(s) / c(1), measured where possible; before any measurement the cost model's default slope."""
        one, window = self.cost.estimate(1), self.cost.estimate(s)
        if one > 0 and window > 0:
            return window / one
        return 1.0 + DEFAULT_SLOPE * (s - 1)

    def admit(self, tree: DraftTree, context_len: int) -> bool:
        """Verify ``tree`` (proposed after ``context_len`` tokens)? If not, it is held for scoring."""
        if not len(tree):
            return False
        if 1.0 + self.expected_accepted > self.cost_ratio(len(tree) + 1):
            return True
        self.held_back += 1
        self._held.append(_Held(tree, context_len, int(tree.depths().max())))
        return False

    def verified(self, accepted: int) -> None:
        """A verified draft's accepted length."""
        self._update(accepted)

    def observe_context(self, context: np.ndarray) -> None:
        """Score every held draft whose whole depth ``context`` ([t] int64) now covers."""
        waiting = []
        for held in self._held:
            following = context[held.start : held.start + held.depth]
            if len(following) < held.depth:
                waiting.append(held)
            else:
                self._update(matched_length(held.tree, following))
        self._held = waiting
