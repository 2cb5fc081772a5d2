"""llama.cpp as a peer (pipeline/peers.py): llama-cpp-python on the GGUF the weights stage assembles.

Two runs on one worker (pipeline/lib/peer_worker.py), each its own ``llama_cpp.Llama`` on the GGUF:

- ``llama.cpp/<quant>/plain``: ``Llama.generate`` with the greedy sampler (``temp=0``:
  penalties (a no-op at ``repeat_penalty=1``) then ``greedy``), batch 1.
- ``llama.cpp/<quant>/prompt_lookup``: the same with ``draft_model=LlamaPromptLookupDecoding(
  max_ngram_size, num_pred_tokens)``, llama-cpp-python's prompt-lookup decoding: each round
  evaluates ``[last token] + drafts`` in one batch and keeps the drafts the greedy samples agree
  with. A ``Llama`` with a draft model keeps the logits of every position (``logits_all``), its
  prefill included: that is the library's cost, so it is timed as it comes.

``<quant>`` is the GGUF's ``general.file_type`` (``MOSTLY_Q4_K_M`` -> ``q4_k_m``). Both take the
prompt as token ids (the GGUF's vocabulary is the checkpoint's) and ``n_threads`` =
``n_threads_batch`` = the stage's threads. Each generation starts from an empty KV cache
(``Llama.reset``: no prefix reuse between runs or prompts). Timing as the other peers: the
prefill ends when ``generate`` yields the first new token; the decode covers the rest.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .measure import matched_prefix

# llama-cpp-python's LlamaPromptLookupDecoding defaults are max_ngram_size 2, num_pred_tokens 10
LLAMA_LOOKUP = {"max_ngram_size": 2, "num_pred_tokens": 10}


def find_gguf(path: Path) -> Path:
    """``path`` if it is a file, else the one ``*.gguf`` in the folder ``path`` (the weights stage's gguf/)."""
    path = Path(path)
    if path.is_file():
        return path
    found = sorted(path.glob("*.gguf")) if path.is_dir() else []
    if len(found) != 1:
        raise FileNotFoundError(f"--gguf {path}: expected a .gguf file or a folder holding exactly one, "
                                f"found {len(found)}")
    return found[0]


def gguf_quant(path: Path) -> str:
    """The GGUF's ``general.file_type`` as a run-name part: ``MOSTLY_Q4_K_M`` -> ``q4_k_m``."""
    import gguf

    field = gguf.GGUFReader(str(path)).fields.get("general.file_type")
    if field is None:
        raise ValueError(f"{path}: no general.file_type in the GGUF header")
    name = gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name
    return name.removeprefix("MOSTLY_").lower()


def n_ctx_for(prompts: Sequence[np.ndarray], max_new_tokens: int, lookup: dict[str, int] | None) -> int:
    """A context that holds the longest prompt, the new tokens and one round of drafts past them."""
    drafts = int(lookup["num_pred_tokens"]) if lookup else 0
    return max(len(p) for p in prompts) + max_new_tokens + drafts + 1


def import_llama_cpp(package: str | Path) -> Any:
    """``llama_cpp`` from the ``llama_cpp`` stage's folder (first on ``sys.path``), not the environment."""
    package = str(Path(package).resolve())
    if not (Path(package) / "llama_cpp").is_dir():
        raise FileNotFoundError(f"{package}: no llama_cpp package (built by `python -m pipeline.llama_build`)")
    if package not in sys.path:
        sys.path.insert(0, package)
    import llama_cpp

    if not str(Path(llama_cpp.__file__).resolve()).startswith(package):
        raise RuntimeError(f"llama_cpp was imported from {llama_cpp.__file__}, not from {package}")
    return llama_cpp


class CountingLookup:
    """LlamaPromptLookupDecoding that also keeps each proposal: (context length, draft ids)."""

    def __init__(self, lookup: dict[str, int]):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.inner = LlamaPromptLookupDecoding(max_ngram_size=int(lookup["max_ngram_size"]),
                                               num_pred_tokens=int(lookup["num_pred_tokens"]))
        self.proposals: list[tuple[int, np.ndarray]] = []

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        draft = self.inner(input_ids, **kwargs)  # [d] intc, d <= num_pred_tokens (0: no match)
        self.proposals.append((len(input_ids), draft))
        return draft


def llama_model(llama_cpp: Any, gguf_path: Path, threads: int | None, n_ctx: int,
                lookup: dict[str, int] | None) -> tuple[Any, CountingLookup | None]:
    """A ``Llama`` on ``gguf_path`` (CPU, quiet), with prompt lookup as its draft model when ``lookup``.

    With a draft model the ``Llama`` keeps every position's logits, but llama-cpp-python 0.3.36 sizes
    its score buffer by the ``logits_all`` argument (``n_batch`` rows when False): a prompt longer
    than ``n_batch`` (512) then fails with "could not broadcast input array ... into shape (0,)".
    ``logits_all=True`` with the draft model gives the buffer its ``n_ctx`` rows."""
    draft = CountingLookup(lookup) if lookup else None  # generate() only calls it (no type check)
    kwargs: dict[str, Any] = {"n_threads": threads, "n_threads_batch": threads} if threads is not None else {}
    llama = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_gpu_layers=0, draft_model=draft,
                            logits_all=draft is not None, verbose=False, **kwargs)
    return llama, draft


def spec_stats(prompt_len: int, ids: np.ndarray, proposals: Sequence[tuple[int, np.ndarray]]) -> dict[str, int]:
    """Speculative counters of one generation from its proposals: a draft made with ``length``
    context tokens is accepted up to its first difference from the ids emitted from there (greedy:
    the target keeps a draft token exactly when its own pick equals it). Each proposal is followed
    by one batched evaluation of ``[last] + draft``; the prefill is one more forward pass."""
    accepted = 0
    for length, draft in proposals:
        emitted = ids[length - prompt_len:]
        accepted += matched_prefix(np.asarray(draft, np.int64)[: len(emitted)], emitted)[0]
    return {"rounds": len(proposals), "draft_tokens_proposed": int(sum(len(d) for _, d in proposals)),
            "draft_tokens_accepted": int(accepted), "target_forward_passes": len(proposals) + 1}


def llama_generate(llama: Any, draft: CountingLookup | None, prompt: np.ndarray, max_new_tokens: int,
                   eos: frozenset[int]) -> tuple[np.ndarray, float, float, dict[str, int]]:
    """(new ids [k] int64, prefill_s, decode_s, speculative stats) of one greedy generation from an
    empty KV cache; stops after ``max_new_tokens`` or a stop id (kept, as specrt keeps it)."""
    llama.reset()  # n_tokens = 0: generate() reuses no cached prefix; eval() clears the KV rows from 0
    if draft is not None:
        draft.proposals.clear()
    ids: list[int] = []
    t0 = time.perf_counter()
    t1 = t0
    for token in llama.generate([int(t) for t in prompt], temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        if not ids:
            t1 = time.perf_counter()
        ids.append(int(token))
        if len(ids) >= max_new_tokens or token in eos:
            break
    t2 = time.perf_counter()
    out = np.asarray(ids, np.int64)
    stats = spec_stats(len(prompt), out, draft.proposals) if draft is not None else {}
    return out, t1 - t0, t2 - t1, stats
