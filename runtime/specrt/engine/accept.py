"""The accept rules: which drafted tokens the target accepts, and what it emits, in one module with
one dispatcher (:meth:`Verifier.verify`) for every drafting method.

Vocabulary (vLLM's): drafted tokens the target agrees with are *accepted*; after the first
rejection the target's own token is the *recovered* token; when a leaf is reached with everything
accepted, the target's next token is the *bonus* token. emitted = accepted + (recovered | bonus);
a :class:`Walk` names the three.

Window slots: slot 0 is the root, slot i + 1 is tree node i (see specrt.tree).

Which rule walks a window (:meth:`Verifier.verify`):
    greedy decoding       ``walk_greedy``: follow the target's argmax (exact for any draft)
    sampling, a draft without q (n-gram lookups, retrieval; ``DraftTree.draft_probs`` None)
                          ``walk_sampling``: recursive rejection sampling with q = a point mass
    sampling, a draft sampled from q (a draft model)
                          the method's rule (its registry entry, specrt.drafters.Method.accept):
                          ``sd`` (a chain: token-wise; a tree: multi-candidate), ``hsd``, ``hsd_capped``

Rules for drafts *sampled* from a draft model's distribution q.

Notation. The draft ``x_1 .. x_g`` was drawn autoregressively, ``x_t ~ q_t = q(. | x_<t)``;
``p_t = p(. | x_<t)`` is the target's distribution at the same position and ``p_{g+1}`` the one
after the whole draft; both are warped by the same temperature / top-k / top-p. Joint probabilities
of a prefix: ``P_t = prod_{i <= t} p_i(x_i)``, ``Q_t = prod q_i(x_i)``, ratio ``rho_t = P_t / Q_t``
(``rho_0 = 1``). A rule returns a ``Walk``.

sd — token-wise speculative sampling (Leviathan et al. 2023; Chen et al. 2023)
    Accept ``x_t`` with probability ``min(1, p_t(x_t) / q_t(x_t))``, left to right; at the first
    rejection the recovered token is drawn from ``norm(max(p_t - q_t, 0))``; after full acceptance
    the bonus token from ``p_{g+1}``. Lossless: ``P(y) = min(p, q)(y) + sum(q - p)^+ *
    (p - q)^+(y) / sum(p - q)^+ = p(y)``, since ``sum(q - p)^+ = sum(p - q)^+``.

tree — multi-candidate recursive rejection sampling (SpecInfer, Miao et al. 2024; RSD, Jeon et al.
    2024). The children of a node were drawn from the node's q *without replacement*, in node order.
    With residual ``r := p`` and ``q_1 := q``, child ``k`` (token x) is accepted with probability
    ``min(1, r(x) / q_k(x))``; on rejection ``r := norm(max(r - q_k, 0))`` and ``q_{k+1} := q_k``
    with x removed, renormalised. If every child is rejected the recovered token is drawn from r;
    an accepted child continues the walk; at a leaf the bonus is drawn from p. Each child is one
    sd step of q_k against r, whose output is r: by induction over the children the emitted token
    is distributed as p. A chain is the one-child case: exactly ``sd``.

hsd — hierarchical speculative decoding (Zhou et al. 2026, arXiv 2601.05724; reference code
    github.com/ZhouYuxuanYX/Hierarchical-Speculative-Decoding, ``_speculative_sampling`` with
    ``backward=True`` and ``_forward_sampling``)
    Sequence-level verification:
    1. accept the whole draft with the joint ratio, probability ``min(1, rho_g)``;
    2. else *step back* from level ``t = g`` to 1. The branches that diverge from the draft at
       level t (prefix ``x_<t``, any token y) carry the excess and deficient mass
           ``over_t(y)  = (P_{t-1} p_t(y) - Q_{t-1} q_t(y))^+``  (target mass the drafts miss)
           ``under_t(y) = (Q_{t-1} q_t(y) - P_{t-1} p_t(y))^+``  (draft mass the target lacks)
       Stop at level t with probability ``h_t = sum over_t / max(sum over_t, sum under_t)``
       (``h_1 = 1``): accept ``x_<t`` and draw the recovered token from ``norm(over_t)``, the
       branch-divergence distribution (dividing by ``Q_{t-1}``: ``over_t ~ (rho_{t-1} p_t - q_t)^+``);
    3. *forward sampling*: the recovered branch ``x_<t y`` has ``rho > 1``; its remaining levels
       ``t + 1 .. g`` are drawn one by one from ``norm((rho p - q)^+)`` at the new prefix
       (``rho *= p(y) / q(y)`` after each), each needing a new target and draft pass: the engine's
       next steps (:class:`Verifier` keeps the ``HsdResume``). After level g plain sampling goes on.
    Why lossless. Claim, for every prefix z (depth d <= g) and the drafts through it: if
    ``P(z) <= Q(z)`` the decodes that stop inside z's subtree emit exactly ``P(z) p(. | z)`` and
    ``Q(z) - P(z)`` steps back out of z; if ``P(z) > Q(z)`` nothing steps back and they emit
    ``P(z) p(. | z)`` less a deficit of mass ``P(z) - Q(z)`` whose law is forward sampling from z.
    Induction from depth g (a full draft keeps ``min(P, Q)`` with the bonus, steps back ``(Q - P)^+``)
    up: z's children step back ``sum under`` in all and lack ``over(y) = (P(zy) - Q(zy))^+`` each,
    with forward sampling from zy as its law; stopping at z's level turns
    ``min(sum over, sum under)`` of the stepped-back mass into ``y ~ norm(over)`` followed by forward
    sampling — the children's deficit law — and ``sum over - sum under = P(z) - Q(z)`` gives both
    cases. At the root ``P = Q = 1``: the decodes emit exactly the target's law.

hsd_capped — HSD with capped prefix ratios (the reference code's default, "clever")
    Replace ``rho_t`` by the capped ``rho~_t = min(1, rho~_{t-1} p_t(x_t) / q_t(x_t))``, i.e.
    ``P~_t = P_t / max(1, max_{s <= t} rho_s)`` (the reference's running maximum of the prefix
    ratios, at least 1), in ``over_t``, ``under_t`` and the full acceptance ``rho~_g``. One verify
    pass per block, no forward sampling. Why lossless: give each prefix the target mass
    ``T(zy) = min(T(z) p(y | z), Q(zy))`` (``T = P~``, ``T(root) = 1``), always ``<= Q``; the claim's
    first case holds for every prefix with T in place of P: its subtree emits ``T(z) p(. | z)`` and
    steps back ``Q(z) - T(z)``. At z's level the children's subtrees emit ``T(zy) p(. | zy)`` and
    lack ``(T(z) p(y | z) - Q(zy))^+ = over(y)`` with law ``p(. | zy)``; as ``T(z) <= Q(z)``,
    ``sum over <= sum under``: the stepped-back mass pays every deficit in full with
    ``y ~ norm(over)`` and plain target sampling after it. The capped-off part of an under-drafted
    prefix (``P_t / M_{t-1} - Q_t`` when ``rho_t`` sets a new maximum M) shows up as
    ``over_t(x_t) > 0``: the recovered token may equal the drafted one.
    Deviation from the reference: its capped path accepts the full draft with the uncapped
    ``min(1, P_g / Q_g)``, which over-accepts once a cap is active (some ``rho_s > 1``, s < g) and
    does not reproduce the target (tests/runtime/test_rejection.py shows that variant failing); the
    induction above needs ``rho~_g``, which we use.

Trees under HSD: the joint rule is defined for one draft sequence; given a tree, ``hsd`` and
``hsd_capped`` verify its first-child path (the chain the draft model sampled) and ignore siblings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from specrt.errors import InvalidRequestError
from specrt.sampling import SamplingParams, TargetRows, sample, target_probs
from specrt.tree import DraftTree


@dataclass(frozen=True, eq=False)
class Walk:
    path: np.ndarray  # [a] accepted node indices, root to leaf
    emitted: np.ndarray  # [a + 1] accepted tokens, then the recovered or bonus token
    bonus: bool = False  # the last emitted token is the bonus (the path ends at a leaf), else recovered

    @property
    def accepted(self) -> np.ndarray:  # [a] the accepted drafted tokens
        return self.emitted[:-1]

    @property
    def recovered(self) -> int | None:
        """The target's token after the first rejection; None when the walk ended with a bonus."""
        return None if self.bonus else int(self.emitted[-1])

    @property
    def bonus_token(self) -> int | None:
        """The target's token after a fully accepted root-to-leaf path; None after a rejection."""
        return int(self.emitted[-1]) if self.bonus else None


class SlotArgmax:
    """``argmax(logits, axis=-1)`` of a window, a slot at a time: the greedy walk reads the slots along
    its path, 1 + the accepted drafts, and a slot's argmax over a 151,936-token vocabulary is a pass
    over 600 KB of logits. The same index as the whole window's argmax (the first maximum)."""

    def __init__(self, logits: np.ndarray):
        self.logits = logits  # [n, vocab]
        self.computed: list[int] = []  # slots read so far, in order

    def __len__(self) -> int:
        return len(self.logits)

    def __getitem__(self, slot: int) -> int:
        if not 0 <= slot < len(self.logits):
            raise IndexError(f"window slot {slot} out of range [0, {len(self.logits)})")
        self.computed.append(slot)
        return int(np.argmax(self.logits[slot]))


def walk_greedy(tree: DraftTree, target_next: np.ndarray | SlotArgmax) -> Walk:
    """Follow the target's argmax down the tree. target_next: [n + 1] argmax per window slot, read a
    slot at a time (a SlotArgmax computes only the slots the walk reaches)."""
    path, emitted, node = [], [], -1
    while True:
        want = int(target_next[node + 1])
        emitted.append(want)
        match = [c for c in tree.children(node) if tree.token_ids[c] == want]
        if not match:
            return Walk(np.array(path, np.int64), np.array(emitted, np.int64))
        node = int(match[0])
        path.append(node)


def walk_sampling(tree: DraftTree, probs: np.ndarray | TargetRows, rng: np.random.Generator) -> Walk:
    """Lossless acceptance for deterministic drafts (a point mass per drafted token).

    probs: [n + 1, vocab] target distribution per window slot, read a slot at a time (a TargetRows
    computes only the slots the walk reaches). At each node the children are tried in order; child x
    is accepted with probability r(x) / sum(r), where r is the residual target distribution (the
    target's p with every rejected sibling zeroed), else r(x) := 0. If all are rejected the
    recovered token is drawn from r; at a leaf the bonus token is drawn from p. This is recursive
    rejection sampling with q = delta(x): the emitted token is distributed as p.
    """
    path, emitted, node = [], [], -1
    while True:
        row = residual = probs[node + 1]  # copied at the first rejection only: a leaf or a plain step reads it as is
        accepted = None
        for child in tree.children(node):
            x = int(tree.token_ids[child])
            total = residual.sum()
            if residual[x] > 0 and rng.random() * total < residual[x]:
                accepted = int(child)
                break
            if residual is row:
                residual = row.copy()
            residual[x] = 0.0
        if accepted is None:
            emitted.append(sample(residual, rng))
            return Walk(np.array(path, np.int64), np.array(emitted, np.int64))
        emitted.append(int(tree.token_ids[accepted]))
        path.append(accepted)
        node = accepted


ACCEPTANCE = ("sd", "hsd", "hsd_capped")


@dataclass(frozen=True)
class HsdResume:
    """An HSD block left open by a recovered token before its last level (forward sampling)."""

    ratio: float  # rho = P / Q of the block's emitted branch so far; > 1 (inf when q was 0)
    levels: int  # block levels still to draw from norm((rho p - q)^+), >= 1


@dataclass(frozen=True, eq=False)
class HsdStep:
    walk: Walk
    resume: HsdResume | None  # None: the block is closed, the next step starts a new one


def _drafted_q(draft: np.ndarray, q: np.ndarray) -> np.ndarray:
    """[g] q_t(x_t) of the drafted tokens; refuses a token its q could not have drawn."""
    qx = q[np.arange(len(draft)), draft]
    if np.any(qx <= 0):
        t = int(np.flatnonzero(qx <= 0)[0])
        raise ValueError(f"draft token {int(draft[t])} at position {t} has q = 0: q is not what it was drawn from")
    return qx


def _branch_divergence(rho: float, p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, float]:
    """``over = (rho p - q)^+`` [vocab] and ``sum under = sum (q - rho p)^+`` at one level."""
    if np.isinf(rho):  # a draft token with q -> 0 in a forward-sampled prefix: (rho p - q)^+ ~ p
        return p.copy(), 0.0
    diff = rho * p - q
    return np.maximum(diff, 0.0), float(np.maximum(-diff, 0.0).sum())


def _next_ratio(rho: float, p_y: float, q_y: float) -> float:
    if p_y == 0.0:
        return 0.0
    return float("inf") if q_y == 0.0 or np.isinf(rho) else rho * p_y / q_y


def _emit(draft: np.ndarray, accepted: int, last: int) -> Walk:
    return Walk(np.arange(accepted, dtype=np.int64), np.append(draft[:accepted], last).astype(np.int64))


def accept_sd(draft: np.ndarray, q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> Walk:
    """Token-wise speculative sampling. draft: [g]; q: [g, vocab]; p: [g + 1, vocab]."""
    qx = _drafted_q(draft, q)
    for t, x in enumerate(draft):
        if not rng.random() * qx[t] < p[t, x]:  # reject with probability 1 - min(1, p / q)
            residual = np.maximum(p[t] - q[t], 0.0)
            return _emit(draft, t, sample(residual if residual.sum() > 0 else p[t], rng))
    return _emit(draft, len(draft), sample(p[len(draft)], rng))


def _hsd_scan(
    draft: np.ndarray, q: np.ndarray, p: np.ndarray, rho: np.ndarray, rng: np.random.Generator
) -> tuple[int, int, float]:
    """Steps 1-2 of HSD with prefix ratios ``rho`` ([g + 1]): (accepted a, emitted token, ratio of
    the branch ending in it). a = g with the bonus token, else the recovered token at level a + 1."""
    g = len(draft)
    if rng.random() < min(1.0, rho[g]):
        return g, sample(p[g], rng), 1.0
    for t in range(g, 0, -1):  # level t: branches off the prefix x_<t (rows t - 1)
        over, under = _branch_divergence(rho[t - 1], p[t - 1], q[t - 1])
        mass = over.sum()
        top = max(mass, under)
        if t == 1 or (top > 0 and rng.random() * top < mass):
            # at level 1 rho_0 = 1 so sum over = sum under: h_1 = 1 (p_1 = q_1 leaves nothing to step back to)
            y = sample(over if mass > 0 else p[0], rng)
            return t - 1, y, _next_ratio(rho[t - 1], p[t - 1, y], q[t - 1, y])
    raise AssertionError("unreachable: level 1 always stops")


def accept_hsd(draft: np.ndarray, q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> HsdStep:
    """HSD (uncapped) on a chain: the walk, and the forward-sampling state when the recovered
    token left levels of the block open. draft: [g]; q: [g, vocab]; p: [g + 1, vocab]."""
    r = p[np.arange(len(draft)), draft] / _drafted_q(draft, q)  # [g] p_t(x_t) / q_t(x_t)
    rho = np.concatenate([[1.0], np.cumprod(r)])  # [g + 1] rho_t = P_t / Q_t
    accepted, token, ratio = _hsd_scan(draft, q, p, rho, rng)
    levels = len(draft) - accepted - 1  # levels after the recovered token's
    resume = HsdResume(ratio, levels) if accepted < len(draft) and levels > 0 else None
    return HsdStep(_emit(draft, accepted, token), resume)


def accept_hsd_capped(draft: np.ndarray, q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> Walk:
    """HSD with capped prefix ratios: one pass, no forward sampling. Shapes as :func:`accept_hsd`."""
    r = p[np.arange(len(draft)), draft] / _drafted_q(draft, q)  # [g]
    rho = np.ones(len(draft) + 1)  # [g + 1] capped rho~_t = min(1, rho~_{t-1} r_t)
    for t, ratio in enumerate(r):
        rho[t + 1] = min(1.0, rho[t] * ratio)
    accepted, token, _ = _hsd_scan(draft, q, p, rho, rng)
    return _emit(draft, accepted, token)


def forward_hsd(
    resume: HsdResume, draft: np.ndarray, q: np.ndarray, p: np.ndarray, rng: np.random.Generator
) -> HsdStep:
    """HSD step 3: draw the open block's next levels from ``norm((rho p - q)^+)``.

    draft: [n >= 1] guesses of the levels' tokens (any tokens: they only decide how far this pass's
    target logits reach); q: [n, vocab] the draft's distribution at each slot; p: [n + 1, vocab].
    A level's token continues to the next slot when it equals the guess there and that slot has
    what the next level needs (q, or only p once the block is complete: the bonus)."""
    if len(draft) < 1:
        raise ValueError("forward_hsd needs the draft's q at the root: a draft of at least one token")
    rho, levels = resume.ratio, resume.levels
    for j in range(len(draft) + 1):
        if levels == 0:  # block complete: plain target sampling from here
            return HsdStep(_emit(draft, j, sample(p[j], rng)), None)
        over, _ = _branch_divergence(rho, p[j], q[j])
        y = sample(over if over.sum() > 0 else p[j], rng)  # sum over = rho - 1 + sum under > 0 as rho > 1
        rho, levels = _next_ratio(rho, p[j, y], q[j, y]), levels - 1
        if not (y == draft[j] and (levels == 0 or j + 1 < len(draft))):
            return HsdStep(_emit(draft, j, y), HsdResume(rho, levels) if levels > 0 else None)
    raise AssertionError("unreachable: the last slot either completes the block or stops")


def accept_tree_stochastic(tree: DraftTree, q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> Walk:
    """Multi-candidate recursive rejection sampling over a tree whose siblings were drawn from
    their parent's q without replacement, in node order. q: [n, vocab] (siblings share a row);
    p: [n + 1, vocab] per window slot (slot 0 = root, slot i + 1 = node i)."""
    path, emitted, node = [], [], -1
    while True:
        children = tree.children(node)
        residual = p[node + 1].copy()
        if len(children) == 0:
            emitted.append(sample(residual, rng))  # bonus
            return Walk(np.array(path, np.int64), np.array(emitted, np.int64))
        q_k = q[children[0]].copy()
        accepted = None
        for child in children:
            x = int(tree.token_ids[child])
            if q_k[x] <= 0:
                raise ValueError(f"node {child} (token {x}) has q = 0 after removing its earlier siblings")
            if rng.random() * q_k[x] < residual[x] * q_k.sum() / residual.sum():  # min(1, r(x) / q_k(x))
                accepted = int(child)
                break
            rest = np.maximum(residual / residual.sum() - q_k / q_k.sum(), 0.0)
            residual = rest if rest.sum() > 0 else residual  # rest = 0 only when rejection had probability 0
            q_k[x] = 0.0
            if q_k.sum() <= 0:
                break  # q had no more tokens: no later sibling can have been drawn
        if accepted is None:
            emitted.append(sample(residual, rng))  # recovered
            return Walk(np.array(path, np.int64), np.array(emitted, np.int64))
        emitted.append(int(tree.token_ids[accepted]))
        path.append(accepted)
        node = accepted


def first_child_path(tree: DraftTree) -> np.ndarray:
    """[d] node indices of the path that always takes the first child, from the root."""
    path, node = [], -1
    while len(children := tree.children(node)):
        node = int(children[0])
        path.append(node)
    return np.array(path, np.int64)


class Verifier:
    """One request's accept rules: :meth:`verify` walks every verify window of the request; its
    ``acceptance`` (``sd``, ``hsd`` or ``hsd_capped``, the method's registry entry) is the rule for
    drafts sampled from a q.

    Holds HSD's forward-sampling state between verify passes (``resume``); the engine hands
    ``forward_levels`` to the drafter (``Feedback.open_levels``) to propose the open block's
    remaining levels."""

    def __init__(self, acceptance: str = "sd"):
        if acceptance not in ACCEPTANCE:
            raise InvalidRequestError(f"acceptance must be one of {ACCEPTANCE}, got {acceptance!r}")
        self.acceptance = acceptance
        self.resume: HsdResume | None = None

    @property
    def forward_levels(self) -> int:
        """Levels of an open HSD block the next pass must draw (0: none, start a new block)."""
        return self.resume.levels if self.resume is not None else 0

    def reset(self) -> None:
        self.resume = None

    def verify(self, tree: DraftTree, logits: np.ndarray, sampling: SamplingParams, rng: np.random.Generator) -> Walk:
        """The walk of one verify window (the module docstring's table). logits: [n + 1, vocab] the
        target's per window slot; ``sampling`` warps them into p."""
        if sampling.greedy:
            walk = walk_greedy(tree, SlotArgmax(logits))
        else:  # a deterministic draft's walk reads only the rows it reaches; the others read them all
            lazy = tree.draft_probs is None and self.resume is None
            walk = self.walk(tree, TargetRows(logits, sampling) if lazy else target_probs(logits, sampling), rng)
        last = int(walk.path[-1]) if len(walk.path) else -1
        return replace(walk, bonus=len(tree.children(last)) == 0)

    def walk(self, tree: DraftTree, probs: np.ndarray | TargetRows, rng: np.random.Generator) -> Walk:
        """The sampling half of :meth:`verify`. probs: [n + 1, vocab] the target's distribution per
        window slot (a TargetRows only for a deterministic draft outside an open HSD block, whose
        walk reads a slot at a time)."""
        q = tree.draft_probs
        if self.resume is not None:
            chain = first_child_path(tree)
            if q is None or len(chain) == 0 or len(chain) != len(tree):
                raise ValueError("an open HSD block needs a chain of at least one node with its draft_probs")
            step = forward_hsd(self.resume, tree.token_ids, q, probs, rng)
            self.resume = step.resume
            return step.walk
        if q is None:
            return walk_sampling(tree, probs, rng)
        if self.acceptance == "sd":
            if len(first_child_path(tree)) == len(tree):
                return accept_sd(tree.token_ids, q, probs, rng)
            return accept_tree_stochastic(tree, q, probs, rng)
        chain = first_child_path(tree)
        slots = np.concatenate([[0], chain + 1])  # the root's slot, then the chain's nodes'
        if self.acceptance == "hsd":
            step = accept_hsd(tree.token_ids[chain], q[chain], probs[slots], rng)
            self.resume, walk = step.resume, step.walk
        else:
            walk = accept_hsd_capped(tree.token_ids[chain], q[chain], probs[slots], rng)
        return Walk(chain[walk.path], walk.emitted)
