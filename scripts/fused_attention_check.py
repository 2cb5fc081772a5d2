"""Does onnxruntime's fused GroupQueryAttention give a query the same bits in a verify window as in
a single decoding step? Lossless greedy speculation needs exactly that (docs/benchmark.md).

    python scripts/fused_attention_check.py --past 37 126 300 --threads 2

One ``com.microsoft.GroupQueryAttention`` node (Qwen2.5-0.5B's shape: 14 query heads, 2 key/value
heads, head size 64, no rotary), random inputs. For each ``past``: a chain window of 6 queries
(GQA's own causal mask) and a tree window of the same 6 (parents [-1, 0, 0, 1, 2, 3], an
``attention_bias`` of 0 on a node's ancestors and the past, -inf elsewhere); each row is then run
alone as a single step whose past holds the ``past`` keys plus the row's ancestors. Prints, per
row, whether the two outputs are equal bit for bit, and the largest difference; a window of one
query (the single step itself) is the control that shows the comparison can come out equal.

``--pad-single`` runs every single step as two query rows (the second a copy of the first, whose
key the first may not see): GQA multiplies a one-row query with onnxruntime's matrix-vector
kernel, which rounds differently from the many-row kernel that a window takes. The control (an
unpadded window of one) then differs from its padded single step: that is the one-row kernel.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

HEADS, KV_HEADS, HEAD_DIM = 14, 2, 64
PARENTS = [-1, 0, 0, 1, 2, 3]  # a tree of 6 nodes: two branches below the root


def gqa_session(threads: int | None) -> ort.InferenceSession:
    node = helper.make_node(
        "GroupQueryAttention",
        ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "", "", "",
         "attention_bias"],
        ["output", "present_key", "present_value"],
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS, scale=HEAD_DIM ** -0.5,
    )
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("query", f, [1, "s", HEADS * HEAD_DIM]),
        helper.make_tensor_value_info("key", f, [1, "s", KV_HEADS * HEAD_DIM]),
        helper.make_tensor_value_info("value", f, [1, "s", KV_HEADS * HEAD_DIM]),
        helper.make_tensor_value_info("past_key", f, [1, KV_HEADS, "past", HEAD_DIM]),
        helper.make_tensor_value_info("past_value", f, [1, KV_HEADS, "past", HEAD_DIM]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        helper.make_tensor_value_info("attention_bias", f, [1, 1, "s", "total"]),
    ]
    outputs = [helper.make_tensor_value_info(name, f, None) for name in node.output]
    model = helper.make_model(helper.make_graph([node], "gqa", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def attend(session: ort.InferenceSession, q: np.ndarray, k: np.ndarray, v: np.ndarray, past_k: np.ndarray,
           past_v: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """q [1, s, heads*d], k/v [1, s, kv*d], past_k/v [1, kv, past, d], bias [1, 1, s, past+s] -> [1, s, heads*d]."""
    s, past = q.shape[1], past_k.shape[2]
    feeds = {"query": q, "key": k, "value": v, "past_key": past_k, "past_value": past_v,
             "seqlens_k": np.array([past + s - 1], np.int32), "total_sequence_length": np.array(past + s, np.int32),
             "attention_bias": bias}
    return session.run(["output"], feeds)[0]


def heads_first(x: np.ndarray) -> np.ndarray:
    """[1, s, kv*d] -> [1, kv, s, d] (the past's layout)."""
    return x.reshape(1, x.shape[1], KV_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)


def single_step(session: ort.InferenceSession, q: np.ndarray, k: np.ndarray, v: np.ndarray, past_k: np.ndarray,
                past_v: np.ndarray, pad: bool) -> np.ndarray:
    """One query (q [1, 1, heads*d]) over ``past_k/v`` plus its own key -> [1, heads*d]. ``pad``: as
    row 0 of a two-row pass whose row 1 (a copy) is hidden from row 0."""
    total = past_k.shape[2] + 1
    if not pad:
        return attend(session, q, k, v, past_k, past_v, np.zeros((1, 1, 1, total), np.float32))[:, 0]
    bias = np.zeros((1, 1, 2, total + 1), np.float32)
    bias[0, 0, 0, total] = -np.inf  # row 0 does not see the copy's key
    two = [np.concatenate([x, x], axis=1) for x in (q, k, v)]
    return attend(session, *two, past_k, past_v, bias)[:, 0]


def compare(session: ort.InferenceSession, past: int, parents: list[int], rng: np.random.Generator,
            pad: bool = False) -> list[float]:
    """Largest |window row - single step| per row (0.0: bit for bit equal)."""
    n = len(parents)
    past_k, past_v = (rng.standard_normal((1, KV_HEADS, past, HEAD_DIM)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((1, n, HEADS * HEAD_DIM)).astype(np.float32) * 2
    k, v = (rng.standard_normal((1, n, KV_HEADS * HEAD_DIM)).astype(np.float32) for _ in range(2))
    ancestors = []
    for j in range(n):
        chain, a = [], parents[j]
        while a >= 0:
            chain.append(a)
            a = parents[a]
        ancestors.append(chain[::-1])
    bias = np.full((1, 1, n, past + n), -np.inf, np.float32)
    bias[..., :past] = 0.0
    for j in range(n):
        bias[0, 0, j, [past + a for a in (*ancestors[j], j)]] = 0.0
    window = attend(session, q, k, v, past_k, past_v, bias)
    diffs = []
    for j in range(n):
        anc = ancestors[j]
        single = single_step(session, q[:, j:j + 1], k[:, j:j + 1], v[:, j:j + 1],
                             np.concatenate([past_k, heads_first(k[:, anc])], axis=2),
                             np.concatenate([past_v, heads_first(v[:, anc])], axis=2), pad)
        diffs.append(float(np.abs(single[0] - window[0, j]).max()))
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--past", type=int, nargs="+", default=[37, 126, 300])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--pad-single", action="store_true", help="single steps as two query rows (see above)")
    args = parser.parse_args()
    session = gqa_session(args.threads)
    rng = np.random.default_rng(0)
    chain = [-1, *range(len(PARENTS) - 1)]
    for past in args.past:
        # control: a window of one query is the single step itself, so it must compare equal
        # (unless --pad-single: then it shows the one-row kernel)
        for name, parents in (("control (window of 1)", [-1]), ("chain", chain), ("tree", PARENTS)):
            diffs = compare(session, past, parents, rng, args.pad_single)
            exact = [d == 0.0 for d in diffs]
            print(f"past {past} {name}: rows equal to single steps {sum(exact)}/{len(exact)}, "
                  f"largest difference {max(diffs):.2e}")


if __name__ == "__main__":
    main()
