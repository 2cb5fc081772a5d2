"""Parity of an exported decoder against the torch model it came from.

Two checks, both against plain full-sequence torch forwards (HF's own masks):
- chain: the ONNX decoder prefills ``ids[:split]`` in chunks, then verifies ``ids[split:]`` in one
  window; every position's logits must match torch's logits for the whole sequence.
- tree: after the same prefill, a two-branch draft tree is verified in one window; each node's
  logits must match torch's logits at the end of that node's root-to-node path.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import PreTrainedModel

from specrt.backend.prefill import prefill
from specrt.backend.session import OrtDecoder
from specrt.backend.window import flatten
from specrt.tree import DraftTree


@torch.no_grad()
def torch_logits(model: PreTrainedModel, ids: np.ndarray) -> np.ndarray:
    """[t, vocab] logits of one plain forward over ``ids`` ([t] int)."""
    return model(torch.from_numpy(np.asarray(ids, np.int64))[None]).logits[0].float().numpy()


def compare_logits(got: np.ndarray, ref: np.ndarray) -> dict[str, float | int]:
    """Max |diff| and how many argmaxes differ where torch's top-2 margin exceeds that diff."""
    diff = float(np.abs(got - ref).max())
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * diff
    flips = int(((got.argmax(-1) != ref.argmax(-1)) & clear).sum())
    return {"max_abs_diff": diff, "argmax_flips": flips, "positions": int(len(ref))}


def chain_parity(decoder: OrtDecoder, ids: np.ndarray, ref: np.ndarray, split: int, chunk: int) -> dict:
    """Prefill ``ids[:split]``, verify the rest as one chain; ref: [t, vocab] torch logits of ``ids``.
    Leaves ``ids[:split]`` cached."""
    decoder.reset(len(ids) + 8)
    head = np.concatenate([out.logits for out in prefill(decoder, ids[:split], chunk)])
    window = flatten(int(ids[split]), DraftTree.chain(ids[split + 1 :]), decoder.past)
    tail = decoder.forward(window.input_ids, window.position_ids, window.attention_bias).logits
    return compare_logits(np.concatenate([head, tail]), ref)


def tree_parity(model: PreTrainedModel, decoder: OrtDecoder, ids: np.ndarray, ref: np.ndarray, split: int) -> dict:
    """With ``ids[:split]`` cached, verify a tree over ids[split:split+3] and a sibling branch of
    other tokens; ref: [t, vocab] torch logits of ``ids`` (the main branch's reference).

          root = ids[split]
          /              \\
      n0 = ids[split+1]   n2 = alt0
        |                   |
      n1 = ids[split+2]   n3 = alt1
    """
    a, b = int(ids[split + 1]), int(ids[split + 2])
    vocab = decoder.dims.vocab
    alt0, alt1 = (a + 1) % vocab, (b + 7) % vocab
    tree = DraftTree(np.array([a, b, alt0, alt1]), np.array([-1, 0, -1, 2]))
    window = flatten(int(ids[split]), tree, decoder.past)
    got = decoder.forward(window.input_ids, window.position_ids, window.attention_bias).logits
    ref_alt = torch_logits(model, np.concatenate([ids[: split + 1], [alt0, alt1]]))[-2:]  # n2, n3
    return compare_logits(got, np.concatenate([ref[split : split + 3], ref_alt]))


def check_parity(
    model: PreTrainedModel, decoder: OrtDecoder, ids: np.ndarray, *, chunk: int, tolerance: float
) -> dict:
    """Both checks on ``ids`` (the verify window covers the last 8 positions); adds ``ok``."""
    split = len(ids) - 8
    report = {
        "tokens": int(len(ids)),
        "tolerance": tolerance,
    }
    ref = torch_logits(model, ids)
    report["chain"] = chain_parity(decoder, ids, ref, split, chunk)
    decoder.truncate(split)
    report["tree"] = tree_parity(model, decoder, ids, ref, split)
    report["ok"] = all(
        r["max_abs_diff"] <= tolerance and r["argmax_flips"] == 0 for r in (report["chain"], report["tree"])
    )
    return report
