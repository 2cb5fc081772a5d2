"""The user-facing model: an artifact folder loaded for generation.

    model = specrt.load("artifacts/qwen2.5-coder-0.5b-instruct/fp32")
    result = model.generate("def add(a, b):", max_new_tokens=64, method="pld")
    for piece in model.stream("def add(a, b):", method="pld"):
        print(piece, end="")
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from .backend import OrtDecoder
from .cost import VerifyCostModel
from .datastore import STATE_KEY as DATASTORE_STATE_KEY
from .datastore import datastore_for
from .drafters import Drafter, DrafterEnv, make_drafter
from .engine import LoopConfig, SpeculativeLoop
from .errors import ArtifactError, InvalidRequestError
from .manifest import Manifest, read_manifest
from .sampling import SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationResult:
    text: str  # the completion, special tokens removed
    token_ids: tuple[int, ...]  # the completion's tokens (an EOS that ended it included)
    prompt_token_ids: tuple[int, ...]
    finish_reason: str  # "eos" or "length"
    method: str
    tree: bool
    stats: dict[str, Any]  # see specrt.engine.LoopStats.as_dict


class TextStream:
    """Incremental detokenization: the text of newly emitted tokens, holding back a partial character."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0  # characters already returned

    def push(self, ids: np.ndarray) -> str:
        self.ids.extend(int(t) for t in ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next tokens
            return ""
        piece, self.sent = text[self.sent :], len(text)
        return piece


class SpecModel:
    """A loaded artifact: tokenizer + ONNX decoder + KV cache. One request at a time."""

    def __init__(
        self, folder: Path, manifest: Manifest, *, provider: str, threads: int | None, datastore: Path | None = None
    ):
        self.folder = folder
        self.manifest = manifest
        self.datastore = datastore
        self.drafter_state: dict[str, Any] = {}  # per-method state that outlives a request
        self.verify_cost = VerifyCostModel()  # measured verify-pass time by window size
        try:
            self.tokenizer = Tokenizer.from_file(str(folder / manifest.tokenizer))
        except Exception as e:  # the tokenizers library raises a bare Exception on bad JSON
            raise ArtifactError(f"{folder / manifest.tokenizer}: not a valid tokenizer.json ({e})") from None
        self.decoder = OrtDecoder(folder / manifest.decoder, manifest.dims, provider=provider, threads=threads)
        if datastore is not None:  # refuse a datastore of another tokenizer now, not at the first request
            datastore_for(self.drafter_env(tree=False), "load")
        if not manifest.spec_safe:
            log.warning("%s/%s is flagged spec_safe=false: speculative output may differ from plain decoding",
                        manifest.name, manifest.variant)

    def encode(self, prompt: str, *, chat: bool = False) -> np.ndarray:
        if not isinstance(prompt, str):
            raise InvalidRequestError(f"prompt must be a str, got {type(prompt).__name__}")
        if chat:
            if self.manifest.chat is None:
                raise InvalidRequestError(f"{self.manifest.name} has no chat template; call without chat=True")
            prompt = self.manifest.chat.prefix + prompt + self.manifest.chat.suffix
        return np.array(self.tokenizer.encode(prompt).ids, np.int64)

    def stream_ids(
        self,
        prompt_ids: np.ndarray | list[int],
        *,
        max_new_tokens: int = 128,
        method: str | Drafter = "pld",
        tree: bool = False,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        draft_budget: int = 8,
        prefill_chunk: int = 256,
    ) -> tuple[SpeculativeLoop, Iterator[np.ndarray]]:
        """The loop for one request on token ids, and the iterator of its emitted token chunks.

        ``method`` is a registered name (``specrt.METHODS``) or a ready Drafter instance."""
        ids = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
        vocab = self.manifest.dims.vocab
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab):
            raise InvalidRequestError(f"prompt token ids must lie in [0, {vocab}), got {ids.min()}..{ids.max()}")
        config = LoopConfig(
            max_new_tokens=max_new_tokens,
            sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p),
            draft_budget=draft_budget,
            prefill_chunk=prefill_chunk,
            seed=seed,
        )
        drafter = make_drafter(method, self.drafter_env(tree)) if isinstance(method, str) else method
        loop = SpeculativeLoop(self.decoder, drafter, self.manifest.eos_token_ids, config, self.verify_cost)
        return loop, loop.run(ids)

    def forget_history(self) -> None:
        """Drop what drafters learned across requests (suffix histories, adjacency tables, ...);
        a loaded datastore stays. Benchmarks call it between methods so none profits from another."""
        for key in [k for k in self.drafter_state if k != DATASTORE_STATE_KEY]:
            del self.drafter_state[key]

    def drafter_env(self, tree: bool) -> DrafterEnv:
        return DrafterEnv(
            vocab=self.manifest.dims.vocab,
            tree=tree,
            state=self.drafter_state,
            datastore=self.datastore,
            verify_cost=self.verify_cost.estimate,
            tokenizer_sha256=self.manifest.files[self.manifest.tokenizer].sha256,
        )

    def generate_ids(self, prompt_ids: np.ndarray | list[int], **options: Any) -> tuple[np.ndarray, SpeculativeLoop]:
        """All emitted token ids ([k] int64) for ``prompt_ids``, and the finished loop (stats)."""
        loop, chunks = self.stream_ids(prompt_ids, **options)
        out = [c for c in chunks]
        return (np.concatenate(out) if out else np.zeros(0, np.int64)), loop

    def generate(self, prompt: str, *, chat: bool = False, **options: Any) -> GenerationResult:
        """Complete ``prompt``; options as :meth:`stream_ids` (method, tree, temperature, ...)."""
        prompt_ids = self.encode(prompt, chat=chat)
        ids, loop = self.generate_ids(prompt_ids, **options)
        return GenerationResult(
            text=self.tokenizer.decode(ids.tolist(), skip_special_tokens=True),
            token_ids=tuple(ids.tolist()),
            prompt_token_ids=tuple(prompt_ids.tolist()),
            finish_reason=loop.finish_reason or "length",
            method=str(options.get("method", "pld")),
            tree=bool(options.get("tree", False)),
            stats=loop.stats.as_dict(),
        )

    def stream(self, prompt: str, *, chat: bool = False, **options: Any) -> Iterator[str]:
        """Yield the completion's text as the verifier accepts it."""
        _, chunks = self.stream_ids(self.encode(prompt, chat=chat), **options)
        text = TextStream(self.tokenizer)
        for chunk in chunks:
            piece = text.push(chunk)
            if piece:
                yield piece


def load(
    folder: str | Path,
    *,
    provider: str = "cpu",
    threads: int | None = None,
    check_hashes: bool = True,
    datastore: str | Path | None = None,
) -> SpecModel:
    """Load an artifact folder built by the pipeline (``artifacts/<model>/<variant>``).

    Refuses a folder whose files differ from its manifest (sizes always; sha256 unless
    ``check_hashes=False``).
    """
    folder = Path(folder)
    manifest = read_manifest(folder, check_hashes=check_hashes)
    store = Path(datastore) if datastore is not None else None
    return SpecModel(folder, manifest, provider=provider, threads=threads, datastore=store)
