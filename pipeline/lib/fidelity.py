"""How far a quantized decoder is from its fp32 source: top-1 agreement and KL, teacher-forced.

Both decoders read the same token sequences (a prompt and the fp32 model's own greedy
continuation) in prefill chunks; at every position we compare the next-token distributions:
top-1 agreement = share of positions with the same argmax, KL = mean KL(p_fp32 || p_variant).
"""

from __future__ import annotations

import numpy as np

from specrt.backend.prefill import prefill
from specrt.backend.session import OrtDecoder


def _log_softmax(logits: np.ndarray) -> np.ndarray:  # [t, vocab] -> [t, vocab]
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def compare(reference: OrtDecoder, variant: OrtDecoder, sequences: list[np.ndarray], chunk: int) -> dict:
    """Top-1 agreement and mean/max KL(reference || variant) over all positions of ``sequences``
    ([t] int64 each); both decoders prefill in lockstep, one [chunk, vocab] block each at a time."""
    agree, kls = 0, []
    for ids in sequences:
        reference.reset(len(ids))
        variant.reset(len(ids))
        for a, b in zip(prefill(reference, ids, chunk), prefill(variant, ids, chunk), strict=True):
            ref, got = _log_softmax(a.logits), _log_softmax(b.logits)
            agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
            kls.append((np.exp(ref) * (ref - got)).sum(-1))
    kl = np.concatenate(kls)
    return {
        "positions": int(len(kl)),
        "top1_agreement": round(agree / len(kl), 6),
        "mean_kl": round(float(kl.mean()), 6),
        "max_kl": round(float(kl.max()), 6),
    }
