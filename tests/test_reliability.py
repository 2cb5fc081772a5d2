"""Reliability: bad input, faults and concurrency never crash the runtime or lose data.

One row of the issue per section; tests/runtime/test_errors.py holds the first checks of bad input
(missing files, option ranges, unknown names) on every architecture. Here one tiny model (qwen2)
built once for the module.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

import specrt
from pipeline import corpora, export
from pipeline.lib.atomic import staged_dir, write_text_atomic
from specrt import ArtifactError, InvalidRequestError
from specrt.cli import main as cli_main
from specrt.drafters import pld
from specrt.drafters.indexes.datastore import MANIFEST_NAME as DATASTORE_MANIFEST
from specrt.drafters.indexes.datastore import open_datastore, write_datastore
from specrt.errors import DrafterError, SpecrtError
from specrt.tree import DraftTree
from tests.helpers import EOS, PROMPTS, tiny_tokenizer
from tests.tiny import build_tiny_artifact, tiny_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_artifact("qwen2", tmp_path_factory.mktemp("reliability") / "fp32")[0]


@pytest.fixture(scope="module")
def model(folder):
    return specrt.load(folder, threads=1)


@pytest.fixture
def copy(folder, tmp_path):
    dst = tmp_path / "artifact"
    shutil.copytree(folder, dst)
    return dst


def edit_manifest(folder: Path, **fields) -> None:
    raw = json.loads((folder / "manifest.json").read_text())
    raw.update(fields)
    (folder / "manifest.json").write_text(json.dumps(raw))


# ---------------------------------------------------------------------------------------------
# artifact folder, manifest, corpus


def test_corrupt_artifact_is_refused_before_anything_loads(copy, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("a session or tokenizer was loaded from a corrupt folder")

    monkeypatch.setattr("specrt.model.DecoderSession", must_not_run)
    monkeypatch.setattr("specrt.model.Tokenizer.from_file", must_not_run)
    data = bytearray((copy / "tokenizer.json").read_bytes())
    data[-3] ^= 0x01
    (copy / "tokenizer.json").write_bytes(bytes(data))
    expected = json.loads((copy / "manifest.json").read_text())["files"]["tokenizer.json"]["sha256"]
    found = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(ArtifactError, match=rf"tokenizer\.json: sha256 differs .*expected {expected}, found {found}"):
        specrt.load(copy)


def test_complete_folder_without_its_manifest_is_refused(copy):
    (copy / "manifest.json").unlink()  # the pipeline writes it last: a folder without it is half-written
    with pytest.raises(ArtifactError, match=r"manifest\.json: no manifest"):
        specrt.load(copy)


@pytest.mark.parametrize("fmt", ["specrt-decoder/2", "specrt-decoder/0", None])
def test_manifest_of_another_format_names_both_versions(copy, fmt):
    edit_manifest(copy, format=fmt)
    with pytest.raises(ArtifactError, match=rf"'format' is {fmt!r}, expected 'specrt-decoder/1'"):
        specrt.load(copy)


def test_corpus_of_another_tokenizer_is_refused_naming_both_hashes(folder, tmp_path):
    other = hashlib.sha256(b"another tokenizer.json").hexdigest()
    store = tmp_path / "datastore"
    write_datastore(store, [("code", "test", [np.array([5, 6, 7, 8, 5, 6], np.int32)])], other)
    ours = json.loads((folder / "manifest.json").read_text())["files"]["tokenizer.json"]["sha256"]
    with pytest.raises(ArtifactError, match=rf"tokenizer sha256 {other}, the model's tokenizer is {ours}"):
        specrt.load(folder, datastore=store)


# ---------------------------------------------------------------------------------------------
# the context


def test_prompt_that_does_not_fit_fails_before_any_work(model, monkeypatch):
    def forward(*args, **kwargs):
        raise AssertionError("the decoder ran")

    monkeypatch.setattr("specrt.backend.session.OrtDecoder.forward", forward)
    context = model.manifest.dims.max_context
    with pytest.raises(InvalidRequestError, match=rf"at most {context - 1} prompt tokens"):
        model.generate_ids([7] * context, max_new_tokens=0)


@pytest.mark.parametrize(("method", "tree"), [("baseline", False), ("pld", False), ("pld", True)])
def test_generation_stops_cleanly_when_the_context_is_full(model, method, tree):
    context = model.manifest.dims.max_context
    prompt = model.encode(PROMPTS[0] * 20)[: context - 6]  # room for 6 new tokens
    free = model.generate_ids(prompt[:-20], method="baseline", max_new_tokens=26)[0]
    assert not np.isin(free, model.manifest.eos_token_ids).any()  # precondition: no EOS in reach

    ids, loop = model.generate_ids(prompt, method=method, tree=tree, max_new_tokens=50)
    assert len(ids) == 6 and loop.finish_reason == "context"
    assert ids.tolist() == model.generate_ids(prompt, method="baseline", max_new_tokens=6)[0].tolist()
    exact, loop = model.generate_ids(prompt, method=method, tree=tree, max_new_tokens=6)
    assert exact.tolist() == ids.tolist() and loop.finish_reason == "length"  # asked for exactly the room


def test_last_prompt_token_that_fits_gives_one_token(model):
    context = model.manifest.dims.max_context
    result = model.generate_ids([7] * (context - 1), method="pld", max_new_tokens=10)
    assert len(result[0]) == 1 and result[1].finish_reason in ("context", "eos")


# ---------------------------------------------------------------------------------------------
# request options


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"max_new_tokens": 1.5}, "max_new_tokens must be an int"),
        ({"max_new_tokens": True}, "max_new_tokens must be an int, got bool"),
        ({"max_new_tokens": "8"}, "max_new_tokens must be an int, got str"),
        ({"max_new_tokens": -3}, "max_new_tokens must be >= 0"),
        ({"draft_budget": 2.0}, "draft_budget must be an int"),
        ({"draft_budget": False}, "draft_budget must be an int, got bool"),
        ({"prefill_chunk": 0}, "prefill_chunk must be >= 1"),
        ({"seed": 1.5}, "seed must be an int"),
        ({"seed": "42"}, "seed must be an int"),
        ({"seed": True}, "seed must be an int, got bool"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"temperature": -0.1}, "temperature must be a finite number >= 0"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"temperature": True}, "temperature must be a number, got bool"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.01}, r"top_p must be in \(0, 1\]"),
        ({"top_p": float("nan")}, "top_p must be a finite number"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"top_k": 2.5}, "top_k must be an int"),
        ({"top_k": True}, "top_k must be an int, got bool"),
        ({"tree": "yes"}, "tree must be a bool"),
        ({"method": 123}, "method must be a method name .*baseline.* or a Drafter"),
        ({"method": None}, "method must be a method name"),
    ],
)
def test_bad_option_is_refused_naming_the_argument(model, options, argument):
    with pytest.raises(InvalidRequestError, match=argument):
        model.generate("def add(", **options)
    assert isinstance(InvalidRequestError(), ValueError)


@pytest.mark.parametrize(
    ("prompt_ids", "message"),
    [
        ([1.5, 2.0], "prompt token ids must be ints, got dtype float64"),
        ([True, False], "prompt token ids must be ints, got dtype bool"),
        ([[1, 2], [3, 4]], "prompt token ids must be 1-D"),
        ([1, -1], r"prompt token ids must lie in \[0, 320\)"),
        ([], "prompt is empty"),
    ],
)
def test_bad_prompt_ids_are_refused(model, prompt_ids, message):
    with pytest.raises(InvalidRequestError, match=message):
        model.generate_ids(prompt_ids)


def test_numpy_ints_are_ints(model):
    a = model.generate_ids(np.array([5, 6, 7], np.int32), max_new_tokens=np.int64(4), seed=np.int64(1))[0]
    b = model.generate_ids([5, 6, 7], max_new_tokens=4, seed=1)[0]
    assert a.tolist() == b.tolist() and len(a) <= 4


@pytest.mark.parametrize("method", ["baseline", "pld", "suffix_decoding"])
def test_zero_new_tokens_is_an_empty_completion(model, method):
    result = model.generate("def add(", max_new_tokens=0, method=method, tree=True)
    assert (result.token_ids, result.text, result.finish_reason) == ((), "", "length")
    assert list(model.stream("def add(", max_new_tokens=0, method=method)) == []


# ---------------------------------------------------------------------------------------------
# prompt text


def test_lone_surrogate_is_refused(model):
    with pytest.raises(InvalidRequestError, match=r"lone surrogate U\+D800 at index 4"):
        model.generate("def \ud800(", max_new_tokens=3)


def test_control_characters_generate(model):
    result = model.generate("\x00\x01\x07\x1b[0m\r\n\t\x7f def add(", max_new_tokens=5)
    assert 1 <= len(result.token_ids) <= 5


def test_very_long_tokens_generate_or_fail_cleanly_and_fast(model):
    t0 = time.perf_counter()
    fits = model.generate("x" * 200, method="pld", max_new_tokens=5)  # no spaces: one long pre-token
    assert 1 <= len(fits.token_ids) <= 5
    with pytest.raises(InvalidRequestError, match="does not fit the model's context"):
        model.generate("y" * 10_000, method="pld", max_new_tokens=5)
    with pytest.raises(InvalidRequestError, match="does not fit the model's context"):
        model.generate("\U0001f600" * 10_000, method="suffix_decoding", max_new_tokens=5)
    assert time.perf_counter() - t0 < 30


def test_cli_refuses_undecodable_input_without_traceback(folder, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"def \xff\xfe add("), encoding="utf-8"))
    assert cli_main(["generate", "--model", str(folder), "-"]) == 2
    # bytes that are not UTF-8 on the command line reach Python as lone surrogates (surrogateescape)
    assert cli_main(["generate", "--model", str(folder), "def \udcff("]) == 2
    err = capsys.readouterr().err
    assert "stdin is not valid utf-8 text: byte 4" in err and "lone surrogate U+DCFF" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# interrupted pipeline stages


def test_staged_dir_replaces_only_on_success(tmp_path):
    final = tmp_path / "out"
    with staged_dir(final) as stage:
        (stage / "a.txt").write_text("old")
    assert (final / "a.txt").read_text() == "old"
    with pytest.raises(RuntimeError, match="interrupted"):
        with staged_dir(final) as stage:
            (stage / "a.txt").write_text("half")
            raise RuntimeError("interrupted")
    assert (final / "a.txt").read_text() == "old"
    with staged_dir(final) as stage:
        (stage / "b.txt").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no stage or old copy left behind


def test_write_text_atomic_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "report.json"
    write_text_atomic(path, '{"a": 1}\n')
    with pytest.raises(TypeError):
        write_text_atomic(path, 123)  # fails mid-write
    assert path.read_text() == '{"a": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


KILLED_STAGE = """
import os, signal, sys
from pathlib import Path
from pipeline.lib.atomic import staged_dir
with staged_dir(Path(sys.argv[1])) as stage:
    (stage / "decoder.onnx").write_bytes(b"half a graph")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_killed_stage_leaves_the_old_output_and_a_rerun_completes(tmp_path):
    final = tmp_path / "fp32"
    final.mkdir()
    (final / "manifest.json").write_text("old")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "runtime")])}
    run = subprocess.run([sys.executable, "-c", KILLED_STAGE, str(final)], env=env, cwd=ROOT)
    assert run.returncode == -9
    assert [p.name for p in final.iterdir()] == ["manifest.json"] and (final / "manifest.json").read_text() == "old"
    assert any(p.name.startswith(".fp32.partial-") for p in tmp_path.iterdir())  # the killed stage's leftovers
    with staged_dir(final) as stage:  # the rerun
        (stage / "manifest.json").write_text("new")
    assert (final / "manifest.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["fp32"]  # leftovers removed


@pytest.fixture(scope="module")
def hf_parts(tmp_path_factory):
    tokenizer_json = tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token=EOS)
    return tiny_model("qwen2", hf_tok.vocab_size, hf_tok.eos_token_id), hf_tok, tokenizer_json


def interrupted_export(model, out: Path, monkeypatch) -> None:
    def export_onnx(torch_model, dims, path, opset, attention, image_token_id=None):
        path.write_bytes(b"half a graph")
        raise KeyboardInterrupt  # as if killed mid-write

    monkeypatch.setattr(export, "export_onnx", export_onnx)
    torch_model, hf_tok, tokenizer_json = model
    with pytest.raises(KeyboardInterrupt):
        export.build_artifact(
            torch_model, hf_tok, tokenizer_json, out, name="tiny", max_context=64, opset=20,
            check_ids=np.arange(20), tolerance=1e-3, prefill_chunk=8,
        )


def test_interrupted_export_publishes_nothing(hf_parts, tmp_path, monkeypatch):
    out = tmp_path / "fp32"
    interrupted_export(hf_parts, out, monkeypatch)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_export_keeps_the_old_artifact(hf_parts, folder, tmp_path, monkeypatch):
    out = tmp_path / "fp32"
    shutil.copytree(folder, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    interrupted_export(hf_parts, out, monkeypatch)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["fp32"]
    specrt.load(out)  # still loads


def test_interrupted_corpus_build_keeps_the_old_datastore(folder, tmp_path, monkeypatch):
    out = tmp_path / "datastore"
    texts = [("code", "test", ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n"])]
    corpora.build_from_texts(texts, folder / "tokenizer.json", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def write_datastore_then_die(stage, sources, sha):
        (stage / "tokens.npy").write_bytes(b"half an array")
        raise KeyboardInterrupt

    monkeypatch.setattr(corpora, "write_datastore", write_datastore_then_die)
    with pytest.raises(KeyboardInterrupt):
        corpora.build_from_texts(texts, folder / "tokenizer.json", out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["datastore"]
    specrt.load(folder, datastore=out)  # the old datastore still loads


def test_datastore_without_its_manifest_is_refused(folder, tmp_path):
    out = tmp_path / "datastore"
    corpora.build_from_texts([("code", "test", ["def add(a, b): return a + b"])], folder / "tokenizer.json", out)
    (out / DATASTORE_MANIFEST).unlink()
    with pytest.raises(ArtifactError, match=DATASTORE_MANIFEST):
        open_datastore(out, tokenizer_sha256=None)


# ---------------------------------------------------------------------------------------------
# concurrency

CONCURRENT = [  # (method, tree, sampling options)
    ("pld", False, {}),
    ("pld", True, {}),
    ("suffix_decoding", False, {}),
    ("suffix_decoding", True, {}),
    ("pld", True, {"temperature": 0.8, "top_k": 20, "seed": 3}),
]


def run_concurrently(jobs, threads: int) -> list:
    """Run the callables ``jobs`` on ``threads`` threads, started together; their results in order."""
    barrier = threading.Barrier(threads)

    def start(job):
        try:
            barrier.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass  # fewer jobs left than threads
        return job()

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(start, jobs))


@pytest.mark.parametrize("threads", [2, 4])
def test_threads_on_one_model_match_single_thread_runs(model, threads):
    prompts = [model.encode(p) for p in PROMPTS[:4]]
    cases = [(ids, method, tree, opts) for ids in prompts for method, tree, opts in CONCURRENT]

    def once(ids, method, tree, opts):
        return model.generate_ids(ids, method=method, tree=tree, max_new_tokens=24, **opts)[0].tolist()

    expected = [once(*case) for case in cases]
    jobs = [lambda case=case: once(*case) for case in cases * 2]
    assert run_concurrently(jobs, threads) == expected * 2


def test_two_models_in_one_process_share_no_state(folder, model):
    other = specrt.load(folder, threads=1)
    assert other.drafter_state is not model.drafter_state and other.verify_cost is not model.verify_cost
    prompts = [model.encode(p) for p in PROMPTS[:3]]
    expected = [model.generate_ids(ids, method="baseline", max_new_tokens=24)[0].tolist() for ids in prompts]
    other.drafter_state.clear()
    jobs = [
        lambda m=m, ids=ids, method=method: m.generate_ids(ids, method=method, tree=True, max_new_tokens=24)[0].tolist()
        for m in (model, other) for ids in prompts for method in ("suffix_decoding", "pld")
    ]
    assert run_concurrently(jobs, 4) == [e for _ in range(2) for e in expected for _ in range(2)]
    assert "suffix_decoding" in other.drafter_state
    fresh = specrt.load(folder, threads=1)
    assert fresh.drafter_state == {}  # a third loaded model starts empty: nothing leaked through a module


def test_interleaved_streams_in_one_thread(model):
    prompts = [model.encode(p) for p in PROMPTS[:3]]
    expected = [model.generate_ids(ids, method="pld", max_new_tokens=30)[0].tolist() for ids in prompts]
    streams = [model.stream_ids(ids, method=m, tree=True, max_new_tokens=30)[1]
               for ids, m in zip(prompts, ["pld", "suffix_decoding", "baseline"], strict=True)]
    outs: list[list[int]] = [[] for _ in streams]
    live = set(range(len(streams)))
    while live:  # one chunk of each live stream in turn
        for i in sorted(live):
            chunk = next(streams[i], None)
            if chunk is None:
                live.discard(i)
            else:
                outs[i] += chunk.tolist()
    assert outs == expected


def test_concurrent_requests_of_one_method_draft_on_private_state(model, references):
    model.drafter_state.clear()
    (ids, base), (other_ids, other_base) = references[0], references[1]
    held = model.stream_ids(ids, method="suffix_decoding", max_new_tokens=24)[1]
    out = next(held).tolist()  # a request in flight holds the shared suffix cache...
    cache = model.drafter_state["suffix_decoding"]
    assert cache.request_id == 1
    # ...so a concurrent one of the same method drafts on a private cache; another method on the shared state
    again = model.generate_ids(other_ids, method="suffix_decoding", max_new_tokens=24)[0]
    recycled = model.generate_ids(other_ids, method="token_recycling", max_new_tokens=24)[0]
    assert again.tolist() == recycled.tolist() == other_base.tolist()
    assert cache.request_id == 1 and "token_recycling" in model.drafter_state
    out += [t for chunk in held for t in chunk.tolist()]  # the held request was not disturbed
    assert out == base.tolist()
    model.generate_ids(other_ids, method="suffix_decoding", max_new_tokens=24)
    assert cache.request_id == 2  # given back at the end: the next request used the shared cache


def test_abandoned_streams_give_back_their_cache_and_state(model, references):
    model.drafter_state.clear()
    ids, base = references[0]
    held = model.stream(PROMPTS[0], method="suffix_decoding", max_new_tokens=30)
    next(held)
    cache = model.drafter_state["suffix_decoding"]
    del held  # abandoned mid-way
    gc.collect()
    never_started = model.stream_ids(ids, method="suffix_decoding")[1]
    del never_started  # abandoned before its first chunk
    gc.collect()
    assert model.generate_ids(ids, method="suffix_decoding", max_new_tokens=24)[0].tolist() == base.tolist()
    assert cache.request_id == 2  # the shared cache served the second request that began


# ---------------------------------------------------------------------------------------------
# faulty drafters


class Raising:
    def __init__(self, step: str):
        self.step = step

    def begin(self, prompt, hidden_states):
        if self.step == "begin":
            raise KeyError("no such thing")

    def propose(self, context, budget):
        if self.step == "propose":
            raise ValueError("boom")
        return DraftTree.chain([int(context[-1])])

    def observe(self, emitted, feedback):
        if self.step == "observe":
            raise ZeroDivisionError("division by zero")


class Proposing:
    """Proposes whatever ``make(context, budget)`` returns."""

    def __init__(self, make):
        self.make = make

    def begin(self, prompt, hidden_states):
        pass

    def propose(self, context, budget):
        return self.make(context, budget)

    def observe(self, emitted, feedback):
        pass


def mutated_parents(context, budget):
    tree = DraftTree.chain([1, 2, 3])
    tree.parents[2] = 5  # frozen dataclass, mutable array
    return tree


@pytest.mark.parametrize(
    ("drafter", "message"),
    [
        (Raising("begin"), r"drafter Raising raised KeyError in begin: 'no such thing'"),
        (Raising("propose"), r"drafter Raising raised ValueError in propose: boom"),
        (Raising("observe"), r"drafter Raising raised ZeroDivisionError in observe: division by zero"),
        (Proposing(lambda c, b: [1, 2]), r"drafter Proposing proposed a list, not a DraftTree"),
        (Proposing(lambda c, b: None), r"drafter Proposing proposed a NoneType, not a DraftTree"),
        (Proposing(lambda c, b: DraftTree.chain([5, 999])), r"proposed token id 999 outside \[0, 320\)"),
        (Proposing(lambda c, b: DraftTree.chain([-4])), r"proposed token id -4 outside \[0, 320\)"),
        (Proposing(lambda c, b: DraftTree.chain([5] * (b + 1))), r"proposed 9 nodes over its budget of 8"),
        (Proposing(mutated_parents), r"proposed parents\[2\] = 5: need -1 <= parents\[i\] < i"),
        (
            Proposing(lambda c, b: DraftTree(np.array([1.0, 2.0]), np.array([-1, 0]))),
            r"token_ids is a float64 array of shape \(2,\), not a 1-D int array",
        ),
        (
            Proposing(lambda c, b: DraftTree(np.array([1, 2]), np.array([-1]))),
            r"drafter Proposing raised ValueError in propose: DraftTree: token_ids",
        ),
        (
            Proposing(lambda c, b: DraftTree(np.array([1, 2]), np.array([-1, 0]), np.full((2, 7), 1 / 7))),
            r"proposed draft_probs of shape \(2, 7\), expected \(2, 320\)",
        ),
    ],
)
def test_faulty_drafter_is_named_and_the_model_stays_usable(model, drafter, message):
    with pytest.raises(DrafterError, match=message) as info:
        model.generate(PROMPTS[0], method=drafter, max_new_tokens=12, draft_budget=8)
    assert isinstance(info.value, SpecrtError)
    base = model.generate(PROMPTS[0], method="baseline", max_new_tokens=12)
    assert model.generate(PROMPTS[0], method="pld", max_new_tokens=12).token_ids == base.token_ids


def test_registered_drafter_is_named_by_its_method(model, monkeypatch):
    def propose(self, context, budget):
        raise ValueError("bad context")

    monkeypatch.setattr(pld.PromptLookup, "propose", propose)
    with pytest.raises(DrafterError, match=r"drafter 'pld' \(PromptLookup\) raised ValueError in propose: bad context"):
        model.generate(PROMPTS[0], method="pld", max_new_tokens=12)


# ---------------------------------------------------------------------------------------------
# a drafter can change the speed, never the text


@pytest.fixture(scope="module")
def references(model):
    """Greedy plain decoding of each prompt, 24 tokens (or up to EOS)."""
    return [(ids, model.generate_ids(ids, method="baseline", max_new_tokens=24)[0]) for ids in
            (model.encode(p) for p in PROMPTS)]


class RandomDrafter:
    """Random trees: each node's token is the true continuation (from ``oracle``) with probability
    ``hit``, else a random token; each node's parent is a random earlier node or the root."""

    def __init__(self, oracle: np.ndarray, prompt_len: int, seed: int, hit: float, tree: bool):
        self.oracle, self.prompt_len, self.hit, self.tree = oracle, prompt_len, hit, tree
        self.rng = np.random.default_rng(seed)

    def begin(self, prompt, hidden_states):
        pass

    def propose(self, context, budget):
        n = int(self.rng.integers(0, budget + 1))
        parents = np.arange(n) - 1
        if self.tree and n:
            parents = np.array([int(self.rng.integers(-1, i)) for i in range(n)], np.int64)
        depths = DraftTree(np.zeros(n, np.int64), parents).depths()
        ids = self.rng.integers(0, 320, n)
        for i, d in enumerate(depths):  # the token depth d after the context, if the oracle has it
            pos = len(context) - self.prompt_len + d - 1
            if pos < len(self.oracle) and self.rng.random() < self.hit:
                ids[i] = self.oracle[pos]
        return DraftTree(ids.astype(np.int64), parents.astype(np.int64))

    def observe(self, emitted, feedback):
        pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.integers(0, len(PROMPTS) - 1),
    seed=st.integers(0, 2**32 - 1),
    hit=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    tree=st.booleans(),
    budget=st.integers(0, 10),
    max_new_tokens=st.integers(1, 24),
    prefill_chunk=st.sampled_from([3, 16, 256]),
)
def test_random_drafters_never_change_greedy_output(
    model, references, prompt, seed, hit, tree, budget, max_new_tokens, prefill_chunk
):
    ids, base = references[prompt]
    drafter = RandomDrafter(base, len(ids), seed, hit, tree)
    out, loop = model.generate_ids(
        ids, method=drafter, tree=tree, max_new_tokens=max_new_tokens, draft_budget=budget,
        prefill_chunk=prefill_chunk,
    )
    assert out.tolist() == base[:max_new_tokens].tolist()
    assert loop.stats.accepted <= loop.stats.drafted


# ---------------------------------------------------------------------------------------------
# spec_safe=false


def test_spec_unsafe_model_warns_once_when_speculating(copy, caplog):
    edit_manifest(copy, spec_safe=False)
    with caplog.at_level(logging.WARNING, logger="specrt"):
        unsafe = specrt.load(copy)
        unsafe.generate("def add(", method="baseline", max_new_tokens=4)
        assert not [r for r in caplog.records if "spec_safe" in r.getMessage()]  # plain decoding is exact
        unsafe.generate("def add(", method="pld", max_new_tokens=4)
        unsafe.generate("def add(", method="suffix_decoding", tree=True, max_new_tokens=4)
    warnings = [r for r in caplog.records if "spec_safe=false" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "method='baseline' is exact" in warnings[0].getMessage()
