"""The speculative loop: prefill, then draft -> verify in one pass -> accept -> keep the accepted KV.

    prompt ──prefill──► first token = root
    loop:  drafter.propose(context) ─► tree ─► flatten(root, tree) ─► decoder.forward (one pass)
           ─► walk (greedy argmax / lossless sampling) ─► commit root + accepted path KV
           ─► emitted = accepted + recovered|bonus; last emitted token is the next root

Under greedy decoding every emitted token is the target's argmax given the tokens before it,
so the output equals plain decoding token for token; stopping (EOS, max_new_tokens) is applied
to the emitted tokens in order, so it stops exactly where plain decoding stops.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .backend import ForwardOutput, OrtDecoder
from .cost import VerifyCostModel
from .drafters import Drafter, Feedback
from .errors import InvalidRequestError
from .sampling import SamplingParams, sample, target_probs
from .tree import DraftTree, causal_bias, flatten
from .verify import Walk, walk_greedy, walk_sampling


@dataclass(frozen=True)
class LoopConfig:
    max_new_tokens: int
    sampling: SamplingParams
    draft_budget: int = 8  # draft-tree nodes per step (a chain of this length in chain mode)
    prefill_chunk: int = 256  # prompt positions per prefill pass (bounds the [chunk, vocab] logits)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise InvalidRequestError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.draft_budget < 0:
            raise InvalidRequestError(f"draft_budget must be >= 0, got {self.draft_budget}")
        if self.prefill_chunk < 1:
            raise InvalidRequestError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")


@dataclass
class LoopStats:
    """Counters of one request; times in seconds. A step is one verify pass after the prefill."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0  # decoder forward passes of the decode phase
    decode_s: float = 0.0  # whole decode phase: draft + verify + accept/bookkeeping
    steps: int = 0
    drafted: int = 0  # draft-tree nodes sent to verification
    accepted: int = 0  # drafted tokens the target accepted
    accepted_lengths: list[int] = field(default_factory=list)  # per step

    @property
    def decode_tokens(self) -> int:
        """Tokens emitted by verify steps: all new tokens but the one the prefill produced."""
        return max(self.new_tokens - 1, 0)

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per verify step (accepted + recovered/bonus): tau in the papers."""
        return self.decode_tokens / self.steps if self.steps else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "prefill_s": round(self.prefill_s, 6),
            "decode_s": round(self.decode_s, 6),
            "draft_s": round(self.draft_s, 6),
            "verify_s": round(self.verify_s, 6),
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            "mean_accepted_tokens_per_step": round(self.tokens_per_step, 4),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
        }


def prefill(decoder: OrtDecoder, ids: np.ndarray, chunk: int) -> Iterator[ForwardOutput]:
    """Cache ``ids`` ([t] int64) after the decoder's past, ``chunk`` positions per pass; yields
    each pass's output (logits [<= chunk, vocab], hidden states [<= chunk, hidden])."""
    for start in range(0, len(ids), chunk):
        piece = ids[start : start + chunk]
        past = decoder.past
        out = decoder.forward(piece, np.arange(past, past + len(piece)), causal_bias(past, len(piece)))
        decoder.commit(np.arange(len(piece)))
        yield out


class SpeculativeLoop:
    """Runs one request on a decoder; iterate :meth:`run` for emitted token chunks."""

    def __init__(
        self,
        decoder: OrtDecoder,
        drafter: Drafter,
        eos_token_ids: tuple[int, ...],
        config: LoopConfig,
        cost: VerifyCostModel | None = None,
    ):
        self.decoder = decoder
        self.drafter = drafter
        self.eos = np.array(eos_token_ids, np.int64)
        self.config = config
        self.cost = cost
        self.rng = np.random.default_rng(config.seed)
        self.stats = LoopStats()
        self.finish_reason: str | None = None

    def _choose(self, logits: np.ndarray) -> int:  # logits: [vocab]
        if self.config.sampling.greedy:
            return int(np.argmax(logits))
        return sample(target_probs(logits[None], self.config.sampling)[0], self.rng)

    def _walk(self, tree: DraftTree, logits: np.ndarray) -> Walk:  # logits: [n + 1, vocab]
        if self.config.sampling.greedy:
            return walk_greedy(tree, np.argmax(logits, axis=-1))
        return walk_sampling(tree, target_probs(logits, self.config.sampling), self.rng)

    def _stop(self, emitted: np.ndarray, produced: int) -> tuple[np.ndarray, str | None]:
        """Cut ``emitted`` at the first EOS (kept) or at the max_new_tokens limit."""
        eos_at = np.flatnonzero(np.isin(emitted, self.eos))
        if len(eos_at) and eos_at[0] < self.config.max_new_tokens - produced:
            return emitted[: eos_at[0] + 1], "eos"
        room = self.config.max_new_tokens - produced
        if len(emitted) >= room:
            return emitted[:room], "length"
        return emitted, None

    def run(self, prompt: np.ndarray) -> Iterator[np.ndarray]:
        """Yield the emitted tokens ([k] int64) step by step; ``stats`` and ``finish_reason`` are
        final once the iterator is exhausted. prompt: [t] int64, t >= 1."""
        cfg, stats = self.config, self.stats
        capacity = self.decoder.dims.max_context
        stats.prompt_tokens = len(prompt)
        if len(prompt) == 0:
            raise InvalidRequestError("prompt is empty: need at least one token")
        if len(prompt) + cfg.max_new_tokens > capacity:
            raise InvalidRequestError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                f"model's context of {capacity} tokens"
            )
        if cfg.max_new_tokens == 0:
            self.finish_reason = "length"
            return
        self.decoder.reset(min(capacity, len(prompt) + cfg.max_new_tokens + cfg.draft_budget + 1))

        t0 = time.perf_counter()
        hidden = []
        for out in prefill(self.decoder, prompt, cfg.prefill_chunk):
            hidden.append(out.hidden_states)
        first = np.array([self._choose(out.logits[-1])], np.int64)
        stats.prefill_s = time.perf_counter() - t0
        emitted, self.finish_reason = self._stop(first, 0)
        context = np.concatenate([prompt, emitted])
        stats.new_tokens = len(emitted)
        self.drafter.begin(prompt, np.concatenate(hidden))
        yield emitted

        while self.finish_reason is None:
            t_step = time.perf_counter()
            remaining = cfg.max_new_tokens - stats.new_tokens
            # never draft beyond what can still be emitted or cached (the root needs one slot)
            budget = min(cfg.draft_budget, remaining - 1, self.decoder.capacity - self.decoder.past - 1)
            t = time.perf_counter()
            tree = self.drafter.propose(context, budget) if budget > 0 else DraftTree.empty()
            stats.draft_s += time.perf_counter() - t
            if len(tree) > max(budget, 0):
                raise RuntimeError(f"drafter proposed {len(tree)} nodes over its budget of {budget}")

            window = flatten(int(context[-1]), tree, self.decoder.past)
            t = time.perf_counter()
            out = self.decoder.forward(window.input_ids, window.position_ids, window.attention_bias)
            elapsed = time.perf_counter() - t
            stats.verify_s += elapsed
            if self.cost is not None:
                self.cost.record(len(window.input_ids), elapsed)
            walk = self._walk(tree, out.logits)
            self.decoder.commit(np.concatenate([[0], walk.path + 1]))

            emitted, self.finish_reason = self._stop(walk.emitted, stats.new_tokens)
            stats.steps += 1
            stats.drafted += len(tree)
            stats.accepted += len(walk.path)
            stats.accepted_lengths.append(len(walk.path))
            stats.new_tokens += len(emitted)
            context = np.concatenate([context, emitted])
            self.drafter.observe(emitted, Feedback(tree, walk.path, out.logits, out.hidden_states))
            stats.decode_s += time.perf_counter() - t_step
            yield emitted
