"""Accept rules for sampled drafts (specrt.engine.accept): sd, multi-candidate trees, hsd, hsd_capped.

Statistical tests draw RUNS outcomes of a rule on a toy target p / draft q (random tables over
V = 5 tokens for every prefix) and compare the emitted tokens with the target's exact joint law by
a Pearson chi-square goodness-of-fit test at significance ALPHA = 1e-3 (cells expected below 5
times are pooled). Seeds are fixed, so each outcome is deterministic; a correct rule fails one
such test by chance with probability 1e-3. Deliberately broken rules must fail the same tests.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from specrt.engine.accept import (
    HsdResume,
    HsdStep,
    Verifier,
    Walk,
    _hsd_scan,
    accept_hsd,
    accept_hsd_capped,
    accept_sd,
    accept_tree_stochastic,
    first_child_path,
    forward_hsd,
)
from specrt.errors import InvalidRequestError
from specrt.sampling import sample
from specrt.tree import DraftTree
from tests.helpers import chi2_pvalue

V = 5
DEPTH = 5  # longest prefix with tables
RUNS = 8_000
K = 3  # emitted tokens compared with the target's joint law
ALPHA = 1e-3

# ---------------------------------------------------------------------------------------------
# deterministic cases


def test_sd_accepts_everything_when_q_equals_p():
    p = np.array([[0.2, 0.8], [0.6, 0.4], [0.0, 1.0]])
    rng = np.random.default_rng(0)
    for _ in range(100):
        walk = accept_sd(np.array([1, 0]), p[:2], p, rng)
        assert walk.path.tolist() == [0, 1]
        assert walk.emitted.tolist() == [1, 0, 1]  # bonus from p[2], a point mass on 1


def test_sd_never_accepts_a_token_the_target_excludes():
    # the target's top-k removed token 0; the draft drew it: always rejected, recovered from (p - q)^+
    q = np.array([[0.5, 0.5, 0.0]])
    p = np.array([[0.0, 0.3, 0.7], [1.0, 0.0, 0.0]])
    rng = np.random.default_rng(0)
    for _ in range(200):
        walk = accept_sd(np.array([0]), q, p, rng)
        assert walk.path.tolist() == [] and walk.emitted.tolist() == [2]  # (p - q)^+ = [0, 0, 0.2]


def test_rules_refuse_a_token_q_could_not_draw():
    q = np.array([[1.0, 0.0]])
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    for rule in (accept_sd, accept_hsd, accept_hsd_capped):
        with pytest.raises(ValueError, match="has q = 0"):
            rule(np.array([1]), q, p, np.random.default_rng(0))


#   q: x1 = 0 with 0.5, then x2 = 0 with 0.5   (Q_2 = 0.25)
#   p: x1 = 0 with 0.25, then x2 = 0 with 1.0  (P_2 = 0.25)
# per-token ratios 0.5 and 2: sd accepts x1 half the time; the joint ratio is 1, so HSD always
# accepts both (capped: rho~ = min(1, 0.5 * 2) = 1)
JOINT_Q = np.array([[0.5, 0.5], [0.5, 0.5]])
JOINT_P = np.array([[0.25, 0.75], [1.0, 0.0], [0.0, 1.0]])


@pytest.mark.parametrize("rule", [accept_hsd_capped, lambda *a: accept_hsd(*a).walk], ids=["capped", "uncapped"])
def test_hsd_accepts_a_draft_by_its_joint_ratio(rule):
    rng = np.random.default_rng(0)
    walks = [rule(np.array([0, 0]), JOINT_Q, JOINT_P, rng) for _ in range(200)]
    assert all(w.emitted.tolist() == [0, 0, 1] for w in walks)
    sd_full = sum(len(accept_sd(np.array([0, 0]), JOINT_Q, JOINT_P, rng).path) == 2 for _ in range(2000))
    assert 800 < sd_full < 1200  # token-wise: accepted with min(1, 0.5) * min(1, 2) = 0.5


def test_hsd_leaves_the_block_open_after_an_early_recovered_token():
    # x1 has p = 0: the whole draft is rejected; only level 1 can stop (h_2 = 0: nothing to pay
    # at level 2 as P_1 = 0); the recovered token's branch is under-drafted and 2 levels remain
    q = np.array([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3], [1 / 3, 1 / 3, 1 / 3]])
    p = np.array([[0.0, 0.2, 0.8], [1 / 3, 1 / 3, 1 / 3], [1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]])
    step = accept_hsd(np.array([0, 1, 2]), q, p, np.random.default_rng(0))
    assert step.walk.path.tolist() == [] and step.walk.emitted.tolist() == [2]  # (p - q)^+ = [0, 0, 0.8]
    assert step.resume == HsdResume(ratio=float("inf"), levels=2)  # q(2) = 0: rho = inf


def test_forward_hsd_with_infinite_ratio_samples_the_target():
    # rho = inf: norm((rho p - q)^+) = p; the guess matches, the block completes, the bonus follows
    q = np.array([[0.9, 0.1]])
    p = np.array([[0.0, 1.0], [1.0, 0.0]])
    step = forward_hsd(HsdResume(float("inf"), 1), np.array([1]), q, p, np.random.default_rng(0))
    assert step.walk.path.tolist() == [0] and step.walk.emitted.tolist() == [1, 0] and step.resume is None


def test_forward_hsd_stops_where_the_next_level_has_no_q():
    # 2 levels open, 1 guessed node: level 1 matches the guess but level 2 would need q after it
    q = np.array([[0.5, 0.5]])
    p = np.array([[0.0, 1.0], [0.5, 0.5]])
    step = forward_hsd(HsdResume(2.0, 2), np.array([1]), q, p, np.random.default_rng(0))
    assert step.walk.path.tolist() == [] and step.walk.emitted.tolist() == [1]
    assert step.resume == HsdResume(ratio=4.0, levels=1)  # rho * p(1) / q(1) = 2 * 1 / 0.5
    with pytest.raises(ValueError, match="at least one token"):
        forward_hsd(HsdResume(2.0, 2), np.zeros(0, np.int64), np.zeros((0, 2)), p[:1], np.random.default_rng(0))


def test_verifier_validates_its_rule_and_open_blocks():
    with pytest.raises(InvalidRequestError, match="acceptance must be one of"):
        Verifier("spec")
    verifier = Verifier("hsd")
    verifier.resume = HsdResume(2.0, 1)
    assert verifier.forward_levels == 1
    with pytest.raises(ValueError, match="open HSD block"):
        verifier.walk(DraftTree.chain([1]), np.full((2, 2), 0.5), np.random.default_rng(0))  # no draft_probs


def test_verifier_hsd_reads_a_trees_first_child_path():
    #        root
    #       /    \
    #    n0:0    n1:1       n1 is ignored by HSD; n0 -> n2 is the chain it verifies
    #      |
    #    n2:0
    q = np.array([JOINT_Q[0], JOINT_Q[0], JOINT_Q[1]])
    tree = DraftTree(np.array([0, 1, 0]), np.array([-1, -1, 0]), draft_probs=q)
    assert first_child_path(tree).tolist() == [0, 2]
    probs = np.array([JOINT_P[0], JOINT_P[1], [0.5, 0.5], JOINT_P[2]])  # slots: root, n0, n1, n2
    for acceptance in ("hsd", "hsd_capped"):
        walk = Verifier(acceptance).walk(tree, probs, np.random.default_rng(0))
        assert walk.path.tolist() == [0, 2] and walk.emitted.tolist() == [0, 0, 1]


# ---------------------------------------------------------------------------------------------
# the emitted tokens follow the target (statistical)


class Toy:
    """Random target p and draft q for every prefix of up to DEPTH tokens; about a quarter of the
    entries are 0 (as after top-k), so supports differ. Seed 1 (the tests' default) is a toy on
    which the broken HSD variants below move the law of the first two tokens clearly (noncentrality
    0.01-0.04 per decode by exact enumeration); a correct rule passes on any seed."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.p: dict[tuple[int, ...], np.ndarray] = {}
        self.q: dict[tuple[int, ...], np.ndarray] = {}
        for n in range(DEPTH + 1):
            for prefix in itertools.product(range(V), repeat=n):
                self.p[prefix], self.q[prefix] = self._dist(rng), self._dist(rng)

    @staticmethod
    def _dist(rng: np.random.Generator) -> np.ndarray:
        w = rng.random(V) ** 3
        w[rng.random(V) < 0.25] = 0.0
        w[rng.integers(V)] += 0.05  # never all zero
        return w / w.sum()

    def chain(self, prefix: tuple[int, ...], g: int, rng: np.random.Generator, guess: bool = False):
        """A g-token draft after ``prefix`` (drawn from q, or q's argmax as forward-sampling guesses):
        draft [g], q [g, V], p [g + 1, V]."""
        tokens: list[int] = []
        for _ in range(g):
            q = self.q[prefix + tuple(tokens)]
            tokens.append(int(np.argmax(q)) if guess else sample(q, rng))
        q_rows = np.array([self.q[prefix + tuple(tokens[:i])] for i in range(g)]).reshape(g, V)
        p_rows = np.array([self.p[prefix + tuple(tokens[:i])] for i in range(g + 1)])
        return np.array(tokens, np.int64), q_rows, p_rows

    def joint(self, k: int) -> dict[tuple[int, ...], float]:
        """The target's law of the first k tokens."""
        law = {}
        for seq in itertools.product(range(V), repeat=k):
            law[seq] = float(np.prod([self.p[seq[:i]][seq[i]] for i in range(k)]))
        return law


Rule = Callable[..., Walk | HsdStep]


def first_tokens(rule: Rule, toy: Toy, g: int, rng: np.random.Generator, forward: bool = True) -> tuple[int, ...]:
    """The first K tokens of one decode: a g-token draft checked by ``rule``, then forward sampling
    while an HSD block is open (``forward=False``: a defect, plain sampling instead), then the target."""
    result = rule(*toy.chain((), g, rng), rng)
    walk, resume = (result.walk, result.resume) if isinstance(result, HsdStep) else (result, None)
    out = walk.emitted.tolist()
    while len(out) < K:
        if resume is not None and forward:
            n = int(rng.integers(1, resume.levels + 1))  # chains shorter than the open levels, too
            step = forward_hsd(resume, *toy.chain(tuple(out), n, rng, guess=True), rng)
            resume = step.resume
            out += step.walk.emitted.tolist()
        else:
            out.append(sample(toy.p[tuple(out)], rng))
    return tuple(out[:K])


@functools.cache
def toy(seed: int) -> Toy:
    return Toy(seed)


def pvalues(rule: Rule, seed: int = 1, forward: bool = True) -> dict[str, float]:
    """p-values of the first 1, 2 and 3 emitted tokens over RUNS decodes, each drafting 1-3 tokens."""
    rng = np.random.default_rng(seed)
    draws = [first_tokens(rule, toy(seed), int(rng.integers(1, 4)), rng, forward) for _ in range(RUNS)]
    return {f"first {k}": chi2_pvalue(Counter(d[:k] for d in draws), toy(seed).joint(k)) for k in (1, 2, 3)}


def hsd_walk(draft, q, p, rng) -> HsdStep:
    return accept_hsd(draft, q, p, rng)


RULES = {"sd": accept_sd, "hsd": hsd_walk, "hsd_capped": accept_hsd_capped}


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_emits_the_target_distribution(name):
    result = pvalues(RULES[name])
    assert min(result.values()) > ALPHA, result


def broken_sd(defect: str) -> Rule:
    def rule(draft, q, p, rng) -> Walk:
        for t, x in enumerate(draft):
            ratio = q[t, x] / p[t, x] if defect == "inverse_ratio" and p[t, x] > 0 else p[t, x] / q[t, x]
            if defect == "inverse_ratio" and p[t, x] == 0:
                ratio = np.inf
            if rng.random() >= min(1.0, ratio):
                recovered = p[t] if defect == "recover_from_p" else np.maximum(p[t] - q[t], 0)
                return Walk(np.arange(t), np.append(draft[:t], sample(recovered, rng)))
        return Walk(np.arange(len(draft)), np.append(draft, sample(p[len(draft)], rng)))

    return rule


def capped_with_raw_final_ratio(draft, q, p, rng) -> Walk:
    """The reference code's capped path: capped prefix ratios, but the full draft accepted with the
    uncapped joint ratio min(1, P_g / Q_g)."""
    r = p[np.arange(len(draft)), draft] / q[np.arange(len(draft)), draft]
    rho = np.ones(len(draft) + 1)
    for t, ratio in enumerate(r):
        rho[t + 1] = min(1.0, rho[t] * ratio)
    rho[-1] = min(1.0, float(np.prod(r)))
    accepted, token, _ = _hsd_scan(draft, q, p, rho, rng)
    return Walk(np.arange(accepted), np.append(draft[:accepted], token))


def test_broken_sd_copy_is_faithful():
    result = pvalues(broken_sd("none"))
    assert min(result.values()) > ALPHA, result


@pytest.mark.parametrize(
    "rule, forward",
    [
        (broken_sd("inverse_ratio"), True),  # accept with min(1, q / p)
        (broken_sd("recover_from_p"), True),  # recovered from p, not norm((p - q)^+)
        (hsd_walk, False),  # HSD without forward sampling after an early recovered token
        (capped_with_raw_final_ratio, True),  # capped HSD, uncapped full acceptance (the reference's)
    ],
    ids=["sd-inverse-ratio", "sd-recover-from-p", "hsd-no-forward-sampling", "hsd-capped-raw-final-ratio"],
)
def test_broken_rules_fail_the_same_test(rule, forward):
    result = pvalues(rule, forward=forward)
    assert min(result.values()) < ALPHA, result


# ---------------------------------------------------------------------------------------------
# trees: siblings drawn without replacement, multi-candidate recursive rejection sampling
#
#           root
#        /   |    \
#     n0:a  n1:b  n2:c     a, b, c drawn from q_root without replacement (fewer if q has fewer tokens)
#     /  \
#  n3:d  n4:e              d, e drawn from q(. | a) without replacement


def without_replacement(q: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    drawn, rest = [], q.copy()
    while len(drawn) < k and rest.sum() > 0:
        drawn.append(sample(rest, rng))
        rest[drawn[-1]] = 0.0
    return drawn


def tree_first_tokens(rule: Callable, toy: Toy, rng: np.random.Generator) -> tuple[int, int]:
    top = without_replacement(toy.q[()], 3, rng)
    below = without_replacement(toy.q[(top[0],)], 2, rng)
    ids = np.array(top + below, np.int64)
    parents = np.array([-1] * len(top) + [0] * len(below), np.int64)
    q = np.array([toy.q[()]] * len(top) + [toy.q[(top[0],)]] * len(below))
    prefixes = [()] + [(t,) for t in top] + [(top[0], t) for t in below]  # per window slot
    walk = rule(DraftTree(ids, parents), q, np.array([toy.p[s] for s in prefixes]), rng)
    out = walk.emitted.tolist()
    while len(out) < 2:
        out.append(sample(toy.p[tuple(out)], rng))
    return out[0], out[1]


def tree_pvalues(rule: Callable, seed: int = 1) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    draws = [tree_first_tokens(rule, toy(seed), rng) for _ in range(RUNS)]
    return {f"first {k}": chi2_pvalue(Counter(d[:k] for d in draws), toy(seed).joint(k)) for k in (1, 2)}


def tree_without_renormalising(tree: DraftTree, q: np.ndarray, p: np.ndarray, rng) -> Walk:
    """Defect: every sibling is checked against the full q, as if drawn with replacement."""
    path, emitted, node = [], [], -1
    while True:
        children, residual = tree.children(node), p[node + 1].copy()
        accepted = None
        for child in children:
            x, q_k = int(tree.token_ids[child]), q[child]
            if rng.random() * q_k[x] < residual[x] / residual.sum():
                accepted = int(child)
                break
            rest = np.maximum(residual / residual.sum() - q_k, 0.0)
            residual = rest if rest.sum() > 0 else residual
        if accepted is None:
            return Walk(np.array(path, np.int64), np.array([*emitted, sample(residual, rng)], np.int64))
        emitted.append(int(tree.token_ids[accepted]))
        path.append(accepted)
        node = accepted


def test_tree_rule_emits_the_target_distribution():
    result = tree_pvalues(accept_tree_stochastic)
    assert min(result.values()) > ALPHA, result


def test_tree_rule_that_ignores_sampling_without_replacement_fails():
    result = tree_pvalues(tree_without_renormalising)
    assert min(result.values()) < ALPHA, result


def test_verifier_sd_uses_the_tree_rule_for_branching_trees():
    # the same seed gives the same walk through the Verifier and through the rule itself
    t = toy(1)
    q_root = t.q[()]
    a, b = np.argsort(-q_root)[:2]
    tree = DraftTree(np.array([a, b]), np.array([-1, -1]), draft_probs=np.array([q_root, q_root]))
    probs = np.array([t.p[()], t.p[(int(a),)], t.p[(int(b),)]])
    for seed in range(20):
        mine = Verifier("sd").walk(tree, probs, np.random.default_rng(seed))
        theirs = accept_tree_stochastic(tree, tree.draft_probs, probs, np.random.default_rng(seed))
        assert mine.path.tolist() == theirs.path.tolist() and mine.emitted.tolist() == theirs.emitted.tolist()
