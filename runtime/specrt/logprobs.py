"""Log-probabilities of emitted tokens: the model's own distribution at each position (log-softmax
of the raw logits, before temperature, top-k or top-p), with the ``top`` most likely tokens.

In a verify step the token emitted after accepting ``path`` (node indices) is predicted by window
row 0 (the root) for the first emitted token and row ``path[i] + 1`` for the one after node
``path[i]``: the rows plain decoding computes one step at a time at the same positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float  # log p(token_id | everything before it)
    top: tuple[tuple[int, float], ...]  # the most likely tokens there, (id, logprob), most likely first


def token_logprobs(logits: np.ndarray, tokens: np.ndarray, top: int) -> list[TokenLogprob]:
    """logits: [k, vocab] (row i predicts tokens[i]); tokens: [k] int64; ``top`` >= 0 alternatives."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))  # [k, vocab]
    out = []
    for row, token in zip(logp, tokens, strict=True):
        best = np.argpartition(-row, top - 1)[:top] if top else np.zeros(0, np.int64)
        best = best[np.argsort(-row[best], kind="stable")]
        out.append(TokenLogprob(int(token), float(row[token]), tuple((int(t), float(row[t])) for t in best)))
    return out


def window_rows(path: np.ndarray) -> np.ndarray:
    """The window rows ([len(path) + 1]) that predicted the tokens a verify step emitted after
    accepting ``path``: the root's row, then each accepted node's."""
    return np.concatenate([[0], np.asarray(path, np.int64) + 1])
