"""Where one sequence's KV cache lives: host numpy memory, or onnxruntime memory on a device.

Both stores hold the whole cache as one float32 block ``[n_buffers, capacity, kv_heads, head_dim]``:
buffer ``2 * layer`` holds a layer's keys, ``2 * layer + 1`` its values. Any run of rows of one
buffer is contiguous, so the decoder binds the past (rows ``[0, past)``) as an input and the
present (rows ``[past, past + s)``) as an output by pointer, ``ptr(buffer, row)``, and neither
side copies the cache.

    HostKV    numpy; bound as "cpu" memory; compaction is one numpy fancy-index copy
    DeviceKV  one OrtValue on the session's device ("cuda"; "cpu" to test the same code on the CPU EP),
              never copied to the host; compaction gathers rows on the device (specrt.backend.gather)

Compaction (:meth:`compact`) keeps window slots ``keep`` (ascending, [k]) of the rows after
``past`` as rows ``past .. past + k - 1``; rolling back is the caller's ``past = k``, no copy.
:meth:`read` / :meth:`write` copy the first rows to / from the host (the prefix cache's entries).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnxruntime as ort

from specrt.backend.binding import DEVICE_ID
from specrt.backend.gather import Block, RowGather

FLOAT_BYTES = 4


class KVStore(Protocol):
    device: str  # onnxruntime device type of the memory: "cpu" or "cuda"
    capacity: int  # rows per buffer (0 until allocated)

    def allocate(self, capacity: int) -> None:
        """Fresh buffers of ``capacity`` rows; the old contents are gone."""

    def ptr(self, buffer: int, row: int) -> int:
        """Address of ``row`` of ``buffer``; rows of a buffer are contiguous."""

    def compact(self, past: int, keep: np.ndarray) -> None:
        """Rows ``past + keep`` ([k] ascending) -> rows ``past .. past + k - 1``, in every buffer."""

    def read(self, rows: int) -> np.ndarray:
        """A host copy of rows ``[0, rows)`` of every buffer: [n_buffers, rows, kv_heads, head_dim]."""

    def write(self, kv: np.ndarray) -> None:
        """Rows ``[0, k)`` of every buffer <- ``kv`` ([n_buffers, k, kv_heads, head_dim] float32)."""

    def to_numpy(self) -> np.ndarray:
        """A host copy of the whole cache, [n_buffers, capacity, kv_heads, head_dim] (tests, debugging)."""


class HostKV:
    """The cache in numpy memory (the CPU EP's default: the decoder reads and writes it in place)."""

    device = "cpu"

    def __init__(self, n_buffers: int, kv_heads: int, head_dim: int):
        self.row_shape = (kv_heads, head_dim)
        self.n_buffers = n_buffers
        self.row_bytes = kv_heads * head_dim * FLOAT_BYTES
        self.capacity = 0
        self._buf = np.zeros((n_buffers, 0, kv_heads, head_dim), np.float32)  # [n_buffers, capacity, heads, dim]
        self._stride = 0  # bytes per buffer
        self._base = 0

    def allocate(self, capacity: int) -> None:
        self._buf = np.zeros((self.n_buffers, capacity, *self.row_shape), np.float32)
        self.capacity = capacity
        self._stride = capacity * self.row_bytes
        self._base = self._buf.ctypes.data

    def ptr(self, buffer: int, row: int) -> int:
        return self._base + buffer * self._stride + row * self.row_bytes

    def compact(self, past: int, keep: np.ndarray) -> None:
        if not np.array_equal(keep, np.arange(len(keep))):
            self._buf[:, past : past + len(keep)] = self._buf[:, past + keep]  # the right side is a copy

    def read(self, rows: int) -> np.ndarray:
        return self._buf[:, :rows].copy()

    def write(self, kv: np.ndarray) -> None:
        self._buf[:, : kv.shape[1]] = kv

    def to_numpy(self) -> np.ndarray:
        return self._buf.copy()


class DeviceScratch:
    """Grow-only float32 memory on a device, for intermediate results that never go to the host."""

    def __init__(self, device: str):
        self.device = device
        self._value: ort.OrtValue | None = None
        self._size = 0  # float32 values

    def ptr(self, size: int) -> int:
        """Address of at least ``size`` float32 values (the old contents may be gone)."""
        if size > self._size:
            self._size = max(size, 2 * self._size)
            self._value = ort.OrtValue.ortvalue_from_shape_and_type([self._size], np.float32, self.device, DEVICE_ID)
        assert self._value is not None
        return self._value.data_ptr()


class DeviceKV:
    """The cache as one OrtValue on ``device``, allocated once per :meth:`allocate`. Compaction is
    two Gather runs on the device, through scratch memory (an output never overlaps an input):

        rows past + keep[m:]  ──gather──►  scratch [k - m rows]  ──gather(arange)──►  rows past + m ..

    where ``m`` is the first slot that moves (``keep[i] == i`` before it: those rows stay)."""

    def __init__(self, n_buffers: int, kv_heads: int, head_dim: int, device: str, gather: RowGather):
        self.row_shape = (kv_heads, head_dim)
        self.n_buffers = n_buffers
        self.width = kv_heads * head_dim  # float32 values per row
        self.row_bytes = self.width * FLOAT_BYTES
        self.device = device
        self.gather = gather
        self.capacity = 0
        self._cache: ort.OrtValue | None = None  # [n_buffers, capacity, kv_heads, head_dim] on device
        self._base = 0
        self._scratch = DeviceScratch(device)

    def allocate(self, capacity: int) -> None:
        self._cache = None  # free the old block before taking the new one
        shape = [self.n_buffers, capacity, *self.row_shape]
        self._cache = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, self.device, DEVICE_ID)
        self.capacity = capacity
        self._base = self._cache.data_ptr()

    def ptr(self, buffer: int, row: int) -> int:
        return self._base + (buffer * self.capacity + row) * self.row_bytes

    def compact(self, past: int, keep: np.ndarray) -> None:
        moved = np.flatnonzero(keep != np.arange(len(keep)))
        if not len(moved):
            return
        m = int(moved[0])
        src = keep[m:]  # [k - m] ascending, src[0] > m
        k, lo = len(src), int(src[0])
        span = int(src[-1]) - lo + 1  # window rows read
        scratch = self._scratch.ptr(self.n_buffers * k * self.width)
        staged = [Block(self.device, scratch + b * k * self.row_bytes, k, self.width) for b in range(self.n_buffers)]
        window = [Block(self.device, self.ptr(b, past + lo), span, self.width) for b in range(self.n_buffers)]
        self.gather.run(window, src - lo, staged)
        dest = [Block(self.device, self.ptr(b, past + m), k, self.width) for b in range(self.n_buffers)]
        self.gather.run(staged, np.arange(k), dest)

    def _host_blocks(self, kv: np.ndarray) -> list[Block]:
        """Each buffer of the host array ``kv`` ([n_buffers, k, kv_heads, head_dim], C-contiguous) as a Block."""
        k = kv.shape[1]
        return [Block("cpu", kv.ctypes.data + b * k * self.row_bytes, k, self.width) for b in range(self.n_buffers)]

    def read(self, rows: int) -> np.ndarray:
        out = np.empty((self.n_buffers, rows, *self.row_shape), np.float32)
        if rows:
            window = [Block(self.device, self.ptr(b, 0), rows, self.width) for b in range(self.n_buffers)]
            self.gather.run(window, np.arange(rows), self._host_blocks(out))
        return out

    def write(self, kv: np.ndarray) -> None:
        kv = np.ascontiguousarray(kv, np.float32)
        k = kv.shape[1]
        if k:
            dest = [Block(self.device, self.ptr(b, 0), k, self.width) for b in range(self.n_buffers)]
            self.gather.run(self._host_blocks(kv), np.arange(k), dest)

    def to_numpy(self) -> np.ndarray:
        if self._cache is None:
            return np.zeros((self.n_buffers, 0, *self.row_shape), np.float32)
        return np.array(self._cache.numpy(), copy=True)
