"""The cost-aware controller (specrt.drafters.auto): its decisions on recorded traces (the offline
simulator), and ``auto`` against plain decoding (greedy bit for bit, sampling in law)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

import specrt
from specrt.backend.draft_model import OrtDraftModel
from specrt.backend.manifest import read_manifest
from specrt.backend.session import OrtDecoder
from specrt.backoff import Backoff
from specrt.cost import VerifyCostModel
from specrt.drafters import DrafterEnv, Feedback
from specrt.drafters.auto import (
    EVERY_STEP_SHARE,
    PROBE_EVERY,
    PROBE_SHARE,
    Auto,
    AutoConfig,
    MeasuredCost,
    Member,
    make,
)
from specrt.drafters.pld import PromptLookup
from specrt.drafters.suffix_decoding import SuffixDecoding
from specrt.errors import InvalidRequestError
from specrt.sampling import SamplingParams
from specrt.simulate import simulate
from specrt.tree import DraftTree
from tests.helpers import PROMPTS, chi2_pvalue
from tests.test_draft_model import ALPHA, SAMPLING, SEEDS, Pair, target_law
from tests.tiny_pair import build_tiny_pair

PROMPT = np.array([1, 2], np.int64)
OUTPUT = np.arange(10, 90, dtype=np.int64)  # a recorded greedy continuation of 80 tokens
WRONG = 99  # a token the record never holds


class Knows:
    """Proposes the record's true continuation while the tokens emitted so far number in [lo, hi),
    else a chain of WRONG tokens."""

    def __init__(self, output: np.ndarray, lo: int, hi: int):
        self.output, self.lo, self.hi = output, lo, hi
        self.start = 0

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        self.start = len(prompt)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        done = len(context) - self.start
        truth = self.output[done : done + budget]
        return DraftTree.chain(truth if self.lo <= done < self.hi else np.full(len(truth), WRONG))

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        pass


class Traced(Auto):
    """The controller, recording (tokens emitted before the step, chosen member or None) per step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trace: list[tuple[int, str | None]] = []

    def begin(self, prompt, hidden_states):
        super().begin(prompt, hidden_states)
        self.prompt_len = len(prompt)

    def propose(self, context, budget):
        tree = super().propose(context, budget)
        self.trace.append((len(context) - self.prompt_len, self.last_choice))
        return tree


def counts_controller(drafters: dict[str, object], cost: VerifyCostModel | None = None,
                      token_cost: float = 0.0, probe_share: float = PROBE_SHARE,
                      every_step_share: float = EVERY_STEP_SHARE) -> Traced:
    cost = cost if cost is not None else VerifyCostModel()  # nothing measured: c(s) = 1 + 0.15 (s - 1)
    members = [Member(name, d, Backoff(cost), token_cost) for name, d in drafters.items()]
    return Traced(members, cost, AutoConfig(timed=False, probe_share=probe_share, every_step_share=every_step_share))


def costs(seconds_by_size: dict[int, float]) -> VerifyCostModel:
    model = VerifyCostModel()
    for s, seconds in seconds_by_size.items():
        model.record(s, seconds)
    return model


# ---------------------------------------------------------------------------------------------
# decisions on recorded traces


def test_it_follows_the_member_the_trace_rewards():
    # "early" knows the first 40 tokens, "late" the last 40: the controller verifies early's drafts
    # in the first half and late's in the second, once late's probes proved it. After the switch
    # early's wrong drafts are verified while its estimate decays: each one multiplies P(m >= 1)
    # (at most 1) by the decay 0.7, and a 1-deep draft stops paying below 0.15 (the default
    # slope) after at most 6 of them (0.7^6 < 0.15 < 0.7^5).
    auto = counts_controller({"early": Knows(OUTPUT, 0, 40), "late": Knows(OUTPUT, 40, 80)})
    result = simulate(auto, PROMPT, OUTPUT, budget=8)
    first = Counter(choice for done, choice in auto.trace if done < 40)
    second = Counter(choice for done, choice in auto.trace if done >= 40)
    assert first["early"] > 0 and first["late"] == 0
    assert second["late"] >= 3 and second["early"] <= 6
    switch = [choice for _, choice in auto.trace].index("late")
    assert "early" not in [choice for _, choice in auto.trace[switch:]]
    assert result.steps < len(OUTPUT) / 3  # plain decoding takes 79 steps
    assert auto.choices() == {"early": first["early"] + second["early"], "late": second["late"],
                              "plain": first[None] + second[None]}


def test_the_first_steps_run_plain_until_a_held_proposal_is_scored():
    # step 1's proposal (8 true tokens) is held (the estimate starts at 0) and scored after 8 plain
    # steps; from then on every draft is verified and accepted in full (8 + the bonus per step)
    auto = counts_controller({"oracle": Knows(OUTPUT, 0, 80)})
    result = simulate(auto, PROMPT, OUTPUT, budget=8)
    assert [choice for _, choice in auto.trace[:9]] == [None] * 8 + ["oracle"]
    assert result.accepted_lengths[:8] == (0,) * 8 and set(result.accepted_lengths[8:-1]) == {8}


def test_a_draft_whose_window_costs_more_than_its_gain_is_never_verified():
    # a window of s positions costs 1 + 1.5 (s - 1) single steps: even an oracle's k accepted tokens
    # (k + 1 emitted) do not pay for k + 1 positions, so every step is plain
    dear = costs({1: 0.01, 5: 0.07})
    auto = counts_controller({"oracle": Knows(OUTPUT, 0, 80)}, dear)
    result = simulate(auto, PROMPT, OUTPUT, budget=8)
    assert result.drafted == 0 and result.steps == len(OUTPUT) - 1
    assert auto.choices() == {"oracle": 0, "plain": len(OUTPUT) - 2}  # the last step has no budget to propose
    cheaper = counts_controller({"oracle": Knows(OUTPUT, 0, 80)}, costs({1: 0.01, 5: 0.04}))  # 0.75 per position
    assert simulate(cheaper, PROMPT, OUTPUT, budget=8).accepted > 0


def test_a_member_whose_drafting_costs_more_than_its_gain_is_asked_only_to_probe():
    # windows are cheap (the default slope), but each drafted token costs a whole single step to draft
    # (a slow draft model): k <= 2 accepted tokens never pay for 1 + 0.15 k + 2 steps (a 2-token
    # proposal), so the member is asked to propose only as a probe: with a probe share of 0.1, a
    # probe costing 2 steps once every 2 / 0.1 = 20 steps, the first once 20 steps would pay for it
    # (steps 20, 40, 60), and near the end, where one token is left to draft, a 1-token probe after
    # 10 (step 74 of 74), the last draft verified in full. A probe's drafting is spent when the
    # choice is made (a plain step pays it too): its draft is verified when its window alone pays.
    asked: list[int] = []

    class Slow(Knows):
        def propose(self, context, budget):
            asked.append(auto.step)
            return super().propose(context, budget)

    auto = counts_controller({"slow": Slow(OUTPUT, 0, 80)}, token_cost=1.0, probe_share=0.1)
    result = simulate(auto, PROMPT, OUTPUT, budget=2)
    assert asked == [20, 40, 60, 74] and auto.step == 74
    steps_chosen = [step for step, (_, choice) in enumerate(auto.trace, 1) if choice == "slow"]
    assert set(steps_chosen) <= set(asked) and steps_chosen
    assert 0 < result.accepted == result.drafted


def test_with_every_member_useless_it_runs_plain_steps_only():
    # pld finds no repeated n-gram in 10, 11, ..., 89; the two others always propose wrong tokens.
    # Drafting is free in counts mode, so each member proposes at every step (78 steps propose);
    # with every_step_share 0 each proposes only on probes, the bound: 20 of the 78 steps
    members = {"pld": PromptLookup(), "wrong": Knows(OUTPUT, 0, 0), "also_wrong": Knows(OUTPUT, 80, 80)}
    for share, proposals in [(EVERY_STEP_SHARE, len(OUTPUT) - 2), (0.0, math.ceil((len(OUTPUT) - 2) / PROBE_EVERY))]:
        auto = counts_controller(members, every_step_share=share)
        result = simulate(auto, PROMPT, OUTPUT, budget=8)
        assert result.drafted == 0 and result.steps == len(OUTPUT) - 1
        assert [m.proposed for m in auto.members] == [proposals] * 3
        assert auto.choices() == {"pld": 0, "wrong": 0, "also_wrong": 0, "plain": len(OUTPUT) - 2}


def test_a_cheap_member_proposes_at_every_step_and_is_verified_where_its_draft_pays():
    # P(m >= 1) = 0.12, deeper 0: a 1-deep draft earns 1.12 tokens for a window of 1.15 single steps,
    # so no depth pays. A copy drafter (drafting free in counts mode) proposes at every step all the
    # same, and its proposals stay unverified; at P(m >= 1) = 0.5 each is verified cut to 1 token.
    # A draft model (a drafted token costs 0.25 of a step: 2 steps a proposal) and, with
    # every_step_share 0, a copy drafter that does not pay propose only as probes (the draft model's
    # first once 2 / 0.03 = 67 steps would pay for it; the copy drafter's every 4 steps). The
    # estimates stay as set: nothing is observed, so no proposal is scored.
    def asked(reach_1: float, token_cost: float = 0.0, every_step_share: float = EVERY_STEP_SHARE) -> tuple[int, int]:
        cost = VerifyCostModel()
        member = Member("m", Knows(OUTPUT, 0, 80), Backoff(cost), token_cost)
        member.estimate.reach[1] = reach_1
        auto = Auto([member], cost, AutoConfig(timed=False, every_step_share=every_step_share))
        auto.begin(PROMPT, np.zeros((len(PROMPT), 4), np.float32))
        verified = sum(len(auto.propose(np.concatenate([PROMPT, OUTPUT[:i]]), 8)) for i in range(12))
        return member.proposed, verified

    assert asked(0.12) == (12, 0)
    assert asked(0.0) == (12, 0)
    assert asked(0.5) == (12, 12)
    assert asked(0.12, token_cost=0.25) == (0, 0)
    assert asked(0.12, every_step_share=0.0) == (3, 0)  # steps 1, 5, 9
    assert asked(0.5, every_step_share=0.0) == (12, 12)  # it leads and pays


def test_a_member_that_was_not_chosen_still_observes_every_step():
    seen: list[list[int]] = []

    class Listener(Knows):
        def observe(self, emitted, feedback):
            seen.append(emitted.tolist())

    auto = counts_controller({"oracle": Knows(OUTPUT, 0, 80), "listener": Listener(OUTPUT, 80, 80)})
    simulate(auto, PROMPT, OUTPUT[:30], budget=4)
    assert np.concatenate(seen).tolist() == OUTPUT[1:30].tolist()
    assert auto.choices()["listener"] == 0


def test_config_is_checked():
    with pytest.raises(InvalidRequestError, match="probe_every"):
        AutoConfig(probe_every=0)
    with pytest.raises(InvalidRequestError, match="probe_share"):
        AutoConfig(probe_share=0.0)
    with pytest.raises(InvalidRequestError, match="every_step_share"):
        AutoConfig(every_step_share=1.5)
    with pytest.raises(InvalidRequestError, match="every_step_share"):
        AutoConfig(every_step_share=-0.1)
    with pytest.raises(InvalidRequestError, match="draft_token_cost"):
        AutoConfig(draft_token_cost=-1.0)
    member = Member("pld", PromptLookup(), Backoff(VerifyCostModel()))
    with pytest.raises(InvalidRequestError, match="repeat"):
        Auto([member, member], VerifyCostModel())


def test_seeded_sampling_decides_from_counts_and_keeps_no_estimate():
    state: dict = {}
    greedy = make(DrafterEnv(vocab=100, tree=False, state=state, verify_cost=lambda s: 0.01 * s))
    assert greedy.config.timed and [m.name for m in greedy.members] == ["pld", "suffix_decoding"]
    assert set(state["auto/estimates/chain"]) == {"pld", "suffix_decoding"}  # the next request starts from them
    seeded = make(DrafterEnv(vocab=100, tree=False, state={}, verify_cost=lambda s: 0.01 * s,
                             sampling=SamplingParams(temperature=1.0), seed=7))
    assert not seeded.config.timed and isinstance(seeded.cost, VerifyCostModel)
    assert "suffix_decoding" in state["auto/members"] and "suffix_decoding" not in state  # apart from the method's


def test_a_step_reads_each_measured_cost_once_and_a_request_reads_its_own():
    reads: Counter = Counter()

    def measured(s: int) -> float:  # the engine's estimate: 10 ms a step, 1 ms per extra position
        reads[s] += 1
        return 0.010 + 0.001 * (s - 1)

    def run(cost) -> Traced:
        members = [Member("pld", PromptLookup(), Backoff(cost)), Member("oracle", Knows(OUTPUT, 20, 60), Backoff(cost))]
        auto = Traced(members, cost, AutoConfig(timed=False))
        simulate(auto, PROMPT, OUTPUT, budget=8)
        return auto

    memo = run(MeasuredCost(measured))
    assert max(reads.values()) <= memo.step  # once a step at most, per window size
    unmemoized = run(costs({s: measured(s) for s in range(1, 10)}))  # the same figures, read every time
    assert memo.trace == unmemoized.trace and "oracle" in [choice for _, choice in memo.trace]
    # a request's members start from the last request's estimates, and read this request's cost
    state: dict = {}
    make(DrafterEnv(vocab=100, tree=False, state=state, verify_cost=lambda s: 0.01 * s))
    second = make(DrafterEnv(vocab=100, tree=False, state=state, verify_cost=measured))
    assert all(m.estimate.cost is second.cost for m in second.members) and second.cost.measured is measured


# ---------------------------------------------------------------------------------------------
# auto against plain decoding


@pytest.fixture(scope="module")
def model(tiny_artifact):
    return specrt.load(tiny_artifact[0])


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_auto_verifying_from_the_first_step_is_bit_exact_with_baseline(model, tree):
    # counts mode and warm estimates: the decisions do not depend on timing, and drafts are verified
    accepted, verified = 0, 0
    for prompt in PROMPTS:
        base = model.generate(prompt, method="baseline", max_new_tokens=40)
        cost = VerifyCostModel()
        env = DrafterEnv(vocab=model.manifest.dims.vocab, tree=tree, state={})
        controller = Auto([Member("pld", PromptLookup(tree=tree), warm(cost)),
                           Member("suffix_decoding", SuffixDecoding(env), warm(cost))], cost, AutoConfig(timed=False))
        ids, loop = model.generate_ids(model.encode(prompt), method=controller, tree=tree, max_new_tokens=40)
        assert tuple(ids.tolist()) == base.token_ids, prompt
        accepted += loop.stats.accepted
        verified += sum(n for name, n in controller.choices().items() if name != "plain")
    assert verified > 0 and accepted > 0  # drafts were verified and some of them kept


def test_auto_is_the_default_method(model):
    from specrt.cli import _parser

    loop, chunks = model.stream_ids(model.encode(PROMPTS[0]), max_new_tokens=8)
    list(chunks)
    assert isinstance(loop.drafter, Auto) and loop.backoff is None
    assert model.generate(PROMPTS[0], max_new_tokens=8).method == "auto"
    assert _parser().parse_args(["generate", "--model", "m", "p"]).method == "auto"


# ---------------------------------------------------------------------------------------------
# with a draft model: greedy bit for bit, sampling in law


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Pair:
    target_folder, draft_folder = build_tiny_pair(tmp_path_factory.mktemp("tiny-pair"))
    manifest = read_manifest(draft_folder)
    target = specrt.load(target_folder, draft=draft_folder)
    return Pair(target, target_folder, draft_folder,
                OrtDraftModel(OrtDecoder(draft_folder / manifest.decoder, manifest.dims)))


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_auto_with_a_draft_model_is_bit_exact_with_baseline(pair, tree):
    model = pair.target
    for prompt in PROMPTS:
        base = model.generate(prompt, method="baseline", max_new_tokens=40)
        ids, loop = model.generate_ids(model.encode(prompt), method="auto", tree=tree, max_new_tokens=40)
        assert tuple(ids.tolist()) == base.token_ids, prompt
        assert [m.name for m in loop.drafter.members] == ["pld", "suffix_decoding", "sd"]
    # a controller whose estimate expects matches verifies the draft model's drafts from the first step
    chosen: Counter = Counter()
    for prompt in PROMPTS:
        base = model.generate(prompt, method="baseline", max_new_tokens=40)
        cost = VerifyCostModel()
        sd = pair.drafter("sd", tree=tree, gamma=3)
        controller = Auto([Member("sd", sd, warm(cost), 0.25)], cost, AutoConfig(timed=False))
        ids, _ = model.generate_ids(model.encode(prompt), method=controller, tree=tree, max_new_tokens=40)
        assert tuple(ids.tolist()) == base.token_ids, prompt
        chosen.update(controller.choices())
    assert chosen["sd"] > 0, chosen


def warm(cost: VerifyCostModel) -> Backoff:
    """An estimate that expects 9 in 10 drafted tokens at every depth: drafts are verified at once."""
    estimate = Backoff(cost)
    estimate.reach[:] = 0.9
    return estimate


@pytest.mark.parametrize("how", ["by name", "warm"])
def test_auto_with_a_draft_model_samples_the_target_distribution(pair, how):
    # "by name": the registered method, seeded (counts, cold estimates: its first steps run plain);
    # "warm": a controller whose estimates expect matches, so the first step verifies a member's draft
    # (the draft model's sampled chain, with its q rows, or pld's), as tests/test_draft_model.py's
    # law test does for sd alone: the first three emitted tokens follow the target's law
    prompt_ids = pair.target.encode(PROMPTS[3])
    law = target_law(pair, prompt_ids, 3)
    counts: Counter = Counter()
    chosen: Counter = Counter()
    for seed in range(SEEDS):
        if how == "by name":
            drafter: object = "auto"
        else:
            cost = VerifyCostModel()
            sd = pair.drafter("sd", sampling=SAMPLING, seed=seed, gamma=2)
            drafter = Auto([Member("pld", PromptLookup(), warm(cost)), Member("sd", sd, warm(cost), 0.25)], cost,
                           AutoConfig(timed=False))
        ids, loop = pair.target.generate_ids(prompt_ids, method=drafter, max_new_tokens=4, temperature=1.0,
                                             top_k=SAMPLING.top_k, seed=seed)  # fmt: skip
        counts[tuple(ids[:3].tolist())] += 1
        chosen.update({name: n for name, n in loop.drafter.choices().items() if name != "plain"})
    assert chi2_pvalue(counts, law) > ALPHA, (counts.most_common(8), sorted(law.items(), key=lambda kv: -kv[1])[:8])
    if how == "warm":
        assert chosen["sd"] > SEEDS // 2, chosen


def test_seeded_sampling_with_auto_repeats(pair):
    model = pair.target
    ids = model.encode(PROMPTS[3])
    runs = []
    for _ in range(2):
        model.forget_history()  # the members' suffix history, as for suffix_decoding alone
        runs.append([model.generate_ids(ids, method="auto", max_new_tokens=24, temperature=1.0, seed=s)[0].tolist()
                     for s in range(4)])
    assert runs[0] == runs[1]
