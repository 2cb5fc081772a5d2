"""Walking a verified draft tree: which drafted tokens the target accepts, and what it emits.

Vocabulary (vLLM's): drafted tokens the target agrees with are *accepted*; after the first
rejection the target's own token is the *recovered* token; when a leaf is reached with everything
accepted, the target's next token is the *bonus* token. emitted = accepted + (recovered | bonus).

Window slots: slot 0 is the root, slot i + 1 is tree node i (see specrt.tree).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sampling import sample
from .tree import DraftTree


@dataclass(frozen=True, eq=False)
class Walk:
    path: np.ndarray  # [a] accepted node indices, root to leaf
    emitted: np.ndarray  # [a + 1] accepted tokens, then the recovered or bonus token


def walk_greedy(tree: DraftTree, target_next: np.ndarray) -> Walk:
    """Follow the target's argmax down the tree. target_next: [n + 1] argmax per window slot."""
    path, emitted, node = [], [], -1
    while True:
        want = int(target_next[node + 1])
        emitted.append(want)
        match = [c for c in tree.children(node) if tree.token_ids[c] == want]
        if not match:
            return Walk(np.array(path, np.int64), np.array(emitted, np.int64))
        node = int(match[0])
        path.append(node)


def walk_sampling(tree: DraftTree, probs: np.ndarray, rng: np.random.Generator) -> Walk:
    """Lossless acceptance for deterministic drafts (a point mass per drafted token).

    probs: [n + 1, vocab] target distribution per window slot. At each node the children are tried
    in order; child x is accepted with probability r(x) / sum(r), where r is the residual target
    distribution (the target's p with every rejected sibling zeroed), else r(x) := 0. If all are
    rejected the recovered token is drawn from r; at a leaf the bonus token is drawn from p. This
    is recursive rejection sampling with q = delta(x): the emitted token is distributed as p.
    """
    path, emitted, node = [], [], -1
    while True:
        residual = probs[node + 1].copy()
        accepted = None
        for child in tree.children(node):
            x = int(tree.token_ids[child])
            total = residual.sum()
            if residual[x] > 0 and rng.random() * total < residual[x]:
                accepted = int(child)
                break
            residual[x] = 0.0
        if accepted is None:
            emitted.append(sample(residual, rng))
            return Walk(np.array(path, np.int64), np.array(emitted, np.int64))
        emitted.append(int(tree.token_ids[accepted]))
        path.append(accepted)
        node = accepted
