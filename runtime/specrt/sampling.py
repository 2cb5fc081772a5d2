"""The target distribution: logits -> probabilities under temperature, top-k and top-p."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# tokens whose order the top-p cut sorts first: the nucleus of a language model's next-token law is
# usually far smaller; when these do not reach top_p, four times as many, up to the whole vocabulary
NUCLEUS_CANDIDATES = 1024
# tokens per block of sample()'s two-level draw: ~300 blocks on a 151,936-token vocabulary
SAMPLE_BLOCK = 512


def target_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """[n, vocab] logits -> [n, vocab] float64 probabilities of the (warped) target distribution.
    Greedy decoding (temperature 0) has no distribution: callers take the argmax instead."""
    if params.greedy:
        raise ValueError("target_probs needs temperature > 0 (greedy decoding uses the argmax)")
    z = np.divide(logits, params.temperature, dtype=np.float64)
    if params.top_k and params.top_k < z.shape[-1]:
        kth = np.partition(z, -params.top_k, axis=-1)[:, -params.top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z, out=z)
    p /= p.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        drop = np.stack([outside_nucleus(row, params.top_p) for row in p])
        p = np.where(drop, 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def outside_nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """[vocab] bool: the tokens that top-p drops from ``p`` ([vocab] float64, sums to 1).

    The definition: order the tokens by probability, descending, ties by token id (a stable sort),
    and keep the smallest prefix whose mass reaches top_p; the first token always stays. Sorting
    the whole vocabulary took ~15 ms a row on 151,936 tokens, so only the most probable candidates
    are sorted, with the same result: the candidates (every token at or above the k-th largest
    probability, ties included) are the order's first tokens, their running sums are the same
    sequential float sums, and every token after them has at least their mass before it, so it is
    dropped once that mass reaches top_p (else k grows). Zero-probability tokens (top-k's cut)
    come last and are dropped, or kept at probability zero: the same distribution."""
    positive = np.flatnonzero(p > 0)
    k = NUCLEUS_CANDIDATES
    while True:
        candidates = positive if k >= len(positive) else np.flatnonzero(p >= np.partition(p, -k)[-k])
        order = candidates[np.argsort(-p[candidates], kind="stable")]  # candidates ascend by id: ties by id
        sorted_p = p[order]
        mass = np.cumsum(sorted_p)
        if len(candidates) == len(positive) or mass[-1] >= top_p:
            drop = np.ones(len(p), bool)
            drop[order] = mass - sorted_p >= top_p
            return drop
        k *= 4


class TargetRows:
    """``target_probs(logits, params)`` of a window, each row computed when it is first read.

    The walk of a deterministic draft (specrt.engine.accept.walk_sampling) reads the rows along the
    path it takes, 1 + the accepted drafts, of a window of up to budget + 1: on a 151,936-token
    vocabulary a row's float64 softmax costs about a millisecond on one core. Row ``i`` is
    ``target_probs(logits, params)[i]`` bit for bit: the function works row by row."""

    def __init__(self, logits: np.ndarray, params: SamplingParams):
        self.logits = logits  # [n, vocab]
        self.params = params
        self._rows: dict[int, np.ndarray] = {}  # window slot -> [vocab] float64

    def __len__(self) -> int:
        return len(self.logits)

    def __getitem__(self, slot: int) -> np.ndarray:
        row = self._rows.get(slot)
        if row is None:
            if not 0 <= slot < len(self.logits):
                raise IndexError(f"window slot {slot} out of range [0, {len(self.logits)})")
            row = self._rows[slot] = target_probs(self.logits[slot : slot + 1], self.params)[0]
        return row

    @property
    def computed(self) -> list[int]:
        """The slots computed so far, ascending."""
        return sorted(self._rows)


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from an unnormalised non-negative vector ``p`` [vocab] with positive mass: token i
    with probability p[i] / sum(p), from one ``rng.random()``.

    u = random() * total falls in one step of the running sum of ``p``; the token is that step's.
    A running sum is sequential (0.4 ms over 151,936 float64 on one core), so a long vector is drawn
    in two levels: the running sum of its blocks of SAMPLE_BLOCK tokens picks the block, the block's
    own running sum the token, at u's place in the block rescaled to that sum (the block's total and its
    running sum's last value may differ in the last bits). A zero-probability token is never drawn: its
    step is empty, and where rounding leaves the place at or past the block's last step the block's last
    token with mass is drawn."""
    if len(p) <= SAMPLE_BLOCK:
        return _draw(p, rng.random())
    full = len(p) // SAMPLE_BLOCK * SAMPLE_BLOCK
    sums = p[:full].reshape(-1, SAMPLE_BLOCK).sum(axis=1)  # [blocks]
    if full < len(p):
        sums = np.append(sums, p[full:].sum())
    cdf = np.cumsum(sums)
    if not cdf[-1] > 0:
        raise ValueError("sample: p has no positive mass")
    # u < the total: random() < 1, and a double times one below 1 never rounds up to a normal double
    u = rng.random() * cdf[-1]
    block = int(np.searchsorted(cdf, u, side="right"))  # cdf[block - 1] <= u < cdf[block]: a block with mass
    start = block * SAMPLE_BLOCK
    below = float(cdf[block - 1]) if block else 0.0
    return start + _draw(p[start : start + SAMPLE_BLOCK], (u - below) / sums[block])


def _draw(p: np.ndarray, r: float) -> int:
    """The token of ``p`` ([n] non-negative, positive mass) whose running-sum step holds r * total."""
    cdf = np.cumsum(p)
    if not cdf[-1] > 0:
        raise ValueError("sample: p has no positive mass")
    i = int(np.searchsorted(cdf, r * cdf[-1], side="right"))
    return i if i < len(p) else int(np.flatnonzero(p > 0)[-1])
