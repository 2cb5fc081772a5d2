"""Draft trees and their flattening into one verify window (specrt.tree)."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.backend.contract import MASK_VALUE
from specrt.backend.window import ancestor_mask, causal_bias, flatten
from specrt.tree import DraftTree

M = MASK_VALUE


def test_flatten_branching_tree():
    #        root:11        slot 0, position past
    #       /    \
    #    n0:5    n1:7       slots 1, 2, position past + 1
    #      |
    #    n2:9               slot 3, position past + 2
    tree = DraftTree(token_ids=np.array([5, 7, 9]), parents=np.array([-1, -1, 0]))
    window = flatten(11, tree, past=2)
    assert window.input_ids.tolist() == [11, 5, 7, 9]  # root first, then nodes in order
    assert window.input_ids.dtype == np.int64
    assert window.position_ids.tolist() == [2, 3, 3, 4]  # siblings share a position
    # 2 cached columns (all visible), then the window: each slot sees its ancestors-or-self
    expected = np.array(
        [
            [0, 0, 0, M, M, M],  # root
            [0, 0, 0, 0, M, M],  # n0: root, n0
            [0, 0, 0, M, 0, M],  # n1: root, n1 (not its sibling n0)
            [0, 0, 0, 0, M, 0],  # n2: root, n0, n2 (not n1)
        ],
        dtype=np.float32,
    )
    assert window.attention_bias.dtype == np.float32
    np.testing.assert_array_equal(window.attention_bias, expected)


def test_flatten_without_past():
    #     root:3
    #       |
    #     n0:4
    #     /   \
    #  n1:5  n2:6
    tree = DraftTree(np.array([4, 5, 6]), np.array([-1, 0, 0]))
    window = flatten(3, tree, past=0)
    assert window.position_ids.tolist() == [0, 1, 2, 2]  # no cached prefix: positions start at 0
    expected = np.array(
        [
            [0, M, M, M],
            [0, 0, M, M],
            [0, 0, 0, M],
            [0, 0, M, 0],  # n2 sees n0 but not its sibling n1
        ],
        dtype=np.float32,
    )
    np.testing.assert_array_equal(window.attention_bias, expected)


def test_ancestor_mask_deep_branch():
    #        root
    #       /    \
    #     n0      n1
    #     |        |
    #     n2      n3
    #     |
    #     n4
    mask = ancestor_mask(np.array([-1, -1, 0, 1, 2]))
    # rows: slot q; True columns: slot q and its ancestors (slot 0 = root, slot i + 1 = node i)
    rows = [np.flatnonzero(row).tolist() for row in mask]
    assert rows == [[0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4], [0, 1, 3, 5]]


@pytest.mark.parametrize("past", [0, 1, 5])
@pytest.mark.parametrize("n", [0, 1, 4])
def test_chain_flattens_to_causal_bias(past, n):
    # a chain is a plain causal chunk: same bias, consecutive positions
    tree = DraftTree.chain(list(range(10, 10 + n)))
    assert tree.parents.tolist() == list(range(-1, n - 1))
    window = flatten(7, tree, past)
    np.testing.assert_array_equal(window.attention_bias, causal_bias(past, n + 1))
    assert window.position_ids.tolist() == list(range(past, past + n + 1))
    assert window.input_ids.tolist() == [7, *range(10, 10 + n)]


def test_causal_bias_literal():
    # 1 cached position, 3 new ones: lower triangle on the window, cached column always open
    expected = np.array([[0, 0, M, M], [0, 0, 0, M], [0, 0, 0, 0]], dtype=np.float32)
    np.testing.assert_array_equal(causal_bias(1, 3), expected)


def test_empty_tree_flattens_to_root_only():
    tree = DraftTree.empty()
    assert len(tree) == 0
    assert tree.depths().tolist() == []
    assert tree.children(-1).tolist() == []
    window = flatten(42, tree, past=3)
    assert window.input_ids.tolist() == [42]
    assert window.position_ids.tolist() == [3]
    np.testing.assert_array_equal(window.attention_bias, np.zeros((1, 4), np.float32))  # sees all


def test_depths_and_children():
    #        root
    #     /   |    \
    #   n0   n1    n3
    #   |     |
    #   n2   n4
    tree = DraftTree(np.array([1, 2, 3, 4, 5]), np.array([-1, -1, 0, -1, 1]))
    assert tree.depths().tolist() == [1, 1, 2, 1, 2]
    assert tree.children(-1).tolist() == [0, 1, 3]  # in node order
    assert tree.children(0).tolist() == [2]
    assert tree.children(1).tolist() == [4]
    assert tree.children(2).tolist() == []  # a leaf


def test_truncated_keeps_the_nodes_up_to_a_depth_and_renumbers_their_parents():
    # the tree above: depth 1 keeps n0, n1, n3 (not a prefix of the node order: n2 sits between)
    tree = DraftTree(np.array([1, 2, 3, 4, 5]), np.array([-1, -1, 0, -1, 1]))
    cut = tree.truncated(1)
    assert cut.token_ids.tolist() == [1, 2, 4] and cut.parents.tolist() == [-1, -1, -1]
    assert tree.truncated(2) is tree
    # a chain's cut is its first nodes (the prefix path), and so is a tree whose deeper nodes come last
    chain = DraftTree.chain([7, 8, 9, 10])
    assert chain.truncated(2).token_ids.tolist() == [7, 8] and chain.truncated(2).parents.tolist() == [-1, 0]
    late = DraftTree(np.array([1, 2, 3, 4]), np.array([-1, -1, 0, 2]))
    assert late.truncated(2).token_ids.tolist() == [1, 2, 3] and late.truncated(2).parents.tolist() == [-1, -1, 0]
    assert len(late.truncated(0)) == 0


@pytest.mark.parametrize(
    "parents",
    [
        [0],  # parents[0] = 0: a node cannot be its own parent
        [-1, 1],  # parents[1] = 1 >= 1
        [-1, 2, -1],  # forward reference: parents[1] = 2 >= 1
        [-1, -2],  # below -1
    ],
)
def test_draft_tree_rejects_bad_parents(parents):
    with pytest.raises(ValueError, match=r"parents must satisfy -1 <= parents\[i\] < i"):
        DraftTree(np.arange(len(parents)), np.array(parents))


@pytest.mark.parametrize(
    "token_ids, parents",
    [
        ([1, 2, 3], [-1, 0]),  # parents shorter than token_ids
        ([1], [-1, 0]),  # parents longer
        ([[1, 2]], [[-1, 0]]),  # 2-D arrays of equal shape
    ],
)
def test_draft_tree_rejects_mismatched_shapes(token_ids, parents):
    with pytest.raises(ValueError, match="must be 1-D arrays of the same length"):
        DraftTree(np.array(token_ids), np.array(parents))


def test_a_branching_tree_is_cut_to_the_key_block_of_its_first_node():
    from specrt.backend.window import KEY_BLOCK, fit_window

    tree = DraftTree(np.array([1, 2, 3, 4, 5, 6]), np.array([-1, -1, 0, 1, 2, 3]))
    assert KEY_BLOCK == 128
    cut = fit_window(tree, past=123, key_block=KEY_BLOCK)  # nodes at slots 124..127 fit, 128 is the next block
    assert cut.token_ids.tolist() == [1, 2, 3, 4] and cut.parents.tolist() == [-1, -1, 0, 1]
    assert fit_window(tree, past=127, key_block=KEY_BLOCK) is tree  # the nodes start a block: all six fit
    assert len(fit_window(tree, past=126, key_block=KEY_BLOCK)) == 1
    chain = DraftTree.chain([1, 2, 3, 4, 5, 6])
    assert fit_window(chain, past=126, key_block=KEY_BLOCK) is chain  # a chain keeps every key at its single-step slot
