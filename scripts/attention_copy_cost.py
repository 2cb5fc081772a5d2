"""Microseconds of one layer's attention products for four ways of laying them out in ONNX, at
several cache lengths (Qwen2.5-0.5B's shape: 14 query heads over 2 key/value heads, head size 64,
one new token; the grouped attention stacks a KV head's 7 queries as rows).

    python scripts/attention_copy_cost.py --past 150 700 1500 --threads 2

    padded      session 10's export: the cached K and V transposed from the cache's [past, kv, d] rows
                to [kv, past, d], the new row concatenated, V padded with a column of ones, one
                product for the values and the softmax's normaliser
    grouped     the export since session 11 (pipeline/grouped_attention.py): the same without the Pad;
                the normaliser is its own product with two columns of ones
    rows        K and V stay in the cache's [t, kv*d] rows (concatenated, never transposed); the scores
                come from block-diagonal queries ([kv*g, kv*d], each row zero outside its head's d
                columns) times K^T, the values from every row times all of V, whose other heads'
                columns are dropped after. Built at 19cb153 and not exact: MLAS sums the keys of a
                row-major product in blocks that change with the number of rows
    keys_first  the export since af92827: the same products keys-first, scores_t = K @ q_t
                ([t, kv*g]) and the values FusedMatMul(e_t, V, transA=1), whose key blocks do not
                depend on the rows (pipeline/grouped_attention.py)

Every layout but padded sums the softmax's normaliser with its own product (two columns of ones).
Each graph gets random inputs of its own layout and runs in blocks of 50 for ``--rounds`` rounds,
taking turns; the median block is printed. Ratios between the graphs are the reading: the machine
moves, and one layer's products leave out the rest of a decode step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

KV, G, D = 2, 7, 64  # key/value heads, queries per key/value head, head size
LAYOUTS = ("padded", "grouped", "rows", "keys_first")


def _ones() -> list:
    """ones [t, 2] from t [1] (the normaliser's two columns of ones)."""
    return [helper.make_node("Concat", ["t", "two"], ["ones_shape"], axis=0),
            helper.make_node("Expand", ["one_row", "ones_shape"], ["ones"])]


def _divide(axis: int) -> list:
    """out = num / den2's first column (``axis``: the columns' axis, 1 or 3)."""
    return [helper.make_node("Slice", ["den2", "zero", "one_i", "one_i" if axis == 1 else "three"], ["den"]),
            helper.make_node("Div", ["num", "den"], ["out"])]


def _nodes(layout: str) -> list:
    """Nodes from the cache rows (pk, pv [1, past, kv, d]) and the new row (nk, nv [1, 1, kv, d]) to
    ``scores`` and ``out``; queries q [1, kv, g, d] (qbd [kv*g, kv*d] for ``rows``), softmax
    numerators e [1, kv, g, t] (eall [kv*g, t]; qt [kv*d, kv*g] and et [t, kv*g] keys-first)."""
    node = helper.make_node
    if layout == "keys_first":
        return [node("Concat", ["pk", "nk"], ["k4"], axis=1), node("Reshape", ["k4", "rows"], ["k"]),
                node("MatMul", ["k", "qt"], ["scores"]),
                node("Concat", ["pv", "nv"], ["v4"], axis=1), node("Reshape", ["v4", "rows"], ["v"]),
                node("FusedMatMul", ["et", "v"], ["num"], domain="com.microsoft", transA=1),
                node("Shape", ["et"], ["t"], start=0, end=1), *_ones(),
                node("FusedMatMul", ["et", "ones"], ["den2"], domain="com.microsoft", transA=1), *_divide(1)]
    if layout == "rows":
        return [node("Concat", ["pk", "nk"], ["k4"], axis=1), node("Reshape", ["k4", "rows"], ["k"]),
                node("Transpose", ["k"], ["kT"], perm=[1, 0]), node("MatMul", ["qbd", "kT"], ["scores"]),
                node("Concat", ["pv", "nv"], ["v4"], axis=1), node("Reshape", ["v4", "rows"], ["v"]),
                node("MatMul", ["eall", "v"], ["num"]), node("Shape", ["eall"], ["t"], start=1, end=2), *_ones(),
                node("MatMul", ["eall", "ones"], ["den2"]), *_divide(1)]
    heads_first = [0, 2, 1, 3]
    nodes = [node("Transpose", ["pk"], ["pkt"], perm=heads_first), node("Transpose", ["nk"], ["nkt"], perm=heads_first),
             node("Concat", ["pkt", "nkt"], ["k"], axis=2), node("Transpose", ["k"], ["kT"], perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "kT"], ["scores"]),
             node("Transpose", ["pv"], ["pvt"], perm=heads_first), node("Transpose", ["nv"], ["nvt"], perm=heads_first),
             node("Concat", ["pvt", "nvt"], ["v"], axis=2)]
    if layout == "padded":
        return nodes + [node("Pad", ["v", "pads", "one"], ["vp"]), node("MatMul", ["e", "vp"], ["ev"]),
                        node("Split", ["ev", "split"], ["num", "den"], axis=3), node("Div", ["num", "den"], ["out"])]
    return nodes + [node("MatMul", ["e", "v"], ["num"]), node("Shape", ["v"], ["t"], start=2, end=3), *_ones(),
                    node("MatMul", ["e", "ones"], ["den2"]), *_divide(3)]


def session(layout: str, threads: int | None) -> ort.InferenceSession:
    f = TensorProto.FLOAT
    shapes = {"pk": [1, "past", KV, D], "pv": [1, "past", KV, D], "nk": [1, 1, KV, D], "nv": [1, 1, KV, D],
              "q": [1, KV, G, D], "e": [1, KV, G, "t"], "qbd": [KV * G, KV * D], "eall": [KV * G, "t"],
              "qt": [KV * D, KV * G], "et": ["t", KV * G]}
    nodes = _nodes(layout)
    used = {name for n in nodes for name in n.input}
    inputs = [helper.make_tensor_value_info(name, f, shape) for name, shape in shapes.items() if name in used]
    constants = {"rows": np.array([-1, KV * D], np.int64), "pads": np.array([0, 0, 0, 0, 0, 0, 0, 1], np.int64),
                 "one": np.array(1.0, np.float32), "split": np.array([D, 1], np.int64),
                 "two": np.array([2], np.int64), "one_row": np.ones((1, 2), np.float32),
                 "zero": np.array([0], np.int64), "one_i": np.array([1], np.int64), "three": np.array([3], np.int64)}
    inits = [numpy_helper.from_array(value, name) for name, value in constants.items() if name in used]
    outputs = [helper.make_tensor_value_info(name, f, None) for name in ("scores", "out")]
    model = helper.make_model(helper.make_graph(nodes, layout, inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--past", type=int, nargs="+", default=[150, 700, 1500])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    sessions = {layout: session(layout, args.threads) for layout in LAYOUTS}
    rng = np.random.default_rng(0)
    for past in args.past:
        t = past + 1
        values = {"pk": (1, past, KV, D), "pv": (1, past, KV, D), "nk": (1, 1, KV, D), "nv": (1, 1, KV, D),
                  "q": (1, KV, G, D), "e": (1, KV, G, t), "qbd": (KV * G, KV * D), "eall": (KV * G, t),
                  "qt": (KV * D, KV * G), "et": (t, KV * G)}
        feeds = {name: rng.random(shape, np.float32) for name, shape in values.items()}
        times: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        for _ in range(args.rounds):
            for layout, s in sessions.items():
                own = {i.name: feeds[i.name] for i in s.get_inputs()}
                t0 = time.perf_counter()
                for _ in range(50):
                    s.run(None, own)
                times[layout].append((time.perf_counter() - t0) / 50)
        cells = ", ".join(f"{layout} {1e6 * float(np.median(v)):.0f} us" for layout, v in times.items())
        print(f"past {past}: {cells} per layer")


if __name__ == "__main__":
    main()
