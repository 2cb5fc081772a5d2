"""The transformers backend: a Hugging Face causal LM folder, no export, through the same engine and
drafters (``specrt.load(folder, backend="hf")``; the ``hf`` extra installs torch and transformers).

It keeps the onnxruntime backend's contract on a torch model. One forward pass takes the window's
token ids, explicit position ids and the additive attention bias [s, past + s] as a 4D mask
[1, 1, s, past + s], so a draft tree is verified in one pass (each slot sees the cache and its
ancestors); the KV cache is transformers' ``DynamicCache``, and :meth:`HfDecoder.commit` keeps the
accepted path's rows, as :class:`specrt.backend.session.OrtDecoder` does. Only this module imports
torch; ``import specrt`` never loads it.

What differs from an exported artifact:
- no manifest: :func:`read_hf_folder` builds one from ``config.json``, ``generation_config.json``,
  ``tokenizer.json`` and the chat template (``chat_template.jinja``, or ``tokenizer_config.json``'s
  ``chat_template``), with the sizes and hashes of those files and the
  weights: ``*.safetensors``, or ``gguf.json``, the pointer to a GGUF file that the pipeline's
  weights stage writes instead of them (its weights load dequantized to float32 through
  transformers' ``gguf_file=``, which needs the ``gguf`` and ``accelerate`` packages of the ``hf``
  extra; saving such a model with ``save_pretrained`` once makes later loads faster);
- no gate verdict: before the first speculative request the runtime runs its self-check
  (specrt.backend.verdict), since torch's float32 products may round a row differently in a window;
- sliding-window layers (Gemma 3, named in the config's ``layer_types``) get a mask of their own,
  the window's bias with every key a window behind its query masked; a sliding-window model
  without ``layer_types`` holds at most one window of context (its forward would give every layer
  the one mask);
- no prefix cache and no device cache (those are the onnxruntime backend's).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from specrt.backend.contract import MASK_VALUE
from specrt.backend.manifest import ChatTemplateFile, Manifest, ModelDims
from specrt.backend.session import ForwardOutput
from specrt.errors import ArtifactError, InvalidRequestError, MissingDependencyError
from specrt.files import file_entry

PROVIDER = "torch"  # what a verdict's basis and error messages call this backend
DEVICES = ("cpu", "cuda")
TOKENIZER_FILE = "tokenizer.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GGUF_POINTER = "gguf.json"  # in place of weights: the GGUF file that holds them (the pipeline's weights stage)
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
ATTENTION = ("sdpa", "eager")  # implementations that take a 4D additive mask as given


def _json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ArtifactError(f"{path}: expected a JSON object")
    return raw


def _eos_ids(folder: Path, config: Any) -> tuple[int, ...]:
    eos = _json(folder / "generation_config.json").get("eos_token_id", getattr(config, "eos_token_id", None))
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    return tuple(int(i) for i in ids)


def _sliding_window(config: Any) -> int | None:
    """The window of a model whose layers include sliding-window attention layers named in
    ``layer_types`` (Gemma 3): their mask is passed apart (HfDecoder.forward). None: no such layers."""
    types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    return int(window) if window and any(t == "sliding_attention" for t in types) else None


def _max_context(config: Any) -> int:
    """Positions a sequence may hold: the model's limit; one window for a sliding-window model whose
    layers are not named in ``layer_types`` (its forward would apply a given mask to every layer)."""
    limit = int(getattr(config, "max_position_embeddings", 0) or 0)
    if limit <= 0:
        raise ArtifactError(f"{config.model_type}: config.json has no max_position_embeddings")
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and _sliding_window(config) is None \
            and getattr(config, "layer_types", None) is None:
        limit = min(limit, int(window))
    return limit


def read_hf_folder(folder: Path) -> tuple[Manifest, Any]:
    """The manifest of a Hugging Face causal-LM folder (``variant`` "hf") and its config; ArtifactError
    naming the file when it is not one specrt can run."""
    if not (folder / "config.json").is_file():
        raise ArtifactError(f"{folder}: no config.json: not a Hugging Face model folder")
    if not (folder / TOKENIZER_FILE).is_file():
        raise ArtifactError(f"{folder}: no {TOKENIZER_FILE} (the runtime encodes with the fast tokenizer's file)")
    try:
        config = AutoConfig.from_pretrained(folder)
    except (ValueError, OSError) as e:
        raise ArtifactError(f"{folder}/config.json: transformers cannot read it ({e})") from None
    if not any(a.endswith("ForCausalLM") for a in getattr(config, "architectures", None) or []):
        raise ArtifactError(f"{folder}/config.json: architectures {getattr(config, 'architectures', None)} "
                            "has no *ForCausalLM: not a causal language model")
    weights = [p.name for p in sorted(folder.glob("*.safetensors"))]
    if not weights:
        if not (folder / GGUF_POINTER).is_file():
            raise ArtifactError(f"{folder}: no weights (*.safetensors, or {GGUF_POINTER} naming a GGUF file)")
        _gguf(folder)  # the file it names exists, with the recorded size
        weights = [GGUF_POINTER]  # (it records the GGUF's sha256)
    text = getattr(config, "text_config", None) or config
    heads = int(text.num_attention_heads)
    dims = ModelDims(
        num_layers=int(text.num_hidden_layers),
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // heads),
        hidden=int(text.hidden_size),
        vocab=int(text.vocab_size),
        max_context=_max_context(text),
    )
    # the chat template: chat_template.jinja (save_pretrained's), else tokenizer_config.json's
    # "chat_template" string (older folders, and the pipeline's weights stage)
    tokens = _json(folder / TOKENIZER_CONFIG_FILE)
    special = {k: v for k, v in tokens.items() if k.endswith("_token") and isinstance(v, str)}
    template = ChatTemplateFile(file=CHAT_TEMPLATE_FILE, special_tokens=special) \
        if (folder / CHAT_TEMPLATE_FILE).is_file() else \
        ChatTemplateFile(file=TOKENIZER_CONFIG_FILE, special_tokens=special) \
        if isinstance(tokens.get("chat_template"), str) else None
    names = ["config.json", TOKENIZER_FILE, *([template.file] if template else []), *weights]
    manifest = Manifest(
        name=folder.name, variant="hf", arch=str(text.model_type), dims=dims, decoder="", tokenizer=TOKENIZER_FILE,
        eos_token_ids=_eos_ids(folder, text), files={n: file_entry(folder / n) for n in names}, io={},
        producers={"transformers": _version("transformers"), "torch": torch.__version__}, chat_template=template,
        attention="torch",
    )
    return manifest, config


def _gguf(folder: Path) -> Path:
    """The GGUF file that ``folder/gguf.json`` names ({"file": path relative to the folder, "sha256",
    "bytes"}, as pipeline/lib/checkpoint.py writes it), present with the recorded size; ArtifactError
    naming the pointer otherwise."""
    pointer = folder / GGUF_POINTER
    raw = _json(pointer)
    if not isinstance(raw.get("file"), str) or not isinstance(raw.get("bytes"), int):
        raise ArtifactError(f"{pointer}: expected {{\"file\": str, \"sha256\": str, \"bytes\": int}}, got {raw!r}")
    path = (folder / raw["file"]).resolve()
    if not path.is_file():
        raise ArtifactError(f"{pointer} names {raw['file']} ({path}), which does not exist")
    if path.stat().st_size != raw["bytes"]:
        raise ArtifactError(f"{path} has {path.stat().st_size} bytes, {pointer} records {raw['bytes']}")
    return path


def _version(package: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(package)


class HfSession:
    """A loaded causal LM, where the onnxruntime backend has its DecoderSession: no sequence state;
    every request's :class:`HfDecoder` runs on it with a cache of its own."""

    provider = PROVIDER
    key_block = None  # torch's attention takes each row's visible keys wherever they sit: no cut

    def __init__(self, folder: Path, dims: ModelDims, *, device: str = "cpu"):
        if device not in DEVICES:
            raise InvalidRequestError(f"device must be one of {DEVICES} for the hf backend, got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise InvalidRequestError("device='cuda': torch sees no CUDA device (a CPU build of torch?)")
        self.dims = dims
        self.device = torch.device(device)
        gguf = None if any(folder.glob("*.safetensors")) else _gguf(folder)

        def load(attention: str) -> Any:
            where = {"pretrained_model_name_or_path": folder} if gguf is None else \
                {"pretrained_model_name_or_path": gguf.parent, "gguf_file": gguf.name}  # dequantized to float32
            try:
                return AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32, attn_implementation=attention)
            except ModuleNotFoundError as e:  # transformers reads a GGUF with gguf, and places it with accelerate
                if gguf is None:
                    raise
                raise MissingDependencyError(f"{gguf}: loading GGUF weights needs the {e.name!r} package: "
                                             'pip install "specrt[hf]" (its hf extra)') from None

        try:
            model = load("sdpa")
        except (ValueError, OSError) as e:  # an architecture without SDPA: the eager attention takes the mask too
            try:
                model = load("eager")
            except (ValueError, OSError):
                raise ArtifactError(f"{folder}: transformers cannot load it as a causal LM ({e})") from None
        self.model = model.to(self.device).eval()
        text = getattr(model.config, "text_config", None) or model.config
        self.softcap = getattr(text, "final_logit_softcapping", None)
        self.window = _sliding_window(text)  # sliding layers get a mask of their own
        self.lock = threading.Lock()  # torch modules run from several threads, but a pass is not interleaved

    def decoder(self) -> HfDecoder:
        """A new, empty cache on this model."""
        return HfDecoder(self)


class HfDecoder:
    """The KV cache of one sequence on an :class:`HfSession`, with OrtDecoder's interface: ``forward``
    runs a window whose rows stay pending until ``commit`` keeps some of them."""

    def __init__(self, graph: HfSession):
        self.graph = graph
        self.dims = graph.dims
        self.cache = DynamicCache()
        self.past = 0
        self._capacity = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def reset(self, capacity: int) -> None:
        """Start a new sequence of at most ``capacity`` positions."""
        if capacity > self.dims.max_context:
            raise InvalidRequestError(f"a sequence of {capacity} positions: this model holds {self.dims.max_context}")
        self.cache = DynamicCache()
        self.past = 0
        self._capacity = max(capacity, self._capacity)

    def forward(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        attention_bias: np.ndarray,
        *,
        logits_rows: slice | None = None,
    ) -> ForwardOutput:
        """input_ids, position_ids: [s] int64; attention_bias: [s, past + s] float32 (0 = may attend)."""
        s = len(input_ids)
        if self.past + s > self._capacity:
            raise InvalidRequestError(f"window of {s} after {self.past} positions exceeds the cache's {self._capacity}")
        if attention_bias.shape != (s, self.past + s):
            raise ValueError(f"attention_bias {attention_bias.shape}, expected ({s}, {self.past + s})")
        self._keep(self.past)  # drop the rows of a window that was not committed
        device = self.graph.device
        mask: Any = torch.from_numpy(np.ascontiguousarray(attention_bias, np.float32))[None, None].to(device)
        if self.graph.window is not None:  # sliding layers: the same mask, and no key a window behind its query
            keys = np.concatenate([np.arange(self.past), position_ids])  # cached slot i holds position i
            behind = (np.asarray(position_ids)[:, None] - keys[None, :]) >= self.graph.window  # [s, past + s]
            sliding = np.where(behind, np.float32(MASK_VALUE), attention_bias).astype(np.float32)
            mask = {"full_attention": mask, "sliding_attention": torch.from_numpy(sliding)[None, None].to(device)}
        with self.graph.lock, torch.inference_mode():
            out = self.graph.model.model(
                input_ids=torch.from_numpy(np.asarray(input_ids, np.int64))[None].to(device),
                position_ids=torch.from_numpy(np.asarray(position_ids, np.int64))[None].to(device),
                attention_mask=mask,
                cache=self.cache,
                use_cache=True,
            )
            hidden = out.last_hidden_state[0]  # [s, hidden], after the final norm
            rows = hidden if logits_rows is None else hidden[logits_rows]
            logits = self.graph.model.lm_head(rows)
            if self.graph.softcap:  # Gemma's final logit soft-capping, as its own forward applies it
                logits = torch.tanh(logits / self.graph.softcap) * self.graph.softcap
        return ForwardOutput(logits.float().cpu().numpy(), hidden.float().cpu().numpy())

    def commit(self, keep: np.ndarray) -> None:
        """Keep window slots ``keep`` (ascending, [k] int) as the next ``k`` cached positions."""
        keep = np.asarray(keep, np.int64)
        pending = self.cache.get_seq_length() - self.past
        if len(keep) and (keep[0] < 0 or np.any(np.diff(keep) <= 0) or keep[-1] >= pending):
            raise ValueError(f"commit: slots must be ascending and inside the last window, got {keep.tolist()}")
        index = torch.from_numpy(self.past + keep).to(self.graph.device)
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                rows = getattr(layer, name)  # [1, kv_heads, past + s, head_dim]
                setattr(layer, name, torch.cat([rows[:, :, : self.past], rows.index_select(2, index)], dim=2))
        self.past += len(keep)

    def truncate(self, past: int) -> None:
        """Roll the cache back to its first ``past`` positions."""
        if not 0 <= past <= self.past:
            raise ValueError(f"truncate: past must be in [0, {self.past}], got {past}")
        self._keep(past)
        self.past = past

    def _keep(self, n: int) -> None:
        """Cut every layer's rows to the first ``n`` (transformers' own crop also trims sliding layers)."""
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.shape[2] > n:
                layer.keys, layer.values = layer.keys[:, :, :n], layer.values[:, :, :n]
