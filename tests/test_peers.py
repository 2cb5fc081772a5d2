"""Peers (pipeline/peers.py) on a tiny random Qwen2: onnxruntime-genai builds it, and every greedy
peer gives the ids of transformers' plain greedy decoding."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (pip install onnxruntime-genai)")

import onnx  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from pipeline import peers, weights  # noqa: E402
from pipeline.lib import checkpoint, genai_peer  # noqa: E402
from tests.helpers import EOS, PROMPTS, tiny_tokenizer  # noqa: E402
from tests.tiny import memorize, tiny_gguf, tiny_model  # noqa: E402

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    """A saved HF checkpoint of a tiny Qwen2 (head size 16, as the genai CPU rotary needs), and
    token-id prompts that repeat text it memorized (so n-gram drafts get accepted)."""
    root = tmp_path_factory.mktemp("peers")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tiny_tokenizer(root / "tokenizer.json")), eos_token=EOS)
    model = memorize(tiny_model("qwen2", tokenizer.vocab_size, tokenizer.eos_token_id), tokenizer)
    hf_dir = root / "hf"
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    prompts = [np.array(tokenizer(p)["input_ids"], np.int64) for p in PROMPTS[:3]]
    return hf_dir, prompts


@pytest.fixture(scope="module")
def hf_plain(tiny_hf: tuple[Path, list[np.ndarray]]) -> dict:
    hf_dir, prompts = tiny_hf
    return peers.run_hf(hf_dir, prompts, NEW_TOKENS, threads=1)


def test_genai_fp32_plain_and_ngram_equal_hf_greedy(tiny_hf, hf_plain, tmp_path):
    hf_dir, prompts = tiny_hf
    build = genai_peer.build_genai(hf_dir, tmp_path / "fp32", "fp32")
    assert build["reused"] is False and build["extra_options"] == {} and build["bytes"] > 0
    assert "-p fp32" in " ".join(build["command"])

    eos = json.loads((hf_dir / "config.json").read_text())["eos_token_id"]
    plain = peers.run_genai(tmp_path / "fp32", prompts, NEW_TOKENS, threads=1, name="ort-genai/fp32/plain")
    ngram = peers.run_genai(tmp_path / "fp32", prompts, NEW_TOKENS, threads=1, speculative=genai_peer.GENAI_NGRAM)
    assert plain["ids"] == hf_plain["ids"]
    assert ngram["ids"] == hf_plain["ids"]  # genai's n-gram speculation is lossless here
    assert ngram["speculative_stats"]["draft_tokens_proposed"] > 0  # and it did speculate
    # one prompt stops at EOS (kept in the ids, as specrt keeps it: genai's sequence leaves it out),
    # one runs to the limit
    assert {len(ids) for ids in plain["ids"]} >= {NEW_TOKENS} and any(ids[-1:] == [eos] for ids in plain["ids"])
    for run in (plain, ngram, hf_plain):
        assert run["decode_tokens"] == sum(len(ids) - 1 for ids in run["ids"])
        assert run["decode_s"] > 0 and run["prefill_s"] > 0


def test_hf_prompt_lookup_equals_hf_plain(tiny_hf, hf_plain):
    hf_dir, prompts = tiny_hf
    lookup = peers.run_hf(hf_dir, prompts, NEW_TOKENS, threads=1, prompt_lookup=10)
    assert lookup["name"] == "hf/fp32/prompt_lookup" and lookup["prompt_lookup_num_tokens"] == 10
    assert lookup["ids"] == hf_plain["ids"]
    # its first pass verifies drafts over the prompt: those tokens count to the prefill
    assert lookup["new_tokens"] == lookup["decode_tokens"] + lookup["prefill_tokens"]
    assert lookup["prefill_tokens"] >= len(prompts)


def _our_variant(name: str) -> dict:
    """params.yaml quantize.variants.<name>: the recipe the genai build is set against."""
    return yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text())["quantize"]["variants"][name]


def _genai_build(hf_dir: Path, out: Path, precision: str) -> tuple[onnx.GraphProto, list, list[dict]]:
    """Build ``precision`` with the builder's default options for it; (graph, MatMulNBits nodes, their attributes)."""
    build = genai_peer.build_genai(hf_dir, out, precision)
    assert build["extra_options"] == genai_peer.GENAI_OPTIONS[precision]
    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    return graph, nbits, [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nbits]


def test_genai_int4_build_follows_our_recipe(tiny_hf, tmp_path):
    # ours (params.yaml quantize.variants.int4): MatMulNBits 4-bit, block 32, symmetric,
    # accuracy_level 4, lm_head and embedding 4-bit
    ours = _our_variant("int4")
    assert (ours["bits"], ours["lm_head_bits"], ours["embedding_bits"]) == (4, 4, 4)
    assert genai_peer.GENAI_INT4_OPTIONS["accuracy_level"] == str(ours["accuracy_level"])
    assert genai_peer.GENAI_INT4_OPTIONS["block_size"] == str(ours["block_size"])
    assert genai_peer.GENAI_INT4_OPTIONS["is_symmetric"] == str(ours["symmetric"]).lower()
    hf_dir, prompts = tiny_hf
    graph, nbits, attrs = _genai_build(hf_dir, tmp_path / "int4", "int4")
    assert nbits and not [n for n in graph.node if n.op_type == "MatMul"]
    assert all(a["bits"] == 4 and a["block_size"] == 32 and a.get("accuracy_level", 0) == 4 for a in attrs)
    assert all(len(n.input) < 4 or not n.input[3] for n in nbits)  # symmetric: no zero points
    assert any(n.name.startswith("/lm_head/") for n in nbits)
    embed = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    assert len(embed) == 1 and {a.name: a.i for a in embed[0].attribute}.get("bits", 4) == 4  # ONNX default: 4

    run = peers.run_genai(tmp_path / "int4", prompts, NEW_TOKENS, threads=1, name="ort-genai/int4/plain")
    assert all(0 < len(ids) <= NEW_TOKENS for ids in run["ids"])


def test_genai_int8_build_is_8_bit_weights_and_activations_like_our_w8a8(tiny_hf, tmp_path):
    # ours (params.yaml quantize.variants.int8): W8A8, lm_head 8-bit, the embedding left fp32
    ours = _our_variant("int8")
    assert (ours["method"], ours["bits"], ours["lm_head_bits"], ours["embedding_bits"]) == ("specrt_w8a8", 8, 8, None)
    hf_dir, prompts = tiny_hf
    graph, nbits, attrs = _genai_build(hf_dir, tmp_path / "int8", "int8")
    assert nbits and not [n for n in graph.node if n.op_type == "MatMul"]
    assert all(a["bits"] == 8 and a["block_size"] == 32 and a.get("accuracy_level", 0) == 4 for a in attrs)
    assert any(n.name.startswith("/lm_head/") for n in nbits)
    assert not [n for n in graph.node if n.op_type == "GatherBlockQuantized"]  # the embedding stays fp32

    run = peers.run_genai(tmp_path / "int8", prompts, NEW_TOKENS, threads=1, name="ort-genai/int8/plain")
    assert all(0 < len(ids) <= NEW_TOKENS for ids in run["ids"])


def test_build_is_reused_when_the_command_is_the_same(tiny_hf, tmp_path):
    hf_dir, _ = tiny_hf
    first = genai_peer.build_genai(hf_dir, tmp_path / "fp32", "fp32")
    again = genai_peer.build_genai(hf_dir, tmp_path / "fp32", "fp32")
    assert again["reused"] is True and again["command"] == first["command"]
    record = json.loads((tmp_path / "fp32" / genai_peer.BUILD_RECORD).read_text())
    assert record["build_s"] == first["build_s"]


def test_failed_build_leaves_no_folder(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="builder exited"):
        genai_peer.build_genai(tmp_path / "broken", tmp_path / "out", "fp32")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["broken"]  # no stage or cache left behind


def test_a_folder_without_weights_or_gguf_pointer_fails_before_building(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty holds neither weights .* nor gguf.json"):
        genai_peer.build_genai(tmp_path / "empty", tmp_path / "out", "fp32")
    assert [p.name for p in tmp_path.iterdir()] == ["empty"]


def _gguf_backed_folder(hf_dir, tmp_path):
    """What the weights stage writes for the tiny model: ``tmp_path/hf`` whose gguf.json points to a GGUF."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    (tmp_path / "gguf").mkdir()
    gguf_path = tiny_gguf(model, hf_dir.parent / "tokenizer.json", tmp_path / "gguf" / "tiny.gguf")
    weights.convert(gguf_path, weights.sha256_file(gguf_path), tmp_path / "hf", PROMPTS[0], 4)


def test_genai_builds_a_checkpoint_whose_weights_are_a_gguf(tiny_hf, hf_plain, tmp_path):
    # The weights stage's folder keeps no float32 weights, only gguf.json -> the GGUF: the builder
    # gets a temporary full checkpoint, removed after the build.
    hf_dir, prompts = tiny_hf
    _gguf_backed_folder(hf_dir, tmp_path)  # tmp_path/hf: config + tokenizer + gguf.json
    assert not checkpoint.has_weights(tmp_path / "hf")

    build = genai_peer.build_genai(tmp_path / "hf", tmp_path / "builds" / "fp32", "fp32")
    assert "gguf.json" in build["source"] and "model.safetensors" not in build["source"]
    assert [p.name for p in (tmp_path / "builds").iterdir()] == ["fp32"]  # the checkpoint is gone
    plain = peers.run_genai(tmp_path / "builds" / "fp32", prompts, NEW_TOKENS, threads=1)
    assert plain["ids"] == hf_plain["ids"]
    assert peers.run_hf(tmp_path / "hf", prompts, NEW_TOKENS, threads=1)["ids"] == hf_plain["ids"]


def test_unknown_precision_fails_early(tmp_path):
    with pytest.raises(ValueError, match="precision must be one of .*'int3'"):
        genai_peer.build_genai(tmp_path, tmp_path / "out", "int3")


def test_token_match_counts_the_prefix_before_the_first_difference():
    reference = {"name": "ref", "ids": [[1, 2, 3, 4], [5, 6]]}
    runs = [
        {"name": "same", "ids": [[1, 2, 3, 4], [5, 6]]},
        {"name": "diverges", "ids": [[1, 2, 9, 4], [5, 6]]},  # 2 of 4, then 2 of 2
        {"name": "short", "ids": [[1, 2, 3], [5, 6]]},  # stopped early: 3 of 4
    ]
    peers.add_token_match(runs, reference)
    assert [r["token_match"] for r in runs] == [1.0, round(4 / 6, 6), round(5 / 6, 6)]
    assert [r["identical"] for r in runs] == [True, False, False]
    assert {r["token_match_vs"] for r in runs} == {"ref"}
    assert not any("token_match_plain" in r for r in runs)  # no plain run of their family
    first_only = [{"name": "first", "ids": [[1, 2, 9, 4]]}]  # a run of the first prompt only
    peers.add_token_match(first_only, reference)
    assert first_only[0]["token_match"] == 0.5 and first_only[0]["identical"] is False
    with pytest.raises(ValueError, match="3 outputs against a reference of 2"):
        peers.token_match([[1], [2], [3]], reference["ids"])


def test_speculative_runs_are_also_matched_against_their_own_plain_run():
    runs = [
        {"name": "specrt/int4/baseline", "ids": [[1, 2, 3]]},
        {"name": "ort-genai/int4/plain", "ids": [[1, 2, 7]]},
        {"name": "ort-genai/int4/ngram", "ids": [[1, 2, 7]]},  # lossless vs its plain run
        {"name": "hf/fp32/plain", "ids": [[1, 2, 3]]},
        {"name": "hf/fp32/prompt_lookup", "ids": [[1, 5, 3]]},  # diverges at 1 from its plain run
    ]
    peers.add_token_match(runs, runs[0])
    assert [r.get("token_match_plain") for r in runs] == [None, None, 1.0, None, round(1 / 3, 6)]
    assert [r["token_match"] for r in runs] == [1.0, round(2 / 3, 6), round(2 / 3, 6), 1.0, round(1 / 3, 6)]
    assert peers.plain_of("specrt/int4/pld") == "specrt/int4/baseline"


def test_metrics_give_each_of_our_runs_over_each_peer():
    from pipeline.peers import metrics

    def run(name, tps):
        return {"name": name, "decode_tokens_per_s": tps, "prefill_s": 0.5, "token_match": 1.0}

    report = {"threads": 2, "prompt_ids": [[1, 2], [3]], "max_new_tokens": 8,
              "runs": [run("specrt/int4/baseline", 10.0), run("specrt/int4/pld", 15.0),
                       run("ort-genai/int4/plain", 12.5), run("hf/fp32/plain", 0.0)]}
    m = metrics(report)
    assert m["prompts"] == 2 and set(m["runs"]) == {r["name"] for r in report["runs"]}
    assert m["ratios"] == {"specrt/int4/baseline / ort-genai/int4/plain": 0.8,
                           "specrt/int4/pld / ort-genai/int4/plain": 1.2}  # a peer at 0 tok/s gets no ratio
    report["runs"][1]["round_decode_tokens_per_s"] = [16.0, 14.0]
    report["runs"][2]["round_decode_tokens_per_s"] = [12.8, 12.5]  # rounds: the ratio per round
    assert metrics(report)["round_ratios"]["specrt/int4/pld / ort-genai/int4/plain"] == [1.25, 1.12]
    # a run without rounds counts as one round: 10 / 12.8
    assert metrics(report)["round_ratios"]["specrt/int4/baseline / ort-genai/int4/plain"] == [0.781]


def test_runs_interleave_prompt_by_prompt_and_odd_rounds_reverse_the_order():
    a, b = peers.PeerRun("a", "w1", {}), peers.PeerRun("b", "w2", {})
    hf = peers.PeerRun("hf", "w3", {}, rounds=1)  # first round only
    order = [(r, i, run.name) for r, i, run in peers.interleave([a, b, hf], prompts=2, rounds=3)]
    assert order == [(0, 0, "a"), (0, 0, "b"), (0, 0, "hf"), (0, 1, "a"), (0, 1, "b"), (0, 1, "hf"),
                     (1, 0, "b"), (1, 0, "a"), (1, 1, "b"), (1, 1, "a"),
                     (2, 0, "a"), (2, 0, "b"), (2, 1, "a"), (2, 1, "b")]
    assert peers.interleave([a], prompts=0, rounds=2) == []
    few = peers.PeerRun("few", "w3", {}, rounds=1, prompts=1)  # the first prompt only
    assert [(r, i, run.name) for r, i, run in peers.interleave([a, few], prompts=2, rounds=1)] == [
        (0, 0, "a"), (0, 0, "few"), (0, 1, "a")]


def test_specrt_runs_report_the_cold_prefill_of_their_prompt():
    ids = np.array([1, 2])
    results = {  # one round, two prompts: (ids, prefill_s, decode_s, first, stats)
        "specrt/int8/baseline": [[(ids, 0.9, 1.0, 1, {"cached_prompt_tokens": 0}),
                                  (ids, 0.01, 1.0, 1, {"cached_prompt_tokens": 256})]],
        "specrt/int8/pld": [[(ids, 0.02, 0.5, 1, {"cached_prompt_tokens": 300}),
                             (ids, 0.7, 0.5, 1, {"cached_prompt_tokens": 0})]],
    }
    peers.cold_prefill(list(results), results)
    assert [[x[1] for x in results[n][0]] for n in results] == [[0.9, 0.7], [0.9, 0.7]]
    assert [x[2] for x in results["specrt/int8/pld"][0]] == [0.5, 0.5]  # decode times untouched
    results["specrt/int8/pld"][0][0] = (ids, 0.8, 0.5, 1, {"cached_prompt_tokens": 0})  # two cold runs
    with pytest.raises(RuntimeError, match="round 0, prompt 0: 2 specrt runs prefilled cold"):
        peers.cold_prefill(list(results), results)


def test_a_worker_that_cannot_load_its_model_fails_with_its_name(tmp_path):
    from pipeline.lib.peer_worker import PeerWorker, WorkerConfig

    config = WorkerConfig("specrt", str(tmp_path / "missing"), 1, (0,), (1, 2), 2)
    with pytest.raises(RuntimeError, match="peer worker 'specrt/x' exited with status 1"):
        PeerWorker("specrt/x", config)
    with pytest.raises(ValueError, match="kind must be one of"):
        WorkerConfig("vllm", "p", 1, (0,), (1,), 2)


def test_params_file_sets_the_options_and_refuses_unknown_ones(tmp_path, monkeypatch):
    import pipeline.peers as peers

    seen = {}
    monkeypatch.setattr(peers, "run", lambda *a, **kw: seen.update(kw) or {"runs": []})
    params = tmp_path / "params.yaml"
    params.write_text("peers: {variants: [int4, int8], prompts_per_task: 2, max_prompts: 3, "
                      "max_new_tokens: 7, threads: 2, prompt_lookup: 0, rounds: 3, transformers_prompts: 2}\n")
    argv = ["--hf", "h", "--prompts", "q", "--out", str(tmp_path / "r.json"), "--params", str(params),
            "--precisions", "int8"]
    assert peers.main(argv) == 0
    assert (seen["precisions"], seen["per_task"], seen["max_prompts"], seen["max_new_tokens"], seen["threads"],
            seen["prompt_lookup"], seen["hf"]) == (["int8"], 2, 3, 7, 2, 0, True)
    assert (seen["rounds"], seen["transformers_prompts"]) == (3, 2)
    params.write_text("peers: {max_new_token: 7}\n")
    with pytest.raises(SystemExit):
        peers.main(argv)


def test_transformers_run_only_with_the_variants_named(tiny_artifact, tmp_path, monkeypatch):
    import pipeline.peers as peers

    folder, _ = tiny_artifact
    variant = peers.artifact_variant(folder)
    seen = {}
    monkeypatch.setattr(peers, "run", lambda *a, **kw: seen.update(kw) or {"runs": []})
    params = tmp_path / "params.yaml"
    argv = ["--hf", "h", "--prompts", "q", "--out", str(tmp_path / "r.json"), "--params", str(params),
            "--artifact", str(folder)]
    for listed, hf in (([variant], True), (["some-other-variant"], False)):
        params.write_text(yaml.safe_dump({"peers": {"transformers_with": listed}}))
        assert peers.main(argv) == 0
        assert seen["hf"] is hf and seen["artifact"] == folder
    params.write_text(yaml.safe_dump({"peers": {"transformers_with": [variant]}}))
    assert peers.main([*argv, "--no-hf"]) == 0 and seen["hf"] is False  # listed, but --no-hf wins
    without_artifact = argv[:-2]  # then transformers is every token match's reference: it runs
    params.write_text(yaml.safe_dump({"peers": {"transformers_with": ["some-other-variant"]}}))
    assert peers.main(without_artifact) == 0 and seen["hf"] is True and seen["artifact"] is None


def test_our_methods_run_after_plain_decoding_and_match_it(tiny_artifact, tmp_path):
    from tests.helpers import specbench_questions

    folder, _ = tiny_artifact
    questions = specbench_questions(tmp_path / "question.jsonl")
    report = peers.run(tmp_path / "no-hf", questions, tmp_path / "builds", precisions=(), max_prompts=2,
                       max_new_tokens=12, threads=1, artifact=folder, methods=("suffix_decoding", "pld"), hf=False,
                       rounds=2)
    variant = json.loads((folder / "manifest.json").read_text())["variant"]
    names = [r["name"] for r in report["runs"]]
    assert names == [f"specrt/{variant}/{m}" for m in ("baseline", "suffix_decoding", "pld")]
    assert [r["token_match"] for r in report["runs"]] == [1.0, 1.0, 1.0]
    assert all(len(r["round_decode_tokens_per_s"]) == 2 and r["repeatable"] for r in report["runs"])
    assert len({r["prefill_s"] for r in report["runs"]}) == 1  # each the cold prefill of its prompts
    assert all(r["decode_tokens"] == 2 * sum(len(ids) - 1 for ids in r["ids"]) for r in report["runs"])  # 2 rounds

    import specrt

    model = specrt.load(folder)
    full = [model.encode(q, chat=model.manifest.chat is not None) for q in PROMPTS[:2]]
    short = peers.run(tmp_path / "no-hf", questions, tmp_path / "builds", precisions=(), max_prompts=2,
                      max_prompt_tokens=5, max_new_tokens=4, threads=1, artifact=folder, methods=(), hf=False,
                      rounds=1)
    assert short["prompt_ids"] == [ids[-5:].tolist() for ids in full]  # a long prompt keeps its last tokens


def test_retrieval_methods_draft_from_the_datastore_given_and_are_refused_without_one(tiny_artifact, tmp_path):
    from pipeline.corpora import build_from_texts
    from tests.helpers import TRAINING_TEXT, specbench_questions

    folder, _ = tiny_artifact
    questions = specbench_questions(tmp_path / "question.jsonl")
    with pytest.raises(ValueError, match=r"methods \['asam_verify', 'rest'\] draft from a retrieval datastore"):
        peers.run(tmp_path / "no-hf", questions, tmp_path / "builds", precisions=(), artifact=folder,
                  methods=("pld", "asam_verify", "rest"), hf=False)
    store = tmp_path / "datastore"
    build_from_texts([("train", "tests.tiny.TRAINING_TEXT", TRAINING_TEXT)], folder / "tokenizer.json", store)
    report = peers.run(tmp_path / "no-hf", questions, tmp_path / "builds", precisions=(), max_prompts=2,
                       max_new_tokens=12, threads=1, artifact=folder, methods=("asam_verify",), datastore=store,
                       hf=False, rounds=1)
    runs = {r["name"].rsplit("/", 1)[1]: r for r in report["runs"]}
    assert list(runs) == ["baseline", "asam_verify"]
    assert runs["asam_verify"]["ids"] == runs["baseline"]["ids"] and runs["asam_verify"]["token_match"] == 1.0


def test_run_loads_a_gguf_checkpoint_once_and_not_at_all_when_builds_are_reused(tiny_hf, tmp_path, monkeypatch):
    # the builder's temporary checkpoint and the transformers runs share one load of the GGUF
    from tests.helpers import specbench_questions

    hf_dir, _ = tiny_hf
    _gguf_backed_folder(hf_dir, tmp_path)  # tmp_path/hf: config + tokenizer + gguf.json
    loads = []
    load_gguf = checkpoint.load_gguf
    monkeypatch.setattr(checkpoint, "load_gguf", lambda path: loads.append(path) or load_gguf(path))
    questions = specbench_questions(tmp_path / "question.jsonl")
    options = dict(precisions=("fp32",), max_prompts=1, max_new_tokens=4, threads=1, prompt_lookup=0)

    first = peers.run(tmp_path / "hf", questions, tmp_path / "builds", **options)
    assert len(loads) == 1 and first["builds"]["fp32"]["reused"] is False
    assert [r["name"] for r in first["runs"]] == ["ort-genai/fp32/plain", "ort-genai/fp32/ngram", "hf/fp32/plain",
                                                  "specrt-hf/fp32/baseline", "specrt-hf/fp32/pld"]
    by_name = {r["name"]: r for r in first["runs"]}
    # specrt's verifier on transformers' model: plain decoding equal to transformers' own, pld to both
    assert by_name["specrt-hf/fp32/baseline"]["ids"] == by_name["hf/fp32/plain"]["ids"]
    assert by_name["specrt-hf/fp32/pld"]["ids"] == by_name["hf/fp32/plain"]["ids"]
    again = peers.run(tmp_path / "hf", questions, tmp_path / "builds", **options, hf=False)
    assert len(loads) == 1 and again["builds"]["fp32"]["reused"] is True  # nothing to build, no transformers run
    assert again["runs"][0]["ids"] == first["runs"][0]["ids"]


# ---------------------------------------------------------------------------------------------
# llama.cpp (pipeline/llama_build.py, pipeline/lib/llama_peer.py)

LLAMA_BUILT = Path(__file__).parents[1] / "artifacts" / "peers" / "llama_cpp"  # the llama_cpp stage's output


def test_llama_build_params_of_the_repo_and_their_errors(tmp_path):
    from pipeline.llama_build import LlamaBuild, read_build

    repo_params = Path(__file__).parents[1] / "params.yaml"
    assert read_build(repo_params, "peers") is None  # the quick profile has no llama.cpp peer
    build = read_build(repo_params, "peers_full")  # pipeline/full/dvc.yaml's llama_cpp stage builds it
    assert build.version == "0.3.36" and "-DLLAVA_BUILD=OFF" in build.cmake_args  # no multimodal library
    assert "-DGGML_NATIVE=ON" in build.cmake_args and build.skip_common  # the CPU's own instructions
    params = tmp_path / "params.yaml"
    params.write_text("peers: {llama_cpp: {enabled: true, version: 0.3, cmake_args: []}}\n")  # a float
    with pytest.raises(ValueError, match="peers.llama_cpp.version must be a quoted string"):
        read_build(params, "peers")
    params.write_text("peers_full: {llama_cpp: {enabled: true, version: '0.3.36'}}\n")
    with pytest.raises(ValueError, match="peers_full.llama_cpp.cmake_args is missing"):
        read_build(params, "peers_full")
    params.write_text("peers: {llama_cpp: true}\n")
    with pytest.raises(ValueError, match="peers.llama_cpp must be a mapping with `enabled`"):
        read_build(params, "peers")
    params.write_text("peers: {llama_cpp: {enabled: false}}\npeers_full: {threads: 2}\n")  # off, or absent
    assert read_build(params, "peers") is None and read_build(params, "peers_full") is None
    with pytest.raises(SystemExit, match="no section 'peers_ful'"):
        read_build(params, "peers_ful")
    with pytest.raises(ValueError, match="exact version"):
        LlamaBuild(">=0.3", ())
    with pytest.raises(ValueError, match="-DNAME=VALUE without spaces, got 'GGML_NATIVE=ON'"):
        LlamaBuild("0.3.36", ("GGML_NATIVE=ON",))


def test_llama_build_command_installs_into_a_folder_from_source_without_pips_wheel_cache(tmp_path):
    from pipeline.llama_build import LlamaBuild, beside_command, check_source, cmake_env, pip_command

    build = LlamaBuild("0.3.36", ("-DLLAVA_BUILD=OFF", "-DGGML_NATIVE=ON"))
    cmd = pip_command(build, tmp_path / "out")
    assert cmd[1:4] == ["-m", "pip", "install"] and cmd[-1] == "llama-cpp-python==0.3.36"
    assert cmd[cmd.index("--target") + 1] == str(tmp_path / "out")
    assert cmd[cmd.index("--no-binary") + 1] == "llama-cpp-python"  # built here, with our CMake args
    assert {"--no-deps", "--no-cache-dir"} <= set(cmd)  # the cache would ignore CMAKE_ARGS
    beside = beside_command(tmp_path / "out")  # llama_cpp's dependency the environment lacks, beside it
    assert beside[beside.index("--target") + 1] == str(tmp_path / "out") and beside[-1] == "diskcache==5.6.3"
    assert beside[beside.index("--only-binary") + 1] == ":all:"
    assert cmake_env(build, Path("h.cmake")) == {"CMAKE_ARGS": "-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON"}
    lean = LlamaBuild("0.3.36", ("-DGGML_NATIVE=ON",), skip_common=True)  # the hook file runs in llama.cpp
    assert cmake_env(lean, Path("/t/h.cmake")) == {
        "CMAKE_ARGS": "-DGGML_NATIVE=ON -DCMAKE_PROJECT_llama.cpp_INCLUDE=/t/h.cmake"}
    sdist = tmp_path / "llama_cpp_python-0.3.35.tar.gz"
    assert pip_command(build, tmp_path / "out", sdist)[-1] == str(sdist)
    with pytest.raises(FileNotFoundError, match="no such file"):
        check_source(build, sdist)
    sdist.write_bytes(b"")
    with pytest.raises(ValueError, match="is not llama-cpp-python 0.3.36"):
        check_source(build, sdist)


def test_llama_build_names_a_missing_compiler_and_the_cause_of_a_failed_build(tmp_path, monkeypatch):
    from pipeline import llama_build

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RuntimeError, match=r"needs a C compiler \(CC or one of cc, gcc, clang\) and a C\+\+"):
        llama_build.check_toolchain({"PATH": str(empty)})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("gcc", "g++"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    found = llama_build.check_toolchain({"PATH": str(bin_dir)})
    assert (found["CC"], found["CXX"], found["cmake"]) == (str(bin_dir / "gcc"), str(bin_dir / "g++"), None)

    assert llama_build.diagnose("...\n-- No CMAKE_CXX_COMPILER could be found.\n") == "CMake found no C++ compiler"
    assert "no package index is reachable" in llama_build.diagnose("Failed to establish a new connection: x")
    assert llama_build.diagnose("something else") == "pip failed (see the end of its output)"

    # a build that fails: the error says why, the output folder is not created, the log is kept
    monkeypatch.setattr(llama_build, "check_toolchain", lambda: {})
    monkeypatch.setattr(llama_build, "pip_command", lambda *a: [sys.executable, "-c",
                                                                "print('CMake Error at CMakeLists.txt:1'); exit(1)"])
    out = tmp_path / "artifacts" / "llama_cpp"
    with pytest.raises(RuntimeError, match=r"failed: CMake failed to configure or build llama.cpp .* pip exited 1"):
        llama_build.build_llama_cpp(llama_build.LlamaBuild("0.3.36", ()), out)
    assert not out.exists() and "CMake Error" in (out.parent / ".llama_cpp.build.log").read_text()


def test_llama_build_disabled_writes_its_record_and_the_peers_refuse_it(tmp_path):
    from pipeline.lib.llama_record import read_record
    from pipeline.llama_build import build_llama_cpp, main

    out = tmp_path / "llama_cpp"
    params = tmp_path / "params.yaml"
    params.write_text("peers: {llama_cpp: {enabled: false, version: '0.3.36', cmake_args: []}}\n")
    assert main(["--params", str(params), "--section", "peers", "--out", str(out)]) == 0  # nothing built
    assert json.loads((out / "llama_build.json").read_text()) == {"enabled": False, "built": False}
    record = build_llama_cpp(None, out)
    assert record == {"enabled": False, "built": False}
    assert json.loads((out / "llama_build.json").read_text())["built"] is False
    with pytest.raises(ValueError, match="llama.cpp was not built"):
        read_record(out)
    with pytest.raises(FileNotFoundError, match="no llama_build.json"):
        read_record(tmp_path)


def test_llama_prompt_lookup_counters_from_its_proposals():
    from pipeline.lib.llama_peer import spec_stats

    # a prompt of 3 tokens, then 5 new ones: [5, 6, 7, 8, 2]
    ids = np.array([5, 6, 7, 8, 2])
    proposals = [
        (4, np.array([6, 7, 9], np.intc)),  # after [5]: drafts 6 7 9, emitted 6 7 8 -> 2 accepted
        (7, np.array([2, 4], np.intc)),  # after [5 6 7 8]: 2 accepted; 4 lies past the stop (not counted)
    ]
    assert spec_stats(3, ids, proposals) == {"rounds": 2, "draft_tokens_proposed": 5, "draft_tokens_accepted": 3,
                                             "target_forward_passes": 3}
    # no n-gram match: an empty draft, a plain step
    assert spec_stats(3, np.array([5, 6]), [(4, np.array([], np.intc))])["draft_tokens_accepted"] == 0


def test_llama_context_gguf_lookup_and_worker_config(tmp_path):
    from pipeline.lib.llama_peer import find_gguf, n_ctx_for
    from pipeline.lib.peer_worker import WorkerConfig

    prompts = [np.zeros(7), np.zeros(30)]
    assert n_ctx_for(prompts, 64, {"num_pred_tokens": 10, "max_ngram_size": 2}) == 30 + 64 + 10 + 1
    assert n_ctx_for(prompts, 64, None) == 30 + 64 + 1
    with pytest.raises(FileNotFoundError, match="found 0"):
        find_gguf(tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"")
    assert find_gguf(tmp_path) == tmp_path / "m.gguf" and find_gguf(tmp_path / "m.gguf") == tmp_path / "m.gguf"
    (tmp_path / "n.gguf").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="found 2"):
        find_gguf(tmp_path)
    with pytest.raises(ValueError, match="'llama_cpp' needs package"):
        WorkerConfig("llama_cpp", "m.gguf", 1, (0,), (1,), 2)
    with pytest.raises(ValueError, match="'genai': only llama_cpp takes package and n_ctx"):
        WorkerConfig("genai", "dir", 1, (0,), (1,), 2, n_ctx=64)
    with pytest.raises(ValueError, match=r"needs the GGUF to run \(--gguf\)"):
        peers.run(tmp_path, tmp_path / "q.jsonl", tmp_path, llama_cpp=tmp_path)


def test_llama_params_enable_the_peer_and_set_its_lookup(tmp_path, monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(peers, "run", lambda *a, **kw: seen.update(kw) or {"runs": []})
    params = tmp_path / "params.yaml"
    argv = ["--hf", "h", "--prompts", "q", "--out", str(tmp_path / "r.json"), "--params", str(params),
            "--section", "peers_full"]
    params.write_text("peers_full: {llama_cpp: {enabled: true, version: '0.3.36', cmake_args: [], "
                      "num_pred_tokens: 5}}\n")
    assert peers.main([*argv, "--llama-cpp", "built", "--gguf", "g"]) == 0
    assert seen["llama_cpp"] == Path("built") and seen["gguf"] == Path("g")
    assert seen["llama_lookup"] == {"max_ngram_size": 2, "num_pred_tokens": 5}
    assert isinstance(json.loads((tmp_path / "r.json").read_text())["stage_s"], float)  # the stage's wall time
    with pytest.raises(SystemExit):  # enabled, but no build folder to run
        peers.main(argv)
    err = capsys.readouterr().err
    assert "peers_full.llama_cpp.enabled is true: pass the llama_cpp stage's folder (--llama-cpp)" in err
    params.write_text("peers_full: {llama_cpp: {enabled: false}}\n")
    assert peers.main([*argv, "--llama-cpp", "built", "--gguf", "g"]) == 0
    assert seen["llama_cpp"] is None  # disabled: the folder given is not used
    params.write_text("peers_full: {llama_cpp: {enabled: true, num_pred: 5}}\n")
    with pytest.raises(SystemExit):
        peers.main(argv)
    err = capsys.readouterr().err
    assert "peers_full.llama_cpp must be a mapping with `enabled`" in err and "num_pred is not one" in err


def test_metrics_give_our_ratios_over_llama_cpp_and_its_lookup_is_matched_to_its_plain_run():
    from pipeline.peers import metrics

    runs = [{"name": "specrt/int8/baseline", "ids": [[1, 2, 3]], "decode_tokens_per_s": 30.0},
            {"name": "llama.cpp/q4_k_m/plain", "ids": [[1, 2, 4]], "decode_tokens_per_s": 40.0},
            {"name": "llama.cpp/q4_k_m/prompt_lookup", "ids": [[1, 2, 4]], "decode_tokens_per_s": 48.0}]
    peers.add_token_match(runs, runs[0])
    assert [r.get("token_match_plain") for r in runs] == [None, None, 1.0]
    for r in runs:
        r["prefill_s"] = 0.1
    m = metrics({"threads": 2, "prompt_ids": [[9]], "max_new_tokens": 3, "runs": runs, "stage_s": 12.5})
    assert m["ratios"] == {"specrt/int8/baseline / llama.cpp/q4_k_m/plain": 0.75,
                           "specrt/int8/baseline / llama.cpp/q4_k_m/prompt_lookup": 0.625}
    # llama.cpp's prompt lookup against llama.cpp plain; against ours: 2 of 3 tokens
    assert m["runs"]["llama.cpp/q4_k_m/prompt_lookup"] == {"decode_tokens_per_s": 48.0, "prefill_s": 0.1,
                                                            "token_match": 0.666667, "token_match_plain": 1.0}
    assert "token_match_plain" not in m["runs"]["llama.cpp/q4_k_m/plain"] and m["stage_s"] == 12.5


def test_llama_model_with_prompt_lookup_keeps_every_positions_logits(monkeypatch, tmp_path):
    # llama-cpp-python 0.3.36 sizes its score buffer by the logits_all argument: without it, a prompt
    # longer than n_batch fails under a draft model (pipeline/lib/llama_peer.py, llama_model)
    import types

    from pipeline.lib.llama_peer import CountingLookup, llama_model

    made = []
    speculative = types.ModuleType("llama_cpp.llama_speculative")
    speculative.LlamaPromptLookupDecoding = lambda **kw: ("lookup", kw)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    fake = types.SimpleNamespace(Llama=lambda **kw: made.append(kw) or "llama")
    llama, draft = llama_model(fake, tmp_path / "m.gguf", 2, 700, {"max_ngram_size": 2, "num_pred_tokens": 10})
    assert llama == "llama" and isinstance(draft, CountingLookup)
    assert draft.inner == ("lookup", {"max_ngram_size": 2, "num_pred_tokens": 10})
    assert made[0]["draft_model"] is draft and made[0]["logits_all"] is True and made[0]["n_ctx"] == 700
    assert (made[0]["n_threads"], made[0]["n_threads_batch"], made[0]["n_gpu_layers"]) == (2, 2, 0)
    assert llama_model(fake, tmp_path / "m.gguf", None, 700, None) == ("llama", None)
    assert made[1]["draft_model"] is None and made[1]["logits_all"] is False and "n_threads" not in made[1]


@pytest.mark.skipif(not (LLAMA_BUILT / "llama_cpp").is_dir(),
                    reason=f"no llama.cpp build at {LLAMA_BUILT} (dvc repro pipeline/full/dvc.yaml:llama_cpp, or "
                    "python -m pipeline.llama_build --params params.yaml --out artifacts/peers/llama_cpp)")
def test_llama_cpp_plain_repeats_and_its_prompt_lookup_equals_it(tiny_hf, hf_plain, tmp_path):
    from pipeline.lib.llama_peer import gguf_quant, n_ctx_for
    from pipeline.lib.peer_worker import PeerWorker, WorkerConfig

    hf_dir, prompts = tiny_hf
    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    gguf_path = tiny_gguf(model, hf_dir / "tokenizer.json", tmp_path / "tiny.gguf")  # float32 tensors
    assert gguf_quant(gguf_path) == "all_f32"
    eos = json.loads((hf_dir / "config.json").read_text())["eos_token_id"]
    lookup = {"max_ngram_size": 2, "num_pred_tokens": 10}
    options = ({"speculative": None}, {"speculative": lookup})
    long = np.resize(prompts[0], 600)  # past n_batch (512): the lookup run keeps every position's logits
    config = WorkerConfig("llama_cpp", str(gguf_path), 1, (eos,), tuple(int(t) for t in prompts[0]), 4, options,
                          package=str(LLAMA_BUILT), n_ctx=n_ctx_for([*prompts, long], NEW_TOKENS, lookup))
    with PeerWorker("llama.cpp", config) as worker:
        plain = [worker.generate(p, NEW_TOKENS, options[0]) for p in prompts]
        again = [worker.generate(p, NEW_TOKENS, options[0]) for p in prompts]
        spec = [worker.generate(p, NEW_TOKENS, options[1]) for p in prompts]
        assert 1 <= len(worker.generate(long, NEW_TOKENS, options[1])[0]) <= NEW_TOKENS
    plain_ids = [r[0].tolist() for r in plain]
    assert [r[0].tolist() for r in again] == plain_ids  # greedy repeats itself
    assert [r[0].tolist() for r in spec] == plain_ids  # prompt lookup: token match 1.0 vs its plain run
    assert sum(r[4]["draft_tokens_accepted"] for r in spec) > 0  # and it did accept drafts
    assert all(r[4] == {} and r[1] > 0 and r[2] > 0 for r in plain)
    # the same float32 model: llama.cpp's greedy ids are transformers' (stops at EOS, kept, as ours)
    assert plain_ids == hf_plain["ids"]
