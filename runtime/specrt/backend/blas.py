"""Drafters' numpy BLAS kept to one thread while onnxruntime owns the cores.

numpy's OpenBLAS runs a large product on a pool of worker threads, and those threads keep spinning
for a while after the product returns before they sleep. A drafter that multiplies hidden states
once per step (``adapld``: [<= 1024, hidden] @ [hidden]) left such a thread spinning
through the verify pass that followed it, on the cores that onnxruntime's intra-op threads use. On a
2-core machine a plain step of the 0.5B int4 model then took 35-39 ms instead of 21-22, and
``adapld`` (tree) decoded Spec-Bench's RAG prompt at 0.5x plain decoding (docs/design.md). A
product of that size gains nothing from a second thread that the decoder needs.

:class:`BlasGuard` runs each drafter call with every BLAS library loaded in the process at one
thread, and gives the libraries back their own thread counts once no call of the same guard is in
flight (one model serves several requests at once). The limit is the process's: while a drafter
call is in flight, BLAS calls of other threads run on one thread too; outside them nothing changes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from threadpoolctl import ThreadpoolController


class BlasGuard:
    """:meth:`single_threaded`: a context in which the process's BLAS libraries use one thread."""

    def __init__(self) -> None:
        # the BLAS libraries loaded now (numpy's OpenBLAS is loaded with numpy); found once: a scan costs ~1 ms
        self._libraries = ThreadpoolController().select(user_api="blas").lib_controllers
        self._lock = threading.Lock()
        self._inside = 0  # calls in flight
        self._restore: list[int] = []  # each library's thread count before the first of them

    @property
    def libraries(self) -> int:
        return len(self._libraries)

    @contextlib.contextmanager
    def single_threaded(self) -> Iterator[None]:
        if not self._libraries:
            yield
            return
        with self._lock:
            if self._inside == 0:
                self._restore = [lib.get_num_threads() for lib in self._libraries]
                for lib in self._libraries:
                    lib.set_num_threads(1)
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    for lib, n in zip(self._libraries, self._restore, strict=True):
                        lib.set_num_threads(n)
