"""Retrieval drafters: ``rest`` (specrt.drafters.rest) and ``sam_decoding``/``asam``/``asam_verify``
(specrt.drafters.sam), on literal datastores, and bit-exact against plain decoding on tiny models."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specrt
from pipeline.corpora import build_from_texts
from specrt.drafters import rest, sam
from specrt.drafters.base import DrafterEnv, Feedback
from specrt.drafters.indexes.datastore import open_datastore, write_datastore
from specrt.drafters.rest import Rest, frequency_tree
from specrt.drafters.sam import AcceptanceModel, AdaptiveSam, SamDecoding
from specrt.errors import ArtifactError, InvalidRequestError
from specrt.tree import DraftTree
from tests.helpers import TRAINING_TEXT, as_lists, ctx

SHA = "c" * 64
#        docs of the literal store:  [1 2 3 4]  [1 2 3 5]  [1 2 3 4]  [7 1 2 6]
DOCS = ([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4], [7, 1, 2, 6])


def store_of(folder, docs):
    write_datastore(folder, [("test", "literal", [np.array(d, np.int32) for d in docs])], SHA)
    return open_datastore(folder, tokenizer_sha256=SHA)


@pytest.fixture
def store(tmp_path):
    return store_of(tmp_path / "store", DOCS)


def feedback(tree: DraftTree, accepted: int) -> Feedback:
    n = len(tree)
    return Feedback(tree, np.arange(accepted, dtype=np.int64), np.zeros((n + 1, 8)), np.zeros((n + 1, 4)))


# ---------------------------------------------------------------------------------------------
# frequency_tree


def test_frequency_tree_chain_follows_the_most_frequent_child():
    paths = [ctx(3, 4), ctx(3, 5), ctx(3, 4), ctx(6)]
    assert as_lists(frequency_tree(paths, 8, tree=False)) == ([3, 4], [-1, 0])  # 3 (x3) then 4 (x2)
    assert as_lists(frequency_tree(paths, 1, tree=False)) == ([3], [-1])
    assert as_lists(frequency_tree([ctx(5), ctx(6)], 8, tree=False)) == ([5], [-1])  # tie: first seen


def test_frequency_tree_tree_keeps_the_most_frequent_nodes():
    #          root
    #        /      \
    #     n0:3(x3)  n1:6(x1)
    #     /    \
    #  n2:4(x2) n3:5(x1)
    paths = [ctx(3, 4), ctx(3, 5), ctx(3, 4), ctx(6)]
    assert as_lists(frequency_tree(paths, 8, tree=True)) == ([3, 6, 4, 5], [-1, -1, 0, 0])
    # budget 3: counts 3, 2, then the ties at 1 go to the shallower node
    assert as_lists(frequency_tree(paths, 3, tree=True)) == ([3, 6, 4], [-1, -1, 0])
    assert as_lists(frequency_tree(paths, 0, tree=True)) == ([], [])
    assert as_lists(frequency_tree([], 8, tree=True)) == ([], [])


# ---------------------------------------------------------------------------------------------
# rest


def test_rest_defaults():
    drafter = Rest(datastore=None)
    assert (drafter.tree, drafter.max_suffix, drafter.min_suffix, drafter.max_occurrences) == (False, 16, 2, 64)


@pytest.mark.parametrize(
    "tree, context, budget, tokens, parents",
    [
        (False, ctx(9, 1, 2), 8, [3, 4], [-1, 0]),  # [1 2] x4 -> 3 4 | 3 5 | 3 4 | 6: most frequent chain
        (True, ctx(9, 1, 2), 8, [3, 6, 4, 5], [-1, -1, 0, 0]),  # the whole trie fits
        (True, ctx(9, 1, 2), 3, [3, 6, 4], [-1, -1, 0]),
        (False, ctx(7, 1, 2), 8, [6], [-1]),  # longest suffix [7 1 2] occurs once: its continuation
        (False, ctx(9, 1, 2), 0, [], []),  # no budget
        (False, ctx(9, 2), 8, [], []),  # only a 1-token match: below min_suffix = 2
        (True, ctx(9, 8), 8, [], []),  # no match
        (False, ctx(3, 4), 8, [], []),  # matches, but only at a document's end: nothing follows
        (False, ctx(), 8, [], []),  # empty context
    ],
)
def test_rest_proposals(store, tree, context, budget, tokens, parents):
    assert as_lists(Rest(store, tree=tree).propose(context, budget)) == (tokens, parents)


def test_rest_min_suffix_one_allows_single_token_matches(store):
    assert as_lists(Rest(store, min_suffix=1).propose(ctx(9, 2), 8)) == ([3, 4], [-1, 0])


def test_rest_samples_occurrences_evenly(tmp_path):
    store = store_of(tmp_path / "s", [[5, 1]] * 6 + [[5, 2]] * 2)  # rows of [5]: six [5 1], two [5 2]
    assert [c.tolist() for c in Rest(store, max_occurrences=4).retrieve(ctx(5), 1)] == []  # below min_suffix
    found = Rest(store, min_suffix=1, max_occurrences=4).retrieve(ctx(5), 1)
    assert [c.tolist() for c in found] == [[1], [1], [1], [2]]  # rows 0, 2, 4, 6 of 8


def test_rest_options_are_validated():
    with pytest.raises(ValueError, match="need 1 <= min_suffix <= max_suffix"):
        Rest(None, min_suffix=3, max_suffix=2)
    with pytest.raises(ValueError, match="max_occurrences must be >= 1"):
        Rest(None, max_occurrences=0)


# ---------------------------------------------------------------------------------------------
# sam_decoding


def test_sam_defaults(store):
    drafter = SamDecoding(store)
    assert (drafter.tree, drafter.min_match, drafter.max_branches) == (False, 2, 1)  # one branch in chain mode
    assert SamDecoding(store, tree=True).max_branches == 4


def test_sam_drafts_from_the_static_automaton(store):
    drafter = SamDecoding(store)
    drafter.begin(ctx(9, 1, 2), np.zeros((3, 4)))
    assert drafter.static_match[1] == 2  # [1 2]
    assert as_lists(drafter.propose(ctx(9, 1, 2), 8)) == ([3, 4], [-1, 0])  # first occurrence: doc 0
    assert as_lists(drafter.propose(ctx(9, 1, 2, 3), 1)) == ([4], [-1])


def test_sam_live_match_is_an_earlier_occurrence(store):
    drafter = SamDecoding(store)
    drafter.begin(ctx(8, 9, 6, 8), np.zeros((4, 4)))
    # [8] occurred at 0, but min_match = 2; [8 9] after one more token
    assert as_lists(drafter.propose(ctx(8, 9, 6, 8), 8)) == ([], [])
    assert as_lists(drafter.propose(ctx(8, 9, 6, 8, 9), 8)) == ([6, 8, 9], [-1, 0, 1])
    assert drafter.live_match[1] == 2


def test_sam_longer_match_wins_and_live_wins_ties(tmp_path):
    store = store_of(tmp_path / "s", [[5, 6, 7, 1], [4, 5, 6, 2]])
    drafter = SamDecoding(store)
    # live: [5 6] earlier at 0 -> [9 5 6]; static: [4 5 6] -> [2] is longer
    assert as_lists(drafter.propose(ctx(5, 6, 9, 4, 5, 6), 8)) == ([2], [-1])
    drafter = SamDecoding(store)
    # live [3 5 6] -> [9 3 5 6] beats static [5 6] -> [7 1]
    assert as_lists(drafter.propose(ctx(3, 5, 6, 9, 3, 5, 6), 8)) == ([9, 3, 5, 6], [-1, 0, 1, 2])
    drafter = SamDecoding(store)
    # tie at 2 tokens: live [5 6] -> [8 5 6], static [5 6] -> [7 1]: the live one
    assert as_lists(drafter.propose(ctx(5, 6, 8, 5, 6), 8)) == ([8, 5, 6], [-1, 0, 1])


def test_sam_tree_merges_both_automata(tmp_path):
    store = store_of(tmp_path / "s", [[5, 6, 7, 1], [4, 5, 6, 2]])
    drafter = SamDecoding(store, tree=True)
    #        root
    #       /    \
    #    n0:8    n3:7       live [5 6] -> 8 5 6, static [5 6] -> 7 1 (ties: live first)
    #     |       |
    #    n1:5    n4:1
    #     |
    #    n2:6
    tree = drafter.propose(ctx(5, 6, 8, 5, 6), 8)
    assert as_lists(tree) == ([8, 5, 6, 7, 1], [-1, 0, 1, -1, 3])
    # budget 3: the first branch is cut to leave a node for the other one
    assert as_lists(drafter.propose(ctx(5, 6, 8, 5, 6), 3)) == ([8, 5, 7], [-1, 0, -1])
    assert as_lists(drafter.propose(ctx(5, 6, 8, 5, 6), 1)) == ([8], [-1])


def test_sam_without_datastore_and_resync(store):
    drafter = SamDecoding(None)
    assert as_lists(drafter.propose(ctx(1, 2, 3, 1, 2), 8)) == ([3, 1, 2], [-1, 0, 1])
    # a shorter context is another request: start over
    assert as_lists(drafter.propose(ctx(4, 5, 4, 5), 2)) == ([4, 5], [-1, 0])
    assert drafter.text == [4, 5, 4, 5]


def test_sam_options_are_validated():
    with pytest.raises(ValueError, match="min_match must be >= 1"):
        SamDecoding(None, min_match=0)
    with pytest.raises(ValueError, match="max_branches must be >= 1"):
        SamDecoding(None, max_branches=0)


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=4),
    context=st.lists(st.integers(0, 4), min_size=1, max_size=14),
    budget=st.integers(0, 6),
)
def test_proposals_are_well_formed_and_matches_longest(tmp_path_factory, docs, context, budget):
    store = store_of(tmp_path_factory.mktemp("h"), docs)
    context = np.array(context, np.int64)
    drafters = [Rest(store, tree=t, min_suffix=1) for t in (False, True)]
    drafters += [SamDecoding(store, tree=t, min_match=1) for t in (False, True)]
    drafters += [AdaptiveSam(store, AcceptanceModel(), tree=t, verify_cost=lambda s: 1.0 + s) for t in (False, True)]
    for drafter in drafters:
        drafter.begin(context[:1], np.zeros((1, 4)))
        tree = drafter.propose(context, budget)
        assert len(tree) <= budget and tree.token_ids.dtype == np.int64
        assert np.all(tree.parents < np.arange(len(tree)))
        if not getattr(drafter, "tree", True):
            assert tree.parents.tolist() == list(range(-1, len(tree) - 1))  # chain mode: a chain
    # the automata's matches are the longest suffixes found by brute force
    drafter = drafters[2]
    text = context.tolist()

    def occurs_in(needle: list[int], hay: list[int]) -> bool:
        return any(hay[i : i + len(needle)] == needle for i in range(len(hay) - len(needle) + 1))

    static = max(m for m in range(len(text) + 1) if m == 0 or any(occurs_in(text[-m:], d) for d in docs))
    live = max(m for m in range(len(text)) if m == 0 or occurs_in(text[-m:], text[:-1]))
    assert drafter.static_match[1] == static and drafter.live_match[1] == live


# ---------------------------------------------------------------------------------------------
# asam / asam_verify


def test_acceptance_model_defaults_and_validation():
    model = AcceptanceModel()
    assert (len(model.judged), model.decay, model.prior) == (64, 0.98, (2.0, 1.0))
    with pytest.raises(ValueError, match="decay must be in"):
        AcceptanceModel(decay=0.0)
    with pytest.raises(ValueError, match="positive prior"):
        AcceptanceModel(prior=(1.0, 0.0))
    with pytest.raises(ValueError, match="min_survival must be in"):
        AdaptiveSam(None, model, min_survival=1.0)


def test_acceptance_model_counts_judged_depths():
    model = AcceptanceModel()  # prior (2, 1): every depth starts at 2/3
    assert model.survival()[:2] == pytest.approx([2 / 3, 4 / 9])
    model.record(drafted_depth=4, accepted_length=2)  # depths 1, 2 accepted, 3 rejected, 4 not judged
    assert model.judged[:5].tolist() == [1, 1, 1, 0, 0]
    assert model.accepted[:5].tolist() == [1, 1, 0, 0, 0]
    p = [3 / 4, 3 / 4, 2 / 4, 2 / 3]
    assert model.survival()[:4] == pytest.approx(np.cumprod(p))
    assert model.quantile_cap(0.1) == 5  # S = .75 .56 .28 .19 .125 .083
    model.record(drafted_depth=0, accepted_length=0)  # nothing drafted: nothing learned
    assert model.judged[:3].tolist() == [1, 1, 1]


def test_acceptance_model_decays_old_steps():
    model = AcceptanceModel(decay=0.5)
    model.record(2, 2)
    model.record(2, 0)
    assert model.judged[:2].tolist() == [1.5, 0.5] and model.accepted[:2].tolist() == [0.5, 0.5]


def test_best_depth_weighs_the_verify_cost():
    model = AcceptanceModel()
    model.record(drafted_depth=4, accepted_length=2)  # S = .75 .5625 .28 ...
    # tokens per step (1 + sum S) / cost: L=0 1/1, L=1 1.75/1.5, L=2 2.31/2, L=3 2.59/2.5
    assert model.best_depth(6, lambda s: 1 + 0.5 * (s - 1)) == 1
    assert model.best_depth(6, lambda s: 1.0) == 6  # free positions: as deep as allowed
    assert model.best_depth(6, lambda s: 0.0) is None  # nothing measured yet


def test_asam_caps_the_depth_and_learns_from_feedback(tmp_path):
    store = store_of(tmp_path / "s", [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
    acceptance = AcceptanceModel()
    drafter = AdaptiveSam(store, acceptance)
    assert drafter.min_survival == 0.1 and drafter.verify_cost is None  # asam defaults
    assert acceptance.quantile_cap(0.1) == 5  # the prior alone: S = 2/3 ** d
    tree = drafter.propose(ctx(1, 2), 8)
    assert as_lists(tree)[0] == [3, 4, 5, 6, 7]
    for _ in range(30):  # every draft rejected at once
        drafter.observe(ctx(9), feedback(tree, 0))
    assert len(drafter.propose(ctx(1, 2), 8)) == 1
    for _ in range(60):  # every draft fully accepted
        drafter.observe(ctx(9), feedback(DraftTree.chain([3] * 8), 8))
    assert len(drafter.propose(ctx(1, 2), 8)) == 8


def test_asam_verify_sizes_drafts_from_the_verify_cost(tmp_path):
    store = store_of(tmp_path / "s", [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
    acceptance = AcceptanceModel()
    acceptance.record(drafted_depth=4, accepted_length=2)
    steep = AdaptiveSam(store, acceptance, verify_cost=lambda s: 1 + 0.5 * (s - 1))
    assert as_lists(steep.propose(ctx(1, 2), 8)) == ([3], [-1])
    flat = AdaptiveSam(store, acceptance, verify_cost=lambda s: 1.0)
    assert len(flat.propose(ctx(1, 2), 8)) == 8
    unmeasured = AdaptiveSam(store, acceptance, verify_cost=lambda s: 0.0)  # falls back to the asam cap
    assert len(unmeasured.propose(ctx(1, 2), 8)) == acceptance.quantile_cap(0.1) == 5
    tree = AdaptiveSam(store, acceptance, tree=True, verify_cost=lambda s: 1 + 0.5 * (s - 1))
    assert len(tree.propose(ctx(1, 2), 8)) == 1  # the depth also caps the nodes


def test_asam_verify_recovers_after_settling_on_plain_steps(tmp_path):
    # after a run of rejections no depth pays on a steep cost: it proposes nothing, but judges the
    # draft it held back ([3] after [1, 2]) on the token each plain step emits
    store = store_of(tmp_path / "s", [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])

    def settled() -> AdaptiveSam:
        acceptance = AcceptanceModel()
        for _ in range(30):
            acceptance.record(drafted_depth=4, accepted_length=0)
        return AdaptiveSam(store, acceptance, verify_cost=lambda s: 1 + 0.5 * (s - 1))

    wrong, right = settled(), settled()
    for _ in range(40):
        assert len(wrong.propose(ctx(1, 2), 8)) == 0
        wrong.observe(ctx(9), feedback(DraftTree.empty(), 0))  # the plain step emitted 9: the shadow [3] was wrong
    steps = 0
    while len(right.propose(ctx(1, 2), 8)) == 0:
        right.observe(ctx(3), feedback(DraftTree.empty(), 0))  # it emitted 3: the shadow was right
        steps += 1
        assert steps < 40, "the estimate never recovered"
    assert as_lists(right.propose(ctx(1, 2), 8))[0][0] == 3 and steps > 1
    asam = AdaptiveSam(store, AcceptanceModel())  # asam (no verify cost) always drafts: no shadow
    asam.propose(ctx(1, 2), 8)
    assert asam._shadow is None


# ---------------------------------------------------------------------------------------------
# factories


@pytest.mark.parametrize("factory", [rest.make, sam.make, sam.make_asam, sam.make_asam_verify])
def test_factories_need_a_datastore(factory):
    with pytest.raises(InvalidRequestError, match=r"drafts from a retrieval datastore.*datastore=\.\.\."):
        factory(DrafterEnv(vocab=16, tree=False))


@dataclass(frozen=True, eq=False)
class EnvWithTokenizer(DrafterEnv):
    tokenizer_sha256: str | None = None  # the model's, once DrafterEnv carries it


def test_factories_refuse_a_datastore_of_another_tokenizer(store):
    env = EnvWithTokenizer(vocab=16, tree=False, datastore=store.folder, tokenizer_sha256="d" * 64)
    with pytest.raises(ArtifactError, match=f"{store.folder}: datastore was tokenized with tokenizer sha256 {SHA}, "
                       f"the model's tokenizer is {'d' * 64}"):
        sam.make(env)
    assert rest.make(EnvWithTokenizer(vocab=16, tree=False, datastore=store.folder, tokenizer_sha256=SHA))


def test_factories_share_the_datastore_and_calibration(store):
    env = DrafterEnv(vocab=16, tree=True, datastore=store.folder, verify_cost=lambda s: 1.0)
    r, s, a, v = rest.make(env), sam.make(env), sam.make_asam(env), sam.make_asam_verify(env)
    assert isinstance(r, Rest) and r.tree and r.datastore is s.datastore is a.datastore is v.datastore
    assert type(s) is SamDecoding and s.tree
    assert a.verify_cost is None and v.verify_cost is env.verify_cost
    assert sam.make_asam(env).acceptance is a.acceptance  # per model, outlives a request
    assert v.acceptance is not a.acceptance
    chain_env = DrafterEnv(vocab=16, tree=False, datastore=store.folder, state=env.state)
    assert sam.make_asam(chain_env).acceptance is not a.acceptance  # chain and tree calibrate apart


# ---------------------------------------------------------------------------------------------
# end to end: tiny models, datastore of their training text, bit-exact with plain decoding


@pytest.fixture(scope="module")
def model(tiny_artifact, tmp_path_factory):
    folder = tiny_artifact[0]
    out = tmp_path_factory.mktemp("datastore")
    build_from_texts([("train", "tests.tiny.TRAINING_TEXT", TRAINING_TEXT)], folder / "tokenizer.json", out)
    return specrt.load(folder, datastore=out)


def test_cli_finds_the_sibling_datastore(tiny_artifact, tmp_path, capsys):
    from specrt.cli import main as cli_main

    folder = tmp_path / "model" / "fp32"
    shutil.copytree(tiny_artifact[0], folder)
    assert cli_main(["generate", "--model", str(folder), "--method", "sam_decoding", "--max-new-tokens", "5", "x"]) == 2
    assert "has none" in capsys.readouterr().err  # no datastore beside the model yet
    build_from_texts([("code", "tests", TRAINING_TEXT)], folder / "tokenizer.json", folder.parent / "datastore")
    assert cli_main(["generate", "--model", str(folder), "--method", "sam_decoding", "--max-new-tokens", "5", "x"]) == 0
