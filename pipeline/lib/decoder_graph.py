"""A Hugging Face causal LM wrapped to the specrt decoder contract, and its ONNX export.

    input_ids, position_ids ──► HF decoder (past from the runtime's cache, custom 4D masks) ──► logits
    attention_bias ──┬──────────────────────────► full-attention layers          └──► hidden_states
                     └─ sliding_bias(window) ──► sliding-window layers    present K/V (new slots only)

The contract (tensor names, shapes, layouts) lives in ``specrt.backend.contract``; this module only
implements it with torch. Sliding-window layers get the bias with every key further than the
window masked too, computed in the graph from ``position_ids`` and the cache invariant "slot j
holds position j", so one bias input stays exact on prompts longer than the window.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from specrt.backend import contract
from specrt.backend.manifest import ModelDims

from .fuse_graph import fuse_for_ort
from .fuse_kernels import fuse_for_kernels
from .grouped_attention import grouped_attention_of
from .logits_rows import select_logits_rows
from .spec_attention import spec_attention_of, translation_table

log = logging.getLogger(__name__)

SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")
ATTENTION_KINDS = ("specrt", "portable")


def model_dims(model: PreTrainedModel, max_context: int) -> ModelDims:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelDims(
        num_layers=cfg.num_hidden_layers,
        kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        hidden=cfg.hidden_size,
        vocab=cfg.vocab_size,
        max_context=max_context,
    )


def sliding_bias(attention_bias: torch.Tensor, position_ids: torch.Tensor, window: int) -> torch.Tensor:
    """attention_bias [1, 1, s, past + s] with keys ``window`` or more positions behind the query masked.

    HF's rule (masking_utils.sliding_window_overlay): key k is visible from query q iff k > q - window.
    """
    s = position_ids.shape[1]
    past = attention_bias.shape[3] - s
    key_pos = torch.cat([torch.arange(past, device=position_ids.device), position_ids[0]])  # [past + s]
    too_far = (position_ids[0][:, None] - key_pos[None, :]) >= window  # [s, past + s]
    return torch.where(too_far[None, None], torch.full_like(attention_bias, contract.MASK_VALUE), attention_bias)


class DecoderForExport(nn.Module):
    """``forward(input_ids, position_ids, attention_bias, *past)`` per ``specrt.backend.contract``.

    past: num_layers pairs (key, value), each [1, past, kv_heads, head_dim].
    Returns (logits [1, s, vocab], key_0, value_0, ..., hidden_states [1, s, hidden]); the K/V
    returned cover the s new positions only.
    """

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model
        cfg = model.config
        self.layer_types = getattr(cfg, "layer_types", None)
        unknown = set(self.layer_types or ()) - set(SUPPORTED_LAYER_TYPES)
        if unknown:
            raise ValueError(f"{cfg.model_type}: layer types {sorted(unknown)} are not supported by the exporter")
        self.window = getattr(cfg, "sliding_window", None)
        if "sliding_attention" in (self.layer_types or ()) and not self.window:
            raise ValueError(f"{cfg.model_type}: sliding_attention layers but no sliding_window in the config")
        self.softcap = getattr(cfg, "final_logit_softcapping", None)

    def _masks(self, attention_bias: torch.Tensor, position_ids: torch.Tensor):
        if self.layer_types is None:  # architectures without per-layer types (llama): one mask
            return attention_bias
        masks = {"full_attention": attention_bias}
        if "sliding_attention" in self.layer_types:
            masks["sliding_attention"] = sliding_bias(attention_bias, position_ids, self.window)
        return masks

    def forward(self, input_ids, position_ids, attention_bias, *past):
        return self._decode({"input_ids": input_ids}, position_ids, attention_bias, past)

    def _decode(self, tokens: dict[str, torch.Tensor], position_ids, attention_bias, past):
        """The contract's outputs for the new positions given as ``tokens`` (input_ids or inputs_embeds)."""
        num_layers = len(past) // 2
        cache = RowCache([(past[2 * i], past[2 * i + 1]) for i in range(num_layers)])
        out = self.model.model(
            **tokens,
            position_ids=position_ids,
            attention_mask=self._masks(attention_bias, position_ids),
            cache=cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state
        logits = self.model.lm_head(hidden)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return (logits, *cache.present(), hidden)


def merge_image_rows(
    embeds: torch.Tensor, input_ids: torch.Tensor, image_embeds: torch.Tensor, image_token_id: int
) -> torch.Tensor:
    """embeds [1, s, hidden] with the k-th ``image_token_id`` of input_ids [1, s] (k = 1, 2, ...)
    replaced by image_embeds[k - 1] ([n, hidden]) while k <= n (specrt.backend.contract).

    Row 0 of the gathered table is a zero row that no taken position reads, so that n = 0 gathers
    nothing out of range."""
    is_image = input_ids[0] == image_token_id  # [s]
    k = torch.cumsum(is_image.to(torch.int64), 0)  # [s] rank of each image token in the pass, from 1
    take = is_image & (k <= image_embeds.shape[0])  # [s]
    table = torch.cat([image_embeds.new_zeros(1, image_embeds.shape[1]), image_embeds])  # [n + 1, hidden]
    picked = table[torch.where(take, k, torch.zeros_like(k))]  # [s, hidden]
    return torch.where(take[None, :, None], picked[None], embeds)


class VisionDecoderForExport(DecoderForExport):
    """``forward(input_ids, position_ids, attention_bias, image_embeds, *past)``: a vision-language
    model's text decoder, whose image tokens embed as the rows of ``image_embeds`` ([n, hidden]; the
    vision encoder's output, pipeline.lib.vision_graph) by :func:`merge_image_rows`. ``model``: the
    text decoder as a causal LM (``model.model`` its base model, with ``embed_tokens``)."""

    def __init__(self, model: PreTrainedModel, image_token_id: int):
        super().__init__(model)
        self.image_token_id = image_token_id

    def forward(self, input_ids, position_ids, attention_bias, image_embeds, *past):
        embeds = self.model.model.embed_tokens(input_ids)  # [1, s, hidden], the model's own (scaled) lookup
        merged = merge_image_rows(embeds, input_ids, image_embeds, self.image_token_id)
        return self._decode({"inputs_embeds": merged}, position_ids, attention_bias, past)


class RowCache:
    """The key/value cache as HF's attention layers use it (``update`` only: the export always passes
    ``position_ids``, so the models never ask the cache for its length), kept in the runtime's
    layout: the cached rows [1, past, kv, d] get the new rows appended along the position axis and are
    never transposed. ``update`` hands the attention a heads-first view [1, kv, t, d] of the
    concatenation, as HF's caches do; ``grouped_attention`` reads it back as rows [t, kv * d], and
    the exporter's optimizer cancels the two transposes (tests/test_fuse_graph.py checks the graph),
    so no pass copies the cache into another layout. SpecAttention layers (pipeline.lib.spec_attention)
    read ``past`` and ``put`` their new rows instead: the kernel reads both where they lie.
    """

    def __init__(self, past: list[tuple[torch.Tensor, torch.Tensor]]):  # per layer (key, value) [1, past, kv, d]
        self._past = past
        self._new: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (key, value) [1, s, kv, d]

    def past(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached key and value rows of a layer, [1, past, kv, d] each."""
        return self._past[layer_idx]

    def put(self, layer_idx: int, key_rows: torch.Tensor, value_rows: torch.Tensor) -> None:
        """Record a layer's new key and value rows, [1, s, kv, d] each (once per layer and pass)."""
        if layer_idx in self._new:
            raise ValueError(f"layer {layer_idx} added to the cache twice in one pass")
        self._new[layer_idx] = (key_rows, value_rows)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key_states, value_states [1, kv, s, d] -> every key and value [1, kv, past + s, d]."""
        new = (key_states.transpose(1, 2), value_states.transpose(1, 2))  # [1, s, kv, d]
        self.put(layer_idx, *new)
        past_key, past_value = self._past[layer_idx]
        return (torch.cat([past_key, new[0]], dim=1).transpose(1, 2),
                torch.cat([past_value, new[1]], dim=1).transpose(1, 2))

    def present(self) -> list[torch.Tensor]:
        """key_0, value_0, key_1, ... [1, s, kv, d]: the new positions as the layers computed them."""
        if sorted(self._new) != list(range(len(self._past))):
            raise ValueError(f"expected every layer to add to the cache once, got layers {sorted(self._new)}")
        return [state for i in range(len(self._past)) for state in self._new[i]]


def example_inputs(dims: ModelDims, s: int = 3, past: int = 5, images: int | None = None) -> tuple[torch.Tensor, ...]:
    """Inputs of the contract's shapes (a chain of s tokens after past cached ones; ``images``: that
    many rows of image_embeds, for a vision-language decoder)."""
    ids = torch.randint(0, dims.vocab, (1, s))
    pos = torch.arange(past, past + s)[None]
    bias = torch.zeros(1, 1, s, past + s)
    bias[0, 0, :, past:] = torch.triu(torch.full((s, s), contract.MASK_VALUE), diagonal=1)
    kv = [torch.randn(1, past, dims.kv_heads, dims.head_dim) for _ in range(2 * dims.num_layers)]
    rows = () if images is None else (torch.randn(images, dims.hidden),)
    return (ids, pos, bias, *rows, *kv)


def export_onnx(
    model: PreTrainedModel, dims: ModelDims, path: Path, opset: int, attention: str = "specrt",
    image_token_id: int | None = None,
) -> None:
    """Export ``model`` to ``path`` (+ ``path.data``, external weights) per ``specrt.backend.contract``.

    attention: "specrt" (one SpecAttention node per layer, run by specrt's kernel library on the CPU;
    pipeline.lib.spec_attention) or "portable" (standard and com.microsoft operators only, for the CUDA
    provider and any onnxruntime without the library; pipeline.lib.grouped_attention).
    image_token_id: the text decoder of a vision-language model, with the contract's image_embeds input
    (:class:`VisionDecoderForExport`)."""
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
    vision = image_token_id is not None
    inputs, outputs = contract.io_table(dims.num_layers, dims.kv_heads, dims.head_dim, dims.hidden, dims.vocab,
                                        image_embeds=vision)
    s, past = torch.export.Dim("s", min=1, max=dims.max_context), torch.export.Dim("past", min=0, max=dims.max_context)
    rows = ({0: torch.export.Dim("n", min=0, max=dims.max_context)},) if vision else ()
    # the varargs `*past` form one tuple in the signature, hence the nested tuple
    dynamic = ({1: s}, {1: s}, {2: s, 3: torch.export.Dim.AUTO}, *rows,
               tuple({1: past} for _ in range(2 * dims.num_layers)))
    path.parent.mkdir(parents=True, exist_ok=True)
    patch = spec_attention_of if attention == "specrt" else grouped_attention_of
    with torch.no_grad(), patch(model):
        wrapper = (VisionDecoderForExport(model, image_token_id) if vision else DecoderForExport(model)).eval()
        program = torch.onnx.export(
            wrapper,
            example_inputs(dims, images=3 if vision else None),
            input_names=[t.name for t in inputs],
            output_names=[t.name for t in outputs],
            dynamic_shapes=dynamic,
            opset_version=opset,
            dynamo=True,
            optimize=True,
            custom_translation_table=translation_table() if attention == "specrt" else None,
        )
    fuse_for_ort(program.model, contract.POSITION_IDS, dims.max_context)
    select_logits_rows(program.model)
    if attention == "specrt":
        fuse_for_kernels(program.model)
    program.model.metadata_props[contract.ATTENTION_METADATA] = attention
    program.save(str(path), external_data=True)
    graph = program.model.graph
    log.info("exported %s (%d inputs, %d outputs)", path, len(graph.inputs), len(graph.outputs))
