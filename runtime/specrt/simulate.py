"""Offline acceptance simulator: replay a recorded greedy generation through a drafter.

Under greedy decoding the target's argmax at every accepted position is the next recorded token,
so the acceptance a drafter would have had needs no model (Arctic Inference's simulator idea)::

    record = record_generation(model, model.encode(prompt), max_new_tokens=128)   # one baseline run
    for factor in (0.5, 1.0, 2.0):
        result = simulate(lambda env: SuffixDecoding(env, max_spec_factor=factor),
                          record.prompt_ids, record.output_ids, budget=8,
                          max_new_tokens=record.max_new_tokens)
        print(factor, result.tokens_per_step, result.drafted)

Each step mirrors specrt.engine.loop: ``propose(context, budget)`` with the budget cut to what can
still be emitted, a walk of the tree against the recorded continuation (a node is accepted iff
its token is the recorded token at its depth and its parent was accepted), emitted = accepted +
the next recorded token, ``observe(emitted, feedback)``, until the record is exhausted. The
feedback's ``logits`` and ``hidden_states`` are zero-size arrays ([n + 1, 0]), as are the
prompt's hidden states passed to ``begin`` ([t, 0]): drafters that need them (heads reading the
target's hidden states) get nothing to read and cannot be simulated. ``accepted`` equals the
engine's ``LoopStats.accepted`` for the same drafter, budget and record, except past an EOS that
ended the record (the target's tokens after it are unknown here, so drafts past it count as
rejected) and when the model's context limit, not ``max_new_tokens``, caps the budget.

To carry a global history (``suffix_decoding``, ``asd``) across records, pass one ``env`` to
several calls, in the order the requests were served.

Tuning defaults: record a few dozen prompts once (minutes on CPU), then sweep options offline;
replaying 20 records (1,600 tokens, Spec-Bench prompts, Qwen2.5-Coder-0.5B) through
``suffix_decoding`` takes ~0.3 s per configuration. Compare ``tokens_per_step`` and, for speed,
``projected_speedup(cost_ratio)``: tokens per unit of verify cost, where ``cost_ratio(s)`` is
what a verify pass over s positions costs in single steps on the target machine (measure it with
``scripts/window_cost.py``), free of the timing noise of real runs.

The engine's back-off (:mod:`specrt.backoff`, on by default for model-free methods) replays too:
pass ``backoff=Backoff(cost)``, with ``cost`` a ``VerifyCostModel`` holding the measured window
times; it cuts each proposal as in a real run, and ``held_back`` counts the plain steps it chose.
Carry its estimate from one record to the next with ``backoff.carried_over()``, as a model does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specrt.backend.window import KEY_BLOCK, fit_window
from specrt.backoff import Backoff
from specrt.drafters.base import Drafter, DrafterEnv, Feedback
from specrt.engine.accept import walk_greedy
from specrt.tree import DraftTree

if TYPE_CHECKING:
    from specrt.model import SpecModel


@dataclass(frozen=True)
class Record:
    """A plain greedy generation to replay."""

    prompt_ids: np.ndarray  # [t] int64
    output_ids: np.ndarray  # [k] int64, what plain decoding emitted (an EOS that ended it included)
    max_new_tokens: int  # the limit it ran under (caps the budget near the end, as in the engine)


@dataclass(frozen=True)
class SimulationResult:
    steps: int  # verify steps (the prefill's first token is not one)
    drafted: int  # draft-tree nodes proposed
    accepted: int  # drafted tokens matching the record
    tokens_per_step: float  # mean tokens emitted per step: (k - 1) / steps (tau)
    accepted_lengths: tuple[int, ...]  # [steps] accepted tokens per step
    window_sizes: tuple[int, ...] = ()  # [steps] positions verified per step: root + draft nodes
    held_back: int = 0  # steps whose proposal the back-off cut to nothing (plain steps)
    decode_tokens: int = 0  # tokens the steps emitted: k - 1

    def verify_cost(self, cost_ratio: Callable[[int], float]) -> float:
        """The steps' summed cost in single steps, when a verify pass over s positions costs
        ``cost_ratio(s)`` of them (``cost_ratio(1)`` = 1)."""
        return sum(cost_ratio(s) for s in self.window_sizes)

    def projected_speedup(self, cost_ratio: Callable[[int], float]) -> float:
        """Decode speed over plain decoding's at that cost: tokens emitted by the steps over their
        :meth:`verify_cost`. Drafting and bookkeeping time are left out."""
        cost = self.verify_cost(cost_ratio)
        return self.decode_tokens / cost if cost > 0 else 0.0


def record_generation(model: SpecModel, prompt_ids: np.ndarray | list[int], max_new_tokens: int) -> Record:
    """One plain greedy run of ``model`` (method "baseline") on ``prompt_ids``, to replay."""
    prompt = np.asarray(prompt_ids, np.int64).reshape(-1)
    output, _ = model.generate_ids(prompt, method="baseline", max_new_tokens=max_new_tokens)
    return Record(prompt, output, max_new_tokens)


def simulate(
    drafter: Drafter | Callable[[DrafterEnv], Drafter],
    prompt_ids: np.ndarray | list[int],
    output_ids: np.ndarray | list[int],
    budget: int = 8,
    *,
    max_new_tokens: int | None = None,  # None: len(output_ids)
    tree: bool = False,  # env.tree when ``drafter`` is a factory and ``env`` is None
    env: DrafterEnv | None = None,  # for a factory; None: a fresh env (vocab from the ids, empty state)
    backoff: Backoff | None = None,  # cut each proposal to the depth that pays, as the engine's back-off
    key_block: int | None = KEY_BLOCK,  # the graph's cut of branching trees (DecoderSession.key_block; None: none)
) -> SimulationResult:
    """Replay ``output_ids`` after ``prompt_ids`` through ``drafter`` (an instance, or a factory
    ``env -> Drafter``) with ``budget`` draft nodes per step."""
    prompt = np.asarray(prompt_ids, np.int64).reshape(-1)
    output = np.asarray(output_ids, np.int64).reshape(-1)
    limit = len(output) if max_new_tokens is None else max_new_tokens
    if len(prompt) == 0:
        raise ValueError("simulate: prompt_ids is empty")
    if budget < 0:
        raise ValueError(f"simulate: budget must be >= 0, got {budget}")
    if limit < len(output):
        raise ValueError(f"simulate: max_new_tokens={limit} is less than the {len(output)} recorded tokens")
    if isinstance(drafter, type) or not hasattr(drafter, "propose"):  # a factory (or a class taking env)
        if env is None:
            vocab = int(max(prompt.max(), output.max(initial=0))) + 1
            env = DrafterEnv(vocab=vocab, tree=tree)
        drafter = drafter(env)

    steps = drafted = accepted = held_back = 0
    lengths: list[int] = []
    windows: list[int] = []
    if len(output):
        produced = 1  # the prefill's token
        context = np.concatenate([prompt, output[:1]])
        drafter.begin(prompt, np.zeros((len(prompt), 0), np.float32))
        while produced < len(output):
            step_budget = min(budget, limit - produced - 1)
            proposal = drafter.propose(context, step_budget) if step_budget > 0 else DraftTree.empty()
            if len(proposal) > max(step_budget, 0):
                raise RuntimeError(f"drafter proposed {len(proposal)} nodes over its budget of {step_budget}")
            if backoff is not None and len(proposal):
                proposal = backoff.choose(proposal, len(context))  # as the engine: empty = a plain step
                held_back += not len(proposal)
            proposal = fit_window(proposal, len(context) - 1, key_block)  # as the engine cuts it
            # target_next[slot]: the recorded token after the slot (-1 past the record's end); the walk
            # only reads slots on the accepted path, whose tokens are the record's
            at = produced + np.concatenate([[0], proposal.depths()])  # [n + 1]
            target_next = np.where(at < len(output), output[np.minimum(at, len(output) - 1)], -1)
            walk = walk_greedy(proposal, target_next)
            emitted = walk.emitted[: len(output) - produced]
            steps += 1
            drafted += len(proposal)
            accepted += len(walk.path)
            lengths.append(len(walk.path))
            windows.append(len(proposal) + 1)
            produced += len(emitted)
            context = np.concatenate([context, emitted])
            if backoff is not None:
                backoff.observe_context(context)
            empty = np.zeros((len(proposal) + 1, 0), np.float32)
            drafter.observe(emitted, Feedback(proposal, walk.path, empty, empty))
    tokens_per_step = (len(output) - 1) / steps if steps else 0.0
    return SimulationResult(steps, drafted, accepted, tokens_per_step, tuple(lengths), tuple(windows), held_back,
                            max(len(output) - 1, 0))
