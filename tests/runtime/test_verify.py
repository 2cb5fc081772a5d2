"""Walking a verified draft tree (specrt.engine.accept): greedy walks and lossless sampling."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from specrt import sampling
from specrt.engine.accept import SlotArgmax, Verifier, Walk, walk_greedy, walk_sampling
from specrt.sampling import SamplingParams, sample, target_probs
from specrt.tree import DraftTree
from tests.helpers import chi2_pvalue, chi2_sf

# ---------------------------------------------------------------------------------------------
# walk_greedy


def test_walk_greedy_stops_at_first_mismatch():
    #        root
    #       /    \
    #    n0:5    n1:7
    #      |
    #    n2:9
    tree = DraftTree(token_ids=np.array([5, 7, 9]), parents=np.array([-1, -1, 0]))
    walk = walk_greedy(tree, target_next=np.array([5, 8, 0, 0]))
    assert walk.path.tolist() == [0]  # accepted n0
    assert walk.emitted.tolist() == [5, 8]  # 5 accepted, 8 recovered (n2 drafted 9)


def test_walk_greedy_full_acceptance_gives_bonus():
    #    root
    #     |
    #    n0:5
    #     |
    #    n1:6
    tree = DraftTree.chain([5, 6])
    walk = walk_greedy(tree, target_next=np.array([5, 6, 3]))
    assert walk.path.tolist() == [0, 1]  # the whole chain accepted
    assert walk.emitted.tolist() == [5, 6, 3]  # 3 is the bonus from the leaf's slot


def test_walk_greedy_picks_the_matching_sibling():
    #        root
    #     /   |    \
    #   n0:5 n1:7  n2:8
    #    |    |
    #   n3:1 n4:2
    tree = DraftTree(np.array([5, 7, 8, 1, 2]), np.array([-1, -1, -1, 0, 1]))
    # slots: root, n0, n1, n2, n3, n4
    walk = walk_greedy(tree, target_next=np.array([7, 1, 2, 0, 0, 4]))
    assert walk.path.tolist() == [1, 4]  # the target wants 7 (n1), then 2 (n4); n0's branch ignored
    assert walk.emitted.tolist() == [7, 2, 4]  # bonus 4 from n4's slot


def test_walk_greedy_duplicate_siblings_take_the_first():
    #        root
    #       /    \
    #    n0:5    n1:5      duplicate token: node order decides (walk_sampling, too, only ever
    #      |      |        accepts the first of duplicate siblings)
    #    n2:6    n3:7
    tree = DraftTree(np.array([5, 5, 6, 7]), np.array([-1, -1, 0, 1]))
    walk = walk_greedy(tree, target_next=np.array([5, 8, 9, 0, 0]))
    assert walk.path.tolist() == [0]  # n0, not n1
    assert walk.emitted.tolist() == [5, 8]  # recovered from n0's slot (n1's would give 9)


def test_walk_greedy_rejects_root_children():
    #        root
    #       /    \
    #    n0:5    n1:7
    tree = DraftTree(np.array([5, 7]), np.array([-1, -1]))
    walk = walk_greedy(tree, target_next=np.array([6, 0, 0]))
    assert walk.path.tolist() == []  # nothing accepted
    assert walk.emitted.tolist() == [6]  # only the recovered token


def test_a_greedy_verify_reads_only_the_slots_its_walk_reaches():
    # random trees and logits: Verifier.verify (an argmax per slot reached) against walk_greedy on
    # the whole window's argmax; a walk reads 1 + its accepted nodes of the n + 1 slots
    rng = np.random.default_rng(9)
    greedy = SamplingParams()
    for trial in range(60):
        n = int(rng.integers(1, 9))
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)])
        tree = DraftTree(rng.integers(0, 3, n), parents)
        logits = rng.standard_normal((n + 1, 3)).astype(np.float32)
        logits[int(rng.integers(0, n + 1)), :] = 0.5  # a slot of ties: the first maximum, as argmax
        want = walk_greedy(tree, np.argmax(logits, axis=-1))
        walk = Verifier().verify(tree, logits, greedy, np.random.default_rng(0))
        assert walk.path.tolist() == want.path.tolist() and walk.emitted.tolist() == want.emitted.tolist(), trial
        slots = SlotArgmax(logits)
        walk_greedy(tree, slots)
        assert slots.computed == [0, *(walk.path + 1).tolist()], trial


def test_walk_greedy_empty_tree():
    walk = walk_greedy(DraftTree.empty(), target_next=np.array([3]))
    assert walk.path.tolist() == []
    assert walk.emitted.tolist() == [3]  # plain decoding: one token from the root's slot
    assert walk.path.dtype == np.int64 and walk.emitted.dtype == np.int64


# ---------------------------------------------------------------------------------------------
# walk_sampling: deterministic cases


def test_walk_sampling_point_masses_act_like_greedy():
    #        root
    #       /    \
    #    n0:1    n1:2
    #      |
    #    n2:3
    tree = DraftTree(np.array([1, 2, 3]), np.array([-1, -1, 0]))
    probs = np.eye(5)[[2, 0, 4, 0]]  # slots: root -> 2, n0 -> 0, n1 -> 4, n2 -> 0
    walk = walk_sampling(tree, probs, np.random.default_rng(0))
    assert walk.path.tolist() == [1]  # n0 (token 1) has p = 0, n1 (token 2) has p = 1
    assert walk.emitted.tolist() == [2, 4]  # accepted 2, then n1 is a leaf: bonus 4


def test_walk_sampling_never_accepts_a_zero_probability_draft():
    # one node drafting token 0, which the target never emits
    tree = DraftTree.chain([0])
    probs = np.array([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    rng = np.random.default_rng(1)
    for _ in range(200):
        walk = walk_sampling(tree, probs, rng)
        assert walk.path.tolist() == []
        assert walk.emitted.tolist() in ([1], [2])  # recovered from the residual, never 0


def test_walk_sampling_leaves_the_target_rows_as_they_were():
    # rejected siblings are zeroed in a copy: a row that the caller keeps (TargetRows caches them)
    # still holds the target's law after a walk through rejections
    tree = DraftTree(np.array([0, 1, 2]), np.array([-1, -1, -1]))  # three siblings at the root
    probs = np.array([[0.0, 0.0, 0.5, 0.5]] + [[0.25] * 4] * 3)  # slots: the root, then one per node
    kept = probs.copy()
    rng = np.random.default_rng(4)
    walks = [walk_sampling(tree, probs, rng) for _ in range(300)]
    np.testing.assert_array_equal(probs, kept)
    assert {tuple(w.emitted.tolist()) for w in walks} == {(2, 0), (2, 1), (2, 2), (2, 3), (3,)}


def test_walk_sampling_empty_tree_samples_from_root():
    walk = walk_sampling(DraftTree.empty(), np.array([[0.0, 0.0, 1.0]]), np.random.default_rng(0))
    assert walk.path.tolist() == []
    assert walk.emitted.tolist() == [2]


def test_verify_of_a_deterministic_draft_computes_only_the_rows_it_walks(monkeypatch):
    # slot 0 (the root) puts no mass on token 0, so the chain [0, 1, 2] is rejected at its first
    # node: of the window's 4 rows only the root's is turned into probabilities; the walk is the one
    # over the whole matrix, with the same random numbers
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 50)).astype(np.float32)
    logits[0, 0] = -1e30
    params = SamplingParams(temperature=0.9, top_p=0.95)
    computed = []

    def counted(rows, p):
        computed.append(len(rows))
        return target_probs(rows, p)

    monkeypatch.setattr(sampling, "target_probs", counted)
    tree = DraftTree.chain([0, 1, 2])
    walk = Verifier().verify(tree, logits, params, np.random.default_rng(11))
    assert computed == [1]
    want = walk_sampling(tree, target_probs(logits, params), np.random.default_rng(11))
    assert walk.path.tolist() == want.path.tolist() == [] and walk.emitted.tolist() == want.emitted.tolist()


def test_verify_of_a_deterministic_draft_walks_as_the_whole_matrix_does():
    # random trees and logits: Verifier.verify (rows computed as reached) against walk_sampling on
    # target_probs of the whole window, the same seed: the same path and the same tokens
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(1, 9))
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)])
        tree = DraftTree(rng.integers(0, 6, n), parents)
        logits = (rng.standard_normal((n + 1, 6)) * 2).astype(np.float32)
        params = SamplingParams(temperature=float(rng.uniform(0.5, 1.5)))
        walk = Verifier().verify(tree, logits, params, np.random.default_rng(trial))
        want = walk_sampling(tree, target_probs(logits, params), np.random.default_rng(trial))
        assert walk.path.tolist() == want.path.tolist() and walk.emitted.tolist() == want.emitted.tolist(), trial


# ---------------------------------------------------------------------------------------------
# walk_sampling: the emitted tokens are distributed as the target (statistical test)


def test_chi2_sf_known_quantiles():
    # upper 1e-3 quantiles of chi-square (standard tables)
    for df, q in [(1, 10.828), (2, 13.816), (3, 16.266), (4, 18.467), (5, 20.515)]:
        assert chi2_sf(q, df) == pytest.approx(1e-3, rel=1e-3)


def law_of(p: np.ndarray) -> dict[int, float]:
    """Token -> probability of the (unnormalized) distribution ``p`` ([vocab])."""
    return {int(t): float(p[t] / p.sum()) for t in range(len(p))}


#            root
#      /    |     |    \
#   n0:1  n1:2  n2:1  n3:4      n2 duplicates n0's token; n3's token has p_root = 0
#   /  \    |
# n4:3 n5:0 n6:2               n5's token has p = 0 at n0
SIBLINGS = DraftTree(np.array([1, 2, 1, 4, 3, 0, 2]), np.array([-1, -1, -1, -1, 0, 0, 1]))
PROBS = np.array(
    [
        [0.10, 0.30, 0.25, 0.35, 0.00],  # slot 0: root
        [0.00, 0.10, 0.30, 0.35, 0.25],  # slot 1: n0 (token 1)
        [0.40, 0.00, 0.20, 0.10, 0.30],  # slot 2: n1 (token 2)
        [0.20, 0.20, 0.20, 0.20, 0.20],  # slot 3: n2 (never reached: its token is n0's)
        [0.20, 0.20, 0.20, 0.20, 0.20],  # slot 4: n3 (never reached: p_root[4] = 0)
        [0.50, 0.50, 0.00, 0.00, 0.00],  # slots 5..7: leaves (only reached by a third token)
        [0.00, 0.00, 0.50, 0.50, 0.00],
        [0.00, 0.00, 0.00, 0.50, 0.50],
    ]
)
RUNS = 20_000
# Significance of every goodness-of-fit test below. With a fixed seed the outcome is
# deterministic; at 1e-3 a correct walk fails by chance with probability ~3e-3 per seed.
ALPHA = 1e-3


def emitted_pvalues(walk_fn, seed: int = 0) -> dict[str, float]:
    """Chi-square p-values of the first two emitted tokens of ``RUNS`` walks over SIBLINGS, and
    how many walks accepted an unreachable first node.

    Events: the first emitted token over all runs ~ p_root; the second emitted token given that
    the first one was an accepted node ~ p at that node's slot (a walk whose first token is
    recovered stops there, so it has no second token and is not counted)."""
    rng = np.random.default_rng(seed)
    first: Counter = Counter()
    first_node: Counter = Counter()  # accepted first node (-1 = the first token was recovered)
    second: dict[int, Counter] = {0: Counter(), 1: Counter()}  # given accepted n0 / n1
    for _ in range(RUNS):
        walk = walk_fn(SIBLINGS, PROBS, rng)
        first[int(walk.emitted[0])] += 1
        node = int(walk.path[0]) if len(walk.path) else -1
        first_node[node] += 1
        if node in second:
            second[node][int(walk.emitted[1])] += 1
    return {
        "first": chi2_pvalue(first, law_of(PROBS[0])),
        "second | n0": chi2_pvalue(second[0], law_of(PROBS[1])),
        "second | n1": chi2_pvalue(second[1], law_of(PROBS[2])),
        # n2 repeats n0's token and n3's token has p_root = 0: neither may ever be accepted
        "n2 or n3 accepted": float(first_node[2] + first_node[3]),
    }


def test_walk_sampling_emits_the_target_distribution():
    pvalues = emitted_pvalues(walk_sampling)
    assert pvalues.pop("n2 or n3 accepted") == 0, pvalues
    assert all(p > ALPHA for p in pvalues.values()), pvalues


def broken_walk(variant: str):
    """A copy of walk_sampling with one deliberate defect (``variant``; "none" = faithful copy)."""

    def walk(tree: DraftTree, probs: np.ndarray, rng: np.random.Generator) -> Walk:
        path, emitted, node = [], [], -1
        while True:
            # defect: read the parent's slot instead of this node's (off by one)
            slot = node if variant == "wrong_slot" and node >= 0 else node + 1
            residual = probs[slot].copy()
            accepted = None
            for child in tree.children(node):
                x = int(tree.token_ids[child])
                total = residual.sum()
                # defect: accept with min(1, 2 r(x) / sum r)
                gain = 2.0 if variant == "double_accept" else 1.0
                if residual[x] > 0 and rng.random() * total < gain * residual[x]:
                    accepted = int(child)
                    break
                if variant != "keep_rejected":  # defect: the rejected token stays in the residual
                    residual[x] = 0.0
            if accepted is None:
                emitted.append(sample(residual, rng))
                return Walk(np.array(path, np.int64), np.array(emitted, np.int64))
            emitted.append(int(tree.token_ids[accepted]))
            path.append(accepted)
            node = accepted

    return walk


def test_broken_walk_copy_is_faithful():
    # the defect-free copy draws exactly what walk_sampling draws: the negative checks below
    # therefore test the defects, not a drift between the copy and the real walk
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    copy = broken_walk("none")
    for _ in range(500):
        a, b = walk_sampling(SIBLINGS, PROBS, rng_a), copy(SIBLINGS, PROBS, rng_b)
        assert a.path.tolist() == b.path.tolist() and a.emitted.tolist() == b.emitted.tolist()


@pytest.mark.parametrize(
    "variant, event",
    [
        ("double_accept", "first"),  # P(first = 1) becomes 0.6 instead of 0.3
        ("keep_rejected", "first"),  # a rejected 1 is retried at n2 and can be recovered
        ("wrong_slot", "second | n0"),  # the second token follows p_root, not p at n0
    ],
)
def test_broken_walks_fail_the_same_test(variant, event):
    pvalues = emitted_pvalues(broken_walk(variant))
    assert pvalues[event] < ALPHA, pvalues
