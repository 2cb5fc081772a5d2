"""The drafter protocol: propose a draft tree for the current context, observe what was emitted."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from specrt.drafters.indexes.datastore import STATE_KEY, Datastore, open_datastore
from specrt.errors import ArtifactError, InvalidRequestError
from specrt.sampling import SamplingParams
from specrt.tree import DraftTree

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Feedback:
    """What the verifier computed in the last step, for drafters that learn from it.

    Window slot 0 is the root (the token emitted before the step), slot i + 1 is tree node i.
    """

    tree: DraftTree  # the tree that was verified (n nodes)
    path: np.ndarray  # [a] accepted node indices, root to leaf
    logits: np.ndarray  # [n + 1, vocab] verifier logits per window slot
    hidden_states: np.ndarray  # [n + 1, hidden] final-norm hidden states per window slot
    open_levels: int = 0  # levels of an open HSD block the next proposal must draft (specrt.engine.accept)

    @property
    def accepted_slots(self) -> np.ndarray:  # [a + 1] slots of the root and the accepted path
        return np.concatenate([[0], self.path + 1])


class DraftModel(Protocol):
    """A draft model's KV cache, as the draft-model drafters drive it (specrt.backend.draft_model's
    OrtDraftModel is the onnxruntime one): tokens fed are kept; ``truncate`` cuts back to a prefix."""

    @property
    def max_context(self) -> int:
        """Positions the draft model can hold at most."""
        ...

    @property
    def capacity(self) -> int:
        """Positions the cache holds now (``reset`` allocates them)."""
        ...

    @property
    def past(self) -> int:
        """Tokens in the cache."""
        ...

    def reset(self, capacity: int) -> None:
        """An empty cache of ``capacity`` positions."""
        ...

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """Feed ``tokens`` ([k] int64, k >= 1) after the cached ones, keep them, and return the draft's
        logits ([draft vocab]) after the last."""
        ...

    def truncate(self, keep: int) -> None:
        """Keep the first ``keep`` cached tokens."""
        ...


@dataclass(frozen=True, eq=False)
class DrafterEnv:
    """What a drafter factory may use besides its own options."""

    vocab: int  # ids are in [0, vocab)
    tree: bool  # propose branching trees (True) or chains (False)
    state: dict[str, Any] = field(default_factory=dict)  # per-model state that outlives a request, by method
    datastore: Path | None = None  # retrieval corpus folder (built by the pipeline's corpora stage)
    verify_cost: Callable[[int], float] | None = None  # seconds of one verify pass over s positions
    tokenizer_sha256: str | None = None  # the model's tokenizer.json; a datastore must match it
    sampling: SamplingParams | None = None  # the request's sampling (None = greedy): drafters that sample use it
    seed: int | None = None  # the request's seed, for a drafter's own random stream
    draft_model: Callable[[], DraftModel] | None = None  # a fresh KV cache on the draft model, if one is loaded


class Drafter(Protocol):
    """One drafter instance serves one request (a fresh one is built per generate call).

    Call order: ``begin`` once with the prompt, then per step ``propose`` -> verify -> ``observe``.
    A drafter that samples its drafts from a distribution q hands q over with them
    (``DraftTree.draft_probs``); the rule that accepts them is its method's (the registry's
    ``Method.accept``, specrt.drafters).
    """

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        """The prompt ([t] int64) and its final-norm hidden states ([t, hidden] float32, read-only:
        the prefix cache may hand the same array to later requests)."""
        ...

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        """A draft tree of at most ``budget`` nodes continuing ``context`` ([t] int64: prompt and
        everything emitted so far). An empty tree ("nothing to propose") is a normal answer."""
        ...

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        """The tokens ([k] int64) the verifier emitted after the last proposal, and what it saw."""
        ...


def datastore_for(env: DrafterEnv, method: str) -> Datastore:
    """The datastore of ``env`` for a drafter factory, loaded once per model (cached in ``env.state``).

    Raises :class:`InvalidRequestError` when the model has none, :class:`ArtifactError` when it
    does not fit the model (tokenizer, vocabulary) or its files differ from its manifest."""
    if env.datastore is None:
        raise InvalidRequestError(
            f"method {method!r} drafts from a retrieval datastore, and this model has none: load it with "
            "specrt.load(folder, datastore=...) (a folder built by `python -m pipeline.corpora`)"
        )
    cache: dict[Path, Datastore] = env.state.setdefault(STATE_KEY, {})
    folder = Path(env.datastore).resolve()
    if folder not in cache:
        store = open_datastore(folder, tokenizer_sha256=env.tokenizer_sha256)
        if store.manifest.max_token >= env.vocab:
            raise ArtifactError(
                f"{folder}: datastore holds token id {store.manifest.max_token}, the model's vocabulary is "
                f"{env.vocab}: built with another tokenizer?"
            )
        log.info("datastore %s: %d tokens, %d automaton states", folder, store.manifest.tokens, store.manifest.states)
        cache[folder] = store
    return cache[folder]
