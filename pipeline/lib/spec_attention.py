"""Export a decoder layer's attention as one ``ai.specrt.SpecAttention`` node (runtime/kernels).

    hidden ─► q_proj, k_proj, v_proj ─► (q_norm, k_norm: Gemma 3) ─┐
    cos, sin (the model's rotary tables at position_ids) ───────────┼─► SpecAttention ─► o_proj
    past key/value of the layer, attention bias ────────────────────┘        │
                                                       present key/value (the window's rows) ◄┘

Each supported attention module (:data:`SUPPORTED`) runs :func:`_forward` instead of its own while
the model is exported: the same projections and norms, then one call of the torch operator
``specrt::spec_attention``, which :func:`spec_attention_onnx` translates to the ONNX node. Its
torch implementation is a plain reference (used when the patched model runs in torch), its ONNX
schema (:func:`register_schema`) lets onnxscript build the node, and onnxruntime runs the node
with specrt's kernel library. The op is exact by construction: docs/kernels.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import onnx
import onnxscript
import torch
from onnx.defs import OpSchema
from transformers import PreTrainedModel

from specrt.backend import kernels

# Attention modules whose forward is q/k/v projections (+ optional per-head q_norm/k_norm),
# rotate-half rotary from position_embeddings, softmax attention with the layer's mask, o_proj.
SUPPORTED = ("Qwen2Attention", "LlamaAttention", "Gemma3Attention")

_INPUTS = (
    ("query", "[1, s, num_heads * head_dim] before the rotary embedding"),
    ("key", "[1, s, kv_heads * head_dim] before the rotary embedding; absent: packed in query"),
    ("value", "[1, s, kv_heads * head_dim]; absent: packed in query"),
    ("past_key", "[1, past, kv_heads, head_dim] cached keys, after the rotary embedding"),
    ("past_value", "[1, past, kv_heads, head_dim] cached values"),
    ("cos", "[1, s, head_dim] rotary cosines at each row's position"),
    ("sin", "[1, s, head_dim] rotary sines"),
    ("bias", "[1, 1, s, past + s] additive; <= -1e30: not attended"),
)
_OUTPUTS = (
    ("output", "[1, s, num_heads * head_dim]"),
    ("present_key", "[1, s, kv_heads, head_dim] the window's keys, after the rotary embedding"),
    ("present_value", "[1, s, kv_heads, head_dim] the window's values"),
)
_OPSET = onnxscript.values.Opset(kernels.DOMAIN, kernels.OPSET)


def register_schema() -> None:
    """Make ``ai.specrt.SpecAttention`` known to onnx (and so to onnxscript); once per process."""
    if onnx.defs.has(kernels.ATTENTION_OP, kernels.DOMAIN):
        return
    param = OpSchema.FormalParameter
    onnx.defs.register_schema(OpSchema(
        kernels.ATTENTION_OP, kernels.DOMAIN, kernels.OPSET,
        doc="A decoder layer's attention: rotary, grouped-query heads, additive bias, window K/V out.",
        inputs=[param(name, "T", doc, param_option=OpSchema.FormalParameterOption.Optional
                      if name in ("key", "value") else OpSchema.FormalParameterOption.Single)
                for name, doc in _INPUTS],
        outputs=[param(name, "T", doc) for name, doc in _OUTPUTS],
        type_constraints=[("T", ["tensor(float)"], "float32")],
        attributes=[
            OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "query heads"),
            OpSchema.Attribute("kv_heads", OpSchema.AttrType.INT, "key/value heads"),
            OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "score = (q . k) * scale + bias"),
        ],
    ))
    onnx.defs.register_schema(OpSchema(
        kernels.SWIGLU_OP, kernels.DOMAIN, kernels.OPSET,
        doc="silu(x[..., :n]) * x[..., n:] for x [..., 2n], n a multiple of 16.",
        inputs=[param("x", "T", "[..., 2n] the packed [gate | up] rows")],
        outputs=[param("y", "T", "[..., n]")],
        type_constraints=[("T", ["tensor(float)"], "float32")],
    ))


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@torch.library.custom_op("specrt::spec_attention", mutates_args=())
def spec_attention(
    query: torch.Tensor,  # [1, s, heads * d]
    key: torch.Tensor,  # [1, s, kv * d]
    value: torch.Tensor,  # [1, s, kv * d]
    past_key: torch.Tensor,  # [1, past, kv, d]
    past_value: torch.Tensor,  # [1, past, kv, d]
    cos: torch.Tensor,  # [1, s, d]
    sin: torch.Tensor,  # [1, s, d]
    bias: torch.Tensor,  # [1, 1, s, past + s]
    num_heads: int,
    kv_heads: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference semantics of the kernel (torch's summation order, not the kernel's)."""
    s, d = query.shape[1], query.shape[2] // num_heads
    q = _rotate_half(query.reshape(s, num_heads, d), cos[0, :, None], sin[0, :, None])  # [s, heads, d]
    k_new = _rotate_half(key.reshape(s, kv_heads, d), cos[0, :, None], sin[0, :, None])  # [s, kv, d]
    v_new = value.reshape(s, kv_heads, d)
    keys = torch.cat([past_key[0], k_new]).repeat_interleave(num_heads // kv_heads, dim=1)  # [t, heads, d]
    values = torch.cat([past_value[0], v_new]).repeat_interleave(num_heads // kv_heads, dim=1)
    scores = torch.einsum("shd,thd->hst", q, keys) * scale + bias[0]  # [heads, s, t]
    scores = scores.masked_fill(bias[0] <= -1e30, float("-inf"))
    out = torch.einsum("hst,thd->shd", torch.softmax(scores, dim=-1), values)  # [s, heads, d]
    return out.reshape(1, s, num_heads * d), k_new[None].clone(), v_new[None].clone()


@spec_attention.register_fake
def _(query, key, value, past_key, past_value, cos, sin, bias, num_heads, kv_heads, scale):
    s, d = query.shape[1], query.shape[2] // num_heads
    return query.new_empty(query.shape), key.new_empty(1, s, kv_heads, d), value.new_empty(1, s, kv_heads, d)


def spec_attention_onnx(query, key, value, past_key, past_value, cos, sin, bias,
                        num_heads: int, kv_heads: int, scale: float):
    """The ONNX translation of ``specrt::spec_attention``: one SpecAttention node."""
    return _OPSET.SpecAttention(query, key, value, past_key, past_value, cos, sin, bias,
                                num_heads=num_heads, kv_heads=kv_heads, scale=scale)


def translation_table() -> dict[Any, Any]:
    """``custom_translation_table`` for torch.onnx.export."""
    register_schema()
    return {torch.ops.specrt.spec_attention.default: spec_attention_onnx}


def check_supported(model: PreTrainedModel) -> None:
    """ValueError naming what SpecAttention cannot compute for ``model``'s attention layers."""
    cfg = model.config
    for name, module in model.named_modules():
        if not name.endswith("self_attn"):
            continue
        kind = type(module).__name__
        if kind not in SUPPORTED:
            raise ValueError(f"{name}: {kind} is not one of SpecAttention's supported modules {SUPPORTED}; "
                             "export with export.attention: portable")
        heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, module.head_dim
        if d % kernels.HEAD_DIM_MULTIPLE or d > kernels.MAX_HEAD_DIM:
            raise ValueError(f"{name}: head_dim {d} is not a multiple of {kernels.HEAD_DIM_MULTIPLE} up to "
                             f"{kernels.MAX_HEAD_DIM}, which SpecAttention requires; export with export.attention: "
                             "portable")
        if heads % kv:
            raise ValueError(f"{name}: {heads} query heads do not group over {kv} key/value heads")
        if getattr(module, "attn_logit_softcapping", None) is not None:
            raise ValueError(f"{name}: attention logit softcapping is not supported by SpecAttention; "
                             "export with export.attention: portable")


def _forward(self, hidden_states, position_embeddings, attention_mask, cache=None, **kwargs):
    """The attention module's forward with SpecAttention; ``cache`` is the exporter's RowCache."""
    batch, s, _ = hidden_states.shape
    heads, kv = self.config.num_attention_heads, self.config.num_key_value_heads
    query = self.q_proj(hidden_states)  # [1, s, heads * d]
    key = self.k_proj(hidden_states)  # [1, s, kv * d]
    value = self.v_proj(hidden_states)
    if hasattr(self, "q_norm"):  # Gemma 3: RMSNorm per head before the rotary embedding
        query = self.q_norm(query.view(batch, s, heads, self.head_dim)).reshape(batch, s, heads * self.head_dim)
        key = self.k_norm(key.view(batch, s, kv, self.head_dim)).reshape(batch, s, kv * self.head_dim)
    cos, sin = position_embeddings  # [1, s, d]
    past_key, past_value = cache.past(self.layer_idx)
    out, new_key, new_value = torch.ops.specrt.spec_attention(
        query, key, value, past_key, past_value, cos, sin, attention_mask, heads, kv, float(self.scaling)
    )
    cache.put(self.layer_idx, new_key, new_value)
    return self.o_proj(out), None


@contextlib.contextmanager
def spec_attention_of(model: PreTrainedModel) -> Iterator[PreTrainedModel]:
    """``model`` with every attention layer running SpecAttention inside the block, its own after."""
    check_supported(model)
    patched = [module for name, module in model.named_modules() if name.endswith("self_attn")]
    for module in patched:
        module.forward = _forward.__get__(module)
    try:
        yield model
    finally:
        for module in patched:
            del module.forward  # back to the class's forward
