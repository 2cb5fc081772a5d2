"""The offline acceptance simulator (specrt.simulate): literal replays, and agreement with real runs."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.backoff import Backoff
from specrt.cost import VerifyCostModel
from specrt.drafters import DrafterEnv, Feedback
from specrt.drafters.pld import PromptLookup
from specrt.drafters.suffix_decoding import make
from specrt.simulate import Record, SimulationResult, record_generation, simulate
from specrt.tree import DraftTree
from tests.helpers import PROMPTS, ctx


class Oracle:
    """Proposes the recorded continuation (as a chain), or ``wrong`` in its place."""

    def __init__(self, output: np.ndarray, wrong: bool = False):
        self.output, self.wrong = output, wrong
        self.calls: list[tuple[list[int], int]] = []  # (context, budget) per propose
        self.observed: list[tuple[list[int], list[int], tuple[int, ...], tuple[int, ...]]] = []
        self.prompt_len = 0

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        self.prompt_len = len(prompt)
        assert hidden_states.shape == (len(prompt), 0)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        self.calls.append((context.tolist(), budget))
        produced = len(context) - self.prompt_len
        truth = self.output[produced : produced + budget]
        return DraftTree.chain(np.full(len(truth), 99) if self.wrong else truth)

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        self.observed.append(
            (emitted.tolist(), feedback.path.tolist(), feedback.logits.shape, feedback.hidden_states.shape)
        )


PROMPT = ctx(1, 2)
OUTPUT = ctx(5, 6, 7, 8, 9, 10)  # the recorded greedy continuation


def test_true_continuation_is_all_accepted():
    oracle = Oracle(OUTPUT)
    result = simulate(oracle, PROMPT, OUTPUT, budget=2)
    # step 1: context [1, 2, 5] (the prefill's 5), drafts [6, 7], emits [6, 7, 8] (8 = bonus)
    # step 2: 2 tokens left to emit, so budget 1: drafts [9], emits [9, 10]
    assert result == SimulationResult(steps=2, drafted=3, accepted=3, tokens_per_step=2.5, accepted_lengths=(2, 1),
                                      window_sizes=(3, 2), held_back=0, decode_tokens=5)
    # windows of 3 and 2 positions at 1 + 0.5 per extra position: 5 tokens for 2 + 1.5 steps' cost
    assert result.verify_cost(lambda s: 1 + 0.5 * (s - 1)) == pytest.approx(3.5)
    assert result.projected_speedup(lambda s: 1 + 0.5 * (s - 1)) == pytest.approx(5 / 3.5)
    assert oracle.calls == [([1, 2, 5], 2), ([1, 2, 5, 6, 7, 8], 1)]
    assert oracle.observed == [([6, 7, 8], [0, 1], (3, 0), (3, 0)), ([9, 10], [0], (2, 0), (2, 0))]


def costs(seconds_by_size: dict[int, float]) -> VerifyCostModel:
    model = VerifyCostModel()
    for s, seconds in seconds_by_size.items():
        model.record(s, seconds)
    return model


def test_backoff_replay_verifies_once_drafts_were_seen_to_match():
    # windows cost what a single step costs: a draft pays as soon as the estimate expects any match.
    # Steps 1-2 run plain (the estimate starts at 0); step 1's proposal [6, 7] is scored once 7 is
    # known (after step 2): reach[1] = reach[2] = 0.5, so step 3 verifies its draft [8, 9] in full.
    flat = costs({1: 0.01, 2: 0.01, 3: 0.01})
    output = ctx(5, 6, 7, 8, 9, 10, 11, 12, 13, 14)
    oracle = Oracle(output)
    result = simulate(oracle, PROMPT, output, budget=2, backoff=Backoff(flat))
    # (step 5 has one token left to emit: no budget, no proposal)
    assert result.window_sizes == (1, 1, 3, 3, 1) and result.accepted_lengths == (0, 0, 2, 2, 0)
    assert result.held_back == 2 and result.decode_tokens == 9
    assert len(oracle.calls) == 4  # held-back proposals were asked for (and scored) all the same


def test_backoff_replay_never_loses_when_windows_cost_too_much():
    # a window of 2 costs 3 single steps: no draft of this oracle can pay, even all accepted
    dear = costs({1: 0.01, 2: 0.03, 3: 0.05})
    output = ctx(5, 6, 7, 8, 9, 10, 11, 12)
    result = simulate(Oracle(output), PROMPT, output, budget=2, backoff=Backoff(dear))
    assert result.window_sizes == (1,) * 7 and result.accepted == 0
    assert result.held_back == 6  # every proposal (the last step has no budget for one)
    assert result.projected_speedup(lambda s: dear.estimate(s) / dear.estimate(1)) == pytest.approx(1.0)
    free = simulate(Oracle(output), PROMPT, output, budget=2)  # without the back-off it loses here
    assert free.projected_speedup(lambda s: dear.estimate(s) / dear.estimate(1)) < 1.0


def test_wrong_tokens_give_one_token_per_step():
    result = simulate(Oracle(OUTPUT, wrong=True), PROMPT, OUTPUT, budget=3)
    # every draft is rejected at its first node: the recovered token is the recorded one
    assert result == SimulationResult(
        steps=5, drafted=3 + 3 + 2 + 1, accepted=0, tokens_per_step=1.0, accepted_lengths=(0, 0, 0, 0, 0),
        window_sizes=(4, 4, 3, 2, 1), held_back=0, decode_tokens=5,
    )


class Branchy:
    """Two children at the root: a wrong branch first, then the true continuation below 6."""

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        pass

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        #        root
        #       /    \\
        #    n0:42   n1:6
        #              |
        #            n2:7
        return DraftTree(ctx(42, 6, 7)[:budget], ctx(-1, -1, 1)[:budget])

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        pass


def test_tree_walk_follows_the_matching_branch():
    # step 1 accepts n1:6 and n2:7 (bonus 8); step 2 has one token left to emit: no budget
    result = simulate(Branchy(), PROMPT, ctx(5, 6, 7, 8, 9), budget=3)
    assert result.accepted_lengths == (2, 0) and result.steps == 2 and result.drafted == 3


def test_max_new_tokens_of_the_record_keeps_the_budget_near_an_eos():
    # the record ended by EOS (3 tokens) under max_new_tokens=10: the budget is not cut by the record's end
    oracle = Oracle(ctx(5, 6, 0))
    simulate(oracle, PROMPT, ctx(5, 6, 0), budget=4, max_new_tokens=10)
    assert oracle.calls == [([1, 2, 5], 4)]
    # without it, the record's length is the limit: 2 tokens left, budget 1
    oracle = Oracle(ctx(5, 6, 0))
    simulate(oracle, PROMPT, ctx(5, 6, 0), budget=4)
    assert oracle.calls == [([1, 2, 5], 1)]


def test_drafts_past_the_end_of_the_record_count_as_rejected():
    # budget 4 after [5]: the oracle drafts [6, 0] (EOS), then nothing is known after the EOS
    result = simulate(Oracle(ctx(5, 6, 0)), PROMPT, ctx(5, 6, 0), budget=4, max_new_tokens=10)
    assert result.accepted_lengths == (2,) and result.tokens_per_step == 2.0


def test_short_records():
    assert simulate(Oracle(ctx(5)), PROMPT, ctx(5), budget=4).steps == 0  # the prefill's token only
    empty = simulate(Oracle(ctx()), PROMPT, ctx(), budget=4)
    assert (empty.steps, empty.tokens_per_step, empty.accepted_lengths) == (0, 0.0, ())


def test_factory_gets_an_env_and_a_shared_env_carries_history():
    e = DrafterEnv(vocab=16, tree=False)
    first = simulate(make, ctx(1), ctx(7, 8, 9, 10, 11, 12), budget=4, env=e)
    again = simulate(make, ctx(2), ctx(7, 8, 9, 10, 11, 12), budget=4, env=e)  # the first response is history
    assert first.accepted == 0  # nothing repeats within the first request
    assert again.accepted > 0 and again.steps < first.steps
    fresh = simulate(make, ctx(2), ctx(7, 8, 9, 10, 11, 12), budget=4)  # a new env each call: no history
    assert fresh.accepted == 0
    tree_mode = simulate(make, ctx(1, 2, 5, 1, 2, 6, 1), ctx(2, 6, 1), budget=4, max_new_tokens=10, tree=True)
    assert tree_mode.accepted_lengths == (1,)  # tree mode drafts 5 and 6 after [1, 2]; 6 is right


def test_over_budget_drafter_fails():
    class Greedy(Oracle):
        def propose(self, context: np.ndarray, budget: int) -> DraftTree:
            return DraftTree.chain([6] * (budget + 1))

    with pytest.raises(RuntimeError, match="proposed 3 nodes over its budget of 2"):
        simulate(Greedy(OUTPUT), PROMPT, OUTPUT, budget=2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt_ids": ctx()}, "prompt_ids is empty"),
        ({"budget": -1}, "budget must be >= 0, got -1"),
        ({"max_new_tokens": 3}, "max_new_tokens=3 is less than the 6 recorded tokens"),
    ],
)
def test_simulate_validation(kwargs, message):
    args = {"prompt_ids": PROMPT, "output_ids": OUTPUT, "budget": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        simulate(Oracle(OUTPUT), **args)


# ---------------------------------------------------------------------------------------------
# against real runs on the tiny models


@pytest.fixture(scope="module")
def records(model):
    return [record_generation(model, model.encode(prompt), max_new_tokens=30) for prompt in PROMPTS]


def test_record_generation_is_plain_decoding(model, records):
    record = records[0]
    assert isinstance(record, Record) and record.max_new_tokens == 30
    assert record.prompt_ids.tolist() == model.encode(PROMPTS[0]).tolist()
    plain = model.generate(PROMPTS[0], method="baseline", max_new_tokens=30)
    assert record.output_ids.tolist() == list(plain.token_ids)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_simulated_acceptance_equals_the_real_run(model, records, tree):
    # greedy, same budget: the simulator predicts the engine's counters exactly (pld is stateless;
    # suffix_decoding starts from an empty history on both sides)
    for record in records:
        for factory in (lambda env: PromptLookup(tree=env.tree), make):
            model.drafter_state.clear()
            out, loop = model.generate_ids(
                record.prompt_ids, method=factory(model.drafter_env(tree)), max_new_tokens=30, draft_budget=6
            )
            assert out.tolist() == record.output_ids.tolist()
            predicted = simulate(
                factory, record.prompt_ids, record.output_ids, budget=6, max_new_tokens=record.max_new_tokens, tree=tree
            )
            assert predicted.accepted == loop.stats.accepted
            assert predicted.accepted_lengths == tuple(loop.stats.accepted_lengths)
            assert (predicted.steps, predicted.drafted) == (loop.stats.steps, loop.stats.drafted)
            assert predicted.tokens_per_step == pytest.approx(loop.stats.tokens_per_step)
