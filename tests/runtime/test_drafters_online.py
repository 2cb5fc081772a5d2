"""Model-free drafters that learn online: pld_plus, adapld, anpd, lookahead, token_recycling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrt.drafters import DrafterEnv, Feedback, adapld, anpd, lookahead, pld_plus, token_recycling
from specrt.drafters.adapld import AdaptivePromptLookup
from specrt.drafters.anpd import AdaptiveNgram
from specrt.drafters.lookahead import LookaheadPool
from specrt.drafters.pld_plus import HiddenStore, PromptLookupPlus
from specrt.drafters.token_recycling import DEFAULT_RANK_PROBS, TokenRecycling, tree_template
from specrt.engine.accept import walk_greedy
from specrt.tree import DraftTree
from tests.helpers import as_lists, ctx

VOCAB = 10
FACTORIES = {
    "pld_plus": pld_plus.make,
    "adapld": adapld.make,
    "anpd": anpd.make,
    "lookahead": lookahead.make,
    "token_recycling": token_recycling.make,
}


def rows(*vectors: tuple[float, ...]) -> np.ndarray:
    return np.array(vectors, np.float32)


def ranked_logits(*rankings: list[int]) -> np.ndarray:
    """[len(rankings), VOCAB] logits; row s ranks rankings[s] first (in order), then the rest by id."""
    logits = -np.tile(np.arange(VOCAB, dtype=np.float32), (len(rankings), 1))
    for s, ranking in enumerate(rankings):
        logits[s, ranking] = 100.0 - np.arange(len(ranking))
    return logits


def feedback(tree: DraftTree, path: list[int], logits=None, hidden=None) -> Feedback:
    n = len(tree)
    return Feedback(
        tree,
        np.array(path, np.int64),
        np.zeros((n + 1, VOCAB), np.float32) if logits is None else logits,
        np.zeros((n + 1, 2), np.float32) if hidden is None else hidden,
    )


# ---------------------------------------------------------------------------------------------
# pld_plus

#                  0  1  2  3  4  5  6  7
RERANK = ctx(5, 1, 7, 2, 1, 8, 3, 1)  # [1] at 4 (-> 8, 3, 1) and at 1 (-> 7, 2, 1); [3, 1] nowhere else
# keys: the occurrence at 1 is scored by h[0], the one at 4 by h[3]; the query is h[6]
RERANK_H = rows((1, 0), (0.5, 0.5), (0.5, 0.5), (0, 1), (0.5, 0.5), (0.5, 0.5), (1, 0.1))


def begun(drafter, context: np.ndarray, hidden: np.ndarray):
    """``drafter`` after ``begin`` with all of ``context`` but its last token (the prefill's token)."""
    drafter.begin(context[:-1], hidden)
    return drafter


def test_pld_plus_prefers_the_occurrence_with_the_most_similar_hidden_state():
    # h[0] ~ h[6]: the older occurrence at 1 wins over the most recent one (which pld takes)
    assert as_lists(begun(PromptLookupPlus(), RERANK, RERANK_H).propose(RERANK, 3)) == ([7, 2, 1], [-1, 0, 1])


def test_pld_plus_flips_with_the_query():
    # the query h[6] now matches h[3]: the recent occurrence at 4 wins
    hidden = RERANK_H.copy()
    hidden[6] = (0.1, 1)
    assert as_lists(begun(PromptLookupPlus(), RERANK, hidden).propose(RERANK, 3)) == ([8, 3, 1], [-1, 0, 1])


def test_pld_plus_equal_similarities_keep_recency():
    hidden = np.ones((7, 2), np.float32)
    assert as_lists(begun(PromptLookupPlus(), RERANK, hidden).propose(RERANK, 3)) == ([8, 3, 1], [-1, 0, 1])


def test_pld_plus_without_aligned_hidden_states_is_pld():
    # no begin: recency order
    assert as_lists(PromptLookupPlus().propose(RERANK, 3)) == ([8, 3, 1], [-1, 0, 1])
    # a store that is not one shorter than the context (here: 7 states for 9 tokens): recency order
    drafter = begun(PromptLookupPlus(), RERANK, RERANK_H)
    longer = np.concatenate([RERANK, ctx(1)])  # suffix [1, 1] nowhere else; [1] at 7, 4, 1
    assert as_lists(drafter.propose(longer, 2)) == ([1], [-1])  # the most recent, at 7 -> [1]


def test_pld_plus_max_occurrences_reranks_only_the_most_recent():
    drafter = begun(PromptLookupPlus(max_occurrences=1), RERANK, RERANK_H)
    assert as_lists(drafter.propose(RERANK, 3)) == ([8, 3, 1], [-1, 0, 1])  # the similar one at 1 is too old


def test_pld_plus_longer_ngram_beats_similarity():
    #                 0  1  2  3  4  5  6  7
    context = ctx(3, 1, 9, 5, 1, 7, 3, 1)  # [3, 1] at 0 (-> 9, 5); [1] at 4 (-> 7, 3)
    hidden = rows((0, 1), (1, 0), (1, 0), (1, 0), (1, 0), (1, 0), (1, 0))  # h[3] == query h[6]; h[0] orthogonal
    assert as_lists(begun(PromptLookupPlus(), context, hidden).propose(context, 2)) == ([9, 5], [-1, 0])


def test_pld_plus_occurrence_at_position_zero_has_no_state_and_ranks_last():
    #                 0  1  2  3  4  5  6
    context = ctx(1, 7, 2, 1, 8, 3, 1)  # [1] at 3 (scored by h[2]) and at 0 (no h[-1])
    hidden = rows((1, 0), (1, 0), (-1, 0), (1, 0), (1, 0), (1, 0))  # h[2] opposite to the query h[5]
    assert as_lists(begun(PromptLookupPlus(), context, hidden).propose(context, 2)) == ([8, 3], [-1, 0])


def test_pld_plus_tree_merges_reranked_branches():
    #        root
    #       /    \
    #    n0:7    n2:8      the similar occurrence first, each branch half the budget deep
    #      |      |
    #    n1:2    n3:3
    drafter = begun(PromptLookupPlus(tree=True), RERANK, RERANK_H)
    assert as_lists(drafter.propose(RERANK, 4)) == ([7, 2, 8, 3], [-1, 0, -1, 2])


def test_pld_plus_observe_uses_the_root_state_as_the_next_query():
    # prompt [5, 1, 7, 2, 1, 8], prefill token 3; a step with nothing drafted emits [1]: the root
    # (3, position 6) gets its state from the window's slot 0 and becomes the query h[6]
    for root_state, expected in [((1, 0), [7, 2, 1]), ((0.1, 1), [8, 3, 1])]:
        drafter = begun(PromptLookupPlus(), RERANK[:-1], RERANK_H[:6])
        assert len(drafter.store) == 6
        drafter.observe(ctx(1), feedback(DraftTree.empty(), [], hidden=rows(root_state)))
        assert len(drafter.store) == len(RERANK) - 1
        assert as_lists(drafter.propose(RERANK, 3)) == (expected, [-1, 0, 1])


def test_pld_plus_observe_appends_the_root_and_accepted_states_only():
    # chain [4, 5, 6], nodes 0 and 1 accepted, emitted [4, 5, 9]: slots 0, 1, 2 are the input
    # positions of the new tokens shifted by one; slot 3 (the rejected 6) is not stored
    drafter = PromptLookupPlus()
    drafter.begin(ctx(1, 2), rows((1, 0), (1, 0)))
    hidden = rows((3, 0), (0, 2), (-1, 0), (9, 9))
    drafter.observe(ctx(4, 5, 9), feedback(DraftTree.chain([4, 5, 6]), [0, 1], hidden=hidden))
    assert drafter.store.rows.tolist() == [[1, 0], [1, 0], [1, 0], [0, 1], [-1, 0]]  # unit norm
    # emitted cut by max_new_tokens after one token: only the root's state
    drafter.begin(ctx(1, 2), rows((1, 0), (1, 0)))
    drafter.observe(ctx(4), feedback(DraftTree.chain([4, 5, 6]), [0, 1], hidden=hidden))
    assert drafter.store.rows.tolist() == [[1, 0], [1, 0], [1, 0]]


def test_hidden_store_grows_and_checks_shapes():
    store = HiddenStore()
    store.extend(np.zeros((0, 3)))
    store.extend(np.tile([0.0, 0.0, 2.0], (100, 1)))  # past the initial capacity of 64
    assert len(store) == 100 and store.rows[-1].tolist() == [0, 0, 1]
    store.extend(np.zeros((1, 3)))
    assert store.rows[-1].tolist() == [0, 0, 0]  # a zero state stays zero (similarity 0)
    with pytest.raises(ValueError, match="hidden size 2 differs from the stored 3"):
        store.extend(np.zeros((1, 2)))
    with pytest.raises(ValueError, match=r"must be \[k, hidden\]"):
        store.extend(np.zeros(3))


def test_pld_plus_begin_needs_one_state_per_prompt_token():
    with pytest.raises(ValueError, match=r"prompt has 3 tokens, hidden states have shape \(2, 4\)"):
        PromptLookupPlus().begin(ctx(1, 2, 3), np.zeros((2, 4), np.float32))


def test_pld_plus_defaults_and_factory():
    drafter = PromptLookupPlus()
    assert (drafter.tree, drafter.max_ngram, drafter.min_ngram, drafter.max_branches) == (False, 3, 1, 1)
    assert drafter.max_occurrences == 128
    tree = pld_plus.make(DrafterEnv(vocab=VOCAB, tree=True))
    assert (tree.tree, tree.max_branches) == (True, 4)
    with pytest.raises(ValueError, match="pld_plus: need 1 <= min_ngram <= max_ngram, got 0, 3"):
        PromptLookupPlus(min_ngram=0)


# ---------------------------------------------------------------------------------------------
# adapld

DISTINCT = ctx(1, 2, 3, 4, 5, 6)  # no n-gram repeats; the query is h[4]
# h[1] is the most similar (-> c[3:] = [4, 5, 6]), then h[0] (-> [3, 4, ...]); h[2], h[3] dissimilar
DISTINCT_H = rows((0, 1), (1, 0), (-1, 0), (0, -1), (1, 0.2))


def test_adapld_semantic_fallback_drafts_what_followed_the_most_similar_state():
    drafter = begun(AdaptivePromptLookup(), DISTINCT, DISTINCT_H)
    assert as_lists(drafter.propose(DISTINCT, 3)) == ([4, 5, 6], [-1, 0, 1])
    assert len(PromptLookupPlus().propose(DISTINCT, 3)) == 0  # pld_plus has nothing here


def test_adapld_ngram_match_comes_first():
    # with an n-gram match adapld proposes what pld_plus proposes
    assert as_lists(begun(AdaptivePromptLookup(), RERANK, RERANK_H).propose(RERANK, 3)) == ([7, 2, 1], [-1, 0, 1])


def test_adapld_tree_fills_with_semantic_branches():
    #        root
    #       /    \
    #    n0:4    n2:3      h[1] (-> 4, 5) then h[0] (-> 3, 4); h[3], h[2] have negative similarity
    #      |      |
    #    n1:5    n3:4
    drafter = begun(AdaptivePromptLookup(tree=True), DISTINCT, DISTINCT_H)
    assert as_lists(drafter.propose(DISTINCT, 4)) == ([4, 5, 3, 4], [-1, 0, -1, 2])
    assert as_lists(drafter.propose(DISTINCT, 8)) == ([4, 5, 6, 3, 4, 5, 6], [-1, 0, 1, -1, 3, 4, 5])


def test_adapld_tree_puts_ngram_branches_before_semantic_ones():
    #                 0  1  2  3  4
    context = ctx(9, 1, 2, 3, 9)  # [9] at 0 -> [1, 2]; semantic: h[1] ~ query h[3] -> c[3:] = [3, 9]
    hidden = rows((0, 1), (1, 0), (0, -1), (1, 0))
    drafter = begun(AdaptivePromptLookup(tree=True), context, hidden)
    assert as_lists(drafter.propose(context, 4)) == ([1, 2, 3, 9], [-1, 0, -1, 2])
    chain = begun(AdaptivePromptLookup(), context, hidden)
    assert as_lists(chain.propose(context, 4)) == ([1, 2, 3, 9], [-1, 0, 1, 2])  # the n-gram one only


def test_adapld_min_similarity_and_window():
    # cos(h[1], h[4]) = 0.98: below 0.99 nothing is similar enough
    assert len(begun(AdaptivePromptLookup(min_similarity=0.99), DISTINCT, DISTINCT_H).propose(DISTINCT, 3)) == 0
    # a window of 1 compares h[3] only (-> c[5:] = [6]); its similarity -0.2 is below the default 0.0
    assert len(begun(AdaptivePromptLookup(semantic_window=1), DISTINCT, DISTINCT_H).propose(DISTINCT, 3)) == 0
    windowed = begun(AdaptivePromptLookup(semantic_window=1, min_similarity=-1.0), DISTINCT, DISTINCT_H)
    assert as_lists(windowed.propose(DISTINCT, 3)) == ([6], [-1])


def test_adapld_without_hidden_states_has_no_fallback():
    assert len(AdaptivePromptLookup().propose(DISTINCT, 3)) == 0


def test_adapld_defaults_and_factory():
    drafter = AdaptivePromptLookup()
    assert (drafter.tree, drafter.max_ngram, drafter.min_ngram, drafter.max_branches) == (False, 3, 1, 1)
    assert (drafter.semantic_window, drafter.min_similarity) == (1024, 0.0)
    assert adapld.make(DrafterEnv(vocab=VOCAB, tree=True)).max_branches == 4
    with pytest.raises(ValueError, match="adapld: semantic_window must be >= 1, got 0"):
        AdaptivePromptLookup(semantic_window=0)
    with pytest.raises(ValueError, match=r"adapld: min_similarity must lie in \[-1, 1\], got 2"):
        AdaptivePromptLookup(min_similarity=2)


# ---------------------------------------------------------------------------------------------
# anpd

LONG = ctx(1, 2, 3, 4, 5, 6, 7, 8, 9, 1)  # [1] at 0 -> [2, 3, 4, ...]
ONLY_1GRAM = ctx(1, 2, 3, 4, 5, 1)  # [1] at 0; no 2-gram match


def test_anpd_defaults_draft_4_tokens_from_a_1gram():
    drafter = AdaptiveNgram()
    assert (drafter.ngram, drafter.draft_len, drafter.max_ngram, drafter.max_draft, drafter.max_branches) == (
        1, 4, 4, 8, 1
    )
    assert as_lists(drafter.propose(LONG, 8)) == ([2, 3, 4, 5], [-1, 0, 1, 2])  # draft_len 4 < budget 8
    assert as_lists(drafter.propose(LONG, 2)) == ([2, 3], [-1, 0])  # budget < draft_len


def test_anpd_full_acceptance_grows_the_draft():
    drafter = AdaptiveNgram()
    drafter.observe(ctx(2, 3, 4, 5, 6), feedback(DraftTree.chain([2, 3, 4, 5]), [0, 1, 2, 3]))
    assert drafter.draft_len == 5
    assert as_lists(drafter.propose(LONG, 8)) == ([2, 3, 4, 5, 6], [-1, 0, 1, 2, 3])


def test_anpd_early_rejection_shrinks_the_draft_and_tightens_the_match():
    drafter = AdaptiveNgram()
    drafter.observe(ctx(7), feedback(DraftTree.chain([2, 3, 4, 5]), []))
    assert (drafter.draft_len, drafter.ngram) == (2, 2)
    assert len(drafter.propose(ONLY_1GRAM, 8)) == 0  # a 1-gram no longer counts
    drafter.observe(ctx(2), feedback(DraftTree.empty(), []))  # a step without a draft relaxes it
    assert drafter.ngram == 1
    assert as_lists(drafter.propose(ONLY_1GRAM, 8)) == ([2, 3], [-1, 0])


def test_anpd_partial_acceptance_changes_nothing():
    drafter = AdaptiveNgram()
    drafter.observe(ctx(2, 3, 9), feedback(DraftTree.chain([2, 3, 4, 5]), [0, 1]))
    assert (drafter.draft_len, drafter.ngram) == (4, 1)


def test_anpd_stays_within_bounds():
    drafter = AdaptiveNgram(max_ngram=2, max_draft=5)
    for _ in range(4):
        drafter.observe(ctx(2, 3), feedback(DraftTree.chain([2]), [0]))
    assert (drafter.draft_len, drafter.ngram) == (5, 1)
    for _ in range(5):
        drafter.observe(ctx(7), feedback(DraftTree.chain([2]), []))
    assert (drafter.draft_len, drafter.ngram) == (1, 2)


def test_anpd_tree_full_acceptance_is_reaching_a_leaf():
    #        root
    #       /    \
    #    n0:5    n2:4
    #      |
    #    n1:9
    tree = DraftTree(ctx(5, 9, 4), ctx(-1, 0, -1))
    drafter = AdaptiveNgram(tree=True)
    drafter.observe(ctx(5, 7), feedback(tree, [0]))  # n0 has a child: partial
    assert drafter.draft_len == 4
    drafter.observe(ctx(4, 7), feedback(tree, [2]))  # n2 is a leaf: full
    assert drafter.draft_len == 5


def test_anpd_tree_branches_are_draft_len_deep():
    #                  0  1  2  3  4  5  6  7  8  9  10 11
    branchy = ctx(1, 2, 3, 1, 2, 4, 1, 2, 5, 9, 1, 2)  # [1, 2] at 6, 3, 0
    assert as_lists(AdaptiveNgram(tree=True, init_draft=1).propose(branchy, 8)) == ([5, 4, 3], [-1, -1, -1])
    assert as_lists(anpd.make(DrafterEnv(vocab=VOCAB, tree=True)).propose(branchy, 4)) == (
        [5, 9, 4, 1], [-1, 0, -1, 2]
    )


def test_anpd_validation():
    with pytest.raises(ValueError, match="anpd: need 1 <= min_draft <= init_draft <= max_draft, got 1, 9, 8"):
        AdaptiveNgram(init_draft=9)
    with pytest.raises(ValueError, match="anpd: need 1 <= min_ngram <= max_ngram, got 3, 2"):
        AdaptiveNgram(min_ngram=3, max_ngram=2)


# ---------------------------------------------------------------------------------------------
# lookahead


def test_lookahead_defaults_draft_a_4_token_continuation_of_the_last_token():
    drafter = LookaheadPool()
    assert (drafter.tree, drafter.ngram, drafter.pool_size, drafter.learn_from_verifier) == (False, 5, 8, True)
    prompt = ctx(7, 1, 2, 3, 4, 5, 6)
    drafter.begin(prompt, np.zeros((7, 2), np.float32))
    assert as_lists(drafter.propose(np.concatenate([prompt, ctx(1)]), 8)) == ([2, 3, 4, 5], [-1, 0, 1, 2])


def test_lookahead_chain_takes_the_most_recent_tree_merges_all():
    #                 0  1  2  3  4  5  6  7  8
    context = ctx(1, 2, 3, 9, 1, 4, 5, 9, 1)  # key 1: (2, 3) at 0, (4, 5) at 4
    assert as_lists(LookaheadPool(ngram=3).propose(context, 8)) == ([4, 5], [-1, 0])
    assert as_lists(LookaheadPool(ngram=3, tree=True).propose(context, 8)) == ([4, 5, 2, 3], [-1, 0, -1, 2])
    assert as_lists(LookaheadPool(ngram=3, tree=True).propose(context, 3)) == ([4, 5, 2], [-1, 0, -1])


def test_lookahead_longer_continuations_rank_first():
    #                 0  1  2  3  4  5  6  7
    context = ctx(1, 2, 3, 4, 9, 1, 5, 1)  # key 1: (2, 3, 4) at 0, and (5, 1) at 5 cut by the end
    assert as_lists(LookaheadPool(ngram=4).propose(context, 8)) == ([2, 3, 4], [-1, 0, 1])


def test_lookahead_learns_verified_ngrams_from_every_slot():
    # root 5 ─ n0:6 ─ n1:9; target argmax per slot: 6, 7, 3 -> n0 accepted, n1 rejected
    drafter = LookaheadPool(ngram=3)
    assert len(drafter.propose(ctx(4, 5), 4)) == 0  # key 5: nothing yet
    logits = ranked_logits([6], [7], [3])
    drafter.observe(ctx(6, 7), feedback(DraftTree.chain([6, 9]), [0], logits=logits))
    assert drafter.candidates(5) == [(6, 7)]  # slot 0, extended through the agreeing n0
    assert drafter.candidates(6) == [(7,)]
    assert drafter.candidates(9) == [(3,)]  # what the target says after the rejected 9
    assert as_lists(drafter.propose(ctx(4, 5, 6, 7, 9), 4)) == ([3], [-1])
    quiet = LookaheadPool(ngram=3, learn_from_verifier=False)
    quiet.propose(ctx(4, 5), 4)
    quiet.observe(ctx(6, 7), feedback(DraftTree.chain([6, 9]), [0], logits=logits))
    assert quiet.candidates(9) == [] and quiet.candidates(6) == []


def test_lookahead_root_of_a_step_without_propose_is_the_last_emitted_token():
    # the engine skips propose when there is no budget: the root is then the last emitted token (7)
    drafter = LookaheadPool(ngram=3)
    drafter.propose(ctx(4, 5), 4)
    drafter.observe(ctx(6, 7), feedback(DraftTree.chain([6]), [0], logits=ranked_logits([6], [7])))
    drafter.observe(ctx(2), feedback(DraftTree.empty(), [], logits=ranked_logits([2])))
    assert drafter.candidates(7) == [(2,)]


def test_lookahead_pool_prefixes_and_eviction():
    drafter = LookaheadPool(ngram=3, pool_size=2)
    drafter.add(1, (2,))
    drafter.add(1, (2, 3))  # supersedes (2,)
    drafter.add(1, (2,))  # a prefix of a known one: refreshes it
    assert drafter.candidates(1) == [(2, 3)]
    drafter.add(1, (4, 5))
    drafter.add(1, (2, 3))  # refreshed: (4, 5) is now the least recent
    drafter.add(1, (6, 7))  # evicts (4, 5)
    assert drafter.candidates(1) == [(6, 7), (2, 3)]


@pytest.mark.parametrize("tree_mode", [False, True])
def test_lookahead_nothing_to_propose(tree_mode):
    assert len(LookaheadPool(tree=tree_mode).propose(ctx(), 4)) == 0
    assert len(LookaheadPool(tree=tree_mode).propose(ctx(3), 4)) == 0
    assert len(LookaheadPool(tree=tree_mode).propose(ctx(1, 2, 3), 4)) == 0  # key 3 never had a follower
    assert len(LookaheadPool(tree=tree_mode).propose(ctx(1, 2, 1), 0)) == 0


def test_lookahead_validation_and_factory():
    assert lookahead.make(DrafterEnv(vocab=VOCAB, tree=True)).tree
    with pytest.raises(ValueError, match="lookahead: ngram must be >= 2, got 1"):
        LookaheadPool(ngram=1)


# ---------------------------------------------------------------------------------------------
# token_recycling


def recycled(tree_mode: bool = False, **options) -> TokenRecycling:
    """A drafter that saw one step: root 5 ─ n0:6 with slot 0 ranking [6, 2, 3], slot 1 [7, 1]."""
    drafter = TokenRecycling(tree=tree_mode, **options)
    drafter.propose(ctx(5), 4)
    drafter.observe(ctx(6, 7), feedback(DraftTree.chain([6]), [0], logits=ranked_logits([6, 2, 3], [7, 1])))
    return drafter


def test_token_recycling_cold_start_proposes_nothing():
    assert len(TokenRecycling().propose(ctx(5), 4)) == 0
    assert len(TokenRecycling(tree=True).propose(ctx(5), 4)) == 0
    assert len(recycled().propose(ctx(), 4)) == 0


def test_token_recycling_rows_are_the_top_k_of_each_slot():
    drafter = recycled()  # default top_k 8: then the rest by id
    assert drafter.table[5].tolist() == [6, 2, 3, 0, 1, 4, 5, 7]
    assert drafter.table[6].tolist() == [7, 1, 0, 2, 3, 4, 5, 6]
    assert recycled(top_k=2).table[5].tolist() == [6, 2]


def test_token_recycling_chain_follows_top_1():
    # 5 -> 6 -> 7 -> (no row for 7)
    assert as_lists(recycled().propose(ctx(9, 5), 8)) == ([6, 7], [-1, 0])
    assert as_lists(recycled().propose(ctx(9, 5), 1)) == ([6], [-1])


def test_token_recycling_tree_expands_the_static_template():
    # template for 4: (0,), (0, 0), (1,), (0, 0, 0); (0, 0, 0) needs the row of 7: dropped
    #        root:5
    #       /      \
    #    n0:6      n2:2
    #      |
    #    n1:7
    assert tree_template(4, DEFAULT_RANK_PROBS) == [(0,), (0, 0), (1,), (0, 0, 0)]
    assert as_lists(recycled(True).propose(ctx(5), 4)) == ([6, 7, 2], [-1, 0, -1])


def test_token_recycling_root_of_a_step_without_propose_is_the_last_emitted_token():
    # after emitting [6, 7], a step with no budget (no propose) has root 7: its row is learnt
    drafter = recycled(top_k=2)
    drafter.observe(ctx(8), feedback(DraftTree.empty(), [], logits=ranked_logits([8, 1])))
    assert drafter.table[7].tolist() == [8, 1]
    assert as_lists(drafter.propose(ctx(5), 8)) == ([6, 7, 8], [-1, 0, 1])


def test_token_recycling_cycles_are_followed():
    # rows 5 -> [6, ...] and 6 -> [5, ...]: the chain alternates
    drafter = TokenRecycling(top_k=2)
    drafter.propose(ctx(5), 4)
    drafter.observe(ctx(6, 5), feedback(DraftTree.chain([6]), [0], logits=ranked_logits([6, 1], [5, 1])))
    assert as_lists(drafter.propose(ctx(5), 5)) == ([6, 5, 6, 5, 6], [-1, 0, 1, 2, 3])


def test_token_recycling_default_template_is_imbalanced():
    assert tree_template(8, DEFAULT_RANK_PROBS) == [
        (0,), (0, 0), (1,), (0, 0, 0), (2,), (0, 1), (1, 0), (0, 0, 0, 0)
    ]


def test_token_recycling_custom_template():
    drafter = recycled(True, template=[(1,), (2,), (0,), (0, 0)])
    assert as_lists(drafter.propose(ctx(5), 3)) == ([2, 3, 6], [-1, -1, -1])  # cut to 3 paths
    assert as_lists(drafter.propose(ctx(5), 8)) == ([2, 3, 6, 7], [-1, -1, -1, 2])
    with pytest.raises(ValueError, match=r"template path \(0, 0\) repeats or comes before its parent"):
        TokenRecycling(template=[(0, 0), (0,)])
    with pytest.raises(ValueError, match=r"template path \(9,\) has a rank outside \[0, 8\)"):
        TokenRecycling(template=[(9,)])
    with pytest.raises(ValueError, match="rank_probs must be non-increasing values in"):
        TokenRecycling(rank_probs=(0.2, 0.5))


def test_token_recycling_factory_shares_the_table_across_requests():
    env = DrafterEnv(vocab=VOCAB, tree=False)
    first = token_recycling.make(env)
    first.propose(ctx(5), 4)
    first.observe(ctx(6, 7), feedback(DraftTree.chain([6]), [0], logits=ranked_logits([6], [7])))
    second = token_recycling.make(env)  # the next request starts hot
    assert as_lists(second.propose(ctx(5), 4)) == ([6, 7], [-1, 0])
    assert token_recycling.make(DrafterEnv(vocab=VOCAB, tree=True)).tree


# ---------------------------------------------------------------------------------------------
# property: random contexts, random verifier feedback -> every proposal is a well-formed tree


@pytest.mark.parametrize("tree_mode", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("name", sorted(FACTORIES))
@settings(max_examples=40, deadline=None)
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=25),
    budget=st.integers(0, 10),
    seed=st.integers(0, 2**32 - 1),
)
def test_proposals_are_well_formed_under_random_feedback(name, tree_mode, prompt, budget, seed):
    rng = np.random.default_rng(seed)
    drafter = FACTORIES[name](DrafterEnv(vocab=VOCAB, tree=tree_mode))
    context = np.array(prompt, np.int64)
    drafter.begin(context, rng.normal(size=(len(context), 3)).astype(np.float32))
    context = np.concatenate([context, rng.integers(0, VOCAB, 1)])  # the prefill's token
    for _ in range(8):
        tree = drafter.propose(context, budget)
        n = len(tree)
        assert tree.token_ids.dtype == np.int64 and tree.parents.dtype == np.int64
        assert n <= budget
        assert np.all(tree.parents >= -1) and np.all(tree.parents < np.arange(n))
        assert np.all((tree.token_ids >= 0) & (tree.token_ids < VOCAB))
        if not tree_mode:
            assert tree.parents.tolist() == list(range(-1, n - 1))
        # a random verifier: its argmax decides what is accepted; sometimes max_new_tokens cuts
        logits = rng.normal(size=(n + 1, VOCAB)).astype(np.float32)
        walk = walk_greedy(tree, np.argmax(logits, axis=-1))
        emitted = walk.emitted[: rng.integers(1, len(walk.emitted) + 1)]
        drafter.observe(emitted, Feedback(tree, walk.path, logits, rng.normal(size=(n + 1, 3)).astype(np.float32)))
        context = np.concatenate([context, emitted])
