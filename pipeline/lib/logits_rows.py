"""The lm_head on the rows that need logits only: a ``logits_index`` input selects them.

    h [1, s, hidden] ──MatMul(W_lm)──► logits [1, s, vocab]
                  ──Gather(axis=1, logits_index [r])──► [1, r, hidden] ──MatMul(W_lm)──► logits [1, r, vocab]

A prefill chunk of s positions needs the logits of its last row at most (the next token), yet
without the input the graph computes all s rows: on Qwen2.5-Coder-0.5B the lm_head (151,936 x 896)
is 136 M of the ~494 M multiply-adds of a row. A verify window asks for every row. The runtime binds
the input when the graph has it (specrt.backend.contract) and computes all rows on graphs without
it. The hidden_states output keeps every row: drafters read them.

Each selected row's logits are the lm_head of that row alone, with the bits the kernels give a row
whatever the rows beside it (MatMulQ4, MatMulW8A8); a float32 lm_head (onnxruntime's MatMul) gives
the prefill's next token with the same code in plain decoding and in speculation, so the two still
agree token for token.
"""

from __future__ import annotations

import onnx_ir as ir

from specrt.backend import contract

# ops that may sit between the lm_head MatMul and the logits output (a final-logit softcap: tanh(x / c) * c)
ELEMENTWISE = ("Div", "Tanh", "Mul", "Cast")


def logits_output(graph: ir.Graph) -> ir.Value:
    """The graph's ``logits`` output."""
    logits = next((out for out in graph.outputs if out.name == contract.LOGITS), None)
    if logits is None:
        raise ValueError(f"graph has no {contract.LOGITS!r} output: not a specrt decoder")
    return logits


def lm_head_matmul(graph: ir.Graph) -> ir.Node:
    """The MatMul whose product becomes the ``logits`` output (through elementwise ops only)."""
    node = logits_output(graph).producer()
    for _ in range(8):
        if node is None:
            break
        if node.op_type == "MatMul" and node.domain == "":
            return node
        if node.op_type not in ELEMENTWISE:
            break
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    raise ValueError(f"graph has no MatMul behind its {contract.LOGITS!r} output (through {ELEMENTWISE} only)")


def select_logits_rows(model: ir.Model) -> None:
    """Add the ``logits_index`` input and gather those rows of the lm_head's input, in place."""
    graph = model.graph
    if any(value.name == contract.LOGITS_INDEX for value in graph.inputs):
        raise ValueError(f"graph already has a {contract.LOGITS_INDEX!r} input")
    head = lm_head_matmul(graph)
    index = ir.Value(name=contract.LOGITS_INDEX, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["r"]))
    graph.inputs.append(index)
    gather = ir.node("Gather", inputs=[head.inputs[0], index], attributes={"axis": 1}, name="logits_rows")
    graph.insert_before(head, gather)
    head.replace_input_with(0, gather.outputs[0])
    # the values from the lm_head to the output now hold r rows, not s
    logits = logits_output(graph)
    value = logits.producer().inputs[0] if logits.producer() is not head else None
    while value is not None:
        value.shape = None
        producer = value.producer()
        value = producer.inputs[0] if producer is not None and producer is not head else None
    vocab = logits.shape[-1] if logits.shape is not None else "vocab"
    logits.shape = ir.Shape([1, "r", vocab])
