"""Prompt lookup decoding (specrt.drafters.pld) and the drafter registry."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrt.drafters import METHODS, DrafterEnv, Feedback, make_drafter
from specrt.drafters.baseline import NoDraft
from specrt.drafters.pld import NgramIndex, PromptLookup, build_trie, continuations, ngram_matches
from specrt.errors import InvalidRequestError
from specrt.tree import DraftTree
from tests.helpers import as_lists, ctx

# every implemented method, and nothing else
REGISTERED = [
    "adapld", "anpd", "asam", "asam_verify", "asd", "asd_verify", "auto", "baseline", "hsd", "hsd_capped", "lookahead",
    "pld", "pld_plus", "rest", "sam_decoding", "sd", "suffix_decoding", "token_recycling",
]


# ---------------------------------------------------------------------------------------------
# ngram_matches


@pytest.mark.parametrize(
    "context, n, expected",
    [
        (ctx(1, 2, 3, 1, 2, 4, 1, 2), 2, [3, 0]),  # suffix [1, 2]: most recent occurrence first
        (ctx(1, 2, 3, 1, 2, 4, 1, 2), 1, [4, 1]),  # suffix [2]; the suffix itself (index 7) excluded
        (ctx(1, 2, 3, 1, 2, 4, 1, 2), 3, []),  # suffix [4, 1, 2] only occurs as the suffix
        (ctx(7, 7, 7, 7), 2, [1, 0]),  # overlapping occurrences; index 2 is the suffix itself
        (ctx(7, 7, 7, 7), 3, [0]),
        (ctx(5, 6), 2, []),  # n = len: only the suffix itself
        (ctx(5, 6), 3, []),  # n > len
        (ctx(5, 5), 0, []),  # n < 1
        (ctx(), 1, []),  # empty context
    ],
)
def test_ngram_matches(context, n, expected):
    hits = ngram_matches(context, n)
    assert hits.tolist() == expected
    assert hits.dtype == np.int64


# ---------------------------------------------------------------------------------------------
# NgramIndex


def test_ngram_index_gives_the_scan_s_starts_as_the_context_grows():
    index = NgramIndex(1, 3)
    assert list(index.continuation_starts(ctx(1, 2, 3, 1, 2), 2)) == [2]  # [1, 2] at 0, followed from 2
    assert list(index.continuation_starts(ctx(1, 2, 3, 1, 2, 4, 1, 2), 2)) == [5, 2]  # 3 tokens later
    assert list(index.continuation_starts(ctx(1, 2, 3, 1, 2, 4, 1, 2), 1)) == [5, 2]
    assert list(index.continuation_starts(ctx(1, 2, 3, 1, 2, 4, 1, 2), 3)) == []
    assert list(index.continuation_starts(ctx(7, 7, 7, 7), 2)) == [3, 2]  # not an extension: afresh
    assert list(index.continuation_starts(ctx(7, 7, 7, 7), 4)) == []  # n above the index's 3
    assert list(index.continuation_starts(ctx(5), 1)) == [] and list(index.continuation_starts(ctx(), 1)) == []
    grown = NgramIndex(1, 3)  # a token a step: each 3-gram is indexed across the previous call's end
    for t in range(1, 10):
        starts = list(grown.continuation_starts(ctx(1, 2, 3, 1, 2, 3, 1, 2, 3)[:t], 3))
    assert starts == [6, 3]


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=0, max_size=60),
    cuts=st.lists(st.integers(0, 60), min_size=1, max_size=8),
    lo=st.integers(1, 3),
    extra=st.integers(0, 2),
)
def test_ngram_index_matches_the_scan_on_any_sequence_of_contexts(tokens, cuts, lo, extra):
    # contexts that grow, shrink or jump (a new request), then grow a token at a time, each looked
    # up at every n of the index
    index, hi = NgramIndex(lo, lo + extra), lo + extra
    sequence = np.array(tokens, np.int64)
    for cut in sorted(cuts)[: len(cuts) // 2] + cuts + list(range(len(sequence) + 1)):
        context = sequence[: min(cut, len(sequence))]
        for n in range(lo, hi + 1):
            assert list(index.continuation_starts(context, n)) == (ngram_matches(context, n) + n).tolist()
        indexed = continuations(context, hi, lo, 4, 3, index.continuation_starts)
        assert [c.tolist() for c in indexed] == [c.tolist() for c in continuations(context, hi, lo, 4, 3)]


# ---------------------------------------------------------------------------------------------
# continuations

#                     0  1  2  3  4  5  6  7  8  9  10
REPEATS = ctx(4, 2, 3, 7, 1, 2, 3, 8, 1, 2, 3)  # suffix [1, 2, 3] occurs at 4; [2, 3] also at 1


def test_continuations_longest_ngram_first_and_dedup():
    # 3-gram at 4 -> [8, 1]; 2-gram at 5 -> [8, 1] again (dropped), at 1 -> [7, 1];
    # 1-gram [3] at 6 and 2 repeat those two continuations (dropped)
    found = continuations(REPEATS, max_ngram=3, min_ngram=1, length=2, limit=10)
    assert [c.tolist() for c in found] == [[8, 1], [7, 1]]


def test_continuations_limit():
    found = continuations(REPEATS, max_ngram=3, min_ngram=1, length=2, limit=1)
    assert [c.tolist() for c in found] == [[8, 1]]  # only the best one


def test_continuations_min_ngram_excludes_short_matches():
    # context [1, 2, 9, 2]: only a 1-gram match ([2] at 1 -> [9, 2]); min_ngram = 2 forbids it
    assert continuations(ctx(1, 2, 9, 2), 3, 2, length=2, limit=4) == []
    assert [c.tolist() for c in continuations(ctx(1, 2, 9, 2), 3, 1, length=2, limit=4)] == [[9, 2]]


def test_continuations_are_cut_at_the_end_of_the_context():
    # [5, 6] at 0 is followed by [5, 6] only: length 4 asks for more than there is
    found = continuations(ctx(5, 6, 5, 6), 2, 2, length=4, limit=4)
    assert [c.tolist() for c in found] == [[5, 6]]


def test_continuations_max_ngram_larger_than_context():
    found = continuations(ctx(3, 3), max_ngram=8, min_ngram=1, length=3, limit=4)
    assert [c.tolist() for c in found] == [[3]]  # 1-gram [3] at 0, followed by the last 3


# ---------------------------------------------------------------------------------------------
# build_trie


def test_build_trie_merges_shared_prefixes():
    #        root
    #       /    \
    #    n0:1    n4:5
    #      |
    #    n1:2
    #    /   \
    # n2:3  n3:4
    paths = [ctx(1, 2, 3), ctx(1, 2, 4), ctx(5)]
    assert as_lists(build_trie(paths, budget=10)) == ([1, 2, 3, 4, 5], [-1, 0, 1, 1, -1])


def test_build_trie_identical_paths_cost_nothing():
    assert as_lists(build_trie([ctx(1, 2), ctx(1, 2), ctx(1)], budget=10)) == ([1, 2], [-1, 0])


@pytest.mark.parametrize(
    "budget, tokens, parents",
    [
        (4, [1, 2, 3, 4], [-1, 0, 1, 1]),  # the [5] branch does not fit
        (3, [1, 2, 3], [-1, 0, 1]),  # only the first path fits
        (2, [1, 2], [-1, 0]),  # the first path is cut
        (0, [], []),  # nothing fits
    ],
)
def test_build_trie_respects_budget(budget, tokens, parents):
    paths = [ctx(1, 2, 3), ctx(1, 2, 4), ctx(5)]
    assert as_lists(build_trie(paths, budget)) == (tokens, parents)


def test_build_trie_stops_at_the_first_path_that_overflows():
    # budget 4: [1, 2, 3] takes 3 nodes, [6, 7] is cut after 6; [1, 2] would be free but the
    # trie is full, so the result is the same with or without it
    tree = build_trie([ctx(1, 2, 3), ctx(6, 7), ctx(1, 2)], budget=4)
    assert as_lists(tree) == ([1, 2, 3, 6], [-1, 0, 1, -1])


def test_build_trie_no_paths():
    assert len(build_trie([], budget=5)) == 0


# ---------------------------------------------------------------------------------------------
# PromptLookup


def test_chain_no_3gram_match_2gram_match():
    # suffix [4, 1, 2] never occurred; [1, 2] did at 0, followed by [3, 4, 1]
    tree = PromptLookup(max_ngram=3).propose(ctx(1, 2, 3, 4, 1, 2), budget=3)
    assert as_lists(tree) == ([3, 4, 1], [-1, 0, 1])


def test_chain_takes_most_recent_occurrence():
    # [1, 2] at 3 (-> 5, 1) is more recent than at 0 (-> 3, 1)
    tree = PromptLookup().propose(ctx(1, 2, 3, 1, 2, 5, 1, 2), budget=2)
    assert as_lists(tree) == ([5, 1], [-1, 0])


def test_chain_is_shorter_than_budget_near_the_end():
    # [9] at 1 is followed by [8, 9] only: 2 nodes although 5 are allowed
    tree = PromptLookup().propose(ctx(7, 9, 8, 9), budget=5)
    assert as_lists(tree) == ([8, 9], [-1, 0])


#                     0  1  2  3  4  5  6  7  8  9  10 11
BRANCHY = ctx(1, 2, 3, 1, 2, 4, 1, 2, 5, 9, 1, 2)  # [1, 2] at 6, 3, 0; [9, 1, 2] nowhere else


def test_tree_mode_branches_on_distinct_continuations():
    #        root
    #       /    \
    #    n0:5    n2:4        [1, 2] at 6 -> [5, 9], at 3 -> [4, 1]; each branch 2 deep
    #      |      |
    #    n1:9    n3:1
    tree = PromptLookup(tree=True).propose(BRANCHY, budget=4)
    assert as_lists(tree) == ([5, 9, 4, 1], [-1, 0, -1, 2])


def test_tree_mode_budget_cuts_the_last_branch():
    #        root
    #       /    \
    #    n0:5    n3:4        depth 3 each; the third branch ([3, 1, 2], at 0) does not fit
    #      |      |
    #    n1:9    n4:1
    #      |      |
    #    n2:1    n5:2
    tree = PromptLookup(tree=True).propose(BRANCHY, budget=6)
    assert as_lists(tree) == ([5, 9, 1, 4, 1, 2], [-1, 0, 1, -1, 3, 4])


def test_tree_mode_merges_shared_prefixes():
    #        root
    #         |
    #       n0:5             [1] at 3 -> [5, 7, 1], at 0 -> [5, 6, 1]: one shared node 5
    #       /   \
    #    n1:7   n3:6
    #      |      |
    #    n2:1   n4:1
    tree = PromptLookup(tree=True).propose(ctx(1, 5, 6, 1, 5, 7, 1), budget=6)
    assert as_lists(tree) == ([5, 7, 1, 6, 1], [-1, 0, 1, 0, 3])


def test_tree_mode_max_branches():
    # the same context as above with one branch: only the most recent continuation
    tree = PromptLookup(tree=True, max_branches=1).propose(BRANCHY, budget=4)
    assert as_lists(tree) == ([5, 9], [-1, 0])


def test_defaults_chain_mode_3gram_1gram():
    #                     0  1  2  3  4  5  6  7  8  9  10 11 12 13
    context = ctx(5, 6, 7, 8, 9, 1, 6, 7, 8, 2, 5, 6, 7, 8)
    drafter = PromptLookup()
    # default max_ngram = 3: the 4-gram [5, 6, 7, 8] at 0 (-> 9) is not looked for; the
    # 3-gram [6, 7, 8] at 6 (-> 2, 5, 6) is the most recent one; chain mode: one path
    assert as_lists(drafter.propose(context, budget=3)) == ([2, 5, 6], [-1, 0, 1])
    assert as_lists(PromptLookup(max_ngram=4).propose(context, budget=3)) == ([9, 1, 6], [-1, 0, 1])
    # default min_ngram = 1: a lone repeated token is enough
    assert as_lists(drafter.propose(ctx(4, 3, 5, 3), budget=2)) == ([5, 3], [-1, 0])
    # default is a chain even when several continuations exist
    assert as_lists(drafter.propose(BRANCHY, budget=4)) == ([5, 9, 1, 2], [-1, 0, 1, 2])


def test_make_drafter_pld_uses_the_defaults():
    chain = make_drafter("pld", DrafterEnv(vocab=16, tree=False))
    tree = make_drafter("pld", DrafterEnv(vocab=16, tree=True))
    assert isinstance(chain, PromptLookup) and isinstance(tree, PromptLookup)
    assert (chain.tree, chain.max_ngram, chain.min_ngram, chain.max_branches) == (False, 3, 1, 1)
    assert (tree.tree, tree.max_ngram, tree.min_ngram, tree.max_branches) == (True, 3, 1, 4)
    assert as_lists(tree.propose(BRANCHY, budget=4)) == ([5, 9, 4, 1], [-1, 0, -1, 2])


@pytest.mark.parametrize("tree_mode", [False, True])
@pytest.mark.parametrize(
    "context, budget",
    [
        (ctx(1, 2, 1, 2), 0),  # budget 0: nothing, though there is a match
        (ctx(1, 2, 1, 2), -1),  # negative budget: nothing
        (ctx(), 4),  # empty context
        (ctx(3), 4),  # a single token cannot repeat
        (ctx(1, 2, 3, 4), 4),  # all distinct: no match at any n
    ],
)
def test_nothing_to_propose_is_an_empty_tree(tree_mode, context, budget):
    tree = PromptLookup(tree=tree_mode).propose(context, budget)
    assert isinstance(tree, DraftTree)
    assert len(tree) == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_ngram": 0}, "need 1 <= min_ngram <= max_ngram, got 0, 3"),
        ({"min_ngram": 4, "max_ngram": 3}, "need 1 <= min_ngram <= max_ngram, got 4, 3"),
        ({"max_branches": 0, "tree": True}, "max_branches must be >= 1, got 0"),
    ],
)
def test_prompt_lookup_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PromptLookup(**kwargs)


def test_observe_changes_nothing():
    drafter = PromptLookup()
    before = as_lists(drafter.propose(BRANCHY, budget=3))
    verified = DraftTree.chain([5, 9, 1])
    feedback = Feedback(verified, path=ctx(0, 1), logits=np.zeros((4, 16), np.float32), hidden_states=np.zeros((4, 8)))
    drafter.begin(BRANCHY, np.zeros((len(BRANCHY), 8), np.float32))
    drafter.observe(ctx(5, 9, 7), feedback)
    assert as_lists(drafter.propose(BRANCHY, budget=3)) == before


# ---------------------------------------------------------------------------------------------
# registry


def test_make_drafter_unknown_method_lists_valid_ones():
    with pytest.raises(InvalidRequestError, match=r"unknown method 'eagle'; valid methods: adapld, anpd, asam, "):
        make_drafter("eagle", DrafterEnv(vocab=16, tree=False))


def test_registry_names():
    assert sorted(METHODS) == REGISTERED
    assert isinstance(make_drafter("baseline", DrafterEnv(vocab=16, tree=True)), NoDraft)
    assert len(make_drafter("baseline", DrafterEnv(vocab=16, tree=False)).propose(BRANCHY, budget=4)) == 0


# ---------------------------------------------------------------------------------------------
# property: every proposal is a well-formed tree of continuations that occurred


def occurs_after_suffix(context: np.ndarray, path: list[int], min_ngram: int, max_ngram: int) -> bool:
    """Some suffix n-gram (min_ngram <= n <= max_ngram) occurred earlier at i, followed by ``path``."""
    t = len(context)
    for n in range(min_ngram, min(max_ngram, t - 1) + 1):
        for i in range(t - n):  # i + n < t: the suffix itself excluded
            if context[i : i + n].tolist() == context[t - n :].tolist():
                if context[i + n : i + n + len(path)].tolist() == path:
                    return True
    return False


def has_match(context: np.ndarray, min_ngram: int, max_ngram: int) -> bool:
    return any(len(ngram_matches(context, n)) for n in range(min_ngram, max_ngram + 1))


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=30),
    budget=st.integers(0, 12),
    tree_mode=st.booleans(),
    ngrams=st.tuples(st.integers(1, 4), st.integers(0, 2)),
    max_branches=st.integers(1, 5),
)
def test_proposals_are_well_formed_continuations(tokens, budget, tree_mode, ngrams, max_branches):
    min_ngram, extra = ngrams
    max_ngram = min_ngram + extra
    context = np.array(tokens, np.int64)
    drafter = PromptLookup(tree=tree_mode, max_ngram=max_ngram, min_ngram=min_ngram, max_branches=max_branches)
    tree = drafter.propose(context, budget)
    n = len(tree)
    ids, parents = tree.token_ids, tree.parents

    # well-formed: 1-D int64, parents[i] in [-1, i), at most budget nodes, tokens from the context
    assert ids.dtype == np.int64 and parents.dtype == np.int64
    assert n <= max(budget, 0)
    assert np.all(parents >= -1) and np.all(parents < np.arange(n))
    assert set(ids.tolist()) <= set(tokens)
    if not tree_mode:
        assert parents.tolist() == list(range(-1, n - 1))  # a chain
    else:
        # a trie: no two siblings draft the same token; no branch deeper than half the budget
        pairs = list(zip(parents.tolist(), ids.tolist(), strict=True))
        assert len(set(pairs)) == n
        assert n == 0 or tree.depths().max() <= max(1, (budget + 1) // 2)

    # every root-to-node path occurred after an earlier occurrence of a suffix n-gram
    for node in range(n):
        path, i = [], node
        while i >= 0:
            path.append(int(ids[i]))
            i = int(parents[i])
        assert occurs_after_suffix(context, path[::-1], min_ngram, max_ngram), (path[::-1], tokens)

    # nothing to propose only when there is no room or no match
    if budget >= 1 and has_match(context, min_ngram, max_ngram):
        assert n >= 1
