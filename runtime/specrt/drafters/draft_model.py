"""``sd``, ``hsd``, ``hsd_capped``: drafts from a small draft model that shares the target's vocabulary.

The draft model runs autoregressively on its own KV cache (a ``DraftModel``, specrt.drafters.base)
and proposes a chain
of gamma tokens: the argmax under greedy decoding, draws from its own q under sampling, where q is
the draft's logits warped by the request's temperature / top-k / top-p exactly as the target's p
is (so q > 0 wherever the draft can sample). The q rows travel with the tree
(``DraftTree.draft_probs``) and the drafter's ``verifier`` names the accept rule
(specrt.engine.accept): token-wise speculative sampling (``sd``), hierarchical speculative decoding
(``hsd``, with forward sampling over the next steps when a block is left open) or HSD with capped
prefix ratios (``hsd_capped``). Greedy decoding walks the argmax, which is exact for any draft.

KV cache: the draft cache holds a prefix of the context, never its last token. Each proposal
feeds the context tokens it lacks (one, or two after full acceptance: the last drafted token and
the bonus), then one token per drafted position but the last. After the verifier emits its tokens
the cache is cut back to the longest prefix it shares with the new context: the accepted drafted
tokens stay, the rejected ones go, and the recovered / bonus token is fed by the next proposal.

Trees (``tree=True``): at a position where the draft is unsure (top-1 probability below
``branch_below``) the chain node gets one sibling leaf, while the budget lasts: the second most
likely token under greedy decoding; under ``sd`` sampling a draw from q without the chain's token
(sampling without replacement, verified by multi-candidate recursive rejection sampling). HSD's
joint rule verifies one sequence, so ``hsd`` / ``hsd_capped`` propose plain chains under sampling
(their verifier reads a tree's first-child path) and branch only under greedy decoding.

Adaptive gamma (``adaptive=True``): per request, the chain length maximises the expected tokens per
second of a step, ``E(gamma) / (gamma * draft_step + verify_cost(gamma + 1))`` over
``0 .. min(max_gamma, budget)``, with ``E(gamma) = sum_{i <= gamma} alpha^i = (1 - alpha^(gamma + 1))
/ (1 - alpha)`` the expected emitted tokens when each drafted token is accepted with probability
alpha until the first rejection (Leviathan et al. 2023, eq. 1). alpha is estimated from this
request's steps, ``(accepted + 1) / (accepted + rejections + 2)`` over counts decayed by
``DECAY`` per step (a rejection: a step that accepted fewer tokens than it drafted); draft_step is
the measured time of one draft forward, verify_cost the engine's measured verify-pass time (tree
siblings, a few extra positions, are not counted). Until both are measured, gamma is the given
``gamma``. Under HSD, whose acceptance is not token-wise, the same alpha is a heuristic.
gamma = 0 is a plain step (one token for ``verify_cost(1)``, no draft): where drafting does not pay
(a draft model too slow for its acceptance, as on 2 CPU cores with int4 weights) the request
backs off to plain decoding, and drafts once at the best positive length after ``PROBE_EVERY``
plain steps to measure alpha again (after 16, 32, ... up to ``PROBE_EVERY_MAX`` while probes do
not pay). The draft cache catches up on the skipped tokens at the next draft.

What adaptive gamma learns (:class:`GammaEstimate`: the acceptance counts, the draft step's time,
the probe interval) carries from one request of a model to the next, per method, decoding mode
(greedy or sampling) and chain or tree, in ``env.state``: a request starts where the last one
left off instead of drafting ``gamma`` tokens until its own measurements come in (what that costs
short requests: docs/methods.md). Seeded sampling is the exception: a decision
from measured times would pick which random numbers the request draws, and the request would not
repeat. There gamma is chosen from counts only, a fresh estimate per request, with a draft step
costing ``DRAFT_TOKEN_COST`` single steps and a window of s positions ``1 + DEFAULT_SLOPE (s - 1)``
(specrt.cost).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from specrt.cost import default_cost_ratio
from specrt.drafters.base import DrafterEnv, DraftModel, Feedback
from specrt.errors import ArtifactError, InvalidRequestError
from specrt.sampling import SamplingParams, sample, target_probs
from specrt.sequences import common_prefix
from specrt.tree import DraftTree

GAMMA = 4  # drafted tokens per step, before adaptive gamma has measurements
BRANCH_BELOW = 0.5  # tree mode: add a sibling where the draft's top-1 probability is below this
HEADROOM = 256  # draft-cache positions beyond the prompt allocated at begin (grown on demand)
DECAY = 0.9  # weight of the older steps in the acceptance counts
PROBE_EVERY = 8  # adaptive gamma: plain steps before the first probing draft when drafting does not pay
PROBE_EVERY_MAX = 128  # ... doubling after every probe that did not pay, up to this
ACCEPTANCE = ("sd", "hsd", "hsd_capped")  # the accept rules a draft model drafts for (specrt.engine.accept)
DRAFT_STREAM = 1  # the drafter's random stream: seed [seed, 1] (the engine's is seed)
DRAFT_TOKEN_COST = 0.25  # seeded sampling (counts): one draft forward, in target single steps
ESTIMATE_STATE_KEY = "draft_model/gamma"  # env.state key prefix of the estimates a model's next request starts from


@dataclass
class GammaEstimate:
    """What adaptive gamma has learnt so far (a request's, or carried over from the model's last ones)."""

    accepted: float = 0.0  # decayed count of accepted drafted tokens
    rejections: float = 0.0  # decayed count of steps that stopped before the end of their chain
    draft_step_s: float | None = None  # running mean of one single-token draft forward
    probe_every: int = PROBE_EVERY  # plain steps between probes (doubles while probes do not pay)

    @property
    def alpha(self) -> float:
        """Estimated probability that a drafted token is accepted (Laplace-smoothed)."""
        return (self.accepted + 1.0) / (self.accepted + self.rejections + 2.0)


def expected_tokens(alpha: float, gamma: np.ndarray) -> np.ndarray:
    """[k] expected tokens emitted by a step drafting ``gamma`` ([k]) tokens, each accepted with
    probability ``alpha`` until the first rejection: ``sum_{i=0}^{gamma} alpha^i``."""
    return np.array([np.sum(alpha ** np.arange(int(g) + 1)) for g in gamma])


def best_gamma(
    alpha: float, draft_step_s: float, verify_cost: Callable[[int], float | None], limit: int, minimum: int = 0
) -> int | None:
    """The gamma in ``minimum .. limit`` maximising ``E(gamma) / (gamma * draft_step_s + verify_cost(gamma + 1))``;
    0 (a plain step: one token for ``verify_cost(1)``) when no draft length pays for itself. None
    while a verify cost is not measured (``verify_cost`` answers None or 0)."""
    gammas = np.arange(minimum, limit + 1)  # [limit + 1 - minimum]
    verify = np.array([verify_cost(int(g) + 1) or 0.0 for g in gammas])  # [limit] seconds
    if np.any(verify <= 0):
        return None
    rate = expected_tokens(alpha, gammas) / (gammas * draft_step_s + verify)
    return int(gammas[np.argmax(rate)])


class DraftModelDrafter:
    """Draft-model speculative decoding for one request.

    decoder: a KV cache on the draft model (reset at ``begin``; its vocabulary may be padded
        differently from the target's: ids the target lacks are never drafted). It feeds a prompt
        in chunks of its own (specrt.backend.draft_model.OrtDraftModel: ``prefill_chunk``).
    env: ``vocab`` and ``tree``; ``sampling`` and ``seed`` (None: greedy drafts, fresh entropy);
        ``verify_cost`` for adaptive gamma.
    acceptance: the accept rule under sampling, ``sd`` | ``hsd`` | ``hsd_capped`` (the method's; the
        engine applies it, and this drafter drafts for it: an open HSD block's levels, plain chains
        under HSD sampling).
    gamma: drafted tokens per step (the start value when adaptive); max_gamma caps adaptive gamma
        (default: the engine's budget). branch_below: see the module docstring.
    """

    def __init__(
        self,
        decoder: DraftModel,
        env: DrafterEnv,
        *,
        acceptance: str = "sd",
        gamma: int = GAMMA,
        adaptive: bool = False,
        max_gamma: int | None = None,
        branch_below: float = BRANCH_BELOW,
    ):
        if gamma < 1:
            raise InvalidRequestError(f"gamma must be >= 1, got {gamma}")
        if max_gamma is not None and max_gamma < 1:
            raise InvalidRequestError(f"max_gamma must be >= 1, got {max_gamma}")
        if not 0.0 <= branch_below <= 1.0:
            raise InvalidRequestError(f"branch_below must lie in [0, 1], got {branch_below}")
        self.decoder = decoder
        self.vocab = env.vocab
        self.tree = env.tree
        self.sampling = env.sampling if env.sampling is not None else SamplingParams()
        self.rng = np.random.default_rng(None if env.seed is None else [env.seed, DRAFT_STREAM])
        self.verify_cost = env.verify_cost
        if acceptance not in ACCEPTANCE:
            raise InvalidRequestError(f"acceptance must be one of {ACCEPTANCE}, got {acceptance!r}")
        self.acceptance = acceptance
        self.open_levels = 0  # levels of an open HSD block the next proposal drafts (Feedback.open_levels)
        self.gamma = gamma
        self.adaptive = adaptive
        self.max_gamma = max_gamma
        self.branch_below = branch_below
        self.cached = np.zeros(0, np.int64)  # [capacity] cached[:decoder.past] = the tokens in the draft cache
        self.context = np.zeros(0, np.int64)  # [t] the context after the last observed step
        self.block = 0  # chain length of the last proposal; 0 when it continued an open HSD block
        # seeded sampling decides from counts (the module docstring); otherwise from measured times,
        # with the estimate the model's last request of this method and mode left
        self.timed = env.seed is None or self.sampling.greedy
        if self.timed and adaptive:
            mode = f"{acceptance}/{'greedy' if self.sampling.greedy else 'sampling'}/{'tree' if self.tree else 'chain'}"
            self.estimate: GammaEstimate = env.state.setdefault(f"{ESTIMATE_STATE_KEY}/{mode}", GammaEstimate())
        else:
            self.estimate = GammaEstimate()
        self.plain_steps = 0  # adaptive gamma: plain steps since drafting last paid or probed
        self.last_gamma = 0  # chain length chosen for the last new block

    @property
    def alpha(self) -> float:
        """Estimated probability that a drafted token is accepted (Laplace-smoothed)."""
        return self.estimate.alpha

    # -- the drafter protocol --------------------------------------------------------------------

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        self.open_levels = 0
        self._allocate(min(self.decoder.max_context, len(prompt) + HEADROOM))

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        open_levels = self.open_levels
        n = min(open_levels, budget) if open_levels else self.choose_gamma(budget)
        n = min(n, self.decoder.max_context + 1 - len(context))  # drafted positions the draft model holds
        if n < 1:
            if open_levels:  # cannot happen: an open block's levels fit the budget and context its block fitted
                raise RuntimeError(f"an open HSD block needs a draft of its next level (budget {budget})")
            self.block = 0  # a plain step: nothing drafted, nothing to learn acceptance from
            self.context = np.asarray(context, np.int64)
            return DraftTree.empty()
        self.block = 0 if open_levels else n
        self.last_gamma = self.block or self.last_gamma
        self.context = np.asarray(context, np.int64)
        logits = self._sync(self.context, n)  # [draft vocab] at the context's last token
        greedy = self.sampling.greedy
        branch = self.tree and not open_levels and (greedy or self.acceptance == "sd")
        tokens: list[int] = []
        rows: list[np.ndarray] = []  # [vocab] q per chain node (sampling)
        siblings: list[tuple[int, int, np.ndarray | None]] = []  # (parent node, token, q row)
        for i in range(n):
            z = self._fit_vocab(logits)  # [vocab]
            if greedy:
                x = int(np.argmax(z))
                if branch and len(siblings) < budget - n:
                    probs = np.exp(z - z[x])
                    probs /= probs.sum()
                    if probs[x] < self.branch_below:
                        probs[x] = -1.0
                        siblings.append((i - 1, int(np.argmax(probs)), None))
            else:
                q = target_probs(z[None], self.sampling)[0]  # [vocab]
                x = int(np.argmax(q)) if open_levels else sample(q, self.rng)  # forward levels: a guess
                rows.append(q)
                if branch and len(siblings) < budget - n and q.max() < self.branch_below:
                    rest = q.copy()
                    rest[x] = 0.0
                    if rest.sum() > 0:  # drawn from q without x
                        siblings.append((i - 1, sample(rest, self.rng), q))
            tokens.append(x)
            if i + 1 < n:
                logits = self._step(x)
        ids = np.array(tokens + [s[1] for s in siblings], np.int64)
        parents = np.array(list(range(-1, n - 1)) + [s[0] for s in siblings], np.int64)
        draft_probs = None if greedy else np.stack(rows + [s[2] for s in siblings])  # [nodes, vocab]
        return DraftTree(ids, parents, draft_probs)

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        if self.block:
            accepted, estimate = len(feedback.path), self.estimate
            estimate.accepted = DECAY * estimate.accepted + accepted
            estimate.rejections = DECAY * estimate.rejections + float(accepted < self.block)
        self.open_levels = feedback.open_levels
        self.context = np.concatenate([self.context, emitted])
        self._keep_prefix_of(self.context)

    # -- the draft model's cache -----------------------------------------------------------------

    def _allocate(self, capacity: int) -> None:
        self.decoder.reset(capacity)
        self.cached = np.zeros(self.decoder.capacity, np.int64)

    def _keep_prefix_of(self, context: np.ndarray) -> None:
        """Cut the cache back to the longest prefix it shares with ``context``, its last token excluded."""
        past = self.decoder.past
        n = min(past, len(context) - 1)
        keep = common_prefix(self.cached[:n], context[:n])
        if keep < past:
            self.decoder.truncate(keep)

    def _sync(self, context: np.ndarray, n: int) -> np.ndarray:
        """Feed the context tokens the cache lacks, with room for ``n`` drafted tokens after them;
        the draft's logits ([draft vocab]) after the context's last token."""

        self._keep_prefix_of(context)
        if len(context) + n - 1 > self.decoder.capacity:  # grow (rare): start over in a bigger cache
            grown = max(len(context) + HEADROOM, 2 * self.decoder.capacity)
            self._allocate(min(self.decoder.max_context, grown))
        past = self.decoder.past
        logits = self.decoder.forward(context[past:])
        self.cached[past : len(context)] = context[past:]
        return logits

    def _step(self, token: int) -> np.ndarray:
        """Feed one drafted token; the draft's logits ([draft vocab]) after it."""
        t0 = time.perf_counter()
        past = self.decoder.past
        logits = self.decoder.forward(np.array([token], np.int64))
        elapsed, old = time.perf_counter() - t0, self.estimate.draft_step_s
        self.estimate.draft_step_s = elapsed if old is None else DECAY * old + (1 - DECAY) * elapsed
        self.cached[past] = token
        return logits

    def _fit_vocab(self, logits: np.ndarray) -> np.ndarray:
        """The draft's logits over the target's ids ([vocab]): padded ids of either side are never drafted."""
        if len(logits) >= self.vocab:
            return logits[: self.vocab]
        return np.concatenate([logits, np.full(self.vocab - len(logits), -np.inf, logits.dtype)])

    def choose_gamma(self, budget: int) -> int:
        """Chain length of a new block (see the module docstring: fixed, or adaptive; adaptive
        answers 0, a plain step, while no draft pays for itself, and probes with the best positive
        length after ``PROBE_EVERY`` plain steps, then twice as many each time a probe did not pay, so
        that alpha keeps being measured at a vanishing cost)."""
        limit = budget if self.max_gamma is None else min(self.max_gamma, budget)
        fixed = min(self.gamma, limit)
        costs = self._costs()
        if not self.adaptive or costs is None or limit < 1:
            return fixed
        draft_step, verify_cost = costs
        best = best_gamma(self.alpha, draft_step, verify_cost, limit)
        if best is None:
            return fixed
        estimate = self.estimate
        if best > 0:
            self.plain_steps, estimate.probe_every = 0, PROBE_EVERY
            return best
        self.plain_steps += 1
        if self.plain_steps < estimate.probe_every:
            return 0
        self.plain_steps = 0  # probe: draft once more at the best positive length; wait longer next time
        estimate.probe_every = min(2 * estimate.probe_every, PROBE_EVERY_MAX)
        return best_gamma(self.alpha, draft_step, verify_cost, limit, minimum=1) or 1

    def _costs(self) -> tuple[float, Callable[[int], float | None]] | None:
        """(one draft forward, a verify pass by window size) in one unit for adaptive gamma: measured
        seconds, or single steps counted under seeded sampling; None before a draft step is measured
        or without a verify cost."""
        if not self.timed:
            return DRAFT_TOKEN_COST, default_cost_ratio
        if self.estimate.draft_step_s is None or self.verify_cost is None:
            return None
        return self.estimate.draft_step_s, self.verify_cost


def _make(env: DrafterEnv, acceptance: str) -> DraftModelDrafter:
    if env.draft_model is None:
        raise InvalidRequestError(
            f"method {acceptance!r} needs a draft model: load the target with a draft (specrt.load(..., draft=...))"
        )
    return DraftModelDrafter(env.draft_model(), env, acceptance=acceptance, adaptive=True)


def make_sd(env: DrafterEnv) -> DraftModelDrafter:
    return _make(env, "sd")


def make_hsd(env: DrafterEnv) -> DraftModelDrafter:
    return _make(env, "hsd")


def make_hsd_capped(env: DrafterEnv) -> DraftModelDrafter:
    return _make(env, "hsd_capped")


# -- vocabulary compatibility --------------------------------------------------------------------


def _id_table(path: Path) -> dict[int, tuple[str, bool]]:
    """id -> (token, special) of every id of a tokenizer.json, added tokens included."""
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises a bare Exception on bad JSON
        raise ArtifactError(f"{path}: not a valid tokenizer.json ({e})") from None
    table = {i: (token, False) for token, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    for i, added in tokenizer.get_added_tokens_decoder().items():
        table[i] = (added.content, bool(added.special))
    return table


def _show(entry: tuple[str, bool] | None) -> str:
    if entry is None:
        return "(no token)"
    return repr(entry[0]) + (" (special)" if entry[1] else "")


def check_vocab_compatible(target_tokenizer_json: Path, draft_tokenizer_json: Path) -> None:
    """Refuse (ArtifactError) a draft whose tokenizer maps any id to another token than the target's,
    special and added tokens included; the message names the first ids that differ."""
    target, draft = _id_table(Path(target_tokenizer_json)), _id_table(Path(draft_tokenizer_json))
    differ = [i for i in sorted(set(target) | set(draft)) if target.get(i) != draft.get(i)]
    if differ:
        first = "; ".join(f"id {i}: target {_show(target.get(i))}, draft {_show(draft.get(i))}" for i in differ[:5])
        raise ArtifactError(
            f"draft tokenizer {draft_tokenizer_json} does not match the target's {target_tokenizer_json}: "
            f"{len(differ)} ids differ ({len(target)} ids in the target, {len(draft)} in the draft); first {first}"
        )
