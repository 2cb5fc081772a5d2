"""Suffix decoding (specrt.drafters.indexes.suffix_tree, specrt.drafters.suffix_decoding) and adaptive suffix
decoding (specrt.drafters.asd): tree contents, proposals, request lifecycle, losslessness."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrt.drafters import DrafterEnv, Feedback
from specrt.drafters.asd import AdaptiveSuffixDecoding, make_asd, make_asd_verify
from specrt.drafters.indexes.suffix_tree import Draft, SuffixCache, SuffixTree
from specrt.drafters.suffix_decoding import SuffixDecoding, make
from specrt.tree import DraftTree
from tests.helpers import PROMPTS, as_lists, ctx


def env(tree: bool = False, **kwargs) -> DrafterEnv:
    return DrafterEnv(vocab=32, tree=tree, state={}, **kwargs)


def feedback(tree: DraftTree, accepted: int) -> Feedback:
    """Feedback for a chain whose first ``accepted`` nodes were accepted (no logits)."""
    empty = np.zeros((len(tree) + 1, 0), np.float32)
    return Feedback(tree, np.arange(accepted, dtype=np.int64), empty, empty)


def children_counts(tree: SuffixTree, prefix: list[int]) -> dict[int, int]:
    node = tree._find(prefix)
    return {token: child.count for token, child in node.children.items()}


# ---------------------------------------------------------------------------------------------
# SuffixTree: contents


def test_suffix_tree_counts_every_suffix_cut_at_max_depth():
    # [1, 2, 1, 3], depth 2: suffixes [1, 2], [2, 1], [1, 3], [3]
    tree = SuffixTree(max_depth=2)
    tree.extend(0, ctx(1, 2, 1, 3))
    assert tree.root.count == 4 and tree.num_nodes == 6
    assert children_counts(tree, []) == {1: 2, 2: 1, 3: 1}
    assert children_counts(tree, [1]) == {2: 1, 3: 1}
    assert children_counts(tree, [2]) == {1: 1}
    assert children_counts(tree, [3]) == {}
    assert tree.count([1, 2, 1]) == 0  # longer than max_depth: not kept


def test_extend_in_pieces_equals_extend_at_once():
    whole, pieces = SuffixTree(3), SuffixTree(3)
    whole.extend(0, ctx(4, 5, 4, 5, 6))
    for chunk in (ctx(4), ctx(5, 4), ctx(), ctx(5, 6)):
        pieces.extend(0, chunk)
    for sub in ([4], [5], [4, 5], [5, 4], [4, 5, 4], [5, 4, 5], [4, 5, 6], [6]):
        assert whole.count(sub) == pieces.count(sub), sub
    assert (whole.count([4, 5]), whole.count([4, 5, 6]), whole.num_nodes) == (2, 1, 9)


def test_counts_add_up_over_sequences_and_remove_takes_them_back():
    tree = SuffixTree(max_depth=3)
    tree.extend(0, ctx(1, 2, 3))
    tree.extend(1, ctx(1, 2, 4))
    assert (tree.count([1, 2]), tree.count([1, 2, 3]), tree.count([2, 4]), tree.root.count) == (2, 1, 1, 6)
    nodes = tree.num_nodes  # [1] [1,2] [1,2,3] [2] [2,3] [3] + [1,2,4] [2,4] [4]
    assert nodes == 9
    tree.remove(0)
    assert (tree.count([1, 2]), tree.count([1, 2, 3]), tree.count([3]), tree.root.count) == (1, 0, 0, 3)
    assert tree.num_nodes == 6 and 0 not in tree and 1 in tree
    tree.remove(1)
    assert tree.num_nodes == 0 and tree.root.count == 0 and tree.root.children == {}


def test_match_lists_the_suffixes_that_occur_and_continue():
    tree = SuffixTree(max_depth=8)
    tree.extend(0, ctx(1, 2, 3, 4, 1, 2, 3, 5, 1, 2))
    # [2] and [1, 2] continue (with 3); [5, 1, 2] occurs only at the end: no continuation
    assert [n.count for n in tree.match(ctx(9, 5, 1, 2))] == [3, 3]
    assert tree.match(ctx(7)) == []  # never seen


# ---------------------------------------------------------------------------------------------
# SuffixTree: speculate

#                 0  1  2  3  4  5  6  7  8  9
REPEATS = ctx(1, 2, 3, 4, 1, 2, 3, 5, 1, 2)  # [1, 2] x3 -> 3 (x2); [1, 2, 3] x2 -> 4 | 5


def repeats_tree(max_depth: int = 8) -> SuffixTree:
    tree = SuffixTree(max_depth)
    tree.extend(0, REPEATS)
    return tree


def test_speculate_path_follows_the_most_frequent_child():
    # match [1, 2] (count 3): 3 has count 2 -> p 2/3; then 4 and 5 tie at 1/3: the first seen (4)
    # wins; max_spec_factor 1 with a 2-token match: 2 tokens
    draft = repeats_tree().speculate(REPEATS, max_spec_tokens=8)
    assert as_lists(draft) == ([3, 4], [-1, 0])
    assert draft.probs.tolist() == pytest.approx([2 / 3, 1 / 3])
    assert draft.match_len == 2 and draft.score == pytest.approx(1.0)


def test_speculate_tree_expands_best_first():
    #        root
    #         |
    #       n0:3  (2/3)
    #       /   \
    #  n1:4      n2:5     (1/3 each)
    #    |
    #  n3:1  (1/3)        cap 4 = max_spec_factor 2 x match 2
    draft = repeats_tree().speculate(REPEATS, 8, max_spec_factor=2.0, use_tree_spec=True)
    assert as_lists(draft) == ([3, 4, 5, 1], [-1, 0, 0, 1])
    assert draft.probs.tolist() == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])


def test_speculate_respects_max_spec_tokens_offset_and_min_token_prob():
    tree = repeats_tree()
    assert as_lists(tree.speculate(REPEATS, 1)) == ([3], [-1])  # max_spec_tokens
    assert as_lists(tree.speculate(REPEATS, 8, max_spec_factor=0.0, max_spec_offset=1.0)) == ([3], [-1])
    assert as_lists(tree.speculate(REPEATS, 8, min_token_prob=0.5)) == ([3], [-1])  # 4 has p 1/3
    assert len(tree.speculate(REPEATS, 8, max_spec_factor=0.0)) == 0  # cap 0 at every match length


def test_speculate_prefers_a_shorter_match_that_drafts_further():
    # max_depth 3: the 2-token match [2, 3] sits at depth 2 and can draft only [4] (p 1/2); the
    # 1-token match [3] drafts [4, 1] (p 1/2 each) with max_spec_factor 2: score 1 > 1/2
    tree = SuffixTree(max_depth=3)
    tree.extend(0, ctx(1, 2, 3, 4, 1, 2, 3))
    draft = tree.speculate(ctx(1, 2, 3, 4, 1, 2, 3), 8, max_spec_factor=2.0)
    assert as_lists(draft) == ([4, 1], [-1, 0]) and draft.match_len == 1


def test_speculate_nothing_to_match_is_empty():
    tree = repeats_tree()
    assert len(tree.speculate(ctx(9), 8)) == 0  # unseen token
    assert len(tree.speculate(ctx(), 8)) == 0  # empty context
    assert len(SuffixTree(4).speculate(ctx(1, 2), 8)) == 0  # empty tree
    assert len(tree.speculate(REPEATS, 0)) == 0  # no budget


def test_draft_head_is_a_tree_prefix():
    draft = repeats_tree().speculate(REPEATS, 8, max_spec_factor=2.0, use_tree_spec=True)
    assert as_lists(draft.head(2)) == ([3, 4], [-1, 0])
    assert len(draft.head(0)) == 0 and draft.head(0).match_len == 0


# ---------------------------------------------------------------------------------------------
# SuffixCache: request lifecycle and eviction


def test_cache_lifecycle_keeps_responses_not_prompts():
    cache = SuffixCache(max_depth=4)
    first = cache.start_request(ctx(1, 2, 3))
    cache.add_active_response(ctx(7, 8))
    assert cache.active and cache.active_length == 5 and cache.active_tokens() == [1, 2, 3, 7, 8]
    assert cache.cached_requests == 0  # the response joins the global tree at the end
    cache.stop_request()
    assert not cache.active and cache.cached_requests == 1 and cache.cached_tokens == 2
    assert cache.global_tree.count([7, 8]) == 1 and cache.global_tree.count([1]) == 0
    assert cache.start_request(ctx(5)) == first + 1


def test_start_request_folds_the_active_request():
    cache = SuffixCache(max_depth=4)
    cache.start_request(ctx(1, 2))
    cache.add_active_response(ctx(3, 4))
    cache.start_request(ctx(9))  # no stop_request: the engine never ends a request explicitly
    assert cache.cached_requests == 1 and cache.global_tree.count([3, 4]) == 1
    assert cache.active_tokens() == [9]


def test_eviction_by_requests_is_oldest_first():
    cache = SuffixCache(max_depth=4, max_cached_requests=2)
    for response in (ctx(1, 1), ctx(2, 2), ctx(3, 3)):
        cache.start_request(ctx(0))
        cache.add_active_response(response)
    cache.stop_request()
    assert cache.cached_requests == 2
    assert (cache.global_tree.count([1]), cache.global_tree.count([2]), cache.global_tree.count([3])) == (0, 2, 2)


def test_eviction_by_tokens_and_long_responses_keep_their_tail():
    cache = SuffixCache(max_depth=4, max_cached_tokens=3)
    cache.start_request(ctx(0))
    cache.add_active_response(ctx(1, 2))
    cache.start_request(ctx(0))  # [1, 2] cached: 2 tokens
    cache.add_active_response(ctx(5, 6))
    cache.start_request(ctx(0))  # [5, 6] cached: 4 tokens > 3, so [1, 2] goes
    assert cache.cached_tokens == 2 and cache.global_tree.count([1]) == 0 and cache.global_tree.count([5, 6]) == 1
    cache.add_active_response(ctx(1, 2, 3, 4, 5))
    cache.stop_request()  # 5 tokens > 3: only [3, 4, 5] is kept, and [5, 6] is evicted
    assert cache.cached_tokens == 3 and cache.global_tree.count([3, 4, 5]) == 1 and cache.global_tree.count([6]) == 0


def test_no_global_history_when_max_cached_requests_is_0():
    cache = SuffixCache(max_depth=4, max_cached_requests=0)
    cache.start_request(ctx(1))
    cache.add_active_response(ctx(2, 3))
    cache.stop_request()
    assert cache.cached_requests == 0 and cache.cached_tokens == 0


def test_cache_prefers_the_higher_score_and_local_on_ties():
    cache = SuffixCache(max_depth=8)
    cache.start_request(ctx(0))
    cache.add_active_response(ctx(5, 6, 7))
    cache.stop_request()  # global: [5, 6, 7]; [5, 6] -> [7] scores 1
    cache.start_request(ctx(5, 6))  # local: [5, 6] never continued: the global draft
    assert as_lists(cache.speculate(ctx(5, 6), 8)) == ([7], [-1])
    # local: [5, 6] x2 -> [9, 5] (p 1/2 each: the current occurrence has no continuation yet):
    # score 1, a tie, and the local draft wins ties
    cache.start_request(ctx(5, 6, 9, 5, 6))
    assert as_lists(cache.speculate(ctx(5, 6, 9, 5, 6), 8)) == ([9, 5], [-1, 0])
    # local: the 5-token match [5, 6, 8, 5, 6] -> [8, 5, 6] (p 1/2 each): 1.5 > 1
    cache.start_request(ctx(5, 6, 8, 5, 6, 8, 5, 6))
    assert as_lists(cache.speculate(ctx(5, 6, 8, 5, 6, 8, 5, 6), 8)) == ([8, 5, 6], [-1, 0, 1])


def test_cache_lifecycle_errors():
    cache = SuffixCache()
    with pytest.raises(RuntimeError, match="no active request"):
        cache.add_active_response(ctx(1))
    with pytest.raises(RuntimeError, match="no active request"):
        cache.stop_request()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_depth": 0}, "max_depth must be >= 1, got 0"),
        ({"max_cached_requests": -1}, "max_cached_requests must be >= 0, got -1"),
        ({"max_cached_tokens": -5}, "max_cached_tokens must be >= 0, got -5"),
    ],
)
def test_cache_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SuffixCache(**kwargs)


# ---------------------------------------------------------------------------------------------
# suffix_decoding drafter


def test_make_uses_the_defaults_and_keeps_the_cache_in_env_state():
    e = env(tree=True)
    drafter = make(e)
    assert isinstance(drafter, SuffixDecoding) and drafter.tree is True
    assert (drafter.max_spec_factor, drafter.max_spec_offset, drafter.min_token_prob) == (1.0, 0.0, 0.1)
    cache = e.state["suffix_decoding"]
    assert drafter.cache is cache and isinstance(cache, SuffixCache)
    assert (cache.max_depth, cache.max_cached_requests, cache.max_cached_tokens) == (24, 1000, 100_000)
    assert make(e).cache is cache  # the next request finds the same history
    assert make(env(tree=False)).tree is False


def test_defaults_chain_from_the_prompt():
    # prompt [1, 2, 3, 4, 1, 2, 3] then the prefill's token 4: the 4-token match [1, 2, 3, 4]
    # (count 2: the earlier occurrence and this one) continues with [1, 2, 3, 4] (p 1/2 each);
    # max_spec_factor 1: up to 4 tokens
    drafter = make(env())
    drafter.begin(ctx(1, 2, 3, 4, 1, 2, 3), np.zeros((7, 0), np.float32))
    draft = drafter.speculate(ctx(1, 2, 3, 4, 1, 2, 3, 4), budget=8)
    assert as_lists(draft) == ([1, 2, 3, 4], [-1, 0, 1, 2]) and draft.match_len == 4
    assert draft.probs.tolist() == [0.5, 0.5, 0.5, 0.5]
    assert as_lists(drafter.propose(ctx(1, 2, 3, 4, 1, 2, 3, 4), budget=2)) == ([1, 2], [-1, 0])  # budget


def test_defaults_cap_the_draft_by_the_match_length():
    # only [9] (1 token) matches: max_spec_factor 1 allows 1 token
    drafter = make(env())
    drafter.begin(ctx(9, 5, 6, 7), np.zeros((4, 0), np.float32))
    assert as_lists(drafter.propose(ctx(9, 5, 6, 7, 9), budget=8)) == ([5], [-1])


def test_tree_mode_branches_on_distinct_continuations():
    #        root           context [1, 2, 5, 1, 2, 6, 1, 2]: [1, 2] x3 -> 5 | 6 (1/3 each)
    #       /    \\
    #    n0:5    n1:6
    drafter = make(env(tree=True))
    drafter.begin(ctx(1, 2, 5, 1, 2, 6, 1, 2), np.zeros((8, 0), np.float32))
    assert as_lists(drafter.propose(ctx(1, 2, 5, 1, 2, 6, 1, 2), budget=8)) == ([5, 6], [-1, -1])
    chain = make(env(tree=False))
    assert as_lists(chain.propose(ctx(1, 2, 5, 1, 2, 6, 1, 2), budget=8)) == ([5, 1], [-1, 0])


@pytest.mark.parametrize("tree_mode", [False, True])
@pytest.mark.parametrize(
    "context, budget",
    [
        (ctx(1, 2, 1, 2), 0),  # no budget, though there is a match
        (ctx(1, 2, 1, 2), -1),
        (ctx(3), 4),  # a single token
        (ctx(1, 2, 3, 4), 4),  # nothing repeats
        (ctx(), 4),  # empty context
    ],
)
def test_nothing_to_propose_is_an_empty_tree(tree_mode, context, budget):
    for factory in (make, make_asd, make_asd_verify):
        tree = factory(env(tree=tree_mode)).propose(context, budget)
        assert isinstance(tree, DraftTree) and len(tree) == 0


def test_a_second_request_reuses_the_first_response():
    e = env()
    first = make(e)
    first.begin(ctx(1, 2), np.zeros((2, 0), np.float32))
    assert len(first.propose(ctx(1, 2, 10), budget=4)) == 0  # nothing seen yet
    first.observe(ctx(11, 12, 13, 14), feedback(DraftTree.empty(), 0))  # response: 10 11 12 13 14
    second = make(e)
    second.begin(ctx(3, 4), np.zeros((2, 0), np.float32))  # folds [10, 11, 12, 13, 14]
    assert e.state["suffix_decoding"].cached_tokens == 5
    # the context ends with [10, 11] (2-token match): the first response continues it
    assert as_lists(second.propose(ctx(3, 4, 10, 11), budget=4)) == ([12, 13], [-1, 0])
    # the first request's prompt is not history: [1] matches nothing
    assert len(second.propose(ctx(3, 4, 10, 11, 1), budget=4)) == 0


def test_end_folds_at_once_and_a_stale_drafter_fails_clearly():
    e = env()
    first = make(e)
    first.begin(ctx(1), np.zeros((1, 0), np.float32))
    first.observe(ctx(2, 3), feedback(DraftTree.empty(), 0))
    first.end()
    assert e.state["suffix_decoding"].cached_tokens == 2 and not e.state["suffix_decoding"].active
    make(e).begin(ctx(5), np.zeros((1, 0), np.float32))
    with pytest.raises(RuntimeError, match="a newer request began on the same model"):
        first.propose(ctx(1, 2, 3), budget=4)


def test_propose_without_begin_and_an_unrelated_context_start_a_request():
    drafter = make(env())
    assert as_lists(drafter.propose(ctx(7, 8, 7), budget=4)) == ([8], [-1])  # request = [7, 8, 7]
    assert drafter.cache.active_tokens() == [7, 8, 7]
    drafter.propose(ctx(4, 4), budget=4)  # does not extend [7, 8, 7]: a new request
    assert drafter.cache.active_tokens() == [4, 4] and drafter.cache.global_tree.count([8]) == 0


def test_observe_and_context_sync_build_the_response():
    drafter = make(env())
    drafter.begin(ctx(1, 2), np.zeros((2, 0), np.float32))
    drafter.propose(ctx(1, 2, 3), budget=4)  # the prefill's token 3 comes with the context
    drafter.observe(ctx(4, 5), feedback(DraftTree.empty(), 0))
    drafter.propose(ctx(1, 2, 3, 4, 5), budget=4)  # nothing new
    assert drafter.cache.active_tokens() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_spec_factor": -1.0}, "suffix_decoding: max_spec_factor must be >= 0, got -1.0"),
        ({"min_token_prob": 1.5}, r"suffix_decoding: min_token_prob must be in \[0, 1\], got 1.5"),
        ({"max_depth": 0}, "max_depth must be >= 1, got 0"),
    ],
)
def test_suffix_decoding_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SuffixDecoding(env(), **kwargs)


def test_options_must_match_the_cache_in_env_state():
    e = env()
    make(e)
    with pytest.raises(ValueError, match=r"max_depth=32 differs from the cache already in env.state\['suffix_"):
        SuffixDecoding(e, max_depth=32)
    SuffixDecoding(e, max_spec_factor=2.0)  # speculation options are per drafter: fine


# ---------------------------------------------------------------------------------------------
# asd / asd_verify


def test_make_asd_defaults():
    e = env(verify_cost=lambda s: 0.0)
    asd, verify = make_asd(e), make_asd_verify(e)
    assert isinstance(asd, AdaptiveSuffixDecoding) and isinstance(verify, AdaptiveSuffixDecoding)
    assert (asd.name, asd.verify_cost, verify.name, verify.verify_cost) == ("asd", None, "asd_verify", e.verify_cost)
    for d in (asd, verify):
        assert (d.draft_token_cost, d.calibration_decay, d.prior) == (0.15, 0.9, 1.0)
        assert (d.max_spec_factor, d.max_spec_offset, d.min_token_prob, d.tree) == (1.0, 0.0, 0.01, False)
        assert d.cache.max_depth == 24
    assert e.state["asd"] is asd.cache and e.state["asd_verify"] is verify.cache  # separate histories


def test_draft_length_maximises_expected_tokens_per_cost():
    drafter = make_asd(env())
    # rates (E + 1) / (1 + 0.15 L): L=0: 1, L=1: 2/1.15, L=2: 3/1.3 = 2.31, L=3: 3.1/1.45 = 2.14
    assert drafter.draft_length(np.array([1.0, 1.0, 0.1])) == 2
    assert drafter.draft_length(np.array([0.1, 0.1])) == 0  # 1.1/1.15 < 1: draft nothing
    assert drafter.draft_length(np.array([])) == 0


def test_asd_verify_sizes_drafts_from_the_measured_cost():
    q = np.array([0.9, 0.8, 0.7, 0.6])
    flat = make_asd_verify(env(verify_cost=lambda s: 0.01))  # verifying more costs nothing: draft all
    # half a step per extra position: (E + 1) / (1 + L / 2) = 1, 1.27, 1.35, 1.36, 1.33 for L = 0..4
    steep = make_asd_verify(env(verify_cost=lambda s: 0.01 * (1 + 0.5 * (s - 1))))
    proportional = make_asd_verify(env(verify_cost=lambda s: 0.01 * s))  # every token must beat the mean rate
    unmeasured = make_asd_verify(env(verify_cost=lambda s: 0.0))  # the linear default, like asd
    assert [d.draft_length(q) for d in (flat, steep, proportional, unmeasured)] == [4, 3, 0, 4]
    assert make_asd(env()).draft_length(q) == 4


def run_calibration(accept: int, steps: int = 14) -> list[int]:
    """Draft lengths of ``asd`` when the target accepts the first ``accept`` drafted tokens each step.

    Global history [1, ..., 9]: after [1, 2, 3, 4] it drafts [5, 6, 7, 8] with p 1 (a 4-token
    match); each step emits the accepted tokens and a fresh token (40, 41, ...) so the local tree
    never outscores the global one, then the context ends with [1, 2, 3, 4] again."""
    e = env()
    seed = make_asd(e)
    seed.begin(ctx(0), np.zeros((1, 0), np.float32))
    seed.observe(ctx(1, 2, 3, 4, 5, 6, 7, 8, 9), feedback(DraftTree.empty(), 0))
    drafter = make_asd(e)
    context = ctx(50, 1, 2, 3, 4)
    drafter.begin(context[:-1], np.zeros((4, 0), np.float32))
    lengths = []
    for step in range(steps):
        tree = drafter.propose(context, budget=8)
        assert tree.token_ids.tolist() == [5, 6, 7, 8][: len(tree)]
        lengths.append(len(tree))
        emitted = np.concatenate([tree.token_ids[:accept], [40 + step]])
        drafter.observe(emitted, feedback(tree, min(accept, len(tree))))
        context = np.concatenate([context, emitted, ctx(1, 2, 3, 4)])
    return lengths


def test_calibration_sizes_drafts_to_what_the_target_accepts():
    # nothing accepted: c_1 sinks to ~0.15 (q < draft_token_cost: no draft), then drifts back
    assert run_calibration(0) == [4, 4, 4, 4, 4, 4, 4, 4, 0, 4, 4, 0, 4, 0]
    # 2 accepted: c_3, c_4 sink, so 2 nodes, and a full draft again now and then as they recover
    assert run_calibration(2) == [4, 4, 2, 4, 2, 2, 2, 4, 2, 2, 2, 2, 4, 2]
    # everything accepted: the full draft every step
    assert run_calibration(4) == [4] * 14


def test_calibrated_probabilities_never_exceed_the_parent():
    drafter = make_asd(env())
    drafter.reached[2] = 5.0  # depth 2 looks better than depth 1 ...
    draft = Draft(ctx(3, 4), ctx(-1, 0), np.array([0.5, 0.5]))
    q = drafter.calibrated(draft, ctx(1, 2))
    assert q.tolist() == pytest.approx([0.5, 0.5])  # ... but a child is never likelier than its parent


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"draft_token_cost": -0.1}, "asd: draft_token_cost must be >= 0, got -0.1"),
        ({"calibration_decay": 1.5}, r"asd: calibration_decay must be in \[0, 1\], got 1.5"),
        ({"prior": 0.0}, "asd: prior must be > 0, got 0.0"),
        ({"min_token_prob": -1.0}, r"asd: min_token_prob must be in \[0, 1\], got -1.0"),
    ],
)
def test_asd_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveSuffixDecoding(env(), **kwargs)


# ---------------------------------------------------------------------------------------------
# properties


def occurrences(seq: list[int], sub: list[int]) -> int:
    return sum(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


@settings(max_examples=100, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=4),
    removed=st.sets(st.integers(0, 3)),
    max_depth=st.integers(1, 5),
)
def test_counts_equal_brute_force_occurrences(seqs, removed, max_depth):
    tree = SuffixTree(max_depth)
    for i, seq in enumerate(seqs):
        tree.extend(i, seq[: len(seq) // 2])
        tree.extend(i, seq[len(seq) // 2 :])
    for i in removed & set(range(len(seqs))):
        tree.remove(i)
    kept = [seq for i, seq in enumerate(seqs) if i not in removed]
    subs = {tuple(s[a:b]) for s in kept for a in range(len(s)) for b in range(a + 1, min(len(s), a + max_depth) + 1)}
    for sub in subs:
        assert tree.count(list(sub)) == sum(occurrences(s, list(sub)) for s in kept)
    assert tree.num_nodes == len(subs) and tree.root.count == sum(map(len, kept))


@settings(max_examples=100, deadline=None)
@given(
    previous=st.lists(st.integers(0, 4), max_size=20),
    prompt=st.lists(st.integers(0, 4), min_size=1, max_size=20),
    steps=st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=3), st.integers(-1, 10)), max_size=6),
    factory=st.sampled_from([make, make_asd, make_asd_verify]),
    tree_mode=st.booleans(),
)
def test_proposals_are_well_formed(previous, prompt, steps, factory, tree_mode):
    e = env(tree=tree_mode, verify_cost=lambda s: 0.01 * (1 + 0.3 * s))
    first = factory(e)
    first.begin(ctx(9), np.zeros((1, 0), np.float32))
    first.observe(np.array(previous, np.int64), feedback(DraftTree.empty(), 0))
    drafter = factory(e)  # a second request: the first response is global history
    context = np.array(prompt, np.int64)
    drafter.begin(context, np.zeros((len(context), 0), np.float32))
    history = set(previous) | set(prompt)
    for emitted, budget in steps:
        tree = drafter.propose(context, budget)
        n = len(tree)
        assert tree.token_ids.dtype == np.int64 and tree.parents.dtype == np.int64
        assert n <= max(budget, 0)
        assert np.all(tree.parents >= -1) and np.all(tree.parents < np.arange(n))
        assert set(tree.token_ids.tolist()) <= history
        if not tree_mode:
            assert tree.parents.tolist() == list(range(-1, n - 1))
        assert len(set(zip(tree.parents.tolist(), tree.token_ids.tolist(), strict=True))) == n  # distinct siblings
        drafter.observe(np.array(emitted, np.int64), feedback(tree, 0))
        context = np.concatenate([context, emitted])
        history |= set(emitted)


# ---------------------------------------------------------------------------------------------
# end to end on the tiny models: the global history (every method's bit-exactness: test_lossless_matrix)


@pytest.fixture(scope="module")
def baselines(model):
    """Plain greedy decoding of every prompt: (prompt ids, output ids)."""
    runs = []
    for prompt in PROMPTS:
        ids = model.encode(prompt)
        runs.append((ids, model.generate_ids(ids, method="baseline", max_new_tokens=30)[0]))
    return runs


def test_second_run_of_the_prompts_accepts_more_from_the_global_history(model, baselines):
    # every response of the first pass is global history in the second: the same prompts get
    # their whole answers drafted (within max_spec_factor x match length)
    model.drafter_state.clear()
    passes = []
    for _ in range(2):
        accepted = steps = 0
        for ids, base in baselines:
            spec, loop = model.generate_ids(ids, method=make(model.drafter_env(False)), max_new_tokens=30)
            assert spec.tolist() == base.tolist()
            accepted, steps = accepted + loop.stats.accepted, steps + loop.stats.steps
        passes.append((accepted, steps))
    (first_accepted, first_steps), (second_accepted, second_steps) = passes
    assert second_accepted > first_accepted and second_steps < first_steps
