"""The user-facing model: an artifact folder loaded for generation.

    model = specrt.load("artifacts/qwen2.5-coder-0.5b-instruct/fp32")
    result = model.generate("def add(a, b):", max_new_tokens=64, method="pld")
    for piece in model.stream("def add(a, b):", method="pld"):
        print(piece, end="")

Concurrency: a loaded model serves any number of requests at once (threads, or several streams
interleaved in one thread). The ONNX session is shared (onnxruntime runs it from several threads);
each request gets its own KV cache (an :class:`~specrt.backend.session.OrtDecoder`), so outputs never
depend on what else runs. What outlives a request is guarded:

* ``drafter_state`` (suffix trees, adjacency tables, acceptance statistics: what drafters learn
  across requests, under keys of their own method) is lent per method to one request at a time.
  A request that starts while another request of the same method holds it drafts with a fresh
  private state instead (sharing only the loaded datastores, which are read-only), and its
  history is not kept. That changes how much gets drafted, never the text.
* ``verify_cost`` (measured verify-pass times) is shared by all requests, under a lock.
* ``prefix_cache`` (``prefix_cache_mb`` > 0: prompts' KV rows, :mod:`specrt.engine.prefix_cache`) is
  shared by all requests, under its own lock; a hit leaves the output bit for bit as without it.

A request gives back its cache and its method's state when its iterator is exhausted, closed, or
garbage-collected (an abandoned ``stream`` never blocks later requests). A Drafter instance
passed as ``method`` is the caller's and borrows nothing: one built from :meth:`drafter_env`
works on the shared state, so run it when no request of its method is in flight.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers < 0.21: TextStream decodes a window itself
    DecodeStream = None

from specrt.backend.blas import BlasGuard
from specrt.backend.draft_model import OrtDraftModel
from specrt.backend.manifest import Manifest, read_manifest
from specrt.backend.prefill import PromptImages
from specrt.backend.session import DecoderSession, OrtDecoder
from specrt.backend.verdict import SELF_CHECK_PROMPTS, Verdict, covers
from specrt.cancel import CancelToken
from specrt.chat import ChatRenderer, Message, messages
from specrt.cost import AtContext, VerifyCostModel
from specrt.drafters import (
    DEFAULT_METHOD,
    METHODS,
    NEEDS_DRAFT,
    SELF_BACKING_OFF,
    Drafter,
    DrafterEnv,
    Method,
    make_drafter,
)
from specrt.drafters.base import datastore_for
from specrt.drafters.baseline import NoDraft
from specrt.drafters.draft_model import check_vocab_compatible
from specrt.drafters.indexes.datastore import STATE_KEY as DATASTORE_STATE_KEY
from specrt.engine.loop import LoopConfig, SpeculativeLoop
from specrt.engine.prefix_cache import PrefixCache
from specrt.engine.spec_gate import self_check
from specrt.errors import ArtifactError, InvalidRequestError, MissingDependencyError, check_int, check_number
from specrt.logprobs import TokenLogprob
from specrt.sampling import SamplingParams
from specrt.vision.inputs import ImageInputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationResult:
    text: str  # the completion, special tokens removed
    token_ids: tuple[int, ...]  # the completion's tokens (an EOS that ended it included)
    prompt_token_ids: tuple[int, ...]
    # "eos", "length" (max_new_tokens reached), "context" (the model's context is full), "cancelled" or
    # "timeout" (specrt.cancel)
    finish_reason: str
    method: str
    tree: bool
    stats: dict[str, Any]  # see specrt.engine.loop.LoopStats.as_dict
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token of token_ids, when asked (logprobs=k)


class TextStream:
    """Incremental detokenization in linear time: each :meth:`push` returns the text of the newly
    emitted tokens (a character split across tokens is held back until it is complete), and
    :meth:`finish` the rest, so that all pieces joined equal ``tokenizer.decode(ids,
    skip_special_tokens=True)`` of the whole output.

    Uses tokenizers' ``DecodeStream`` (tokenizers >= 0.21); on older versions, the same windowed
    decoding in Python: only the tokens since the last complete piece, and a few before them for
    context, are decoded at each push."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0  # characters already returned
        self._stream = DecodeStream(skip_special_tokens=True) if DecodeStream is not None else None
        self._prefix = 0  # windowed decoding: ids[_prefix:_read] is the context of the next piece
        self._read = 0

    def push(self, ids: np.ndarray | list[int]) -> str:
        pieces = []
        for t in ids:  # token by token: a piece ends at each complete character
            self.ids.append(int(t))
            if self._stream is not None:
                pieces.append(self._stream.step(self.tokenizer, int(t)) or "")
            else:
                pieces.append(self._window())
        piece = "".join(pieces)
        self.sent += len(piece)
        return piece

    def _window(self) -> str:
        decode = self.tokenizer.decode
        before = decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        text = decode(self.ids[self._prefix :], skip_special_tokens=True)
        if len(text) <= len(before) or text.endswith("\ufffd"):  # nothing new, or an incomplete character
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(before) :]

    def finish(self) -> str:
        """At the end of the output: the text not yet returned (a held-back partial character
        decodes as U+FFFD, as in ``tokenizer.decode`` of the whole output). Decodes the whole
        output once."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        piece, self.sent = text[self.sent :], len(text)
        return piece


class SharedCostModel(VerifyCostModel):
    """A :class:`VerifyCostModel` that concurrent requests record into and estimate from, under a lock."""

    def __init__(self, decay: float = 0.9):
        super().__init__(decay)
        self._lock = threading.Lock()

    def record(self, s: int, seconds: float, past: int = 0) -> None:
        with self._lock:
            super().record(s, seconds, past)

    def estimate(self, s: int, past: int | None = None) -> float:
        with self._lock:
            return super().estimate(s, past)


class _Lease:
    """What one request borrows from its model: a KV cache, and its method's shared drafter state
    when no other request held it. Given back once, by whichever comes first: the end of the request's iterator, its
    close(), or its garbage collection."""

    def __init__(self, model: SpecModel, decoder: OrtDecoder, state_lock: threading.Lock | None):
        self.model = model
        self.decoder = decoder
        self.state_lock = state_lock  # held: this request drafts with the shared drafter_state
        self._released = False

    def release(self) -> None:
        model = self.model
        with model._lock:
            if self._released:
                return
            self._released = True
            if not model._idle:  # keep one idle cache: sequential requests reuse its buffers
                model._idle.append(self.decoder)
            if self.state_lock is not None:
                self.state_lock.release()


BACKENDS = ("onnxruntime", "hf")  # load(backend=): exported artifacts, or Hugging Face folders (the hf extra)
BACKOFF_STATE_PREFIX = "backoff/"  # drafter_state keys holding a method's last back-off estimate


def _run(loop: SpeculativeLoop, ids: np.ndarray, lease: _Lease, keep: Callable[[], None]) -> Iterator[np.ndarray]:
    try:
        yield from loop.run(ids)
        keep()
    finally:
        lease.release()


class SpecModel:
    """A loaded artifact: tokenizer + ONNX decoder session. Serves concurrent requests, each on its
    own KV cache (see the module docstring for what they share)."""

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        provider: str,
        threads: int | None,
        datastore: Path | None = None,
        draft: tuple[Path, Manifest] | None = None,
        device_cache: bool | None = None,
        prefix_cache_mb: float = 0,
        backend: str = "onnxruntime",
        device: str = "cpu",
    ):
        mb = check_number("prefix_cache_mb", prefix_cache_mb)
        if backend not in BACKENDS:
            raise InvalidRequestError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "hf" and (mb or device_cache is not None or threads is not None or provider != "cpu"):
            raise InvalidRequestError("the hf backend takes device= only: prefix_cache_mb, device_cache, threads and "
                                      "provider are the onnxruntime backend's")
        if mb < 0:
            raise InvalidRequestError(f"prefix_cache_mb must be >= 0 (0: no prefix cache), got {prefix_cache_mb}")
        self.folder = folder
        self.manifest = manifest
        self.datastore = datastore
        self.drafter_state: dict[str, Any] = {}  # per-method state that outlives a request (lent to one at a time)
        self.verify_cost = SharedCostModel()  # measured verify-pass time by window size
        self.prefix_cache = PrefixCache(int(mb * 2**20)) if mb > 0 else None  # prompts' KV across requests
        self.blas = BlasGuard()  # drafters' numpy products on one thread: onnxruntime's threads own the cores
        # guards _idle, leases and _warned_unsafe; re-entrant: a lease may be given back by the garbage
        # collector (weakref.finalize) while this thread holds the lock
        self._lock = threading.RLock()
        self._state_locks: dict[str, threading.Lock] = {}  # method -> held by the request using its state
        self._factory_lock = threading.Lock()  # one drafter factory at a time (they may load a datastore)
        self._idle: list[OrtDecoder] = []  # a KV cache no request uses
        self._warned_unsafe = False
        self._verdict: Verdict | None = None  # spec_safety(), decided before the first speculative request
        self._chat: ChatRenderer | None = None  # the compiled chat template, at the first messages rendered
        try:
            self.tokenizer = Tokenizer.from_file(str(folder / manifest.tokenizer))
        except Exception as e:  # the tokenizers library raises a bare Exception on bad JSON
            raise ArtifactError(f"{folder / manifest.tokenizer}: not a valid tokenizer.json ({e})") from None
        def session(at: Path, m: Manifest) -> Any:  # a DecoderSession, or the hf backend's HfSession
            if backend == "hf":
                from specrt.backend.hf import HfSession  # torch: only when asked for

                return HfSession(at, m.dims, device=device)
            return DecoderSession(at / m.decoder, m.dims, provider=provider, threads=threads, device_cache=device_cache)

        self.graph = session(folder, manifest)
        self.draft_manifest: Manifest | None = None  # the draft model of sd / hsd / hsd_capped, if loaded
        self.draft_graph: Any = None
        if draft is not None:
            draft_folder, self.draft_manifest = draft
            check_vocab_compatible(folder / manifest.tokenizer, draft_folder / self.draft_manifest.tokenizer)
            self.draft_graph = session(draft_folder, self.draft_manifest)
        if datastore is not None:  # refuse a datastore of another tokenizer now, not at the first request
            datastore_for(self.drafter_env(tree=False), "load")
        self.images: ImageInputs | None = None  # a vision-language artifact's image side (specrt.vision)
        if manifest.vision is not None and backend == "onnxruntime":
            self.images = ImageInputs(folder, manifest, provider=provider, threads=threads)

    def encode(self, prompt: str, *, chat: bool = False) -> np.ndarray:
        """The prompt's token ids ([t] int64). ``chat``: ``prompt`` as one user turn, wrapped in the
        prefix and suffix the export rendered from the chat template (no Jinja needed; for system
        prompts and several turns see :meth:`encode_chat`, which a folder without them, a Hugging Face
        folder on the hf backend, uses for ``chat`` too). Refuses a str that is not valid Unicode
        (lone surrogates, e.g. from bytes decoded with ``errors="surrogateescape"``)."""
        _check_text(prompt, "prompt")
        if chat:
            if self.manifest.chat is None:
                if self.manifest.chat_template is not None:  # a Hugging Face folder (backend "hf"): its template
                    return self.encode_chat([{"role": "user", "content": prompt}])
                raise InvalidRequestError(f"{self.manifest.name} has no chat template; call without chat=True")
            prompt = self.manifest.chat.prefix + prompt + self.manifest.chat.suffix
        return np.array(self.tokenizer.encode(prompt).ids, np.int64)

    def chat_prompt(self, msgs: Sequence[Message | dict], *, add_generation_prompt: bool = True) -> str:
        """The prompt text of chat messages (``{"role", "content"}``: system, user, assistant, tool),
        rendered by the model's own Jinja chat template (:mod:`specrt.chat`; needs jinja2, the
        ``chat`` extra). InvalidRequestError when the artifact stores no template (exported before
        templates were kept, or a model without one)."""
        checked = messages(msgs)
        for i, m in enumerate(checked):
            _check_text(m.content, f"messages[{i}].content")
        return self._renderer().render(checked, add_generation_prompt=add_generation_prompt)

    def encode_chat(self, msgs: Sequence[Message | dict]) -> np.ndarray:
        """The token ids ([t] int64) of chat messages, ending in the assistant's turn opening: the
        template's text encoded without the tokenizer's own special tokens, as transformers'
        ``apply_chat_template(tokenize=True)``. An artifact without a stored template takes a single
        user message (its export-time prefix and suffix, as ``encode(chat=True)``) and refuses more."""
        checked = messages(msgs)
        if self.manifest.chat_template is None and self.manifest.chat is not None and len(checked) == 1 \
                and checked[0].role == "user":
            return self.encode(checked[0].content, chat=True)
        text = self.chat_prompt(checked)
        return np.array(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int64)

    def _renderer(self) -> ChatRenderer:
        template = self.manifest.chat_template
        if template is None:
            what = ("keeps only a single-user-turn chat prompt (exported before chat templates were stored: "
                    "export it again for system prompts and several turns)") if self.manifest.chat else \
                "has no chat template"
            raise InvalidRequestError(f"{self.manifest.name}/{self.manifest.variant} {what}")
        with self._lock:
            if self._chat is None:
                path = self.folder / template.file
                self._chat = ChatRenderer(_template_text(path), template.special_tokens, name=str(path))
            return self._chat

    def stream_ids(
        self,
        prompt_ids: np.ndarray | list[int],
        *,
        max_new_tokens: int = 128,
        method: str | Drafter = DEFAULT_METHOD,
        tree: bool = False,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        draft_budget: int = 8,
        prefill_chunk: int = 256,
        backoff: bool | None = None,
        cancel: CancelToken | None = None,
        timeout_s: float | None = None,
        logprobs: int | None = None,
        images: PromptImages | None = None,
    ) -> tuple[SpeculativeLoop, Iterator[np.ndarray]]:
        """The loop for one request on token ids, and the iterator of its emitted token chunks.

        ``method`` is a registered name (``specrt.METHODS``; default ``auto``, the cost-aware
        controller over the model-free drafters and a loaded draft model), a
        :class:`specrt.drafters.Method` (a factory with its accept rule) or a ready Drafter instance
        (its sampled drafts accepted by recursive rejection sampling, the ``sd`` rule). Every
        option is checked here, before any work; the request holds a KV cache until its iterator is
        exhausted, closed or garbage-collected. ``backoff`` (``specrt.backoff``): verify a draft
        only while drafts pay for their window, else run plain steps; None: see :meth:`_default_backoff`.

        ``cancel`` (:class:`specrt.cancel.CancelToken`, from any thread) or ``timeout_s`` (a deadline
        from now) stop the request before its next prefill pass or verify step, with finish_reason
        "cancelled" or "timeout"; a token's own deadline: ``CancelToken(timeout_s=...)``.

        ``logprobs`` (k >= 0): the loop records each emitted token's log-probability and its k most
        likely alternatives (``loop.logprobs``, :class:`specrt.logprobs.TokenLogprob`), from the
        model's raw logits at that position, as plain decoding computes them.

        ``images`` (:meth:`encode_images`): the rows of the prompt's image placeholders, one per
        placeholder; such a prompt is never served from or kept in the prefix cache."""
        ids = self._check_ids(prompt_ids)
        if images is not None:
            if self.images is None:
                raise InvalidRequestError(f"{self.manifest.name}/{self.manifest.variant} takes no images")
            self.images.check(ids, images)
        if cancel is not None and not isinstance(cancel, CancelToken):
            raise InvalidRequestError(f"cancel must be a specrt.CancelToken, got {type(cancel).__name__}")
        if timeout_s is not None:
            if cancel is not None:
                raise InvalidRequestError("give either cancel or timeout_s; a token with a deadline is "
                                          "CancelToken(timeout_s=...)")
            cancel = CancelToken(timeout_s)
        if isinstance(tree, np.bool_) or not isinstance(tree, bool):
            raise InvalidRequestError(f"tree must be a bool, got {type(tree).__name__} {tree!r}")
        if not isinstance(method, (str, Method)) and not all(
            callable(getattr(method, name, None)) for name in ("begin", "propose", "observe")
        ):
            raise InvalidRequestError(
                f"method must be a method name ({', '.join(sorted(METHODS))}), a specrt.drafters.Method or a "
                f"Drafter (begin, propose, observe), got {type(method).__name__}"
            )
        config = LoopConfig(
            max_new_tokens=max_new_tokens,
            sampling=SamplingParams(
                temperature=check_number("temperature", temperature),
                top_k=check_int("top_k", top_k),
                top_p=check_number("top_p", top_p),
            ),
            draft_budget=draft_budget,
            prefill_chunk=prefill_chunk,
            seed=seed,
            backoff=self._default_backoff(method, seed, greedy=temperature == 0) if backoff is None else backoff,
            logprobs=logprobs,
        )
        if method != "baseline" and not isinstance(method, NoDraft) and not self.spec_safety().spec_safe:
            self._warn_unsafe()

        lease = self._borrow(method if isinstance(method, str) else None)
        here = AtContext(self.verify_cost)  # the verify cost at this request's cached length (the loop sets it)
        try:
            acceptance = "sd"  # a Drafter instance's drafts sampled from a q: recursive rejection sampling
            if isinstance(method, (str, Method)):
                with self._factory_lock:
                    env = self._env(tree, shared=lease.state_lock is not None, sampling=config.sampling, seed=seed,
                                    here=here)
                    drafter = make_drafter(method, env) if isinstance(method, str) else method.make(env)
                acceptance = (METHODS[method] if isinstance(method, str) else method).accept
            else:
                drafter = method
            label = method if isinstance(method, str) else None
            # a method's back-off estimate carries over from its last finished request (same mode)
            backoff_key = f"{BACKOFF_STATE_PREFIX}{label}/{'tree' if tree else 'chain'}" if label else None
            loop = SpeculativeLoop(
                lease.decoder, drafter, self.manifest.eos_token_ids, config, self.verify_cost, method=label,
                backoff_from=self.drafter_state.get(backoff_key) if backoff_key else None,
                prefix_cache=self.prefix_cache, blas=self.blas, cancel=cancel, acceptance=acceptance, images=images,
                here=here,
            )
        except BaseException:
            lease.release()
            raise

        def keep() -> None:
            if backoff_key and loop.backoff is not None:
                with self._factory_lock:  # forget_history iterates drafter_state under this lock
                    self.drafter_state[backoff_key] = loop.backoff

        chunks = _run(loop, ids, lease, keep)
        weakref.finalize(chunks, lease.release)  # a stream dropped before its first chunk
        return loop, chunks

    @staticmethod
    def _default_backoff(method: str | Drafter, seed: int | None, *, greedy: bool) -> bool:
        """On for the registered model-free methods; off for the draft-model methods (their adaptive
        gamma backs off by itself, and their drafts cost a model), for ``auto`` (its controller cuts
        each draft to what pays itself, specrt.drafters.auto), for Drafter instances (whose cost
        is unknown) and for seeded sampling: the back-off decides from measured times, so it would
        change which random numbers a seeded request draws, and the request would not repeat.
        (Greedy output never depends on it.)"""
        return (isinstance(method, str) and method not in NEEDS_DRAFT | SELF_BACKING_OFF
                and (greedy or seed is None))

    def _check_ids(self, prompt_ids: np.ndarray | list[int]) -> np.ndarray:
        """``prompt_ids`` as [t] int64, or InvalidRequestError: not integers, or outside the vocabulary."""
        try:
            raw = np.asarray(prompt_ids)
        except (ValueError, TypeError) as e:
            raise InvalidRequestError(f"prompt token ids must be a 1-D sequence of ints ({e})") from None
        if raw.size and (raw.dtype == np.bool_ or not np.issubdtype(raw.dtype, np.integer)):
            raise InvalidRequestError(f"prompt token ids must be ints, got dtype {raw.dtype}")
        if raw.ndim > 1:
            raise InvalidRequestError(f"prompt token ids must be 1-D, got shape {raw.shape}")
        ids = raw.astype(np.int64).reshape(-1)
        vocab = self.manifest.dims.vocab
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab):
            raise InvalidRequestError(f"prompt token ids must lie in [0, {vocab}), got {ids.min()}..{ids.max()}")
        return ids

    def _borrow(self, method: str | None) -> _Lease:
        """A KV cache for a new request, and ``method``'s shared drafter state unless another
        request of that method holds it."""
        with self._lock:
            decoder = self._idle.pop() if self._idle else self.graph.decoder()
            lock = self._state_locks.setdefault(method, threading.Lock()) if method in METHODS else None
        if lock is not None and not lock.acquire(blocking=False):
            lock = None
        return _Lease(self, decoder, lock)

    def spec_safety(self) -> Verdict:
        """Whether verify windows give the single steps' argmax on this machine and provider: the
        manifest's verdict where its basis covers them, else a short self-check (specrt.backend.verdict),
        run once per decoder and machine and cached."""
        with self._factory_lock:
            if self._verdict is None:
                recorded = self.manifest.checks.get("gate", {}).get("basis")
                if covers(recorded, self.graph.provider):
                    self._verdict = Verdict(self.manifest.spec_safe, "manifest", recorded, {})
                else:
                    log.info("%s/%s: the gate's verdict was not measured on this machine or provider; running the "
                             "spec-safety self-check", self.manifest.name, self.manifest.variant)
                    prompts = [self.encode(p, chat=self.manifest.chat is not None) for p in SELF_CHECK_PROMPTS]
                    digest = hashlib.sha256("".join(f.sha256 for f in self.manifest.files.values()).encode())
                    self._verdict = self_check(self.graph.decoder(), prompts, digest.hexdigest(),
                                               self.graph.provider)
                    log.info("self-check: spec_safe=%s (%s)", self._verdict.spec_safe, self._verdict.report)
            return self._verdict

    def _warn_unsafe(self) -> None:
        with self._lock:
            if self._warned_unsafe:
                return
            self._warned_unsafe = True
        verdict = self.spec_safety()
        log.warning(
            "%s/%s is not spec-safe %s (verify windows may disagree with single steps): speculative "
            "output may differ from plain decoding; method='baseline' is exact",
            self.manifest.name, self.manifest.variant,
            "(manifest: spec_safe=false)" if verdict.source == "manifest" else
            f"on this machine (self-check: {verdict.report.get('disagreements')} disagreements in "
            f"{verdict.report.get('positions')} positions)",
        )

    def forget_history(self) -> None:
        """Drop what drafters learned across requests (suffix histories, adjacency tables, ...);
        a loaded datastore stays. Benchmarks call it between methods so none profits from another.
        A request in flight keeps what its drafter already holds."""
        with self._factory_lock:
            for key in [k for k in self.drafter_state if k != DATASTORE_STATE_KEY]:
                del self.drafter_state[key]

    def drafter_env(self, tree: bool) -> DrafterEnv:
        """The environment of this model's drafters, with the shared ``drafter_state``: a drafter
        built from it and passed as ``method`` learns across requests."""
        return self._env(tree, shared=True)

    def _draft_cache(self) -> OrtDraftModel:
        """A fresh KV cache on the loaded draft model (one per request), as drafters drive it."""
        assert self.draft_graph is not None
        return OrtDraftModel(self.draft_graph.decoder())

    def _env(
        self, tree: bool, *, shared: bool, sampling: SamplingParams | None = None, seed: int | None = None,
        here: AtContext | None = None,
    ) -> DrafterEnv:
        """The drafter environment; ``shared=False``: a private state that shares only the loaded datastores.
        ``here``: the request's view of the verify cost, at its cached length (None: estimates at the
        lengths measured)."""
        if shared:
            state = self.drafter_state
        else:
            state = {DATASTORE_STATE_KEY: self.drafter_state.setdefault(DATASTORE_STATE_KEY, {})}
        return DrafterEnv(
            vocab=self.manifest.dims.vocab,
            tree=tree,
            state=state,
            datastore=self.datastore,
            verify_cost=self.verify_cost.estimate if here is None else here.estimate,
            tokenizer_sha256=self.manifest.files[self.manifest.tokenizer].sha256,
            sampling=sampling,
            seed=seed,
            draft_model=self._draft_cache if self.draft_graph is not None else None,
        )

    def generate_ids(self, prompt_ids: np.ndarray | list[int], **options: Any) -> tuple[np.ndarray, SpeculativeLoop]:
        """All emitted token ids ([k] int64) for ``prompt_ids``, and the finished loop (stats)."""
        loop, chunks = self.stream_ids(prompt_ids, **options)
        out = [c for c in chunks]
        return (np.concatenate(out) if out else np.zeros(0, np.int64)), loop

    def encode_images(
        self, prompt: str, images: Sequence[Any], *, chat: bool = False
    ) -> tuple[np.ndarray, PromptImages]:
        """A vision-language artifact's prompt with ``images`` (paths, encoded bytes, HxWx3 uint8
        arrays or PIL images; specrt.vision.load_image): the token ids of ``prompt`` with each
        image's placeholder text where it names ``<image>`` (at its start when it names none), and
        the images' rows for those placeholders. ``chat`` as :meth:`encode`."""
        if self.images is None:
            raise InvalidRequestError(f"{self.manifest.name}/{self.manifest.variant} takes no images (not a "
                                      "vision-language artifact" + (", or on the hf backend)" if self.manifest.vision
                                                                     else ")"))
        _check_text(prompt, "prompt")
        text, rows = self.images.prepare(prompt, images)
        ids = self.encode(text, chat=chat)
        return ids, self.images.prompt_images(ids, rows)

    def _prompt(self, prompt: str, chat: bool, options: dict[str, Any]) -> np.ndarray:
        """The ids of ``prompt``; images in ``options`` (``images=[...]``) become the prompt's image rows."""
        images = options.pop("images", None)
        if images is None:
            return self.encode(prompt, chat=chat)
        if isinstance(images, (str, bytes, Path)) or not isinstance(images, Sequence):
            raise InvalidRequestError(f"images must be a list of images, got {type(images).__name__}")
        ids, options["images"] = self.encode_images(prompt, images, chat=chat)
        return ids

    def generate(self, prompt: str, *, chat: bool = False, **options: Any) -> GenerationResult:
        """Complete ``prompt``; options as :meth:`stream_ids` (method, tree, temperature, ...), and
        ``images`` (a list) for a vision-language artifact (:meth:`encode_images`)."""
        return self.generate_result(self._prompt(prompt, chat, options), **options)

    def chat(self, msgs: Sequence[Message | dict], **options: Any) -> GenerationResult:
        """The assistant's answer to chat messages (:meth:`encode_chat`); options as :meth:`stream_ids`."""
        return self.generate_result(self.encode_chat(msgs), **options)

    def generate_result(self, prompt_ids: np.ndarray | list[int], **options: Any) -> GenerationResult:
        """:meth:`generate` on token ids ([t] int64): the text, ids, finish reason and stats."""
        prompt_ids = self._check_ids(prompt_ids)
        ids, loop = self.generate_ids(prompt_ids, **options)
        return GenerationResult(
            text=self.tokenizer.decode(ids.tolist(), skip_special_tokens=True),
            token_ids=tuple(ids.tolist()),
            prompt_token_ids=tuple(prompt_ids.tolist()),
            finish_reason=loop.finish_reason or "length",
            method=str(options.get("method", DEFAULT_METHOD)),
            tree=bool(options.get("tree", False)),
            stats=loop.stats.as_dict(),
            logprobs=tuple(loop.logprobs) if options.get("logprobs") is not None else None,
        )

    def stream(self, prompt: str, *, chat: bool = False, **options: Any) -> Iterator[str]:
        """Yield the completion's text as the verifier accepts it (``images`` as :meth:`generate`)."""
        return self._text(self._prompt(prompt, chat, options), options)

    def stream_chat(self, msgs: Sequence[Message | dict], **options: Any) -> Iterator[str]:
        """Yield the assistant's answer to chat messages as the verifier accepts it."""
        return self._text(self.encode_chat(msgs), options)

    def _text(self, prompt_ids: np.ndarray, options: dict[str, Any]) -> Iterator[str]:
        _, chunks = self.stream_ids(prompt_ids, **options)
        text = TextStream(self.tokenizer)
        try:
            for chunk in chunks:
                piece = text.push(chunk)
                if piece:
                    yield piece
            if piece := text.finish():
                yield piece
        finally:
            chunks.close()  # a stream closed early gives its KV cache back now


def _template_text(path: Path) -> str:
    """A chat template's Jinja source: the file's text, or the "chat_template" string of a JSON file
    (a Hugging Face folder's tokenizer_config.json)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".json":
        return text
    try:
        template = json.loads(text).get("chat_template")
    except (ValueError, AttributeError):
        template = None
    if not isinstance(template, str):
        raise ArtifactError(f"{path}: expected a JSON object whose 'chat_template' is the template's Jinja text")
    return template


def _check_text(text: object, name: str) -> None:
    """InvalidRequestError unless ``text`` is a str of valid Unicode (no lone surrogates)."""
    if not isinstance(text, str):
        raise InvalidRequestError(f"{name} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(
            f"{name} is not valid Unicode: lone surrogate U+{ord(text[e.start]):04X} at index {e.start} "
            "(decode input bytes with errors='replace')"
        ) from None


def load(
    folder: str | Path,
    *,
    provider: str = "cpu",
    threads: int | None = None,
    check_hashes: bool = True,
    datastore: str | Path | None = None,
    draft: str | Path | None = None,
    device_cache: bool | None = None,
    prefix_cache_mb: float = 0,
    backend: str = "onnxruntime",
    device: str = "cpu",
) -> SpecModel:
    """Load an artifact folder built by the pipeline (``artifacts/<model>/<variant>``), or with
    ``backend="hf"`` a Hugging Face causal-LM folder (``config.json``, ``*.safetensors``,
    ``tokenizer.json``) run by transformers on ``device`` "cpu" or "cuda" without an export
    (:mod:`specrt.backend.hf`; the ``hf`` extra). Every method runs on either backend; ``draft`` is then
    a Hugging Face folder too.

    Refuses a folder whose files differ from its manifest (sizes always; sha256 unless
    ``check_hashes=False``, and only for files changed since a load verified them: a verified
    stamp in ``~/.cache/specrt``, :mod:`specrt.backend.stamp`, so an unchanged folder is hashed once).
    ``draft``: the artifact folder of a draft model for ``sd``, ``hsd`` and
    ``hsd_capped``; refused unless its tokenizer maps every id to the same token as the target's.

    ``provider``: "cpu", or "cuda" (needs onnxruntime-gpu; see the README, 'CUDA'): the KV caches
    then live on the GPU. ``device_cache``: None keeps them where the provider computes; True on
    "cpu" runs the GPU code path (onnxruntime memory, device-side compaction) on the CPU, for tests.

    ``prefix_cache_mb``: host memory for the KV rows of recent prompts (0: none). A prompt that
    repeats an earlier one, or shares whole prefill chunks with it (a chat that grows turn by
    turn, a system prompt), skips those prefill passes; the output is bit for bit the same
    (:mod:`specrt.engine.prefix_cache`). On the 0.5B model an entry takes ~28 KiB per prompt token
    (24 KiB of KV rows, 3.5 KiB of hidden states).
    """
    folder = Path(folder)
    if backend not in BACKENDS:
        raise InvalidRequestError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "hf":
        try:
            from specrt.backend.hf import read_hf_folder  # torch and transformers: only when asked for
        except ImportError as e:
            raise MissingDependencyError(f"backend='hf' needs torch and transformers: pip install 'specrt[hf]' ({e})") \
                from None

        def read(at: Path) -> Manifest:
            return read_hf_folder(at)[0]
    else:
        def read(at: Path) -> Manifest:
            return read_manifest(at, check_hashes=check_hashes)
    manifest = read(folder)
    store = Path(datastore) if datastore is not None else None
    draft_pair = (Path(draft), read(Path(draft))) if draft is not None else None
    return SpecModel(folder, manifest, provider=provider, threads=threads, datastore=store, draft=draft_pair,
                     device_cache=device_cache, prefix_cache_mb=prefix_cache_mb, backend=backend, device=device)
