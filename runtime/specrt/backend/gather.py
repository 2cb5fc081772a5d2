"""Row copies that stay on the device: one ONNX Gather graph, built in code, run by raw pointer.

The runtime may not import ``onnx`` (a build-time dependency), so :func:`gather_graph` writes the
ModelProto's protobuf bytes itself. The graph of ``n`` inputs (rank 3, every dim dynamic):

    x.0     [1, rows, width] ──Gather(axis=1)──► y.0     [1, k, width]
    ...                              ▲
    x.{n-1} [1, rows, width] ──Gather(axis=1)──► y.{n-1} [1, k, width]
                                     │
    indices [k] int64 ───────────────┘  (shared by every input)

:class:`RowGather` runs it with IO binding on :class:`Block` s (a pointer, a row count, a width),
so an input can be a window of a KV cache buffer and an output a slice of another buffer, device
scratch memory, or host memory (onnxruntime copies a device result into a host-bound output).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import onnxruntime as ort

from specrt.backend.binding import PointerBinding
from specrt.errors import SpecrtError

OPSET = 13  # Gather with negative-index support; every onnxruntime >= 1.20 runs it
IR_VERSION = 8

_FLOAT, _INT64 = 1, 7  # onnx TensorProto.DataType
_ATTR_INT = 2  # onnx AttributeProto.AttributeType.INT


class Block(NamedTuple):
    """Rows of float32 memory as onnxruntime binds them: ``[1, rows, width]`` at ``ptr`` on ``device``."""

    device: str  # onnxruntime device type: "cpu" or "cuda"
    ptr: int  # address of row 0
    rows: int
    width: int  # float32 values per row


# ---------------------------------------------------------------------------------------------
# protobuf, by hand: varints and length-delimited fields are all an ONNX model of one op needs


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if not n:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _field(number: int, value: int | str | bytes) -> bytes:
    """One protobuf field: an int as a varint (wire type 0), str / bytes length-delimited (type 2)."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _value_info(name: str, elem_type: int, rank: int) -> bytes:
    # ValueInfoProto{name=1, type=2: TypeProto{tensor_type=1: {elem_type=1, shape=2: {dim=1: unknown} * rank}}}
    shape = b"".join(_field(1, b"") for _ in range(rank))
    return _field(1, name) + _field(2, _field(1, _field(1, elem_type) + _field(2, shape)))


def _gather_node(i: int) -> bytes:
    # NodeProto{input=1, output=2, name=3, op_type=4, attribute=5: AttributeProto{name=1, i=3, type=20}}
    axis = _field(1, "axis") + _field(3, 1) + _field(20, _ATTR_INT)
    return (_field(1, f"x.{i}") + _field(1, "indices") + _field(2, f"y.{i}") + _field(3, f"/gather/{i}")
            + _field(4, "Gather") + _field(5, axis))


def gather_graph(n: int) -> bytes:
    """The serialized ModelProto of ``n`` Gather(axis=1) nodes sharing one ``indices`` input."""
    if n < 1:
        raise ValueError(f"gather_graph: n must be >= 1, got {n}")
    graph = b"".join(_field(1, _gather_node(i)) for i in range(n))  # GraphProto.node = 1
    graph += _field(2, f"specrt_gather_{n}")  # GraphProto.name = 2
    graph += b"".join(_field(11, _value_info(f"x.{i}", _FLOAT, 3)) for i in range(n))  # input = 11
    graph += _field(11, _value_info("indices", _INT64, 1))
    graph += b"".join(_field(12, _value_info(f"y.{i}", _FLOAT, 3)) for i in range(n))  # output = 12
    opset = _field(1, "") + _field(2, OPSET)  # OperatorSetIdProto{domain=1: "" (the onnx domain), version=2}
    # ModelProto{ir_version=1, producer_name=2, graph=7, opset_import=8}
    return _field(1, IR_VERSION) + _field(2, "specrt") + _field(7, graph) + _field(8, opset)


# ---------------------------------------------------------------------------------------------


class RowGather:
    """Runs :func:`gather_graph` on one execution provider; one session per input count, built on
    first use. Thread-safe: onnxruntime runs a session from several threads, each with its own binding."""

    def __init__(self, provider: str):
        self.provider = provider  # onnxruntime provider name, e.g. "CUDAExecutionProvider"
        self._sessions: dict[int, ort.InferenceSession] = {}
        self._lock = threading.Lock()

    def _session(self, n: int) -> ort.InferenceSession:
        with self._lock:
            if n not in self._sessions:
                options = ort.SessionOptions()
                options.intra_op_num_threads = 1  # a copy: threads would cost more than they save
                options.inter_op_num_threads = 1
                self._sessions[n] = ort.InferenceSession(gather_graph(n), sess_options=options,
                                                         providers=[self.provider])
            return self._sessions[n]

    def run(self, sources: Sequence[Block], indices: np.ndarray, targets: Sequence[Block]) -> None:
        """``targets[i]`` row ``j`` <- ``sources[i]`` row ``indices[j]``, for every ``i``.

        indices: [k] int in ``[0, rows)`` of every source; every target has ``k`` rows and the
        width of its source. A target must not overlap any source (onnxruntime reads the inputs
        while it writes the outputs)."""
        indices = np.ascontiguousarray(indices, np.int64)
        if len(sources) != len(targets):
            raise ValueError(f"RowGather.run: {len(sources)} sources but {len(targets)} targets")
        for src, dst in zip(sources, targets, strict=True):
            if dst.rows != len(indices) or dst.width != src.width:
                raise ValueError(f"RowGather.run: target [{dst.rows}, {dst.width}] cannot hold {len(indices)} "
                                 f"rows of a [{src.rows}, {src.width}] source")
        session = self._session(len(sources))
        binding = PointerBinding(session)
        binding.host_input("indices", indices)
        for i, (src, dst) in enumerate(zip(sources, targets, strict=True)):
            binding.input(f"x.{i}", src.device, [1, src.rows, src.width], src.ptr)
            binding.output(f"y.{i}", dst.device, [1, dst.rows, dst.width], dst.ptr)
        try:
            binding.run()
            binding.synchronize_outputs()  # the next run may be another session's, on another stream
        except Exception as e:  # onnxruntime's own exception types; should not happen on valid blocks
            raise SpecrtError(f"row gather failed ({len(sources)} blocks, {len(indices)} rows): "
                              f"{type(e).__name__}: {e}") from None
