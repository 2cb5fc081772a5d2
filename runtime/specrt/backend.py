"""ONNX Runtime backend: a decoder session, and the KV caches that run on it.

    DecoderSession  the loaded graph (one onnxruntime InferenceSession), shared and stateless:
                    onnxruntime runs one session from several threads at once
    OrtDecoder      one sequence's KV cache on a DecoderSession; one per request in flight

The cache is one preallocated buffer per layer and per K/V, ``[1, capacity, kv_heads, head_dim]``.
A forward pass binds ``buf[:, :past]`` as the past input and ``buf[:, past:past + s]`` as the
present output, so neither side copies the cache. :meth:`OrtDecoder.commit` then keeps the chosen
window slots (the accepted path) by moving their rows down behind the past; nothing else moves.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from . import contract
from .errors import ArtifactError, InvalidRequestError, SpecrtError
from .manifest import ModelDims

log = logging.getLogger(__name__)

PROVIDERS = {"cpu": "CPUExecutionProvider"}


@dataclass(frozen=True)
class ForwardOutput:
    logits: np.ndarray  # [s, vocab] float32
    hidden_states: np.ndarray  # [s, hidden] float32


def make_session(path: Path, provider: str, threads: int | None) -> ort.InferenceSession:
    if provider not in PROVIDERS:
        raise InvalidRequestError(f"provider {provider!r} is not supported; choose one of {sorted(PROVIDERS)}")
    options = ort.SessionOptions()
    if threads is not None:
        if threads < 1:
            raise InvalidRequestError(f"threads must be >= 1, got {threads}")
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=[PROVIDERS[provider]])
    except Exception as e:  # onnxruntime raises its own untyped exceptions
        raise ArtifactError(f"{path}: onnxruntime could not load the decoder ({type(e).__name__}: {e})") from None


class DecoderSession:
    """The decoder graph loaded in onnxruntime, checked against the I/O contract. Holds no
    sequence state: any number of :class:`OrtDecoder` caches may run on it, from any threads."""

    def __init__(self, path: Path, dims: ModelDims, *, provider: str = "cpu", threads: int | None = None):
        self.path = path
        self.dims = dims
        self.session = make_session(path, provider, threads)
        self._check_io()

    def _check_io(self) -> None:
        inputs, outputs = contract.io_table(
            self.dims.num_layers, self.dims.kv_heads, self.dims.head_dim, self.dims.hidden, self.dims.vocab
        )
        have_in = {i.name for i in self.session.get_inputs()}
        have_out = {o.name for o in self.session.get_outputs()}
        missing = [t.name for t in inputs if t.name not in have_in]
        missing += [t.name for t in outputs if t.name not in have_out]
        if missing:
            raise ArtifactError(f"{self.path}: graph lacks contract tensors {missing[:4]} (exported by another tool?)")


class OrtDecoder:
    """The KV cache of one sequence, run on a :class:`DecoderSession`.

    ``OrtDecoder(path, dims)`` loads its own session; ``OrtDecoder.on(session)`` shares a loaded
    one. Not thread-safe itself: one sequence, one thread at a time."""

    def __init__(self, path: Path, dims: ModelDims, *, provider: str = "cpu", threads: int | None = None):
        self._attach(DecoderSession(path, dims, provider=provider, threads=threads))

    @classmethod
    def on(cls, graph: DecoderSession) -> OrtDecoder:
        """A new, empty cache running on the already loaded ``graph`` (shared with other caches)."""
        decoder = cls.__new__(cls)
        decoder._attach(graph)
        return decoder

    def _attach(self, graph: DecoderSession) -> None:
        self.graph = graph
        self.dims = graph.dims
        self.session = graph.session
        self._keys: list[np.ndarray] = []  # per layer [1, capacity, kv_heads, head_dim]
        self._values: list[np.ndarray] = []
        self.past = 0  # cached positions of the current sequence

    @property
    def capacity(self) -> int:
        return self._keys[0].shape[1] if self._keys else 0

    def reset(self, capacity: int) -> None:
        """Start a new sequence; grow the cache buffers if they hold fewer than ``capacity`` positions."""
        if capacity > self.capacity:
            shape = (1, capacity, self.dims.kv_heads, self.dims.head_dim)
            self._keys = [np.zeros(shape, np.float32) for _ in range(self.dims.num_layers)]
            self._values = [np.zeros(shape, np.float32) for _ in range(self.dims.num_layers)]
        self.past = 0

    def forward(self, input_ids: np.ndarray, position_ids: np.ndarray, attention_bias: np.ndarray) -> ForwardOutput:
        """Run ``s`` new positions against the cache. Their K/V land in slots ``past .. past+s-1``
        but stay uncommitted until :meth:`commit`.

        input_ids, position_ids: [s] int64; attention_bias: [s, past + s] float32.
        """
        s, past = len(input_ids), self.past
        if past + s > self.capacity:
            raise InvalidRequestError(f"window of {s} after {past} cached positions exceeds capacity {self.capacity}")
        if attention_bias.shape != (s, past + s):
            raise ValueError(f"attention_bias has shape {attention_bias.shape}, expected {(s, past + s)}")
        binding = self.session.io_binding()
        binding.bind_cpu_input(contract.INPUT_IDS, np.ascontiguousarray(input_ids, np.int64)[None])
        binding.bind_cpu_input(contract.POSITION_IDS, np.ascontiguousarray(position_ids, np.int64)[None])
        binding.bind_cpu_input(contract.ATTENTION_BIAS, np.ascontiguousarray(attention_bias, np.float32)[None, None])
        for i in range(self.dims.num_layers):
            for name, buf in ((contract.past_key(i), self._keys[i]), (contract.past_value(i), self._values[i])):
                self._bind(binding.bind_input, name, buf[:, :past])
            for name, buf in ((contract.present_key(i), self._keys[i]), (contract.present_value(i), self._values[i])):
                self._bind(binding.bind_output, name, buf[:, past : past + s])
        logits = np.empty((1, s, self.dims.vocab), np.float32)
        hidden = np.empty((1, s, self.dims.hidden), np.float32)
        self._bind(binding.bind_output, contract.LOGITS, logits)
        self._bind(binding.bind_output, contract.HIDDEN_STATES, hidden)
        try:
            self.session.run_with_iobinding(binding)
        except Exception as e:  # onnxruntime's own exception types; should not happen on valid input
            raise SpecrtError(f"decoder forward failed (s={s}, past={past}): {type(e).__name__}: {e}") from None
        return ForwardOutput(logits=logits[0], hidden_states=hidden[0])

    @staticmethod
    def _bind(bind, name: str, view: np.ndarray) -> None:
        # view: a C-contiguous float32 array (a prefix-slice of a cache buffer, or an output buffer)
        bind(name, "cpu", 0, np.float32, list(view.shape), view.ctypes.data)

    def truncate(self, past: int) -> None:
        """Roll the cache back to its first ``past`` positions."""
        if not 0 <= past <= self.past:
            raise ValueError(f"truncate: past must be in [0, {self.past}], got {past}")
        self.past = past

    def commit(self, keep: np.ndarray) -> None:
        """Keep window slots ``keep`` (ascending, [k] int) as the next ``k`` cached positions."""
        keep = np.asarray(keep, np.int64)
        if len(keep) and (keep[0] < 0 or np.any(np.diff(keep) <= 0) or self.past + keep[-1] >= self.capacity):
            raise ValueError(f"commit: slots must be ascending and inside the last window, got {keep.tolist()}")
        if not np.array_equal(keep, np.arange(len(keep))):
            src = self.past + keep
            for buf in (*self._keys, *self._values):
                buf[0, self.past : self.past + len(keep)] = buf[0, src]
        self.past += len(keep)
