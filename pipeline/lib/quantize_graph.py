"""Weight-only quantization of an fp32 specrt decoder graph with onnxruntime's quantizers.

    fp32 decoder.onnx ──fold tied lm_head──► MatMul(h, W[hidden, vocab])       (own initializer)
                      ──body MatMuls──────► MatMulNBits(bits, block_size)      (int4 / int8)
                      ──lm_head───────────► MatMulNBits(lm_head_bits) | fp32
                      ──embedding Gather──► GatherBlockQuantized(embedding_bits) | fp32
    or, for ``method: specrt_q4``: every constant-weight MatMul (and the lm_head) -> specrt's MatMulQ4
    (runtime/kernels/matmul_q4.h): 4-bit blocks of 32, int8 activations, integer block sums, the same
    bits for a row in any window on every CPU (pipeline/lib/q4_pack.py packs the weights);
    or, for ``method: dynamic``: every constant-weight MatMul -> MatMulInteger (quantize_dynamic);
    or, for ``method: w8a8``: every constant-weight MatMul -> per-token int8 activations x per-channel
    int8 weights, MatMulInteger (pipeline/lib/w8a8.py): integer sums, so a row never depends on the window;
    or, for ``method: specrt_w8a8``: the same arithmetic, one specrt MatMulW8A8 node per product
    (runtime/kernels/matmul_w8a8.h), with the same bits.

The lm_head is found as the MatMul that produces the contract's ``logits`` output. A tied
embedding reaches it as ``MatMul(h, Transpose(E))``, which neither quantizer touches: it is folded
into its own ``[hidden, vocab]`` initializer first (the Gather keeps ``E``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

log = logging.getLogger(__name__)

METHODS = ("matmul_nbits", "specrt_q4", "dynamic", "w8a8", "specrt_w8a8")
ONNX_IR_VERSION = 10  # onnxruntime 1.32 reads IR <= 13; the export writes 10


@dataclass(frozen=True)
class QuantConfig:
    """One variant's settings (``params.yaml: quantize.variants.<name>``)."""

    # "matmul_nbits" (onnxruntime's weight-only MatMulNBits), "specrt_q4" (specrt's MatMulQ4, exact by
    # construction; CPU provider), "dynamic" (quantize_dynamic), "w8a8" (pipeline/lib/w8a8.py, onnxruntime's
    # MatMulInteger) or "specrt_w8a8" (the same arithmetic in specrt's MatMulW8A8, one node a product; CPU provider)
    method: str
    bits: int = 4  # body MatMuls (matmul_nbits, specrt_q4)
    block_size: int = 32  # weights per scale along K (matmul_nbits; specrt_q4: 32)
    symmetric: bool = True  # no zero points (matmul_nbits; specrt_q4: true)
    accuracy_level: int = 0  # MatMulNBits compute type: 0 = fp32 activations, 4 = int8 activations
    lm_head_bits: int | None = 8  # None keeps the lm_head fp32
    embedding_bits: int | None = None  # 4: GatherBlockQuantized; None keeps the embedding Gather fp32
    reduce_range: bool = True  # w8a8, specrt_w8a8: 7-bit weights (MatMulInteger on AVX2 saturates 8-bit ones;
    # MatMulW8A8 takes either)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"quantize method must be one of {METHODS}, got {self.method!r}")
        for name in ("bits", "lm_head_bits"):
            value = getattr(self, name)
            if value is not None and value not in (4, 8):
                raise ValueError(f"quantize {name} must be 4, 8 or null, got {value!r}")
        if self.embedding_bits not in (4, None):  # onnxruntime's quantizer makes 4-bit GatherBlockQuantized only
            raise ValueError(f"quantize embedding_bits must be 4 or null, got {self.embedding_bits!r}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"quantize block_size must be a power of two >= 16, got {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"quantize accuracy_level must be 0..4, got {self.accuracy_level}")
        if self.method == "specrt_q4" and (self.bits != 4 or self.block_size != 32 or not self.symmetric
                                           or self.lm_head_bits not in (4, None)):
            raise ValueError("quantize method 'specrt_q4' is 4-bit symmetric blocks of 32: bits 4, block_size 32, "
                             f"symmetric true, lm_head_bits 4 or null (got bits {self.bits}, block_size "
                             f"{self.block_size}, symmetric {self.symmetric}, lm_head_bits {self.lm_head_bits})")
        int8_only = self.method in ("dynamic", "w8a8", "specrt_w8a8")
        if int8_only and (self.bits != 8 or self.lm_head_bits not in (8, None) or self.embedding_bits):
            raise ValueError(f"quantize method {self.method!r} is int8 MatMuls only: bits 8, lm_head_bits 8 or "
                             "null, embedding_bits null")


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output}


def lm_head_node(graph: onnx.GraphProto, logits: str = "logits") -> onnx.NodeProto:
    """The MatMul that computes the logits output (possibly behind a Reshape/Cast)."""
    producers = _producers(graph)
    name = logits
    for _ in range(4):
        node = producers.get(name)
        if node is None:
            break
        if node.op_type == "MatMul":
            return node
        name = node.input[0]
    raise ValueError(f"graph has no MatMul producing {logits!r}: not a specrt decoder?")


def fold_tied_lm_head(model: onnx.ModelProto) -> bool:
    """Give a tied lm_head ``MatMul(h, Transpose(E))`` its own ``E.T`` initializer; True if folded."""
    graph = model.graph
    head = lm_head_node(graph)
    producers = _producers(graph)
    transpose = producers.get(head.input[1])
    inits = {i.name: i for i in graph.initializer}
    if transpose is None or transpose.op_type != "Transpose" or transpose.input[0] not in inits:
        return False
    weight = numpy_helper.to_array(inits[transpose.input[0]], base_dir="")  # [vocab, hidden]
    folded = numpy_helper.from_array(np.ascontiguousarray(weight.T), name=f"{transpose.input[0]}.T")  # [hidden, vocab]
    graph.initializer.append(folded)
    head.input[1] = folded.name
    if not any(transpose.output[0] in n.input for n in graph.node if n is not head):
        graph.node.remove(transpose)
    return True


def _weight_only(model: onnx.ModelProto, bits: int, config: QuantConfig, exclude: list[str],
                 op_types: tuple[str, ...]) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        model,
        bits=bits,
        block_size=config.block_size,
        is_symmetric=config.symmetric,
        accuracy_level=config.accuracy_level,
        nodes_to_exclude=exclude,
        op_types_to_quantize=op_types,
        quant_axes=(("MatMul", 0), ("Gather", 1)),
    )
    quantizer.process()
    return quantizer.model.model


def quantize_model(model: onnx.ModelProto, config: QuantConfig) -> onnx.ModelProto:
    """The quantized graph of an fp32 decoder ``model`` (loaded with its weights)."""
    fold_tied_lm_head(model)
    head = lm_head_node(model.graph).name
    if config.method == "dynamic":
        return _dynamic(model, config, head)
    if config.method == "w8a8":
        from .w8a8 import quantize_w8a8

        return quantize_w8a8(model, exclude=[] if config.lm_head_bits is not None else [head],
                             reduce_range=config.reduce_range)
    matmuls = [n.name for n in model.graph.node if n.op_type == "MatMul"]
    if config.method == "specrt_w8a8":
        _specrt_w8a8(model, exclude=[] if config.lm_head_bits is not None else [head], reduce_range=config.reduce_range)
    elif config.method == "specrt_q4":
        _specrt_q4(model, exclude=[] if config.lm_head_bits is not None else [head])
    else:
        model = _body_and_head_nbits(model, config, head)
    if config.embedding_bits is not None:
        model = _weight_only(model, config.embedding_bits, config, exclude=[], op_types=("Gather",))
    left = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name in matmuls]
    log.info("quantized %d MatMuls (lm_head %s), %d left fp32 (activation x activation)",
             len(matmuls) - len(left), "fp32" if config.lm_head_bits is None else f"{config.lm_head_bits}-bit",
             len(left))
    return model


def _body_and_head_nbits(model: onnx.ModelProto, config: QuantConfig, head: str) -> onnx.ModelProto:
    model = _weight_only(model, config.bits, config, exclude=[head], op_types=("MatMul",))
    if config.lm_head_bits is not None:
        others = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name != head]
        model = _weight_only(model, config.lm_head_bits, config, exclude=others, op_types=("MatMul",))
    return model


def _specrt_q4(model: onnx.ModelProto, exclude: list[str]) -> None:
    """Replace, in place, each MatMul with a constant [K, N] weight (K a multiple of 32) by MatMulQ4."""
    from specrt.backend import kernels

    from .q4_pack import BLOCK, pack_q4, quantize_q4

    def pack(weight: np.ndarray) -> dict[str, np.ndarray]:
        packed, scales = pack_q4(*quantize_q4(weight))
        return {".q4": packed, ".q4_scales": scales}

    _replace_matmuls(model, exclude, kernels.MATMUL_Q4_OP, lambda k: k % BLOCK == 0, pack)


def _specrt_w8a8(model: onnx.ModelProto, exclude: list[str], reduce_range: bool) -> None:
    """Replace, in place, each MatMul with a constant [K, N] weight (K a multiple of 4) by MatMulW8A8:
    w8a8's arithmetic (per-token int8 activations, per-column int8 weights) in one node."""
    from specrt.backend import kernels

    from .w8a8 import GROUP, MAX_K, pack_w8, quantize_weight

    def pack(weight: np.ndarray) -> dict[str, np.ndarray]:
        quantized, scale = quantize_weight(weight, reduce_range)
        return {".w8": pack_w8(quantized), ".w8_scale": scale}

    _replace_matmuls(model, exclude, kernels.MATMUL_W8A8_OP, lambda k: 0 < k <= MAX_K and k % GROUP == 0, pack)


def _replace_matmuls(model: onnx.ModelProto, exclude: list[str], op: str, takes_k: Callable[[int], bool],
                     pack: Callable[[np.ndarray], dict[str, np.ndarray]]) -> None:
    """Replace, in place, each MatMul with a constant [K, N] weight whose K ``takes_k`` by the kernel
    library's ``op`` (attributes K, N): inputs x and ``pack(weight)``'s arrays (as initializers named
    weight + key, in order), and the float32 [N] bias of an Add that alone reads the product."""
    from specrt.backend import kernels

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    users: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    for node in list(graph.node):
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and node.name not in exclude else None
        if weight is None or len(weight.dims) != 2 or not takes_k(weight.dims[0]):
            continue
        k, n = weight.dims
        stem = node.input[1]
        arrays = pack(numpy_helper.to_array(weight, base_dir=""))
        graph.initializer.extend(numpy_helper.from_array(array, stem + key) for key, array in arrays.items())
        inputs, outputs = [node.input[0], *(stem + key for key in arrays)], list(node.output)
        add = _bias_add(graph, inits, node.output[0], n)
        if add is not None:  # y = x W + b in one node: the same float addition, after each output's chain
            bias_name = next(name for name in add.input if name != node.output[0])
            inputs, outputs = inputs + [bias_name], list(add.output)
            graph.node.remove(add)
        replacement = onnx.helper.make_node(op, inputs, outputs, name=node.name, domain=kernels.DOMAIN, K=k, N=n)
        index = list(graph.node).index(node)  # now: a folded Add before it has moved it
        graph.node.remove(node)
        graph.node.insert(index, replacement)
        users[stem] -= 1
        if not users[stem]:
            graph.initializer.remove(inits.pop(stem))
    if not any(o.domain == kernels.DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(kernels.DOMAIN, kernels.OPSET))


def _bias_add(graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto], product: str,
              n: int) -> onnx.NodeProto | None:
    """The Add node that is ``product``'s only reader and adds it to a float32 [n] initializer, if any."""
    readers = [node for node in graph.node if product in node.input]
    outputs = {o.name for o in graph.output}
    if len(readers) != 1 or product in outputs or readers[0].op_type != "Add" or len(readers[0].input) != 2:
        return None
    other = next((name for name in readers[0].input if name != product), None)
    bias = inits.get(other) if other is not None else None
    if bias is None or list(bias.dims) != [n] or bias.data_type != onnx.TensorProto.FLOAT:
        return None
    return readers[0]


def _dynamic(model: onnx.ModelProto, config: QuantConfig, head: str) -> onnx.ModelProto:
    """int8 MatMulInteger with per-tensor dynamic activation scales (onnxruntime quantize_dynamic)."""
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save_model(model, src, save_as_external_data=True, location="in.onnx.data")
        quantize_dynamic(
            src,
            dst,
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul"],
            nodes_to_exclude=[] if config.lm_head_bits is not None else [head],
            use_external_data_format=True,
        )
        return onnx.load(dst)


def load_model(path: Path) -> onnx.ModelProto:
    """``path`` with its external weights read in. ``onnx.load`` refuses a weights file with more
    than one hard link ("potential hardlink attack"), which is what DVC's hardlink cache leaves in
    the workspace; the external data entries are read here by plain file reads instead."""
    model = onnx.load(path, load_external_data=False)
    files: dict[str, Any] = {}
    try:
        for tensor in model.graph.initializer:
            if not external_data_helper.uses_external_data(tensor):
                continue
            info = external_data_helper.ExternalDataInfo(tensor)
            location = Path(info.location)
            if location.is_absolute() or ".." in location.parts:
                raise ValueError(f"{path}: tensor {tensor.name} points outside its folder ({info.location})")
            f = files.get(info.location) or files.setdefault(info.location, open(path.parent / location, "rb"))
            f.seek(info.offset or 0)
            tensor.raw_data = f.read(info.length) if info.length else f.read()
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
    finally:
        for f in files.values():
            f.close()
    return model


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """Write ``path`` and its weights to ``path.name + '.data'`` at the export's IR version."""
    model.ir_version = ONNX_IR_VERSION
    data = path.with_name(path.name + ".data")
    if data.exists():
        data.unlink()
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
