"""The drafter protocol: propose a draft tree for the current context, observe what was emitted."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..tree import DraftTree


class Drafter(Protocol):
    """One drafter instance serves one request (a fresh one is built per generate call)."""

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        """A draft tree of at most ``budget`` nodes continuing ``context`` ([t] int64: prompt and
        everything emitted so far). An empty tree ("nothing to propose") is a normal answer."""
        ...

    def observe(self, emitted: np.ndarray) -> None:
        """The tokens ([k] int64) the verifier emitted after the last proposal."""
        ...
