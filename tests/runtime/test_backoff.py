"""The back-off (specrt.backoff): shadow scoring of held drafts, the pay-off rule, and the loop with it."""

from __future__ import annotations

import numpy as np
import pytest

import specrt
from specrt.backoff import Backoff, matched_length
from specrt.cost import VerifyCostModel
from specrt.tree import DraftTree
from tests.helpers import PROMPTS


def test_matched_length_follows_the_deepest_spelled_path():
    chain = DraftTree.chain([5, 6, 7, 8])
    assert matched_length(chain, np.array([5, 6, 9, 8])) == 2
    assert matched_length(chain, np.array([5, 6, 7, 8])) == 4
    assert matched_length(chain, np.array([4, 6, 7, 8])) == 0
    #        5 - 6          (nodes 0, 2)
    # root <
    #        8 - 9 - 3      (nodes 1, 3, 4)
    tree = DraftTree(np.array([5, 8, 6, 9, 3]), np.array([-1, -1, 0, 1, 3]))
    assert matched_length(tree, np.array([8, 9, 3])) == 3
    assert matched_length(tree, np.array([8, 6, 3])) == 1  # 6 hangs under 5, not under 8
    assert matched_length(tree, np.array([5, 6, 3])) == 2


def _costs(one: float, five: float) -> VerifyCostModel:
    cost = VerifyCostModel()
    cost.record(1, one)
    cost.record(5, five)
    return cost


def test_proposals_are_held_until_held_ones_would_have_paid_then_cut_to_the_depth_that_pays():
    backoff = Backoff(_costs(1.0, 2.0), decay=0.5)  # a window of 5 costs 2 plain steps (linear fit between)
    draft = DraftTree.chain([5, 6, 7, 8])
    assert not len(backoff.choose(draft, 3))  # P(m >= d) starts at 0: a plain step
    backoff.observe_context(np.array([1, 2, 3, 5, 6, 7]))  # 3 of the 4 predicted tokens known: waiting
    assert backoff.expected_accepted(4) == 0.0
    backoff.observe_context(np.array([1, 2, 3, 5, 6, 7, 8]))  # the held draft would have accepted 4
    assert backoff.reach[1:5].tolist() == [0.5, 0.5, 0.5, 0.5]
    # rate(k) = (1 + 0.5 k) / (1 + 0.25 k): best at k = 4 (3.0 / 2.0 = 1.5 > 1)
    assert backoff.choose(draft, 7).token_ids.tolist() == [5, 6, 7, 8]
    backoff.observe_context(np.array([1, 2, 3, 5, 6, 7, 8, 5, 6, 1, 1]))  # that one matches 2 of 4
    assert backoff.reach[1:5].tolist() == [0.75, 0.75, 0.25, 0.25]
    # rates: k=1 1.75/1.25 = 1.4, k=2 2.5/1.5 = 1.67, k=3 2.75/1.75 = 1.57, k=4 3.0/2.0 = 1.5
    assert backoff.choose(draft, 11).token_ids.tolist() == [5, 6]
    assert backoff.held_back == 1
    assert not len(backoff.choose(DraftTree.empty(), 11)) and backoff.held_back == 1  # nothing proposed


def test_a_proposal_is_scored_as_soon_as_its_accepted_depth_is_settled():
    backoff = Backoff(_costs(1.0, 2.0))
    backoff.choose(DraftTree.chain([5, 6, 7, 8]), 3)
    backoff.choose(DraftTree.chain([6, 9, 9, 9]), 4)
    backoff.observe_context(np.array([1, 2, 3, 5, 6, 7]))  # the first still matches, the second left at token 2
    assert backoff.seen[1:5].tolist() == [1, 1, 1, 1] and backoff.reach[1:5].tolist() == [0.5, 0, 0, 0]


def test_a_tree_is_cut_by_depth():
    tree = DraftTree(np.array([5, 8, 6, 9, 3]), np.array([-1, -1, 0, 1, 3]))
    cut = tree.truncated(2)
    assert cut.token_ids.tolist() == [5, 8, 6, 9] and cut.parents.tolist() == [-1, -1, 0, 1]
    assert tree.truncated(3) is tree and len(tree.truncated(0)) == 0


def test_cost_ratio_uses_the_default_slope_before_anything_is_measured():
    assert Backoff(VerifyCostModel()).cost_ratio(5) == pytest.approx(1.0 + 4 * specrt.cost.DEFAULT_SLOPE)
    assert Backoff(_costs(0.01, 0.03)).cost_ratio(5) == pytest.approx(3.0)


class Fixed:
    """Proposes the same chain at every step, or the reference continuation (an oracle)."""

    def __init__(self, tokens: list[int] | None = None, reference: np.ndarray | None = None):
        self.tokens, self.reference = tokens, reference

    def begin(self, prompt, hidden_states):
        self.start = len(prompt)

    def propose(self, context, budget):
        if self.reference is None:
            return DraftTree.chain(self.tokens[:budget])
        done = len(context) - self.start  # tokens emitted so far: the reference continues there
        return DraftTree.chain(self.reference[done : done + budget])

    def observe(self, emitted, feedback):
        pass


class LinearCost(VerifyCostModel):
    """Window costs that do not depend on the machine's load: c(s) = 1 + 0.2 (s - 1)."""

    def record(self, s: int, seconds: float, past: int = 0) -> None:
        pass

    def estimate(self, s: int, past: int | None = None) -> float:
        return 1.0 + 0.2 * (s - 1)


@pytest.fixture
def steady(model, monkeypatch):
    """``model`` with fixed window costs, so the back-off's choices do not follow timing noise."""
    monkeypatch.setattr(model, "verify_cost", LinearCost())
    return model


def test_a_drafter_that_never_matches_is_never_verified_and_output_is_unchanged(steady):
    model = steady
    ids = model.encode(PROMPTS[0])
    base, _ = model.generate_ids(ids, method="baseline", max_new_tokens=30)
    wrong = Fixed([int(base.max()) + 1] * 4)  # a token the greedy continuation never emits
    out, loop = model.generate_ids(ids, method=wrong, max_new_tokens=30, draft_budget=4, backoff=True)
    assert out.tolist() == base.tolist()
    assert loop.stats.drafted == 0 and loop.stats.held_back >= loop.stats.steps - 1 > 0  # the last step has no room
    _, unguarded = model.generate_ids(ids, method=Fixed([int(base.max()) + 1] * 4), max_new_tokens=30,
                                      draft_budget=4, backoff=False)
    assert unguarded.stats.drafted > 0 and unguarded.stats.held_back == 0  # without it every draft is verified


def test_a_drafter_that_matches_gets_verified_after_its_held_drafts_prove_it(steady):
    model = steady
    runs = [(ids, model.generate_ids(ids, method="baseline", max_new_tokens=30)[0])
            for ids in map(model.encode, PROMPTS)]
    ids, base = max(runs, key=lambda run: len(run[1]))  # the longest continuation (some stop at EOS early)
    assert len(base) >= 12
    out, loop = model.generate_ids(ids, method=Fixed(reference=base), max_new_tokens=30, draft_budget=4,
                                   backoff=True)
    assert out.tolist() == base.tolist()
    assert 0 < loop.stats.held_back <= 4  # held until the first held draft's 4 tokens were emitted
    assert loop.stats.accepted == loop.stats.drafted > 0
    assert loop.stats.steps < len(base) - 1  # fewer passes than plain decoding


class SpyCost(LinearCost):
    """LinearCost that keeps every pass recorded and every cached length an estimate was asked at."""

    def __init__(self) -> None:
        super().__init__()
        self.passes: list[tuple[int, int]] = []  # (window size, cached positions before it)
        self.asked: list[int | None] = []

    def record(self, s: int, seconds: float, past: int = 0) -> None:
        self.passes.append((s, past))

    def estimate(self, s: int, past: int | None = None) -> float:
        self.asked.append(past)
        return super().estimate(s, past)


@pytest.mark.parametrize("method", ["pld", "auto"])
def test_windows_are_recorded_and_priced_at_the_request_s_cached_length(model, monkeypatch, method):
    spy = SpyCost()
    monkeypatch.setattr(model, "verify_cost", spy)
    ids = model.encode(PROMPTS[0])
    _, loop = model.generate_ids(ids, method=method, max_new_tokens=20)
    pasts = [past for _, past in spy.passes]
    assert len(spy.passes) == loop.stats.steps and pasts[0] == len(ids)  # the prompt is cached before the first
    emitted = [length + 1 for length in loop.stats.accepted_lengths]  # each step: its accepted drafts + 1
    assert np.diff(pasts).tolist() == emitted[:-1]
    assert spy.asked and set(spy.asked) <= set(pasts)  # the back-off and auto price windows where the request is


@pytest.mark.parametrize("method, options, on", [
    ("pld", {}, True),
    ("suffix_decoding", {"temperature": 0.8}, True),
    ("pld", {"temperature": 0.8, "seed": 3}, False),  # a seeded sampled request must repeat
    ("pld", {"seed": 3}, True),  # greedy: the seed changes nothing
    ("sd_like_instance", {}, False),
    ("baseline", {}, True),
    ("auto", {}, False),  # the controller cuts its drafts itself (specrt.drafters.auto)
])
def test_backoff_defaults(model, method, options, on):
    if method == "sd_like_instance":
        method = Fixed([1, 2])  # a Drafter instance: its cost is unknown
    loop, chunks = model.stream_ids(model.encode(PROMPTS[0]), method=method, max_new_tokens=4, **options)
    list(chunks)
    assert (loop.backoff is not None) == on


def test_the_estimate_carries_over_to_the_next_request_of_the_method_until_history_is_forgotten(model):
    ids = model.encode(PROMPTS[0])
    model.forget_history()
    first, _ = model.stream_ids(ids, method="pld", max_new_tokens=20)
    assert first.backoff is not None and not first.backoff.seen.any()  # a cold start
    list(_)
    kept = model.drafter_state["backoff/pld/chain"]
    assert kept is first.backoff and kept.seen.any()
    second, chunks = model.stream_ids(ids, method="pld", max_new_tokens=20)
    assert second.backoff is not kept and second.backoff.reach.tolist() == kept.reach.tolist()
    list(chunks)
    tree, chunks = model.stream_ids(ids, method="pld", tree=True, max_new_tokens=20)
    assert not tree.backoff.seen.any()  # chain and tree keep their own
    list(chunks)
    model.forget_history()
    assert not [k for k in model.drafter_state if k.startswith("backoff/")]


def test_best_cut_is_the_first_depth_of_the_highest_rate_by_its_definition():
    # best_cut computes every depth's rate in one numpy pass; it must pick what the definition does:
    # the shallowest k of the highest (1 + E[min(m, k)]) / (c(n_k + 1) / c(1) + drafting), if above a
    # plain step's 1 / (1 + drafting), for random estimates, trees and partly measured cost curves
    rng = np.random.default_rng(0)
    for _ in range(500):
        cost = VerifyCostModel()
        for s in rng.choice(np.arange(1, 12), size=int(rng.integers(0, 4)), replace=False):
            cost.record(int(s), float(rng.uniform(0.005, 0.05)))
        backoff = Backoff(cost)
        backoff.reach[1:] = np.sort(rng.uniform(0, 1, len(backoff.reach) - 1))[::-1] * rng.uniform(0, 1)
        n = int(rng.integers(1, 9))
        tree = DraftTree(rng.integers(0, 100, n), np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)]))
        drafting = float(rng.choice([0.0, rng.uniform(0, 0.5)]))
        depths = tree.depths()
        expected, best_rate = 0, 1.0 / (1.0 + drafting)
        for k in range(1, int(depths.max()) + 1):
            rate = (1.0 + backoff.expected_accepted(k)) / (backoff.cost_ratio(int((depths <= k).sum()) + 1) + drafting)
            if rate > best_rate:
                expected, best_rate = k, rate
        depth, rate = backoff.best_cut(tree, drafting)
        assert depth == expected and rate == pytest.approx(best_rate, rel=1e-12)
