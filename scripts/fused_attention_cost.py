"""Milliseconds of a whole decoder's attention (24 layers of Qwen2.5-0.5B's shape: 14 query heads
over 2 key/value heads, head size 64), our export's against onnxruntime's fused GroupQueryAttention,
by window size and cache length: what a fused export would save per pass, before anything else.

    python -m scripts.fused_attention_cost --past 100 700 1500 --sizes 1 2 5 --threads 2   (from the repo root)

    grouped   the export's attention (pipeline/grouped_attention.py, exported by torch and fused as
              pipeline/fuse_graph.py does): the cache's [1, past, kv, d] rows concatenated with the
              window's, keys-first products
    gqa_copy  com.microsoft.GroupQueryAttention on a heads-first past [1, kv, past, d], which it copies
              into a present [1, kv, past + s, d] (how scripts/step_cost.py runs genai's graph)
    gqa_share the same operator on one heads-first buffer [1, kv, capacity, d] bound as both past and
              present (onnxruntime-genai's own loop): the window's rows are written in place, nothing
              is copied. Exact for chains only with a window of >= 2 rows (docs/benchmark.md), so a
              fused export would run a single step as two: compare its s=2 with grouped's s=1

The layers are chained (a layer's output is the next one's queries), each layer has its own cache,
and the graphs take turns in blocks of ``--repeats`` passes for ``--rounds`` rounds; the median block
is printed. The rest of a pass (weights, norms, rotary) is left out: it is the same in both exports.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common  # noqa: F401  (ir.passes.common)
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

from pipeline.fuse_graph import fuse_transposed_operands
from pipeline.grouped_attention import grouped_attention
from specrt.tree import causal_bias

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 14, 2, 64, 24
CAPACITY = 4096  # rows of gqa_share's buffers
KINDS = ("grouped", "gqa_copy", "gqa_share")


class GroupedLayers(torch.nn.Module):
    """forward(q [1, heads, s, d], k, v [1, s, kv, d], bias [1, 1, s, past + s], *past [1, past, kv, d])."""

    def forward(self, q, k, v, bias, *past):
        out = q
        for layer in range(LAYERS):
            keys = torch.cat([past[2 * layer], k], 1).transpose(1, 2)  # [1, kv, t, d], as RowCache hands it over
            values = torch.cat([past[2 * layer + 1], v], 1).transpose(1, 2)
            attended, _ = grouped_attention(self, out, keys, values, bias, HEAD_DIM ** -0.5)  # [1, s, heads, d]
            out = attended.transpose(1, 2)
        return out


def grouped_model(path: Path) -> None:
    s, past = torch.export.Dim("s", min=1, max=CAPACITY), torch.export.Dim("past", min=0, max=CAPACITY)
    example = (torch.randn(1, HEADS, 3, HEAD_DIM), torch.randn(1, 3, KV_HEADS, HEAD_DIM),
               torch.randn(1, 3, KV_HEADS, HEAD_DIM), torch.zeros(1, 1, 3, 8),
               *[torch.randn(1, 5, KV_HEADS, HEAD_DIM) for _ in range(2 * LAYERS)])
    dynamic = ({2: s}, {1: s}, {1: s}, {2: s, 3: torch.export.Dim.AUTO}, tuple({1: past} for _ in range(2 * LAYERS)))
    names = ["q", "k", "v", "bias"] + [f"past{i}" for i in range(2 * LAYERS)]
    program = torch.onnx.export(GroupedLayers().eval(), example, input_names=names, output_names=["out"],
                                dynamic_shapes=dynamic, opset_version=20, dynamo=True, optimize=True)
    ir.passes.common.CommonSubexpressionEliminationPass()(program.model)
    fuse_transposed_operands(program.model)
    ir.passes.common.RemoveUnusedNodesPass()(program.model)
    program.save(str(path))


def gqa_model(path: Path, share: bool) -> None:
    """Inputs q [1, s, heads*d], k, v [1, s, kv*d], seqlens_k [1] int32 (past + s - 1), total [] int32,
    past{i} [1, kv, past or capacity, d]; outputs the last layer's out and every present."""
    f = TensorProto.FLOAT
    length = "capacity" if share else "past"
    inputs = [helper.make_tensor_value_info("q", f, [1, "s", HEADS * HEAD_DIM]),
              helper.make_tensor_value_info("k", f, [1, "s", KV_HEADS * HEAD_DIM]),
              helper.make_tensor_value_info("v", f, [1, "s", KV_HEADS * HEAD_DIM]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total", TensorProto.INT32, [])]
    inputs += [helper.make_tensor_value_info(f"past{i}", f, [1, KV_HEADS, length, HEAD_DIM]) for i in range(2 * LAYERS)]
    nodes, outputs, q = [], [], "q"
    for layer in range(LAYERS):
        present = [f"present{2 * layer}", f"present{2 * layer + 1}"]
        nodes.append(helper.make_node(
            "GroupQueryAttention", [q, "k", "v", f"past{2 * layer}", f"past{2 * layer + 1}", "seqlens_k", "total"],
            [f"out{layer}", *present], domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
            scale=HEAD_DIM ** -0.5))
        outputs += [helper.make_tensor_value_info(name, f, None) for name in present]
        q = f"out{layer}"
    outputs.append(helper.make_tensor_value_info(q, f, None))
    model = helper.make_model(helper.make_graph(nodes, "gqa", inputs, outputs), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    path.write_bytes(model.SerializeToString())


def binding(kind: str, session: ort.InferenceSession, s: int, past: int, rng: np.random.Generator):
    """An IO binding of random inputs of ``kind``'s layout (and the arrays it points into)."""
    b, keep = session.io_binding(), []

    def host(name: str, array: np.ndarray) -> None:
        keep.append(array)
        b.bind_cpu_input(name, array)

    if kind == "grouped":
        host("q", rng.standard_normal((1, HEADS, s, HEAD_DIM), np.float32))
        host("k", rng.standard_normal((1, s, KV_HEADS, HEAD_DIM), np.float32))
        host("v", rng.standard_normal((1, s, KV_HEADS, HEAD_DIM), np.float32))
        host("bias", causal_bias(past, s)[None, None])  # [1, 1, s, past + s]
        for i in range(2 * LAYERS):
            host(f"past{i}", rng.standard_normal((1, past, KV_HEADS, HEAD_DIM), np.float32))
        b.bind_output("out")
        return b, keep
    host("q", rng.standard_normal((1, s, HEADS * HEAD_DIM), np.float32))
    host("k", rng.standard_normal((1, s, KV_HEADS * HEAD_DIM), np.float32))
    host("v", rng.standard_normal((1, s, KV_HEADS * HEAD_DIM), np.float32))
    host("seqlens_k", np.array([past + s - 1], np.int32))
    host("total", np.array(past + s, np.int32))
    for i in range(2 * LAYERS):
        if kind == "gqa_share":  # past and present: one buffer
            buffer = rng.standard_normal((1, KV_HEADS, CAPACITY, HEAD_DIM), np.float32)
            keep.append(buffer)
            b.bind_input(f"past{i}", "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
            b.bind_output(f"present{i}", "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
        else:
            host(f"past{i}", rng.standard_normal((1, KV_HEADS, past, HEAD_DIM), np.float32))
            b.bind_output(f"present{i}")
    b.bind_output(f"out{LAYERS - 1}")
    return b, keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--past", type=int, nargs="+", default=[100, 700, 1500])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 5], help="window sizes s")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if max(args.past) + max(args.sizes) > CAPACITY:
        parser.error(f"--past + --sizes must fit the shared buffers' {CAPACITY} rows")
    options = ort.SessionOptions()
    if args.threads is not None:
        options.intra_op_num_threads = args.threads
    with TemporaryDirectory() as tmp:
        paths = {kind: Path(tmp) / f"{kind}.onnx" for kind in KINDS}
        grouped_model(paths["grouped"])
        gqa_model(paths["gqa_copy"], share=False)
        gqa_model(paths["gqa_share"], share=True)
        sessions = {kind: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
                    for kind, p in paths.items()}
    rng = np.random.default_rng(0)
    for s in args.sizes:
        for past in args.past:
            bindings = {kind: binding(kind, session, s, past, rng) for kind, session in sessions.items()}
            times: dict[str, list[float]] = {kind: [] for kind in KINDS}
            for _ in range(args.rounds):
                for kind, session in sessions.items():
                    b = bindings[kind][0]
                    session.run_with_iobinding(b)  # warm
                    t0 = time.perf_counter()
                    for _ in range(args.repeats):
                        session.run_with_iobinding(b)
                    times[kind].append((time.perf_counter() - t0) / args.repeats)
            cells = ", ".join(f"{kind} {1e3 * float(np.median(v)):.2f} ms" for kind, v in times.items())
            print(f"s={s} past={past}: {cells}", flush=True)


if __name__ == "__main__":
    main()
