"""The back-off (specrt.backoff): shadow scoring of held drafts, the pay-off rule, and the loop with it."""

from __future__ import annotations

import numpy as np
import pytest

import specrt
from specrt.backoff import Backoff, matched_length
from specrt.cost import VerifyCostModel
from specrt.tree import DraftTree
from tests.tiny import PROMPTS


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


def test_drafts_are_held_until_held_ones_would_have_paid_then_verified_until_they_stop_paying():
    backoff = Backoff(_costs(1.0, 2.0), decay=0.5)  # a window of 5 costs 2 plain steps
    draft = DraftTree.chain([5, 6, 7, 8])
    context = np.array([1, 2, 3])
    assert not backoff.admit(draft, len(context))  # E[a] starts at 0: 1 < 2
    backoff.observe_context(np.array([1, 2, 3, 5, 6, 7]))  # 3 of 4 following tokens known: still waiting
    assert backoff.expected_accepted == 0.0
    backoff.observe_context(np.array([1, 2, 3, 5, 6, 7, 8]))  # the held draft would have accepted 4
    assert backoff.expected_accepted == pytest.approx(2.0)
    assert backoff.admit(draft, 7)  # 1 + 2 > 2
    backoff.verified(0)
    assert backoff.expected_accepted == pytest.approx(1.0)
    assert not backoff.admit(draft, 8)  # 1 + 1 = 2: does not beat two plain steps
    assert backoff.held_back == 2
    assert not backoff.admit(DraftTree.empty(), 8) and backoff.held_back == 2  # nothing to hold


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


@pytest.fixture(scope="module")
def model(tiny_artifact):
    return specrt.load(tiny_artifact[0])


def test_a_drafter_that_never_matches_is_never_verified_and_output_is_unchanged(model):
    ids = model.encode(PROMPTS[0])
    base, _ = model.generate_ids(ids, method="baseline", max_new_tokens=30)
    wrong = Fixed([int(base.max()) + 1] * 4)  # a token the greedy continuation never emits
    out, loop = model.generate_ids(ids, method=wrong, max_new_tokens=30, draft_budget=4, backoff=True)
    assert out.tolist() == base.tolist()
    assert loop.stats.drafted == 0 and loop.stats.held_back >= loop.stats.steps - 1 > 0  # the last step has no room
    _, unguarded = model.generate_ids(ids, method=Fixed([int(base.max()) + 1] * 4), max_new_tokens=30,
                                      draft_budget=4, backoff=False)
    assert unguarded.stats.drafted > 0 and unguarded.stats.held_back == 0  # without it every draft is verified


def test_a_drafter_that_matches_gets_verified_after_its_held_drafts_prove_it(model):
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


@pytest.mark.parametrize("method, options, on", [
    ("pld", {}, True),
    ("suffix_decoding", {"temperature": 0.8}, True),
    ("pld", {"temperature": 0.8, "seed": 3}, False),  # a seeded sampled request must repeat
    ("baseline", {}, True),
])
def test_backoff_defaults(model, method, options, on):
    loop, chunks = model.stream_ids(model.encode(PROMPTS[0]), method=method, max_new_tokens=4, **options)
    list(chunks)
    assert (loop.backoff is not None) == on
