"""``auto``: a cost-aware controller that picks, at every step, the draft that pays most (or none).

The members are drafters of their own (``pld``, ``suffix_decoding``, ``sam_decoding`` when a
datastore is loaded, ``sd`` when a draft model is loaded). Each keeps a back-off estimate of its
acceptance (:class:`specrt.backoff.Backoff`: P(m >= d), scored in hindsight against the tokens the
request emitted, whether or not its proposal was verified). A step:

    asked   = every member whose proposal costs at most EVERY_STEP_SHARE of a single step (below);
              the member whose best chain promises most, if it pays for its window and its
              drafting cost; and the members whose probe is due (PROBE_EVERY steps since it last
              proposed, more for a member whose proposal costs more than PROBE_SHARE of those steps)
    D       = the asked members' drafting cost this step, in single steps (c(1) = 1)
    choose  = argmax over asked members m and depths k of  (1 + E_m[min(a, k)]) / (c(n_k + 1) / c(1) + D)
              against a plain step's 1 / (1 + D); ties go to the member listed first

and the chosen tree, cut to depth k, is verified (empty: a plain step). Every member observes every
step's emitted tokens and the verifier's feedback (for the verified window, whoever proposed it),
so a member that was not chosen still learns the text.

A member whose proposal costs at most EVERY_STEP_SHARE of a single step (a copy drafter's:
0.05-0.3 ms against 15 ms for the 0.5B int4 on 2 cores; a draft model's does not) proposes at
every step, whatever its estimate. The estimate is an average over the request's proposals, but
the proposal in hand may be a long match that pays: the best cut decides on the tree itself, as
the engine's back-off does for a method alone, and a draft that does not pay is not verified.
Asked only when its average paid, ``suffix_decoding`` as the only member verified 1.62 tokens a
step on Spec-Bench where the method alone verified 1.67-1.68 (docs/methods.md has the command);
only a proposal made is scored, so a member asked on probes is also slow to learn that the text
has turned its way.

Costs: a window's c(s) is the engine's measured verify cost (``env.verify_cost``); a member's
drafting cost is the running mean of its measured ``propose`` time (a draft model's forward passes
and its catch-up included) over c(1). That is under greedy decoding and unseeded sampling. Under
seeded sampling the decision must not follow wall-clock jitter (it picks which random numbers a
request draws), so it uses counts only: c(s) / c(1) = 1 + DEFAULT_SLOPE (s - 1), drafting costs 0
for model-free members and ``draft_token_cost`` single steps per drafted token for a draft model,
and no estimate carried over from earlier requests: a seeded request repeats.

Output never depends on the controller: it only picks which tokens are verified, and every verify
step is exact (greedy) or keeps the target's law (sampling: deterministic drafts by
``walk_sampling``, a draft model's sampled chain by recursive rejection sampling on its q rows).

Probe bound: a member that neither proposes at every step nor pays proposes, unverified, once
every max(``probe_every``, D_m / ``probe_share``) steps, where D_m is what one of its proposals
costs (a full-budget draft; measured, or counted in seeded mode and before its first proposal),
so probing spends at most ``probe_share`` of the steps on drafting: a draft model whose 8-token
draft costs 2 target steps probes every 67 steps, a copy drafter with ``every_step_share`` 0
every 4. A member's first probe comes at step (D_m + catch-up) / ``probe_share``, the catch-up
being a draft model's prefill of the context so far (at once for a member that drafts for free).
Its proposals are verified only once the estimate says they pay. With every member useless (no
proposal ever matches the next token) no draft is verified: every step is a plain step; a member
that proposes at every step spends at most ``every_step_share`` of each on its proposal, any
other proposes on at most ceil(steps / probe_every) of them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specrt.backoff import Backoff
from specrt.cost import VerifyCostModel
from specrt.drafters.base import Drafter, DrafterEnv, Feedback
from specrt.drafters.draft_model import DRAFT_TOKEN_COST
from specrt.drafters.indexes.datastore import STATE_KEY as DATASTORE_STATE_KEY
from specrt.errors import InvalidRequestError
from specrt.tree import DraftTree

PROBE_EVERY = 4  # steps between the proposals of a member that does not pay, at least
PROBE_SHARE = 0.03  # the share of the steps since its last proposal that a probe may cost, at most
EVERY_STEP_SHARE = 0.02  # a member proposes at every step if a proposal costs at most this share of a single step
# a draft model's prefill of one context token it has not seen, in target single steps: a prior
# (a batched pass, a fraction of a drafted token) for its first probe, which catches the whole
# context up; measured propose times replace it after that
DRAFT_CATCH_UP_COST = 0.05
MEMBER_STATE_KEY = "auto/members"  # env.state key of the members' own state (apart from the methods')
ESTIMATE_STATE_KEY = "auto/estimates"  # env.state key of the members' acceptance estimates, by mode


@dataclass(frozen=True)
class AutoConfig:
    probe_every: int = PROBE_EVERY
    probe_share: float = PROBE_SHARE
    every_step_share: float = EVERY_STEP_SHARE  # 0: a member proposes only when it leads and pays, or to probe
    timed: bool = True  # drafting costs from measured propose times; False: from counts (seeded sampling)
    draft_token_cost: float = DRAFT_TOKEN_COST  # counts mode, for members with ``token_cost`` None

    def __post_init__(self) -> None:
        if not isinstance(self.probe_every, int) or self.probe_every < 1:
            raise InvalidRequestError(f"probe_every must be an int >= 1, got {self.probe_every!r}")
        if not 0.0 < self.probe_share <= 1.0:
            raise InvalidRequestError(f"probe_share must be in (0, 1], got {self.probe_share!r}")
        if not 0.0 <= self.every_step_share <= 1.0:
            raise InvalidRequestError(f"every_step_share must be in [0, 1], got {self.every_step_share!r}")
        if not self.draft_token_cost >= 0.0:
            raise InvalidRequestError(f"draft_token_cost must be >= 0, got {self.draft_token_cost!r}")


class MeasuredCost:
    """The engine's measured verify cost (``DrafterEnv.verify_cost``) where a Backoff wants a cost
    model, read once per window size per step: a step weighs every member at every depth (~80
    lookups at budget 8 with three members), and the engine's estimate takes a lock each time."""

    def __init__(self, measured: Callable[[int], float]):
        self.measured = measured  # seconds of one verify pass over s positions; 0.0: not measured yet
        self._step: dict[int, float] = {}  # window size -> seconds, this step

    def estimate(self, s: int) -> float:
        seconds = self._step.get(s)
        if seconds is None:
            seconds = self._step[s] = self.measured(s)
        return seconds

    def new_step(self) -> None:
        """Forget this step's readings: the engine has recorded a pass since."""
        self._step.clear()


class Member:
    """One drafter under the controller, with its acceptance estimate and its drafting cost."""

    def __init__(self, name: str, drafter: Drafter, estimate: Backoff, token_cost: float = 0.0,
                 catch_up_cost: float = 0.0):
        self.name = name
        self.drafter = drafter
        self.estimate = estimate
        self.token_cost = token_cost  # counts mode: single steps per drafted token (0: model-free)
        self.catch_up_cost = catch_up_cost  # single steps per context token before its first proposal
        self.propose_s: float | None = None  # running mean of one propose call, seconds
        self.last_asked: int | None = None  # step of its last proposal
        self.proposed = 0  # proposals made (probes included)
        self.chosen = 0  # proposals verified

    def record_time(self, seconds: float) -> None:
        old = self.propose_s
        self.propose_s = seconds if old is None else 0.8 * old + 0.2 * seconds


class Auto:
    """The controller as a drafter: :meth:`propose` returns the chosen member's tree, cut to what pays."""

    def __init__(self, members: list[Member], cost: VerifyCostModel | MeasuredCost, config: AutoConfig = AutoConfig()):
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise InvalidRequestError(f"auto: member names repeat: {names}")
        self.members = members
        self.cost = cost
        self.config = config
        self.step = 0
        self.plain = 0  # steps whose proposals all lost to a plain step (or none was made)
        self.last_choice: str | None = None  # the member whose tree the last step verified
        self._context = np.zeros(0, np.int64)  # [t] the context after the last step
        self._ratios: dict[int, list[float]] = {}  # id of a cost model -> its cost ratios, this step

    # -- costs, in single steps (c(1) = 1)

    def drafting_cost(self, member: Member, drafted: int) -> float:
        """What one proposal of ``drafted`` tokens by ``member`` costs, in single steps."""
        one = self.cost.estimate(1)
        if self.config.timed and member.propose_s is not None and one > 0:
            return member.propose_s / one
        return member.token_cost * drafted

    def ratios(self, estimate: Backoff, budget: int) -> list[float]:
        """[budget + 1] c(s) / c(1) for s = 1 .. budget + 1 on ``estimate``'s cost model, read once a step."""
        key = id(estimate.cost)
        ratios = self._ratios.get(key)
        if ratios is None or len(ratios) < budget + 1:
            ratios = self._ratios[key] = estimate.cost_ratios(budget + 1)
        return ratios

    def promise(self, member: Member, budget: int) -> float:
        """The best rate (1 + E[accepted, cut at k]) / (c(k + 1) + drafting) that a chain of depth
        k <= ``budget`` from ``member`` is expected to reach, in tokens per single step (a plain
        step: 1.0; 0.0 when no depth is possible)."""
        estimate = member.estimate
        ratios = self.ratios(estimate, budget)
        best, accepted = 0.0, 0.0  # accepted: E[min(m, k)]
        for k, reach in enumerate(estimate.reach[1 : budget + 1].tolist(), start=1):
            accepted += reach
            best = max(best, (1.0 + accepted) / (ratios[k] + self.drafting_cost(member, k)))  # c(k + 1) / c(1)
        return best

    def probe_due(self, member: Member, budget: int, context_len: int) -> bool:
        """Whether ``member`` proposes this step as a probe (whether or not it pays)."""
        share = self.config.probe_share
        if member.last_asked is None:  # its first probe once the steps so far would pay for it, catch-up included
            return self.step >= (self.drafting_cost(member, budget) + member.catch_up_cost * context_len) / share
        return self.step - member.last_asked >= max(self.config.probe_every, self.drafting_cost(member, budget) / share)

    def every_step(self, member: Member, budget: int) -> bool:
        """Whether ``member`` proposes at every step (the module docstring): a proposal costs at most
        ``every_step_share`` of a single step."""
        share = self.config.every_step_share
        return share > 0 and self.drafting_cost(member, budget) <= share

    # -- the drafter protocol

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        self._context = np.asarray(prompt, np.int64)
        for member in self.members:
            member.drafter.begin(prompt, hidden_states)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        self.step += 1
        if isinstance(self.cost, MeasuredCost):
            self.cost.new_step()
        self._ratios.clear()
        self._context = np.asarray(context, np.int64)
        self.last_choice = None
        offers: list[tuple[Member, DraftTree]] = []
        drafting = 0.0  # single steps spent on this step's proposals
        # the members that cost next to nothing, the one that promises most if it pays, and those
        # whose probe is due; the others would only spend their drafting cost on a draft that is
        # not expected to win (the promises are needed only when a member is not asked anyway)
        every = [self.every_step(member, budget) for member in self.members]
        leader = None
        if not all(every):
            promises = [self.promise(member, budget) for member in self.members]
            best_i = max(range(len(self.members)), key=lambda i: promises[i])  # ties: the first listed
            leader = best_i if promises[best_i] > 1.0 else None
        for i, member in enumerate(self.members):
            if not (every[i] or i == leader or self.probe_due(member, budget, len(context))):
                continue
            t0 = time.perf_counter()
            tree = member.drafter.propose(context, budget)
            member.record_time(time.perf_counter() - t0)
            member.last_asked = self.step
            member.proposed += 1
            drafting += self.drafting_cost(member, len(tree))
            if len(tree):
                member.estimate.track(tree, len(context))
                offers.append((member, tree))
        best: tuple[Member, int] | None = None
        best_rate = 1.0 / (1.0 + drafting)  # a plain step
        for member, tree in offers:
            depth, rate = member.estimate.best_cut(tree, drafting, self.ratios(member.estimate, budget))
            if depth > 0 and rate > best_rate:
                best, best_rate = (member, depth), rate
        if best is None:
            self.plain += 1
            return DraftTree.empty()
        member, depth = best
        member.chosen += 1
        self.last_choice = member.name
        return next(tree for m, tree in offers if m is member).truncated(depth)

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        self._context = np.concatenate([self._context, np.asarray(emitted, np.int64)])
        for member in self.members:
            member.drafter.observe(emitted, feedback)
            member.estimate.observe_context(self._context)

    def choices(self) -> dict[str, int]:
        """Steps that verified each member's draft, and plain steps (``"plain"``)."""
        return {**{m.name: m.chosen for m in self.members}, "plain": self.plain}


def members_for(env: DrafterEnv) -> list[str]:
    """The methods ``auto`` runs for ``env``: the cheap online drafters, retrieval with a datastore,
    the draft model (``sd``) with a draft loaded."""
    names = ["pld", "suffix_decoding"]
    if env.datastore is not None:
        names.append("sam_decoding")
    if env.draft_model is not None:
        names.append("sd")
    return names


def make(env: DrafterEnv) -> Auto:
    from specrt.drafters import METHODS  # the registry imports this module
    from specrt.drafters.draft_model import DraftModelDrafter

    seeded = env.seed is not None and env.sampling is not None and not env.sampling.greedy
    config = AutoConfig(timed=not seeded)
    # the members learn under keys of their own, apart from the same methods run alone (those are
    # lent per method name: a concurrent request of ``pld`` must not share ``auto``'s state)
    state = env.state.setdefault(MEMBER_STATE_KEY, {})
    if DATASTORE_STATE_KEY in env.state or env.datastore is not None:
        state[DATASTORE_STATE_KEY] = env.state.setdefault(DATASTORE_STATE_KEY, {})
    member_env = dataclasses.replace(env, state=state)
    if config.timed and env.verify_cost is not None:
        cost: VerifyCostModel | MeasuredCost = MeasuredCost(env.verify_cost)
        kept = env.state.setdefault(f"{ESTIMATE_STATE_KEY}/{'tree' if env.tree else 'chain'}", {})
    else:
        cost, kept = VerifyCostModel(), {}  # counts: the default slope; a fresh estimate per request
    members = []
    for name in members_for(env):
        if name == "sd":  # a fixed chain: the controller cuts it, so the drafter's own adaptive gamma is off
            assert env.draft_model is not None
            drafter: Drafter = DraftModelDrafter(env.draft_model(), member_env, acceptance="sd")
            token_cost, catch_up_cost = config.draft_token_cost, DRAFT_CATCH_UP_COST
        else:
            drafter, token_cost, catch_up_cost = METHODS[name].make(member_env), 0.0, 0.0
        estimate = kept[name].carried_over(cost) if name in kept else Backoff(cost)
        kept[name] = estimate  # the next request of this model starts from it (timed mode)
        members.append(Member(name, drafter, estimate, token_cost, catch_up_cost))
    return Auto(members, cost, config)
