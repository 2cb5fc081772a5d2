"""``asd`` and ``asd_verify``: adaptive suffix decoding, without a datastore.

The drafts come from the same suffix trees as ``suffix_decoding`` (the active request and this
model's previous responses, in ``env.state["asd"]`` / ``env.state["asd_verify"]``), grown the
same way (at most ``max_spec_factor * match_len`` tokens) but down to a path probability of
``min_token_prob = 0.01``; what adapts is how many of their nodes are sent to verification.

Calibration, per request: the suffix tree gives each node a path probability p_i (its own
estimate that the target accepts it). Per draft depth k, the drafter keeps sums of what it
predicted (``P_k``: sum of p_i over drafted nodes at depth k) and what happened (``A_k``: steps
whose accepted path reached depth k), both decayed by ``calibration_decay`` every step (drafted
or not, so that a request that stopped drafting drifts back to the prior and tries again). The
calibrated acceptance is

    q_i = min(1, c_k * p_i, q_parent(i)),   c_k = (A_k + prior) / (P_k + prior),  k = depth(i)

and the expected accepted tokens of the first L nodes is E(L) = q_0 + ... + q_{L-1}. Nodes come
best-first (parents before children), so any L gives a tree. L is chosen to maximise the
expected tokens per unit of verify time:

    L* = argmax_L (E(L) + 1) / cost(L + 1)        (+1: the recovered/bonus token; L + 1 positions)

``asd`` uses a fixed linear cost, ``cost(s) = 1 + draft_token_cost * (s - 1)`` (one extra
position costs ``draft_token_cost`` of a step: ~0.15 on CPU, see specrt.cost); ``asd_verify``
uses ``env.verify_cost(s)``, the measured seconds of a verify pass, and falls back to the linear
cost while nothing is measured yet (it returns 0.0). On ties the shorter draft wins.
"""

from __future__ import annotations

import numpy as np

from specrt.drafters.base import DrafterEnv, Feedback
from specrt.drafters.indexes.suffix_tree import Draft
from specrt.drafters.suffix_decoding import SuffixDecoding
from specrt.tree import DraftTree


class AdaptiveSuffixDecoding(SuffixDecoding):
    def __init__(
        self,
        env: DrafterEnv,
        *,
        use_verify_cost: bool = False,
        draft_token_cost: float = 0.15,
        calibration_decay: float = 0.9,
        prior: float = 1.0,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.01,
        state_key: str | None = None,  # None: "asd_verify" or "asd"
        **suffix_options,  # tree, max_depth, max_spec_offset, max_cached_requests, max_cached_tokens
    ):
        key = state_key or ("asd_verify" if use_verify_cost else "asd")
        if draft_token_cost < 0:
            raise ValueError(f"{key}: draft_token_cost must be >= 0, got {draft_token_cost}")
        if not 0.0 <= calibration_decay <= 1.0:
            raise ValueError(f"{key}: calibration_decay must be in [0, 1], got {calibration_decay}")
        if prior <= 0:
            raise ValueError(f"{key}: prior must be > 0, got {prior}")
        super().__init__(
            env, max_spec_factor=max_spec_factor, min_token_prob=min_token_prob, state_key=key, **suffix_options
        )
        self.verify_cost = env.verify_cost if use_verify_cost else None
        self.draft_token_cost = draft_token_cost
        self.calibration_decay = calibration_decay
        self.prior = prior
        depths = self.cache.max_depth + 1  # index k = draft depth k (0 unused)
        self.predicted = np.zeros(depths)  # [max_depth + 1] decayed sum of p_i per depth (P_k)
        self.reached = np.zeros(depths)  # [max_depth + 1] decayed count of accepted paths reaching depth k (A_k)
        self._last: tuple[Draft, np.ndarray] | None = None  # the proposed draft and its node depths

    def calibrated(self, draft: Draft, depths: np.ndarray) -> np.ndarray:
        """[n] calibrated acceptance probability q_i of each node (depths: [n], 1 = child of the root)."""
        c = (self.reached + self.prior) / (self.predicted + self.prior)  # [max_depth + 1]
        q = np.minimum(1.0, c[depths] * draft.probs)
        for i, parent in enumerate(draft.parents.tolist()):
            if parent >= 0:
                q[i] = min(q[i], q[parent])
        return q

    def cost(self, sizes: np.ndarray) -> np.ndarray:
        """[m] cost of a verify pass over each window size (root + drafted nodes)."""
        if self.verify_cost is not None:
            measured = np.array([self.verify_cost(int(s)) for s in sizes])
            if np.all(measured > 0):
                return measured
        return 1.0 + self.draft_token_cost * (sizes - 1)

    def draft_length(self, q: np.ndarray) -> int:
        """L* = argmax_L (E(L) + 1) / cost(L + 1) over L = 0..n; q: [n] calibrated probabilities."""
        expected = np.concatenate([[0.0], np.cumsum(q)])  # [n + 1] E(L)
        rate = (expected + 1.0) / self.cost(np.arange(1, len(q) + 2))  # [n + 1]
        return int(np.argmax(rate))

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        self._last = None
        draft = self.speculate(context, budget)
        if len(draft) == 0:
            return DraftTree.empty()
        depths = draft.tree().depths()  # [n]
        n = self.draft_length(self.calibrated(draft, depths))
        self._last = (draft.head(n), depths[:n])
        return self._last[0].tree()

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        super().observe(emitted, feedback)
        # every step forgets a little, drafted or not, so a request that stopped drafting after
        # rejections drifts back to the prior and tries again
        self.predicted *= self.calibration_decay
        self.reached *= self.calibration_decay
        if self._last is None or len(self._last[0]) == 0:
            return
        draft, depths = self._last
        np.add.at(self.predicted, depths, draft.probs)
        self.reached[1 : len(feedback.path) + 1] += 1.0
        self._last = None


def make_asd(env: DrafterEnv) -> AdaptiveSuffixDecoding:
    return AdaptiveSuffixDecoding(env)


def make_asd_verify(env: DrafterEnv) -> AdaptiveSuffixDecoding:
    return AdaptiveSuffixDecoding(env, use_verify_cost=True)
