"""Peers in the same run: what users would pick instead of specrt, on the same checkpoint and prompt ids.

    python -m pipeline.peers --hf artifacts/M/hf --prompts ../shared/data/specbench/question.jsonl \\
        --build-dir /tmp/peers --precisions int4 fp32 --per-task 1 --max-prompts 2 \\
        --max-new-tokens 48 --threads 2 --out /tmp/peers/report.json [--artifact artifacts/M/int4]

The DVC stage runs it once per entry of ``peers.variants``: our artifact of that variant against
onnxruntime-genai's build of the same precision (``--precisions <variant>``).

Peers, each greedy, batch 1, on the CPU, with the same intra-op thread count as ours:

- ``ort-genai/<precision>/plain``: onnxruntime-genai's model builder turns the HF checkpoint into
  its own ONNX model (``python -m onnxruntime_genai.models.builder -i HF -o OUT -p int4|int8|fp32 -e cpu``;
  the int4 build gets ``GENAI_INT4_OPTIONS``, our int4 recipe; int8 ``GENAI_INT8_OPTIONS``, 8-bit weights
  and activations as our W8A8: :mod:`pipeline.lib.genai_peer`), run by its ``Generator`` loop
  (``append_tokens`` the prompt ids, then ``generate_next_token`` until done).
- ``ort-genai/<precision>/ngram``: the same model with onnxruntime-genai's own n-gram (prompt
  lookup) speculative decoding, ``GeneratorParams.set_speculative_options(ngram_size=...,
  max_draft_tokens=...)``. It exists in onnxruntime-genai 0.18.0: the binding has
  ``set_speculative_options`` / ``get_speculative_options`` / ``Generator.get_speculative_stats``,
  the library holds ``Generators::NGramDecodingStrategy``, and its docs/speculative_decoding.md
  documents the options (``ngram_size`` 2-16, ``max_draft_tokens`` 1-16, ``ngram_chained_lookup``,
  ``min_adaptive_k``, ``cooldown``). It needs per-token logits, i.e. a build without
  ``prune_lm_head`` (the builder's default).
- ``hf/fp32/plain`` and ``hf/fp32/prompt_lookup``: transformers ``generate`` (torch, fp32) on the HF
  checkpoint, plain and with ``prompt_lookup_num_tokens=N``, after ``torch.set_num_threads(threads)``.
- ``llama.cpp/<quant>/plain`` and ``llama.cpp/<quant>/prompt_lookup`` with ``--llama-cpp`` (the
  ``llama_cpp`` stage's build of llama-cpp-python, :mod:`pipeline.llama_build`): llama.cpp on the
  GGUF the weights stage assembled (``--gguf``; ``<quant>`` its file type, e.g. ``q4_k_m``), greedy,
  plain and with llama-cpp-python's ``LlamaPromptLookupDecoding`` as draft model
  (:mod:`pipeline.lib.llama_peer`), ``n_threads`` = ``n_threads_batch`` = ``--threads``. The same in
  every run of the stage whatever our variant: our int4 and int8 are each timed against it.
  ``--params``: ``<section>.llama_cpp.enabled`` switches it (on in ``peers`` and ``peers_full``).
- ``specrt/<variant>/baseline`` and ``specrt/<variant>/<method>`` for each of ``--methods``
  (default ``pld``) when ``--artifact`` names one of our artifacts: then the prompts are encoded by
  that artifact, and every peer's token match is reported against specrt's plain decoding. Each
  prompt starts with no history (``forget_history``): no method learns from the others' prompts.
  The retrieval methods (``rest``, ``sam_decoding``, ``asam``, ``asam_verify``) draft from
  ``--datastore`` (the ``corpora`` stage's, built from pinned corpora, not from Spec-Bench).

Prompts are token ids: the first turns of Spec-Bench questions in the model's chat template
(``model.encode(turn, chat=True)`` of the artifact, or else the HF tokenizer with the template
split as the export stage splits it: the same ids); a prompt longer than ``max_prompt_tokens``
keeps its last tokens, as in the benchmark stage (the question's end and the generation prompt).
Every peer gets the same ids and the same stop ids (the artifact's EOS ids, or else the
checkpoint's generation-config EOS), and every run records the ids it generated (EOS kept, as
specrt does).

Timing, as specrt's ``LoopStats``: the prefill ends when the first new token is known
(``prefill_s``); the decode phase covers every later token (``decode_tokens = new - 1``,
``decode_s``); ``decode_tokens_per_s`` is summed tokens over summed seconds across prompts.
onnxruntime-genai: ``append_tokens`` runs the prompt and the first ``generate_next_token``
picks the first token, the two together are the prefill. transformers: a streamer stamps the
time of each ``put``; its second call carries the first new token. Before timing, each model
generates 4 untimed tokens for the first prompt (allocations, lazy weight prepacking).
transformers' prompt lookup has no separate prefill: its first pass verifies drafts over the
prompt, so its first ``put`` may carry several tokens; they count as prefill tokens
(``prefill_tokens``), and ``decode_tokens`` = new tokens - prefill tokens. (onnxruntime-genai's
first ``generate_next_token`` samples from the prefill logits only: its n-gram rounds start after.)
llama.cpp: ``Llama.generate`` yields the first new token after evaluating the prompt (its prompt
lookup drafts only after it): that yield ends the prefill; each generation starts from an empty
KV cache.

Order: every model runs in its own worker process (:mod:`pipeline.lib.peer_worker`: one onnxruntime
session or torch model per process, one process computing at a time), and the runs are
interleaved prompt by prompt, over ``rounds`` rounds that alternate the order of the runs
(:func:`interleave`): the runs compared in a ratio are seconds apart, not minutes, and a steady
drift of the machine's speed favours none of them. The report sums each run over every round
and keeps each round's decode tok/s (``round_decode_tokens_per_s``; the metrics'
``round_ratios``), whose spread is the measurement's. specrt's runs share the benchmark stage's
prefix cache: the first of them on a prompt prefills cold, the others reuse its prompt rows (bit for
bit what their own prefill would compute), and each reports that cold prefill (:func:`cold_prefill`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specrt.drafters import NEEDS_DATASTORE

from .lib.atomic import write_text_atomic
from .lib.checkpoint import full_checkpoint, has_weights, load_causal_lm
from .lib.genai_peer import (
    GENAI_NGRAM,
    GENAI_PRECISIONS,
    build_genai,
    genai_eos,
    genai_generate,
    genai_model,
    reusable_build,
)
from .lib.hf_peer import hf_generator
from .lib.llama_peer import LLAMA_LOOKUP
from .lib.llama_record import read_record
from .lib.measure import matched_prefix
from .lib.params import stage_params
from .lib.specbench import first_per_task, read_questions

log = logging.getLogger(__name__)

WARMUP_TOKENS = 4
SPEC_STATS = ("rounds", "draft_tokens_proposed", "draft_tokens_accepted", "target_forward_passes")


# ---------------------------------------------------------------------------------------------
# in-process runs (onnxruntime-genai: pipeline.lib.genai_peer; transformers: pipeline.lib.hf_peer)


def run_genai(
    model_dir: Path,
    prompts: Sequence[np.ndarray],
    max_new_tokens: int,
    threads: int | None,
    *,
    speculative: dict[str, Any] | None = None,
    eos_token_ids: Sequence[int] | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Greedy onnxruntime-genai generation of every prompt ([t] token ids); with ``speculative``
    (options of ``GeneratorParams.set_speculative_options``, e.g. :data:`pipeline.lib.genai_peer.GENAI_NGRAM`) its
    speculative decoding. ``eos_token_ids`` replaces the model's stop ids."""
    import onnxruntime_genai as og

    model = genai_model(Path(model_dir), threads, eos_token_ids)
    eos = genai_eos(Path(model_dir), eos_token_ids)
    genai_generate(og, model, prompts[0], min(WARMUP_TOKENS, max_new_tokens), speculative, eos)
    results = [(ids, pre, dec, 1, stats)
               for ids, pre, dec, stats in (genai_generate(og, model, p, max_new_tokens, speculative, eos)
                                            for p in prompts)]
    name = name or f"ort-genai/{Path(model_dir).name}/{'ngram' if speculative else 'plain'}"
    return _report(PeerRun(name, "in-process", {"speculative": speculative}), [results])


def run_hf(
    hf_dir: Path,
    prompts: Sequence[np.ndarray],
    max_new_tokens: int,
    threads: int | None,
    prompt_lookup: int | None = None,
    *,
    eos_token_ids: Sequence[int] | None = None,
    model: Any = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Greedy transformers ``generate`` (torch, fp32) of every prompt in this process (see
    :func:`pipeline.lib.hf_peer.hf_generator`). ``model``: an already loaded ``AutoModelForCausalLM`` of ``hf_dir``."""
    generate = hf_generator(model if model is not None else load_causal_lm(hf_dir), threads, prompt_lookup,
                            eos_token_ids)
    generate(prompts[0], min(WARMUP_TOKENS, max_new_tokens))
    name = name or f"hf/fp32/{'prompt_lookup' if prompt_lookup else 'plain'}"
    return _report(PeerRun(name, "in-process", {"prompt_lookup": prompt_lookup}),
                   [[(*generate(p, max_new_tokens), {}) for p in prompts]])


# ---------------------------------------------------------------------------------------------
# report


def _tally(name: str, results: Sequence[tuple[np.ndarray, float, float, int]]) -> dict[str, Any]:
    """One peer run from (new ids [k], prefill_s, decode_s, tokens known when the prefill ended)
    per prompt: sums over the prompts; decode tokens exclude the prefill's."""
    new_tokens = sum(len(ids) for ids, *_ in results)
    prefill_tokens = sum(min(first, len(ids)) for ids, _, _, first in results)
    decode_tokens = new_tokens - prefill_tokens
    decode_s = sum(dec for _, _, dec, _ in results)
    return {
        "name": name,
        "new_tokens": new_tokens,
        "decode_tokens": decode_tokens,
        "decode_s": round(decode_s, 4),
        "decode_tokens_per_s": round(decode_tokens / decode_s, 3) if decode_s > 0 else 0.0,
        "prefill_s": round(sum(pre for _, pre, _, _ in results), 4),
        "prefill_tokens": prefill_tokens,
        "ids": [ids.tolist() for ids, *_ in results],
    }


def token_match(ids: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> float:
    """Tokens equal to the reference's before the first difference (a shorter or longer output
    differs at its end), over the reference's tokens, summed over the prompts of ``ids`` (a run of
    the first N prompts is matched on those)."""
    if len(ids) > len(reference):
        raise ValueError(f"token_match: {len(ids)} outputs against a reference of {len(reference)}")
    matched = total = 0
    for a, b in zip(ids, reference[: len(ids)], strict=True):
        m, n = matched_prefix(np.asarray(a), np.asarray(b))
        matched, total = matched + m, total + n
    return round(matched / total, 6) if total else 1.0


def plain_of(name: str) -> str:
    """The plain-decoding run of the same peer and precision: ort-genai/int4/ngram -> ort-genai/int4/plain."""
    family = name.rsplit("/", 1)[0]
    return family + ("/baseline" if family.startswith("specrt/") else "/plain")


def add_token_match(runs: list[dict[str, Any]], reference: dict[str, Any]) -> None:
    """Writes into every run its ``token_match`` / ``identical`` against ``reference`` (our
    baseline, or transformers' fp32 greedy), and, for a speculative run, ``token_match_plain``
    against the plain decoding of the same peer and precision (1.0: lossless on these prompts)."""
    by_name = {r["name"]: r for r in runs}
    for run in runs:
        run["token_match_vs"] = reference["name"]
        run["token_match"] = token_match(run["ids"], reference["ids"])
        run["identical"] = run["ids"] == reference["ids"][: len(run["ids"])]
        plain = by_name.get(plain_of(run["name"]))
        if plain is not None and plain is not run:
            run["token_match_plain"] = token_match(run["ids"], plain["ids"])


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for module in ("onnxruntime_genai", "onnxruntime", "transformers", "torch"):
        try:
            out[module] = __import__(module).__version__
        except ImportError:
            out[module] = None
    return out


def hf_prompts(hf_dir: Path, texts: Sequence[str], max_prompt_tokens: int) -> tuple[list[np.ndarray], list[int]]:
    """Prompt ids ([t] int64 each) in the checkpoint's chat template, split as the export stage
    splits it (so the ids equal specrt's ``model.encode(text, chat=True)``), and its EOS ids."""
    from transformers import AutoTokenizer, GenerationConfig

    from .lib.chat_template import chat_template

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    chat = chat_template(tokenizer)
    wrap = (lambda t: chat.prefix + t + chat.suffix) if chat else (lambda t: t)
    prompts = [np.array(tokenizer(wrap(t))["input_ids"], np.int64)[-max_prompt_tokens:] for t in texts]
    eos = GenerationConfig.from_pretrained(hf_dir).eos_token_id
    return prompts, [int(e) for e in (eos if isinstance(eos, list) else [eos])]


@dataclass(frozen=True)
class PeerRun:
    """One run of the report: a worker (one model in its own process) and the options of its requests."""

    name: str  # e.g. "ort-genai/int4/ngram"
    worker: str  # key of the worker that serves it
    options: dict[str, Any]  # request options (pipeline.lib.peer_worker)
    rounds: int | None = None  # the rounds it takes part in (None: all)
    prompts: int | None = None  # the prompts it runs: the first N (None: all)


def interleave(runs: Sequence[PeerRun], prompts: int, rounds: int) -> list[tuple[int, int, PeerRun]]:
    """The order of the (round, prompt, run) generations: prompt by prompt, every run in turn; odd
    rounds take the runs in reverse order, so a drift of the machine's speed during a round favours
    no run (the first run of an even round is the last of an odd one)."""
    order = []
    for r in range(rounds):
        turn = [run for run in (runs if r % 2 == 0 else runs[::-1]) if run.rounds is None or r < run.rounds]
        order += [(r, i, run) for i in range(prompts) for run in turn if run.prompts is None or i < run.prompts]
    return order


def run(
    hf_dir: Path,
    questions_path: Path,
    build_dir: Path,
    *,
    precisions: Sequence[str] = GENAI_PRECISIONS,
    per_task: int = 1,
    max_prompts: int | None = None,
    max_prompt_tokens: int = 2048,
    max_new_tokens: int = 48,
    threads: int | None = None,
    prompt_lookup: int = 10,
    genai_ngram: dict[str, Any] | None = None,
    artifact: Path | None = None,
    methods: Sequence[str] = ("pld",),
    datastore: Path | None = None,
    hf: bool = True,
    rebuild: bool = False,
    rounds: int = 2,
    transformers_prompts: int | None = None,
    llama_cpp: Path | None = None,
    gguf: Path | None = None,
    llama_lookup: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Worker of the CLI: builds the genai models under ``build_dir/<precision>``, runs every peer
    on the same prompt ids, and returns the report. ``methods``: specrt's methods run on
    ``artifact`` beside its plain decoding (``baseline``, the reference of every token match);
    the retrieval ones (:data:`specrt.drafters.NEEDS_DATASTORE`) draft from ``datastore``.

    Every model runs in its own worker process (:mod:`pipeline.lib.peer_worker`); the generations are
    interleaved prompt by prompt over ``rounds`` rounds (:func:`interleave`), the transformers runs
    (its ``generate``, plain and with prompt lookup, and specrt's engine on the same torch model,
    backend "hf", plain and the model-free ``methods``) in the first round only and on the first
    ``transformers_prompts`` prompts (None: all): they are ~7x slower than every ONNX peer.

    ``llama_cpp``: the folder of the ``llama_cpp`` stage (:mod:`pipeline.llama_build`); with it,
    llama.cpp runs ``gguf`` (a file, or the weights stage's folder holding one) plain and with its
    prompt lookup (``llama_lookup``, default :data:`pipeline.lib.llama_peer.LLAMA_LOOKUP`)."""
    from .lib.llama_peer import find_gguf, gguf_quant, n_ctx_for
    from .lib.peer_worker import PeerWorker, WorkerConfig

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if llama_cpp is not None and gguf is None:
        raise ValueError("the llama.cpp peer (--llama-cpp) needs the GGUF to run (--gguf)")
    llama_record = read_record(llama_cpp) if llama_cpp is not None else None
    llama_lookup = dict(LLAMA_LOOKUP if llama_lookup is None else llama_lookup)
    if datastore is None and (need := sorted(set(methods) & NEEDS_DATASTORE)):
        raise ValueError(f"methods {need} draft from a retrieval datastore: pass one (--datastore, a folder "
                         "built by `python -m pipeline.corpora`) or leave them out")
    genai_ngram = dict(GENAI_NGRAM if genai_ngram is None else genai_ngram)
    questions = first_per_task(read_questions(questions_path), per_task)[:max_prompts]
    texts = [q.turns[0] for q in questions]
    variant = ""  # of the artifact
    if artifact is not None:
        import specrt

        model = specrt.load(artifact, threads=threads)  # for its tokenizer; the worker loads its own
        chat = model.manifest.chat is not None
        prompts = [model.encode(t, chat=chat)[-max_prompt_tokens:] for t in texts]
        eos = list(model.manifest.eos_token_ids)
        variant = model.manifest.variant
        del model
    else:
        prompts, eos = hf_prompts(hf_dir, texts, max_prompt_tokens)

    builds = {}  # precision -> build record
    if not rebuild:
        for precision in precisions:
            if (record := reusable_build(hf_dir, Path(build_dir) / precision, precision)) is not None:
                log.info("reusing %s (built by the same command from the same checkpoint files)",
                         Path(build_dir) / precision)
                builds[precision] = {**record, "reused": True}

    def config(kind: str, path: Path, options: Sequence[dict[str, Any]]) -> WorkerConfig:
        store = str(Path(datastore).resolve()) if kind == "specrt" and datastore is not None else None
        return WorkerConfig(kind, str(Path(path).resolve()), threads, tuple(eos), tuple(int(t) for t in prompts[0]),
                            min(WARMUP_TOKENS, max_new_tokens), tuple(options), datastore=store)

    hf_options = [{"prompt_lookup": None}, *([{"prompt_lookup": prompt_lookup}] if prompt_lookup else [])]
    workers: dict[str, PeerWorker] = {}
    with contextlib.ExitStack() as stack:
        to_build = [p for p in precisions if p not in builds]
        if to_build:
            # One full checkpoint for every build (a temporary one when hf_dir's weights are a GGUF),
            # removed once the builds are done and the transformers worker has loaded it.
            Path(build_dir).mkdir(parents=True, exist_ok=True)
            torch_model = load_causal_lm(hf_dir) if hf and not has_weights(hf_dir) else None
            with full_checkpoint(hf_dir, scratch=Path(build_dir), model=torch_model) as checkpoint:
                del torch_model
                for precision in to_build:
                    builds[precision] = build_genai(hf_dir, Path(build_dir) / precision, precision, reuse=False,
                                                    checkpoint=checkpoint)
                if hf:
                    workers["hf"] = stack.enter_context(PeerWorker("hf", config("hf", checkpoint, hf_options)))
        builds = {precision: builds[precision] for precision in precisions}  # in the order asked for
        if hf and "hf" not in workers:
            workers["hf"] = stack.enter_context(PeerWorker("hf", config("hf", hf_dir, hf_options)))
        runs: list[PeerRun] = []
        if artifact is not None:
            workers["specrt"] = stack.enter_context(
                PeerWorker("specrt", config("specrt", artifact, [{"method": "baseline"}])))
            runs += [PeerRun(f"specrt/{variant}/{m}", "specrt", {"method": m})
                     for m in ("baseline", *(m for m in methods if m != "baseline"))]
        for precision in precisions:
            key = f"genai/{precision}"
            options = [{"speculative": None}, {"speculative": genai_ngram}]
            workers[key] = stack.enter_context(
                PeerWorker(key, config("genai", Path(build_dir) / precision, options)))
            runs += [PeerRun(f"ort-genai/{precision}/plain", key, options[0]),
                     PeerRun(f"ort-genai/{precision}/ngram", key, options[1])]
        if llama_cpp is not None:
            gguf_path = find_gguf(gguf)
            options = [{"speculative": None}, {"speculative": llama_lookup}]
            workers["llama.cpp"] = stack.enter_context(PeerWorker("llama.cpp", WorkerConfig(
                "llama_cpp", str(gguf_path.resolve()), threads, tuple(eos), tuple(int(t) for t in prompts[0]),
                min(WARMUP_TOKENS, max_new_tokens), tuple(options), package=str(Path(llama_cpp).resolve()),
                n_ctx=n_ctx_for(prompts, max_new_tokens, llama_lookup))))
            quant = gguf_quant(gguf_path)
            runs += [PeerRun(f"llama.cpp/{quant}/plain", "llama.cpp", options[0]),
                     PeerRun(f"llama.cpp/{quant}/prompt_lookup", "llama.cpp", options[1])]
        if hf:
            runs += [PeerRun(f"hf/fp32/{'prompt_lookup' if o['prompt_lookup'] else 'plain'}", "hf", o, rounds=1,
                             prompts=transformers_prompts) for o in hf_options]
            # specrt's verifier on the same torch model (backend "hf"): plain decoding and the methods
            workers["specrt_hf"] = stack.enter_context(
                PeerWorker("specrt_hf", config("specrt_hf", hf_dir, [{"method": "baseline"}])))
            runs += [PeerRun(f"specrt-hf/fp32/{m}", "specrt_hf", {"method": m}, rounds=1, prompts=transformers_prompts)
                     for m in ("baseline", *(m for m in methods if m != "baseline" and m not in NEEDS_DATASTORE))]
        results: dict[str, list[list[Any]]] = {r.name: [[] for _ in range(rounds)] for r in runs}
        seen_by_specrt: set[tuple[int, int]] = set()  # (round, prompt)
        for r, i, peer_run in interleave(runs, len(prompts), rounds):
            options = peer_run.options
            if peer_run.worker == "specrt" and (r, i) not in seen_by_specrt:
                seen_by_specrt.add((r, i))
                options = {**options, "cold": True}  # the prompt's first specrt run: an empty prefix cache
            results[peer_run.name][r].append(workers[peer_run.worker].generate(prompts[i], max_new_tokens, options))
    cold_prefill([r.name for r in runs if r.worker == "specrt"], results)
    reports = [_report(peer_run, [rr for rr in results[peer_run.name] if rr]) for peer_run in runs]
    reference = reports[0] if artifact is not None else next(
        (r for r in reports if r["name"] == "hf/fp32/plain"), reports[0] if reports else None)
    if reference is not None:
        add_token_match(reports, reference)
    return {
        "hf_dir": str(hf_dir),
        "artifact": str(artifact) if artifact else None,
        "questions": [q.question_id for q in questions],
        "prompt_tokens": [len(p) for p in prompts],
        "prompt_ids": [p.tolist() for p in prompts],
        "eos_token_ids": eos,
        "max_new_tokens": max_new_tokens,
        "threads": threads,
        "rounds": rounds,
        "cpu_count": os.cpu_count(),
        "versions": versions(),
        "builds": builds,
        "llama_cpp_build": llama_record,
        "runs": reports,
    }


def cold_prefill(names: Sequence[str], results: dict[str, list[list[Any]]]) -> None:
    """Gives every run of ``names`` (specrt's, which share one prefix cache) the cold prefill of
    its prompt in its round: the one run of the prompt that did not reuse cached prompt rows
    (``stats["cached_prompt_tokens"] == 0``), as the benchmark stage reports plain decoding's cold
    prefill for every method of a prompt. Results are (ids, prefill_s, decode_s, first, stats)."""
    if not names:
        return
    for r, one_round in enumerate(results[names[0]]):
        for i in range(len(one_round)):
            cold = [results[n][r][i][1] for n in names if not results[n][r][i][4].get("cached_prompt_tokens")]
            if len(cold) != 1:
                raise RuntimeError(f"round {r}, prompt {i}: {len(cold)} specrt runs prefilled cold, expected one")
            for n in names:
                ids, _, decode_s, first, stats = results[n][r][i]
                results[n][r][i] = (ids, cold[0], decode_s, first, stats)


def _report(peer_run: PeerRun, by_round: Sequence[Sequence[tuple]]) -> dict[str, Any]:
    """One run's entry: sums over every round and prompt (``_tally``; ids of the first round),
    each round's decode tok/s, whether every round gave the same ids, and the speculative options
    and counters of the peers that report them."""
    flat = [(ids, pre, dec, first) for one in by_round for ids, pre, dec, first, _ in one]
    report = _tally(peer_run.name, flat)
    report["ids"] = [ids.tolist() for ids, *_ in by_round[0]]
    report["round_decode_tokens_per_s"] = [_tally(peer_run.name, [x[:4] for x in one])["decode_tokens_per_s"]
                                           for one in by_round]
    report["repeatable"] = all([ids.tolist() for ids, *_ in one] == report["ids"] for one in by_round)
    options = peer_run.options
    if options.get("speculative"):
        report["speculative_options"] = dict(options["speculative"])
        stats = [s for one in by_round for *_, s in one]
        totals = {k: int(sum(s.get(k, 0) for s in stats)) for k in SPEC_STATS}
        totals["acceptance"] = round(totals["draft_tokens_accepted"] / totals["draft_tokens_proposed"], 4) \
            if totals["draft_tokens_proposed"] else 0.0
        report["speculative_stats"] = totals
    if options.get("prompt_lookup"):
        report["prompt_lookup_num_tokens"] = options["prompt_lookup"]
    return report


def metrics(report: dict[str, Any]) -> dict[str, Any]:
    """Decode tok/s, prefill and token match per run (and ``token_match_plain``, a speculative peer's
    match against its own plain run, e.g. llama.cpp's prompt lookup against llama.cpp plain), and
    every specrt run's decode tok/s over every peer's (``ratios["specrt/int4/pld /
    ort-genai/int4/ngram"]``, ``ratios["specrt/int4/baseline / llama.cpp/q4_k_m/plain"]``: summed
    over the rounds; ``round_ratios``: the same ratio in each round both runs took part in);
    ``stage_s`` when the report has it."""
    keys = ("decode_tokens_per_s", "prefill_s", "token_match", "token_match_plain")
    runs = {r["name"]: {k: r[k] for k in keys if k in r} for r in report["runs"]}
    per_round = {r["name"]: r.get("round_decode_tokens_per_s", [r["decode_tokens_per_s"]]) for r in report["runs"]}
    ours = [n for n in runs if n.startswith("specrt/")]
    pairs = [(a, b) for a in ours for b in runs if b not in ours and runs[b]["decode_tokens_per_s"] > 0]
    ratios = {f"{a} / {b}": round(runs[a]["decode_tokens_per_s"] / runs[b]["decode_tokens_per_s"], 3)
              for a, b in pairs}
    round_ratios = {f"{a} / {b}": [round(x / y, 3) for x, y in zip(per_round[a], per_round[b], strict=False)
                                  if y > 0]
                    for a, b in pairs}
    out = {"threads": report["threads"], "prompts": len(report["prompt_ids"]), "rounds": report.get("rounds", 1),
           "max_new_tokens": report["max_new_tokens"], "runs": runs, "ratios": ratios,
           "round_ratios": round_ratios}
    if "stage_s" in report:
        out["stage_s"] = report["stage_s"]
    return out


def artifact_variant(folder: Path) -> str:
    """The variant (``fp32``, ``int8``, ``int4``) of a specrt artifact folder, from its manifest."""
    from specrt.backend.manifest import read_manifest

    return read_manifest(Path(folder), check_hashes=False).variant


def _llama_params(parser: argparse.ArgumentParser, args: argparse.Namespace, section: Any) -> None:
    """``<section>.llama_cpp`` of params.yaml: ``enabled: false`` drops ``--llama-cpp``, ``enabled: true``
    needs it and ``--gguf``; the lookup options set ``--llama-*``; ``version``, ``cmake_args`` and
    ``skip_common`` are the build stage's (pipeline.llama_build)."""
    where = f"{args.params}: {args.section}.llama_cpp"
    known = {"enabled", "version", "cmake_args", "skip_common", "num_pred_tokens", "max_ngram_size"}
    if not isinstance(section, dict) or "enabled" not in section or set(section) - known:
        parser.error(f"{where} must be a mapping with `enabled` and any of {', '.join(sorted(known - {'enabled'}))}"
                     + (f"; {sorted(set(section) - known)[0]} is not one" if isinstance(section, dict)
                        and set(section) - known else ""))
    if not section["enabled"]:
        args.llama_cpp = None
    elif args.llama_cpp is None or args.gguf is None:
        parser.error(f"{where}.enabled is true: pass the llama_cpp stage's folder (--llama-cpp) and the GGUF (--gguf)")
    for key in ("num_pred_tokens", "max_ngram_size"):
        if key in section:
            setattr(args, f"llama_{key}", int(section[key]))


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the stage's wall time goes into its report and metrics (stage_s)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hf", type=Path, required=True, help="HF checkpoint folder (weights stage)")
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--build-dir", type=Path,
                        help="onnxruntime-genai builds go to DIR/<precision> (default: a temporary folder)")
    parser.add_argument("--out", type=Path, required=True, help="report JSON to write")
    parser.add_argument("--metrics", type=Path, help="small metrics JSON to write: tok/s per run and our ratios")
    parser.add_argument("--precisions", nargs="*", default=list(GENAI_PRECISIONS), choices=GENAI_PRECISIONS)
    parser.add_argument("--per-task", type=int, default=1, help="first turns per Spec-Bench task")
    parser.add_argument("--max-prompts", type=int, help="keep the first N of those prompts")
    parser.add_argument("--max-prompt-tokens", type=int, default=2048,
                        help="a longer prompt keeps its last tokens (the end of the question and the template)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, help="intra-op threads of every peer (default: each one's own)")
    parser.add_argument("--prompt-lookup", type=int, default=10,
                        help="transformers prompt_lookup_num_tokens (0: no prompt-lookup run)")
    parser.add_argument("--genai-ngram-size", type=int, default=GENAI_NGRAM["ngram_size"])
    parser.add_argument("--genai-max-draft-tokens", type=int, default=GENAI_NGRAM["max_draft_tokens"])
    parser.add_argument("--artifact", type=Path, help="a specrt artifact: encodes the prompts, runs specrt "
                        "baseline and --methods beside the peers, and is the token-match reference")
    parser.add_argument("--methods", nargs="*", default=["pld"],
                        help="specrt methods run on --artifact besides its plain decoding (default: pld)")
    parser.add_argument("--datastore", type=Path,
                        help="retrieval datastore of --artifact (needed by rest, sam_decoding, asam, asam_verify)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of the interleaved runs (transformers runs in the first only)")
    parser.add_argument("--transformers-prompts", type=int,
                        help="the transformers runs take the first N prompts (default: all)")
    parser.add_argument("--no-hf", action="store_true", help="leave out the transformers peer")
    parser.add_argument("--rebuild", action="store_true", help="rebuild genai models even if built by the same command")
    parser.add_argument("--llama-cpp", type=Path, help="the llama_cpp stage's folder (python -m pipeline.llama_build): "
                        "runs llama.cpp on --gguf, plain and with its prompt lookup")
    parser.add_argument("--gguf", type=Path, help="the GGUF llama.cpp runs: a file, or a folder holding one "
                        "(the weights stage's artifacts/M/gguf)")
    parser.add_argument("--llama-num-pred-tokens", type=int, default=LLAMA_LOOKUP["num_pred_tokens"],
                        help="LlamaPromptLookupDecoding num_pred_tokens")
    parser.add_argument("--llama-max-ngram-size", type=int, default=LLAMA_LOOKUP["max_ngram_size"],
                        help="LlamaPromptLookupDecoding max_ngram_size")
    parser.add_argument("--params", type=Path, help="params.yaml: its `peers` section sets the options above "
                        "(same names; prompts_per_task is --per-task); `variants` is dvc.yaml's (one stage run "
                        "per variant: --artifact and --precisions), `transformers_with` lists the variants of "
                        "--artifact that also run the transformers peer; `llama_cpp`: {enabled (false: no "
                        "llama.cpp runs), num_pred_tokens, max_ngram_size; version, cmake_args, skip_common: "
                        "the build's}")
    parser.add_argument("--section", default="peers",
                        help="the params.yaml section read by --params (peers_full: the full run)")
    args = parser.parse_args(argv)
    if args.params:
        section = stage_params(args.params, args.section)
        known = {"variants", "transformers_with", "methods", "prompts_per_task", "max_prompts", "max_prompt_tokens",
                 "max_new_tokens", "threads", "prompt_lookup", "genai_ngram_size", "genai_max_draft_tokens", "rounds",
                 "transformers_prompts", "llama_cpp"}
        if set(section) - known:
            parser.error(f"{args.params}: {args.section}.{sorted(set(section) - known)[0]} is not an option "
                         f"(known: {', '.join(sorted(known))})")
        for key, value in section.items():
            if key == "transformers_with":  # without --artifact, transformers is the reference: it runs
                if args.artifact is not None and artifact_variant(args.artifact) not in value:
                    args.no_hf = True
            elif key == "llama_cpp":
                _llama_params(parser, args, value)
            elif key != "variants":
                setattr(args, {"prompts_per_task": "per_task"}.get(key, key), value)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="specrt-peers-") as tmp:
        report = run(
            args.hf, args.prompts, args.build_dir or Path(tmp), precisions=args.precisions, per_task=args.per_task,
            max_prompts=args.max_prompts, max_prompt_tokens=args.max_prompt_tokens,
            max_new_tokens=args.max_new_tokens, threads=args.threads, prompt_lookup=args.prompt_lookup,
            genai_ngram={"ngram_size": args.genai_ngram_size, "max_draft_tokens": args.genai_max_draft_tokens},
            artifact=args.artifact, methods=args.methods, datastore=args.datastore, hf=not args.no_hf,
            rebuild=args.rebuild, rounds=args.rounds, transformers_prompts=args.transformers_prompts,
            llama_cpp=args.llama_cpp, gguf=args.gguf,
            llama_lookup={"max_ngram_size": args.llama_max_ngram_size, "num_pred_tokens": args.llama_num_pred_tokens},
        )
    report["stage_s"] = round(time.perf_counter() - started, 1)
    write_text_atomic(args.out, json.dumps(report, indent=2) + "\n")
    if args.metrics:
        write_text_atomic(args.metrics, json.dumps(metrics(report), indent=2) + "\n")
    for r in report["runs"]:
        rounds = "/".join(f"{x:.2f}" for x in r["round_decode_tokens_per_s"])
        log.info("%-28s decode %7.2f tok/s (%d tokens; rounds %s)  prefill %.2f s  match %.3f vs %s%s", r["name"],
                 r["decode_tokens_per_s"], r["decode_tokens"], rounds, r["prefill_s"], r["token_match"],
                 r["token_match_vs"],
                 f", {r['token_match_plain']:.3f} vs its plain run" if "token_match_plain" in r else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
