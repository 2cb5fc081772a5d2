"""``suffix_decoding``: SuffixDecoding (Oliaro et al., 2024), as in Arctic Inference.

Two depth-bounded suffix trees (specrt.drafters.indexes.suffix_tree): a local one over the active request (prompt +
generation so far) and a global one over previous responses of this model, kept in
``env.state["suffix_decoding"]`` so that it outlives the request. Each step matches the longest
suffix of the context (up to ``max_depth`` tokens) in both trees and grows a draft from the match
node by node frequency: chain mode takes the single most frequent path, tree mode expands
best-first by path probability (``child.count / node.count`` multiplied down the path); a draft
holds at most ``max_spec_factor * match_len + max_spec_offset`` tokens and only tokens whose path
probability is at least ``min_token_prob``. The better-scoring tree's draft wins (Arctic's
``speculate``).

Request lifecycle (Arctic's names, on the shared :class:`SuffixCache`): ``begin`` =
``start_request(prompt)``; tokens of the context not seen yet (the prefill's first token) and
every ``observe``d chunk = ``add_active_response``; the engine has no end-of-request hook, so the
response is folded into the global tree by ``stop_request`` when the next request begins (or
at once by :meth:`SuffixDecoding.end`). The global tree is bounded by ``max_cached_requests``
responses and ``max_cached_tokens`` tokens, oldest evicted first.

A ``propose`` before ``begin`` starts a request with the context as its prompt; a context that
does not extend the request's tokens starts a new request the same way.

Defaults are Arctic's (``max_spec_factor`` 1, ``max_spec_offset`` 0, ``min_token_prob`` 0.1)
but ``max_depth`` 24 (vLLM's; Arctic's 64: a Python trie holds up to max_depth nodes per token)
and smaller cache bounds. Replayed with specrt.simulate on 20 Spec-Bench prompts
(Qwen2.5-Coder-0.5B, 1,600 tokens), factor 1 beat 0.5, 2 and 4 in tokens per unit of verify cost
(1 + 0.15 per drafted token); larger factors draft more and raise tokens per step slightly.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from specrt.drafters.base import DrafterEnv, Feedback
from specrt.drafters.indexes.suffix_tree import Draft, SuffixCache
from specrt.tree import DraftTree

log = logging.getLogger(__name__)

STATE_KEY = "suffix_decoding"


def shared_cache(
    state: dict[str, Any], key: str, max_depth: int, max_cached_requests: int, max_cached_tokens: int
) -> SuffixCache:
    """The cache in ``state[key]``, created on first use; its options must match on later uses."""
    wanted = dict(max_depth=max_depth, max_cached_requests=max_cached_requests, max_cached_tokens=max_cached_tokens)
    cache = state.get(key)
    if cache is None:
        cache = state[key] = SuffixCache(**wanted)
    elif not isinstance(cache, SuffixCache):
        raise ValueError(f"{key}: env.state[{key!r}] holds a {type(cache).__name__}, not a SuffixCache")
    else:
        for option, value in wanted.items():
            if getattr(cache, option) != value:
                raise ValueError(
                    f"{key}: {option}={value} differs from the cache already in env.state[{key!r}] "
                    f"({option}={getattr(cache, option)}); use a fresh env.state or the same options"
                )
    return cache


class SuffixDecoding:
    def __init__(
        self,
        env: DrafterEnv,
        *,
        tree: bool | None = None,  # None: env.tree
        max_depth: int = 24,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        max_cached_requests: int = 1000,
        max_cached_tokens: int = 100_000,
        state_key: str = STATE_KEY,
    ):
        if max_spec_factor < 0:
            raise ValueError(f"{state_key}: max_spec_factor must be >= 0, got {max_spec_factor}")
        if not 0.0 <= min_token_prob <= 1.0:
            raise ValueError(f"{state_key}: min_token_prob must be in [0, 1], got {min_token_prob}")
        self.tree = env.tree if tree is None else tree
        self.max_spec_factor = max_spec_factor
        self.max_spec_offset = max_spec_offset
        self.min_token_prob = min_token_prob
        self.name = state_key
        self.cache = shared_cache(env.state, state_key, max_depth, max_cached_requests, max_cached_tokens)
        self._request: int | None = None  # our request's id in the cache

    # -- lifecycle

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        self._request = self.cache.start_request(np.asarray(prompt, np.int64))

    def end(self) -> None:
        """Fold this request's response into the global history now (else the next begin does)."""
        if self._owns_active_request():
            self.cache.stop_request()

    def _owns_active_request(self) -> bool:
        return self._request is not None and self.cache.active and self.cache.request_id == self._request

    def _sync(self, context: np.ndarray) -> None:
        """Bring the active request up to ``context`` ([t] int64): prompt + all emitted tokens."""
        if self._request is not None and self.cache.request_id != self._request:
            raise RuntimeError(f"{self.name}: a newer request began on the same model; this drafter is stale")
        if not self._owns_active_request():
            self.begin(context, np.zeros((len(context), 0), np.float32))
            return
        known = self.cache.active_length
        tokens = self.cache.active_tokens()
        if len(context) < known or (known and int(context[known - 1]) != tokens[-1]):
            log.debug("%s: the context does not extend the request; starting a new request", self.name)
            self.begin(context, np.zeros((len(context), 0), np.float32))
        elif len(context) > known:
            self.cache.add_active_response(context[known:])

    # -- drafting

    def speculate(self, context: np.ndarray, budget: int) -> Draft:
        """The cache's best draft of at most ``budget`` nodes for ``context`` ([t] int64)."""
        context = np.asarray(context, np.int64)
        self._sync(context)
        if budget < 1:
            return Draft.empty()
        options = (self.max_spec_factor, self.max_spec_offset, self.min_token_prob, self.tree)
        return self.cache.speculate(context, budget, *options)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        return self.speculate(context, budget).tree()

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        if self._owns_active_request():
            self.cache.add_active_response(np.asarray(emitted, np.int64))


def make(env: DrafterEnv) -> SuffixDecoding:
    return SuffixDecoding(env)
