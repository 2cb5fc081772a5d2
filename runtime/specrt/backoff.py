"""Back-off that never lets a model-free drafter lose to plain decoding: verify only what pays.

A verify pass over s positions costs c(s) (``VerifyCostModel``, measured per window size, at the
request's cached length) and emits 1 + a tokens, a = accepted draft tokens; a plain step costs
c(1) and emits one. A drafter proposes a tree; the controller verifies it cut to the depth k that
maximises tokens per second,

    k* = argmax_k (1 + E[min(m, k)]) / c(n_k + 1),    E[min(m, k)] = sum_{d <= k} P(m >= d)

where m is the depth the target would accept from the whole tree and n_k the nodes at depth <= k;
k = 0 is a plain step (ratio 1 / c(1)). So a workload whose drafts do not pay for their window
runs plain decoding, and one whose first draft tokens pay but later ones do not verifies short
drafts.

P(m >= d) is an exponential mean over every tree the drafter proposed in this request, scored in
full against the tokens the request emitted after it (whatever was verified): under greedy
decoding the verifier would have accepted exactly the longest tree path that those tokens spell;
under sampling, a deterministic draft is accepted exactly along the path the emitted (target-law)
tokens spell. So a held-back or cut draft still teaches the estimate what it would have earned:
no probe steps, and speculation resumes as soon as drafts would pay. A model carries the estimate
from one request of a method to the next (``SpecModel``; ``forget_history`` drops it). A proposal is scored as soon
as its accepted depth is settled (a mismatch, or all its depth emitted). The estimate starts at 0
(pessimistic: a request verifies nothing until drafts were seen to match), as one pseudo-proposal
that matched nothing: the first proposals are averaged, later ones enter an exponential mean. Output never depends
on it (a plain step is exact), so the loop stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.cost import CostCurve, default_cost_ratio
from specrt.tree import DraftTree


def matched_length(tree: DraftTree, following: np.ndarray) -> int:
    """Nodes the greedy walk would accept if the target emitted ``following`` ([k] int64) next:
    the depth of the deepest tree path that spells a prefix of ``following``."""
    follow = following.tolist()  # Python ints: this runs for every pending proposal at every step
    matched = [False] * len(tree)
    best = 0
    for i, (token, parent, d) in enumerate(zip(tree.token_ids.tolist(), tree.parents.tolist(),
                                               tree.depths().tolist(), strict=True)):
        if d <= len(follow) and token == follow[d - 1] and (parent < 0 or matched[parent]):
            matched[i] = True
            best = max(best, d)
    return best


def _ratio(one: float, window: float, s: int) -> float:
    """c(s) / c(1) from the seconds of a single step and of the window of ``s``; the default slope
    where either is not measured."""
    if one > 0 and window > 0:
        return max(window / one, 1.0)  # a window does more work than one step: less is timing noise
    return default_cost_ratio(s)


@dataclass(frozen=True)
class _Pending:
    tree: DraftTree  # as proposed, before any cut
    start: int  # context length when it was proposed: the tokens it predicts begin there
    depth: int  # deepest node


class Backoff:
    """Per request: :meth:`choose` the part of each proposal to verify; :meth:`observe_context`
    scores past proposals once the request has emitted the tokens they predicted."""

    def __init__(self, cost: CostCurve, decay: float = 0.7, max_depth: int = 64):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.cost = cost
        self.decay = decay  # weight of the old mean
        self.reach = np.zeros(max_depth + 1, np.float64)  # reach[d] = P(m >= d) estimate; reach[0] unused
        self.seen = np.zeros(max_depth + 1, np.int64)  # proposals scored at depth d
        self.held_back = 0  # proposals cut to nothing (a plain step ran)
        self._pending: list[_Pending] = []

    def carried_over(self, cost: CostCurve | None = None) -> Backoff:
        """A fresh controller for the next request that starts from this one's estimate, on ``cost``
        (None: the same cost model)."""
        nxt = Backoff(self.cost if cost is None else cost, self.decay, len(self.reach) - 1)
        nxt.reach, nxt.seen = self.reach.copy(), self.seen.copy()
        return nxt

    def cost_ratio(self, s: int) -> float:
        """c(s) / c(1), measured where possible; before any measurement the cost model's default slope."""
        return _ratio(self.cost.estimate(1), self.cost.estimate(s), s)

    def cost_ratios(self, n: int) -> list[float]:
        """[n] :meth:`cost_ratio` of s = 1 .. n, reading c(1) once (Python floats: n is a budget of a
        few dozen at most, and callers index it per depth)."""
        one = self.cost.estimate(1)
        return [_ratio(one, self.cost.estimate(s), s) for s in range(1, n + 1)]

    def expected_accepted(self, depth: int) -> float:
        """E[min(m, depth)]: accepted tokens of a proposal cut to ``depth``."""
        return float(self.reach[1 : depth + 1].sum())

    def choose(self, tree: DraftTree, context_len: int) -> DraftTree:
        """``tree`` (proposed after ``context_len`` tokens) cut to its best depth; empty = plain step."""
        if not len(tree):
            return tree
        self.track(tree, context_len)
        best, _ = self.best_cut(tree)
        if best == 0:
            self.held_back += 1
            return DraftTree.empty()
        return tree.truncated(best)

    def track(self, tree: DraftTree, context_len: int) -> None:
        """Score ``tree`` (proposed after ``context_len`` tokens) once the request has emitted what it predicts."""
        if len(tree):
            deepest = min(int(tree.depths().max()), len(self.reach) - 1)
            self._pending.append(_Pending(tree, context_len, deepest))

    def best_cut(self, tree: DraftTree, drafting: float = 0.0, ratios: list[float] | None = None) -> tuple[int, float]:
        """(k*, rate): the depth that maximises expected tokens per unit of cost, and that rate, when the
        step has already spent ``drafting`` (in single steps, c(1) = 1) on proposals; k* = 0 is a
        plain step, rate 1 / (1 + drafting). ``ratios``: :meth:`cost_ratios` of at least the tree's
        size + 1, when the caller has them (else read here). Ties go to the shallower cut.

        Python numbers, not numpy: a tree has a few dozen nodes at most, and this runs for every
        offer at every step, where a numpy call's overhead outweighs its work."""
        plain = 1.0 / (1.0 + drafting)
        if not len(tree):
            return 0, plain
        depths = tree.depths().tolist()
        deepest = min(max(depths), len(self.reach) - 1)
        at_depth = [0] * (deepest + 1)  # nodes at depth d
        for d in depths:
            if d <= deepest:
                at_depth[d] += 1
        size = sum(at_depth)  # nodes at depth <= deepest
        if ratios is None or len(ratios) < size + 1:
            ratios = self.cost_ratios(size + 1)
        best, best_rate = 0, plain
        accepted, nodes = 0.0, 0  # E[min(m, k)], nodes at depth <= k
        for k, reach in enumerate(self.reach[1 : deepest + 1].tolist(), start=1):
            accepted += reach
            nodes += at_depth[k]
            rate = (1.0 + accepted) / (ratios[nodes] + drafting)  # a window of nodes + 1 positions
            if rate > best_rate:  # strictly: the first of equal rates, and above a plain step
                best, best_rate = k, rate
        return best, best_rate

    def observe_context(self, context: np.ndarray) -> None:
        """Score every pending proposal whose accepted depth ``context`` ([t] int64) now settles:
        its whole depth is covered, or the tokens so far already leave every path."""
        waiting = []
        for item in self._pending:
            following = context[item.start : item.start + item.depth]
            m = matched_length(item.tree, following)
            if m == len(following) < item.depth:  # every known token matched: deeper ones decide
                waiting.append(item)
                continue
            # the mean of the first proposals (after one pseudo-proposal that matched nothing), then
            # an exponential mean: the first matches count at once, later ones track the workload
            # (Python numbers: a few depths per proposal, numpy's per-call overhead would dominate)
            end = item.depth + 1
            reach, seen = self.reach[1:end].tolist(), self.seen[1:end].tolist()
            floor = 1.0 - self.decay
            for i in range(item.depth):  # depth d = i + 1
                reach[i] += max(floor, 1.0 / (seen[i] + 2)) * ((i < m) - reach[i])
            self.reach[1:end] = reach
            self.seen[1:end] += 1
        self._pending = waiting
