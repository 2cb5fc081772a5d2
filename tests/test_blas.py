"""Drafter calls run with numpy's BLAS on one thread, and the process gets its thread counts back."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

import specrt
from specrt.backend.blas import BlasGuard
from specrt.tree import DraftTree
from tests.tiny import build_tiny_artifact


def blas_threads() -> list[int]:
    """The thread count of every BLAS library loaded in this process (numpy's OpenBLAS, ...)."""
    return [lib.get_num_threads() for lib in ThreadpoolController().select(user_api="blas").lib_controllers]


@pytest.fixture
def two_threads():
    """Every BLAS library at 2 threads for the test (so that 1 inside a guard is a change), then as before."""
    controller = ThreadpoolController().select(user_api="blas")
    if not controller.lib_controllers:
        pytest.skip("numpy has no BLAS library with a thread pool here")
    with controller.limit(limits=2):
        yield


def test_the_guard_holds_one_thread_until_its_last_call_leaves_then_restores(two_threads):
    guard = BlasGuard()
    assert guard.libraries >= 1 and blas_threads() == [2] * guard.libraries
    with guard.single_threaded():
        assert blas_threads() == [1] * guard.libraries
        with guard.single_threaded():  # a second request's drafter call on the same model
            assert blas_threads() == [1] * guard.libraries
        assert blas_threads() == [1] * guard.libraries  # the first call is still in flight
    assert blas_threads() == [2] * guard.libraries


def test_the_guard_restores_after_a_drafter_raises(two_threads):
    guard = BlasGuard()
    with pytest.raises(RuntimeError, match="drafter failed"), guard.single_threaded():
        raise RuntimeError("drafter failed")
    assert blas_threads() == [2] * guard.libraries


class Recording:
    """Proposes the chain [1, 2] and records the BLAS thread counts it sees in each call."""

    def __init__(self):
        self.seen: dict[str, set[int]] = {"begin": set(), "propose": set(), "observe": set()}

    def begin(self, prompt, hidden_states):
        self.seen["begin"].update(blas_threads())

    def propose(self, context, budget):
        self.seen["propose"].update(blas_threads())
        return DraftTree.chain([1, 2][:budget])

    def observe(self, emitted, feedback):
        self.seen["observe"].update(blas_threads())


def test_a_request_runs_every_drafter_call_on_one_blas_thread_and_leaves_the_count_as_it_was(
    two_threads, tmp_path
):
    folder = build_tiny_artifact("qwen2", tmp_path / "fp32")[0]
    model = specrt.load(folder, threads=1)
    drafter = Recording()
    ids, loop = model.generate_ids(np.array([5, 6, 7, 8]), method=drafter, max_new_tokens=6)
    assert loop.stats.steps >= 1
    assert drafter.seen == {"begin": {1}, "propose": {1}, "observe": {1}}
    assert set(blas_threads()) == {2}
    assert ids.tolist() == model.generate_ids(np.array([5, 6, 7, 8]), method="baseline", max_new_tokens=6)[0].tolist()
