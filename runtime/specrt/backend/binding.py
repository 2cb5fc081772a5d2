"""Binding a pass's inputs and outputs by raw pointer, at a few microseconds per tensor.

A decoder pass binds every layer's past and present K/V (96 tensors on a 24-layer model). The
public ``IOBinding.bind_input/bind_output`` build a fresh ``OrtDevice`` (four Python calls) for
each one: 0.6 ms per pass on the 0.5B model, ~2% of a 2-core int4 step and more of a small
model's. :class:`PointerBinding` makes each device once and hands the pointers straight to the
binding's native object (``IOBinding._iobinding``, the same call the public methods end in).

    binding = PointerBinding(session)
    binding.input("past.0.key", "cpu", [1, past, kv, d], ptr)   # float32 memory at ptr
    binding.output("present.0.key", "cpu", [1, s, kv, d], ptr + past * row_bytes)
    binding.host_input("input_ids", ids)                       # a numpy array, kept alive
    binding.run()
"""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort

DEVICE_ID = 0  # one device per process: the CUDA EP's default device


@functools.cache
def native_device(device: str) -> object:
    """onnxruntime's native device object for ``device`` ("cpu", "cuda"), id :data:`DEVICE_ID`."""
    return ort.OrtDevice.make(device, DEVICE_ID)._get_c_device()


class PointerBinding:
    """One pass's IO binding on ``session``: float32 tensors by pointer, host arrays by reference."""

    def __init__(self, session: ort.InferenceSession):
        self.session = session
        self._binding = session.io_binding()
        self._native = self._binding._iobinding
        self._arrays: list[np.ndarray] = []  # host inputs: onnxruntime reads them in place at run()

    def input(self, name: str, device: str, shape: list[int], ptr: int) -> None:
        self._native.bind_input(name, native_device(device), np.float32, shape, ptr)

    def output(self, name: str, device: str, shape: list[int], ptr: int) -> None:
        self._native.bind_output(name, native_device(device), np.float32, shape, ptr)

    def host_input(self, name: str, array: np.ndarray) -> None:
        """Bind a C-contiguous host array, read at :meth:`run` (kept alive until then)."""
        self._arrays.append(array)
        self._native.bind_input(name, array)

    def run(self) -> None:
        self.session.run_with_iobinding(self._binding)

    def synchronize_outputs(self) -> None:
        self._binding.synchronize_outputs()
