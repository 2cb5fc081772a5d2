"""The drafter protocol: propose a draft tree for the current context, observe what was emitted."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..datastore import STATE_KEY, Datastore, open_datastore
from ..errors import ArtifactError, InvalidRequestError
from ..sampling import SamplingParams
from ..tree import DraftTree

if TYPE_CHECKING:
    from ..backend import OrtDecoder

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

    @property
    def accepted_slots(self) -> np.ndarray:  # [a + 1] slots of the root and the accepted path
        return np.concatenate([[0], self.path + 1])


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
    draft_decoder: Callable[[], OrtDecoder] | None = None  # a fresh KV cache on the draft model, if one is loaded


class Drafter(Protocol):
    """One drafter instance serves one request (a fresh one is built per generate call).

    Call order: ``begin`` once with the prompt, then per step ``propose`` -> verify -> ``observe``.
    A drafter that samples its drafts from a distribution q (``DraftTree.draft_probs``) may name its
    accept rule in a ``verifier`` attribute (a ``specrt.rejection.Verifier``).
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
