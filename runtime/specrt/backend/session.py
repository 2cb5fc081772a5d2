"""ONNX Runtime backend: a decoder session, and the KV caches that run on it.

    DecoderSession  the loaded graph (one onnxruntime InferenceSession), shared and stateless:
                    onnxruntime runs one session from several threads at once
    OrtDecoder      one sequence's KV cache on a DecoderSession; one per request in flight

The cache is one preallocated block ``[2 * layers, capacity, kv_heads, head_dim]`` (a
:mod:`specrt.backend.kvstore` store). A forward pass binds rows ``[0, past)`` of each buffer as the past
input and rows ``[past, past + s)`` as the present output, so neither side copies the cache.
:meth:`OrtDecoder.commit` then keeps the chosen window slots (the accepted path) by moving their
rows down behind the past; nothing else moves.

Providers: ``cpu`` keeps the cache in numpy memory. ``cuda`` (onnxruntime-gpu) keeps it on the
GPU, allocated once, and compacts it there; what comes back to the host per pass is the hidden
states ([s, hidden]) and only the logits rows the caller asks for (``logits_rows``: a prefill
needs its last row only). ``device_cache=True`` runs that device code path on the CPU EP (tests).
"""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specrt.backend import contract, kernels
from specrt.backend.binding import PointerBinding
from specrt.backend.gather import Block, RowGather
from specrt.backend.kvstore import FLOAT_BYTES, DeviceKV, DeviceScratch, HostKV, KVStore
from specrt.backend.manifest import ModelDims
from specrt.backend.window import KEY_BLOCK
from specrt.errors import ArtifactError, InvalidRequestError, SpecrtError

log = logging.getLogger(__name__)

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
DEVICES = {"cpu": "cpu", "cuda": "cuda"}  # provider -> onnxruntime device type of its memory
# fp32 stays fp32 on the GPU: the CUDA EP's default TF32 matmuls round inputs to 10 mantissa bits, which
# moves logits by ~1e-3 and makes a verify window and a single step disagree at near-ties more often
PROVIDER_OPTIONS: dict[str, dict[str, str]] = {"cpu": {}, "cuda": {"use_tf32": "0"}}


@dataclass(frozen=True)
class ForwardOutput:
    logits: np.ndarray  # [r, vocab] float32: the window rows asked for (logits_rows; all s by default)
    hidden_states: np.ndarray  # [s, hidden] float32


def check_provider(provider: str) -> str:
    """The onnxruntime provider name of ``provider`` ("cpu", "cuda"), or InvalidRequestError
    saying what to install when this onnxruntime build lacks it."""
    if provider not in PROVIDERS:
        raise InvalidRequestError(f"provider {provider!r} is not supported; choose one of {sorted(PROVIDERS)}")
    name = PROVIDERS[provider]
    available = ort.get_available_providers()
    if name not in available:
        both = _installed("onnxruntime") and _installed("onnxruntime-gpu")
        raise InvalidRequestError(
            f"provider {provider!r}: the {name} is not in this onnxruntime build "
            f"(onnxruntime {ort.__version__} offers {available}); install the extra specrt[cuda] "
            "(onnxruntime-gpu) instead of onnxruntime: the CPU and GPU packages must not be installed "
            "together (see the README, 'CUDA')"
            + ("; both are installed now: uninstall both, then install onnxruntime-gpu alone" if both else "")
        )
    return name


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def make_session(path: Path, provider: str, threads: int | None) -> ort.InferenceSession:
    name = check_provider(provider)
    options = ort.SessionOptions()
    if threads is not None:
        if threads < 1:
            raise InvalidRequestError(f"threads must be >= 1, got {threads}")
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    kernels.register(options)  # specrt's own operators, for graphs that use them (specrt.backend.kernels)
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=[(name, PROVIDER_OPTIONS[provider])])
    except Exception as e:  # onnxruntime raises its own untyped exceptions
        if (explained := kernels.explain_load_error(path, e)) is not None:
            raise kernels.KernelLibraryError(explained) from None
        raise ArtifactError(f"{path}: onnxruntime could not load the decoder ({type(e).__name__}: {e})") from None
    if name not in session.get_providers():  # onnxruntime falls back to the CPU when an EP fails to start
        raise InvalidRequestError(
            f"provider {provider!r}: onnxruntime could not start the {name} and fell back to "
            f"{session.get_providers()}; are the CUDA and cuDNN libraries of onnxruntime-gpu {ort.__version__} "
            "loadable? (pip install 'onnxruntime-gpu[cuda,cudnn]' and call onnxruntime.preload_dlls() before "
            "loading, or put their lib folders on LD_LIBRARY_PATH)"
        )
    if graph_attention(session) == "specrt" and provider != "cpu":
        raise InvalidRequestError(
            f"{path}: this decoder's attention is specrt's CPU kernel (SpecAttention), which the {name} cannot "
            "run; export the model with export.attention: portable (params.yaml) for this provider"
        )
    return session


def graph_attention(session: ort.InferenceSession) -> str:
    """The loaded graph's attention: "specrt" (SpecAttention nodes) or "portable" (contract.ATTENTION_METADATA;
    graphs exported before the key existed are portable)."""
    return session.get_modelmeta().custom_metadata_map.get(contract.ATTENTION_METADATA, "portable")


class DecoderSession:
    """The decoder graph loaded in onnxruntime, checked against the I/O contract. Holds no
    sequence state: any number of :class:`OrtDecoder` caches may run on it, from any threads.

    ``device_cache``: keep KV caches in onnxruntime memory on the provider's device (None: only
    for a GPU provider; True on "cpu" runs the device code path on the CPU EP, for tests)."""

    def __init__(
        self,
        path: Path,
        dims: ModelDims,
        *,
        provider: str = "cpu",
        threads: int | None = None,
        device_cache: bool | None = None,
    ):
        if device_cache is not None and not isinstance(device_cache, bool):
            raise InvalidRequestError(f"device_cache must be a bool or None, got {type(device_cache).__name__}")
        if device_cache is None:
            device_cache = provider != "cpu"
        self.path = path
        self.dims = dims
        self.provider = provider
        self.session = make_session(path, provider, threads)
        self.attention = graph_attention(self.session)
        # cache slots a branching verify window must stay within (specrt.backend.window.fit_window); None: any
        self.key_block = None if self.attention == "specrt" else KEY_BLOCK
        self.device = DEVICES[provider] if device_cache else None  # None: host numpy caches
        self.gather = RowGather(PROVIDERS[provider]) if device_cache else None  # device-side row copies
        # per layer: (past key, present key), (past value, present value); buffer 2 * layer + j
        self.kv_names = [
            pair
            for i in range(dims.num_layers)
            for pair in ((contract.past_key(i), contract.present_key(i)),
                         (contract.past_value(i), contract.present_value(i)))
        ]
        # a vision-language decoder: its image tokens take rows of the image_embeds input (see contract)
        self.image_embeds = any(i.name == contract.IMAGE_EMBEDS for i in self.session.get_inputs())
        # the graph computes the logits of the rows it is given only (pipeline.lib.logits_rows; see contract)
        self.logits_index = any(i.name == contract.LOGITS_INDEX for i in self.session.get_inputs())
        self.no_image_rows = np.zeros((0, dims.hidden), np.float32)  # image_embeds of a pass without image rows
        self._check_io()

    def decoder(self) -> OrtDecoder:
        """A new, empty cache on this graph (OrtDecoder.on)."""
        return OrtDecoder.on(self)

    def new_store(self) -> KVStore:
        """An empty KV store of this graph's shape, on the host or on the device."""
        n, heads, dim = 2 * self.dims.num_layers, self.dims.kv_heads, self.dims.head_dim
        if self.device is None:
            return HostKV(n, heads, dim)
        assert self.gather is not None
        return DeviceKV(n, heads, dim, self.device, self.gather)

    def _check_io(self) -> None:
        inputs, outputs = contract.io_table(
            self.dims.num_layers, self.dims.kv_heads, self.dims.head_dim, self.dims.hidden, self.dims.vocab,
            image_embeds=self.image_embeds,
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

    def __init__(
        self,
        path: Path,
        dims: ModelDims,
        *,
        provider: str = "cpu",
        threads: int | None = None,
        device_cache: bool | None = None,
    ):
        self._attach(DecoderSession(path, dims, provider=provider, threads=threads, device_cache=device_cache))

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
        self.store = graph.new_store()  # [2 * layers, capacity, kv_heads, head_dim]
        self._logits = DeviceScratch(graph.device) if graph.device is not None else None  # [s, vocab] on device
        self.past = 0  # cached positions of the current sequence

    @property
    def capacity(self) -> int:
        return self.store.capacity

    def reset(self, capacity: int) -> None:
        """Start a new sequence; grow the cache buffers if they hold fewer than ``capacity`` positions."""
        if capacity > self.store.capacity:
            self.store.allocate(capacity)
        self.past = 0

    def forward(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        attention_bias: np.ndarray,
        *,
        logits_rows: slice | None = None,
        image_embeds: np.ndarray | None = None,
    ) -> ForwardOutput:
        """Run ``s`` new positions against the cache. Their K/V land in slots ``past .. past+s-1``
        but stay uncommitted until :meth:`commit`.

        input_ids, position_ids: [s] int64; attention_bias: [s, past + s] float32.
        logits_rows: the window rows whose logits come back (``slice(s - 1, s)``: the last one);
        None: all ``s``. A graph with the contract's ``logits_index`` input computes those rows'
        logits only; with a device cache the other rows never leave the device.
        image_embeds: [n, hidden] float32, the embeddings of the pass's first n image tokens (a
        vision-language decoder's prefill; specrt.backend.contract); None: none.
        """
        s, past = len(input_ids), self.past
        if past + s > self.capacity:
            raise InvalidRequestError(f"window of {s} after {past} cached positions exceeds capacity {self.capacity}")
        if attention_bias.shape != (s, past + s):
            raise ValueError(f"attention_bias has shape {attention_bias.shape}, expected {(s, past + s)}")
        binding = PointerBinding(self.session)
        binding.host_input(contract.INPUT_IDS, np.ascontiguousarray(input_ids, np.int64)[None])
        binding.host_input(contract.POSITION_IDS, np.ascontiguousarray(position_ids, np.int64)[None])
        binding.host_input(contract.ATTENTION_BIAS, np.ascontiguousarray(attention_bias, np.float32)[None, None])
        if self.graph.image_embeds:
            rows = self.graph.no_image_rows if image_embeds is None else np.ascontiguousarray(image_embeds, np.float32)
            if rows.ndim != 2 or rows.shape[1] != self.dims.hidden:
                raise ValueError(f"image_embeds has shape {rows.shape}, expected [n, {self.dims.hidden}]")
            binding.host_input(contract.IMAGE_EMBEDS, rows)
        elif image_embeds is not None and len(image_embeds):
            raise InvalidRequestError(f"{self.graph.path}: the decoder takes no image embeddings (not a "
                                      "vision-language artifact)")
        store, device = self.store, self.store.device
        past_shape = [1, past, self.dims.kv_heads, self.dims.head_dim]
        new_shape = [1, s, self.dims.kv_heads, self.dims.head_dim]
        for b, (past_name, present_name) in enumerate(self.graph.kv_names):
            binding.input(past_name, device, past_shape, store.ptr(b, 0))
            binding.output(present_name, device, new_shape, store.ptr(b, past))
        vocab = self.dims.vocab
        hidden = np.empty((1, s, self.dims.hidden), np.float32)
        # host outputs: on a GPU provider onnxruntime copies the result into them
        binding.output(contract.HIDDEN_STATES, "cpu", list(hidden.shape), hidden.ctypes.data)
        on_device = self._logits is not None and logits_rows is not None
        computed = s  # rows whose logits the pass computes
        if self.graph.logits_index:  # the graph computes the rows asked for only (all, on the device)
            index = np.arange(s, dtype=np.int64)
            if not on_device and logits_rows is not None:
                index = index[logits_rows]
            binding.host_input(contract.LOGITS_INDEX, index)
            computed = len(index)
        if on_device:  # the logits stay on the device; the rows asked for are gathered to the host below
            assert self._logits is not None
            logits_ptr = self._logits.ptr(s * vocab)
            binding.output(contract.LOGITS, self._logits.device, [1, s, vocab], logits_ptr)
        else:
            logits = np.empty((1, computed, vocab), np.float32)
            binding.output(contract.LOGITS, "cpu", list(logits.shape), logits.ctypes.data)
        try:
            binding.run()
            if self.graph.device is not None:  # device cache: complete before another session's run reads it
                binding.synchronize_outputs()
        except Exception as e:  # onnxruntime's own exception types; should not happen on valid input
            raise SpecrtError(f"decoder forward failed (s={s}, past={past}): {type(e).__name__}: {e}") from None
        if not on_device:
            picked_here = logits_rows is None or self.graph.logits_index
            return ForwardOutput(logits=logits[0] if picked_here else logits[0, logits_rows], hidden_states=hidden[0])
        rows = np.arange(s)[logits_rows]  # [r]
        picked = np.empty((1, len(rows), vocab), np.float32)
        if len(rows):
            assert self.graph.gather is not None and self._logits is not None
            source = Block(self._logits.device, logits_ptr, s, vocab)
            self.graph.gather.run([source], rows, [Block("cpu", picked.ctypes.data, len(rows), vocab)])
        return ForwardOutput(logits=picked[0], hidden_states=hidden[0])

    def snapshot(self, rows: int) -> np.ndarray:
        """A host copy of the first ``rows`` cached positions: [2 * layers, rows, kv_heads, head_dim]."""
        if not 0 <= rows <= self.past:
            raise ValueError(f"snapshot: rows must be in [0, {self.past}], got {rows}")
        return self.store.read(rows)

    def snapshot_bytes(self, rows: int) -> int:
        """Size of :meth:`snapshot` (``rows``)."""
        return 2 * self.dims.num_layers * rows * self.dims.kv_heads * self.dims.head_dim * FLOAT_BYTES

    def restore(self, kv: np.ndarray) -> None:
        """Start the sequence from cached positions ``kv`` ([2 * layers, k, kv_heads, head_dim], a
        :meth:`snapshot` of the same graph) instead of computing them; call after :meth:`reset`."""
        expected = (2 * self.dims.num_layers, self.dims.kv_heads, self.dims.head_dim)
        if kv.ndim != 4 or (kv.shape[0], *kv.shape[2:]) != expected or kv.dtype != np.float32:
            raise ValueError(f"restore: kv must be float32 [{expected[0]}, k, {expected[1]}, {expected[2]}], "
                             f"got {kv.dtype} {list(kv.shape)}")
        if self.past != 0 or kv.shape[1] > self.capacity:
            raise ValueError(f"restore: needs an empty cache of at least {kv.shape[1]} positions "
                             f"(past {self.past}, capacity {self.capacity})")
        self.store.write(kv)
        self.past = kv.shape[1]

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
        self.store.compact(self.past, keep)
        self.past += len(keep)
