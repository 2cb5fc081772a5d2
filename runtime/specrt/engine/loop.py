"""The speculative loop: prefill, then draft -> verify in one pass -> accept -> keep the accepted KV.

    prompt ──prefill──► first token = root
    loop:  drafter.propose(context) ─► tree ─► flatten(root, tree) ─► decoder.forward (one pass)
           ─► walk (greedy argmax / lossless sampling) ─► commit root + accepted path KV
           ─► emitted = accepted + recovered|bonus; last emitted token is the next root

Under greedy decoding every emitted token is the target's argmax given the tokens before it,
so the output equals plain decoding token for token; stopping (EOS, max_new_tokens, the end of
the model's context) is applied to the emitted tokens in order, so it stops exactly where plain
decoding stops.

The drafter is untrusted: anything it raises, and any tree that is not a well-formed DraftTree of
at most ``budget`` nodes with token ids in ``[0, vocab)``, ends the request with a
:class:`DrafterError` naming it, before the tree reaches the decoder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specrt.backend.blas import BlasGuard
from specrt.backend.prefill import PromptImages, prefill
from specrt.backend.session import OrtDecoder
from specrt.backend.window import fit_window, flatten
from specrt.backoff import Backoff
from specrt.cancel import CancelToken
from specrt.cost import AtContext, VerifyCostModel
from specrt.drafters import Drafter, Feedback
from specrt.engine.accept import Verifier
from specrt.engine.prefix_cache import PrefixCache, PrefixEntry
from specrt.errors import DrafterError, InvalidRequestError, check_int
from specrt.logprobs import TokenLogprob, token_logprobs, window_rows
from specrt.sampling import SamplingParams, sample, target_probs
from specrt.tree import DraftTree


@dataclass(frozen=True)
class LoopConfig:
    max_new_tokens: int
    sampling: SamplingParams
    draft_budget: int = 8  # draft-tree nodes per step (a chain of this length in chain mode)
    prefill_chunk: int = 256  # prompt positions per prefill pass (bounds the [chunk, vocab] logits)
    seed: int | None = None
    backoff: bool = False  # verify drafts only as deep as pays for the window (specrt.backoff)
    logprobs: int | None = None  # None: off; k >= 0: each emitted token's logprob and its k most likely tokens

    def __post_init__(self) -> None:
        check_int("max_new_tokens", self.max_new_tokens, minimum=0)
        check_int("draft_budget", self.draft_budget, minimum=0)
        check_int("prefill_chunk", self.prefill_chunk, minimum=1)
        if self.seed is not None:
            check_int("seed", self.seed)
        if self.logprobs is not None:
            check_int("logprobs", self.logprobs, minimum=0)
        if not isinstance(self.backoff, bool):
            raise InvalidRequestError(f"backoff must be a bool, got {type(self.backoff).__name__}")
        if not isinstance(self.sampling, SamplingParams):
            raise InvalidRequestError(f"sampling must be a SamplingParams, got {type(self.sampling).__name__}")


@dataclass
class LoopStats:
    """Counters of one request; times in seconds. A step is one verify pass after the prefill."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt positions whose KV came from the prefix cache (no pass ran for them)
    new_tokens: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0  # decoder forward passes of the decode phase
    decode_s: float = 0.0  # whole decode phase: draft + verify + accept/bookkeeping
    steps: int = 0
    drafted: int = 0  # draft-tree nodes sent to verification
    held_back: int = 0  # proposed drafts the back-off cut to nothing (a plain step ran instead)
    accepted: int = 0  # drafted tokens the target accepted
    fully_accepted: int = 0  # steps whose draft was accepted to a leaf: they emitted a bonus token
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
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "new_tokens": self.new_tokens,
            "prefill_s": round(self.prefill_s, 6),
            "decode_s": round(self.decode_s, 6),
            "draft_s": round(self.draft_s, 6),
            "verify_s": round(self.verify_s, 6),
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "held_back": self.held_back,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            "fully_accepted_steps": self.fully_accepted,
            # tau: accepted drafts + the recovered/bonus token, per verify step; and the drafts alone
            "mean_tokens_per_step": round(self.tokens_per_step, 4),
            "mean_accepted_drafts_per_step": round(self.accepted / self.steps, 4) if self.steps else 0.0,
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
        }


def check_tree(tree: object, budget: int, vocab: int, drafter: str) -> DraftTree:
    """``tree`` if it is a well-formed draft tree of at most ``budget`` nodes over ``[0, vocab)``,
    else :class:`DrafterError` naming ``drafter`` and the first defect. (DraftTree checks its
    parents when built, but its arrays stay mutable, and a drafter may build it without ints.)"""
    if not isinstance(tree, DraftTree):
        raise DrafterError(f"{drafter} proposed a {type(tree).__name__}, not a DraftTree")
    ids, parents = tree.token_ids, tree.parents
    for name, a in (("token_ids", ids), ("parents", parents)):
        if not isinstance(a, np.ndarray) or a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            what = f"{a.dtype} array of shape {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
            raise DrafterError(f"{drafter} proposed a tree whose {name} is a {what}, not a 1-D int array")
    if parents.shape != ids.shape:
        raise DrafterError(f"{drafter} proposed {len(ids)} token ids but {len(parents)} parents")
    if len(ids) > budget:
        raise DrafterError(f"{drafter} proposed {len(ids)} nodes over its budget of {budget}")
    bad = np.flatnonzero((ids < 0) | (ids >= vocab))
    if len(bad):
        raise DrafterError(f"{drafter} proposed token id {int(ids[bad[0]])} outside [0, {vocab})")
    bad = np.flatnonzero((parents < -1) | (parents >= np.arange(len(parents))))
    if len(bad):
        raise DrafterError(
            f"{drafter} proposed parents[{bad[0]}] = {int(parents[bad[0]])}: need -1 <= parents[i] < i "
            f"(parents {parents.tolist()})"
        )
    q = tree.draft_probs  # [n, vocab] when the drafts were sampled from a draft distribution
    if q is not None and (not isinstance(q, np.ndarray) or q.shape != (len(ids), vocab)):
        shape = q.shape if isinstance(q, np.ndarray) else type(q).__name__
        raise DrafterError(f"{drafter} proposed draft_probs of shape {shape}, expected ({len(ids)}, {vocab})")
    return tree


class _Stopped(Exception):
    """The cancel token stopped the prefill."""


class SpeculativeLoop:
    """Runs one request on a decoder; iterate :meth:`run` for emitted token chunks."""

    def __init__(
        self,
        decoder: OrtDecoder,
        drafter: Drafter,
        eos_token_ids: tuple[int, ...],
        config: LoopConfig,
        cost: VerifyCostModel | None = None,
        method: str | None = None,  # the drafter's registered name, for error messages
        backoff_from: Backoff | None = None,  # an earlier request's back-off: start from its estimate
        prefix_cache: PrefixCache | None = None,  # prompts' KV kept across requests (specrt.engine.prefix_cache)
        blas: BlasGuard | None = None,  # drafter calls on one BLAS thread (specrt.backend.blas); None: as they are
        cancel: CancelToken | None = None,  # checked before each prefill pass and verify step (specrt.cancel)
        acceptance: str = "sd",  # the accept rule of drafts sampled from a q (the method's registry entry)
        images: PromptImages | None = None,  # a vision-language prompt's image rows (specrt.backend.prefill)
        here: AtContext | None = None,  # ``cost`` at this request's cached length (None: a view of its own)
    ):
        self.cancel = cancel
        self.images = images
        self.decoder = decoder
        self.prefix_cache = prefix_cache
        self.blas = blas
        self.drafter = drafter
        kind = type(drafter).__name__
        self.drafter_label = f"drafter {method!r} ({kind})" if method else f"drafter {kind}"
        self.eos = np.array(eos_token_ids, np.int64)
        self.config = config
        if config.backoff and cost is None:
            cost = VerifyCostModel()  # the back-off needs measured costs: this request's own
        self.cost = cost
        self.backoff: Backoff | None = None
        # windows priced at this request's cached length, set before each step (the request's
        # drafters read the same view through their env's verify_cost)
        self.here = here if here is not None or cost is None else AtContext(cost)
        if config.backoff:
            assert self.here is not None
            self.backoff = backoff_from.carried_over(self.here) if backoff_from is not None else Backoff(self.here)
        self.rng = np.random.default_rng(config.seed)
        self.verifier = Verifier(acceptance)  # every window's walk (specrt.engine.accept)
        self.stats = LoopStats()
        # "eos", "length" (max_new_tokens), "context" (context full), "cancelled" or "timeout" (specrt.cancel)
        self.finish_reason: str | None = None
        self.logprobs: list[TokenLogprob] = []  # one per emitted token when config.logprobs is not None
        self._limit = config.max_new_tokens  # new tokens this request may emit (clipped by the context in run)
        self._limit_reason = "length"

    def _choose(self, logits: np.ndarray) -> int:  # logits: [vocab]
        if self.config.sampling.greedy:
            return int(np.argmax(logits))
        return sample(target_probs(logits[None], self.config.sampling)[0], self.rng)

    def _stop(self, emitted: np.ndarray, produced: int) -> tuple[np.ndarray, str | None]:
        """Cut ``emitted`` at the first EOS (kept) or at the limit (max_new_tokens or the context's end)."""
        room = self._limit - produced
        eos_at = np.flatnonzero((emitted[:, None] == self.eos).any(axis=1))  # few ids: no np.isin sort
        if len(eos_at) and eos_at[0] < room:
            return emitted[: eos_at[0] + 1], "eos"
        if len(emitted) >= room:
            return emitted[:room], self._limit_reason
        return emitted, None

    def _record_logprobs(self, logits: np.ndarray, emitted: np.ndarray) -> None:
        """Append the logprobs of ``emitted`` (logits: [len(emitted), vocab], row i predicts emitted[i])."""
        if self.config.logprobs is not None:
            self.logprobs.extend(token_logprobs(logits[: len(emitted)], emitted, self.config.logprobs))

    def _stopped(self) -> bool:
        """Whether the request's cancel token says stop; sets ``finish_reason`` to its reason."""
        reason = self.cancel.reason() if self.cancel is not None else None
        if reason is not None:
            self.finish_reason = reason
        return reason is not None

    def _call_drafter(self, step: str, fn: Callable[..., Any], *args: Any) -> Any:
        """The drafter's ``step`` (begin / propose / observe), with one BLAS thread when the loop has a
        guard: whatever it raises becomes a DrafterError."""
        try:
            if self.blas is None:
                return fn(*args)
            with self.blas.single_threaded():
                return fn(*args)
        except Exception as e:  # an untrusted plug-in: any failure is reported as the drafter's
            raise DrafterError(f"{self.drafter_label} raised {type(e).__name__} in {step}: {e}") from e

    def _prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cache ``prompt`` ([t] int64), starting from what the prefix cache holds of it; the logits
        of its last position ([vocab]) and its hidden states ([t, hidden]). A prompt with images
        bypasses the prefix cache: its placeholder ids do not say which image they stand for."""
        chunk = self.config.prefill_chunk
        cache = self.prefix_cache if self.images is None else None
        hit = cache.lookup(prompt, chunk) if cache is not None else None
        hidden: list[np.ndarray] = []
        if hit is not None:
            self.decoder.restore(hit.entry.kv[:, : hit.rows])
            self.stats.cached_prompt_tokens = hit.rows
            if hit.whole:
                return hit.entry.last_logits, hit.entry.hidden
            hidden.append(hit.entry.hidden[: hit.rows])
        for out in prefill(self.decoder, prompt[self.decoder.past :], chunk, last_logits_only=True, images=self.images):
            hidden.append(out.hidden_states)
            if self.decoder.past < len(prompt) and self._stopped():
                raise _Stopped
        last_logits, states = out.logits[-1], np.concatenate(hidden)  # [vocab], [t, hidden]
        states.setflags(write=False)  # drafters read it; a cache hit hands later requests the same array
        if cache is not None and cache.fits(self.decoder.snapshot_bytes(len(prompt)) + states.nbytes):
            cache.insert(PrefixEntry(prompt.copy(), self.decoder.snapshot(len(prompt)), states, last_logits.copy(),
                                     chunk))
        return last_logits, states

    def run(self, prompt: np.ndarray) -> Iterator[np.ndarray]:
        """Yield the emitted tokens ([k] int64) step by step; ``stats`` and ``finish_reason`` are
        final once the iterator is exhausted. prompt: [t] int64, 1 <= t < the model's context.

        Prompt + generation never exceed the context (``dims.max_context``): when max_new_tokens
        does not fit, generation stops with finish_reason "context" once the context is full. A
        cancel token stops it before its next prefill pass or verify step ("cancelled", "timeout")."""
        cfg, stats = self.config, self.stats
        context_len = self.decoder.dims.max_context
        stats.prompt_tokens = len(prompt)
        if len(prompt) == 0:
            raise InvalidRequestError("prompt is empty: need at least one token")
        if len(prompt) >= context_len:
            raise InvalidRequestError(
                f"prompt of {len(prompt)} tokens does not fit the model's context of {context_len} tokens "
                f"(at most {context_len - 1} prompt tokens, leaving room for one new token)"
            )
        if cfg.max_new_tokens > context_len - len(prompt):
            self._limit, self._limit_reason = context_len - len(prompt), "context"
        if cfg.max_new_tokens == 0:
            self.finish_reason = "length"
            return
        self.decoder.reset(min(context_len, len(prompt) + self._limit + cfg.draft_budget + 1))

        vocab = self.decoder.dims.vocab
        t0 = time.perf_counter()
        if self._stopped():
            return
        try:
            last_logits, hidden = self._prefill(prompt)
        except _Stopped:  # cancelled between two prefill passes: nothing emitted
            return
        first = np.array([self._choose(last_logits)], np.int64)
        self._record_logprobs(last_logits[None], first)
        stats.prefill_s = time.perf_counter() - t0
        emitted, self.finish_reason = self._stop(first, 0)
        context = np.concatenate([prompt, emitted])
        stats.new_tokens = len(emitted)
        self._call_drafter("begin", self.drafter.begin, prompt, hidden)
        yield emitted

        while self.finish_reason is None:
            if self._stopped():
                return
            t_step = time.perf_counter()
            remaining = self._limit - stats.new_tokens
            # never draft beyond what can still be emitted or cached (the root needs one slot)
            past = self.decoder.past  # cached positions before this step's window
            budget = min(cfg.draft_budget, remaining - 1, self.decoder.capacity - past - 1)
            if self.here is not None:
                self.here.past = past
            t = time.perf_counter()
            tree = DraftTree.empty()
            if budget > 0:
                proposed = self._call_drafter("propose", self.drafter.propose, context, budget)
                tree = check_tree(proposed, budget, vocab, self.drafter_label)
                if self.backoff is not None and len(tree):
                    tree = self.backoff.choose(tree, len(context))  # cut to what pays; empty = plain step
                    stats.held_back += not len(tree)
                # a tree stays inside one key block where the graph's attention needs it
                tree = fit_window(tree, self.decoder.past, self.decoder.graph.key_block)
            stats.draft_s += time.perf_counter() - t

            window = flatten(int(context[-1]), tree, past)
            t = time.perf_counter()
            out = self.decoder.forward(window.input_ids, window.position_ids, window.attention_bias)
            elapsed = time.perf_counter() - t
            stats.verify_s += elapsed
            if self.cost is not None:
                self.cost.record(len(window.input_ids), elapsed, past)
            walk = self.verifier.verify(tree, out.logits, self.config.sampling, self.rng)
            self.decoder.commit(np.concatenate([[0], walk.path + 1]))

            emitted, self.finish_reason = self._stop(walk.emitted, stats.new_tokens)
            self._record_logprobs(out.logits[window_rows(walk.path)[: len(emitted)]], emitted)
            stats.steps += 1
            stats.drafted += len(tree)
            stats.accepted += len(walk.path)
            stats.fully_accepted += bool(len(tree)) and walk.bonus
            stats.accepted_lengths.append(len(walk.path))
            stats.new_tokens += len(emitted)
            context = np.concatenate([context, emitted])
            if self.backoff is not None:
                self.backoff.observe_context(context)
            feedback = Feedback(tree, walk.path, out.logits, out.hidden_states, self.verifier.forward_levels)
            self._call_drafter("observe", self.drafter.observe, emitted, feedback)
            stats.decode_s += time.perf_counter() - t_step
            yield emitted
