"""Draft-model speculative decoding (specrt.drafters.draft_model) on a tiny target / draft pair.

Greedy: every method, chain and tree, fixed and adaptive gamma, emits plain decoding's tokens.
Sampling: the first three emitted tokens over SEEDS seeded requests follow the target's exact law,
enumerated from the target's own logits; Pearson chi-square at significance ALPHA = 1e-3 (cells
expected below 5 times pooled). Seeds are fixed: each outcome is deterministic. At 300 requests
this checks the integration (slots, q rows, the draft cache, HSD blocks across steps) for gross
errors — a recovered token drawn from p instead of norm((p - q)^+) gives p-value ~1e-12 here —
while the rules' subtler defects are caught by tests/runtime/test_rejection.py on toy distributions.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

import specrt
from specrt.backend.draft_model import OrtDraftModel
from specrt.backend.manifest import read_manifest
from specrt.backend.prefill import prefill
from specrt.backend.session import OrtDecoder
from specrt.cost import default_cost_ratio
from specrt.drafters import Method
from specrt.drafters.base import DrafterEnv, Feedback
from specrt.drafters.draft_model import (
    DRAFT_TOKEN_COST,
    GAMMA,
    PROBE_EVERY,
    DraftModelDrafter,
    best_gamma,
    check_vocab_compatible,
    expected_tokens,
    make_hsd,
    make_hsd_capped,
    make_sd,
)
from specrt.errors import ArtifactError, InvalidRequestError
from specrt.files import file_entry
from specrt.sampling import SamplingParams, target_probs
from specrt.tree import DraftTree
from tests.helpers import PROMPTS, chi2_pvalue
from tests.tiny_pair import build_tiny_pair

ACCEPTANCE = ("sd", "hsd", "hsd_capped")
SAMPLING = SamplingParams(temperature=1.0, top_k=3)  # a small support: 27 cells for three tokens
SEEDS = 300
ALPHA = 1e-3


@dataclasses.dataclass(frozen=True, eq=False)
class Pair:
    target: specrt.SpecModel
    target_folder: Path
    draft_folder: Path
    draft: OrtDraftModel  # one draft cache, reset by each drafter's begin

    def fresh_draft(self) -> OrtDraftModel:
        manifest = read_manifest(self.draft_folder)
        return OrtDraftModel(OrtDecoder(self.draft_folder / manifest.decoder, manifest.dims))

    def drafter(self, acceptance: str = "sd", *, tree: bool = False, sampling=None, seed=None, **options):
        # a state of its own: adaptive gamma's estimate does not carry from one test to the next
        env = dataclasses.replace(self.target.drafter_env(tree), sampling=sampling, seed=seed, state={})
        return DraftModelDrafter(self.draft, env, acceptance=acceptance, **options)


def with_rule(drafter: DraftModelDrafter, acceptance: str) -> Method:
    """``drafter`` as a request's method whose accept rule is ``acceptance`` (a registry entry's)."""
    return Method(lambda env: drafter, accept=acceptance)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Pair:
    target_folder, draft_folder = build_tiny_pair(tmp_path_factory.mktemp("tiny-pair"))
    target = specrt.load(target_folder)
    manifest = read_manifest(draft_folder)
    return Pair(target, target_folder, draft_folder,
                OrtDraftModel(OrtDecoder(draft_folder / manifest.decoder, manifest.dims)))


@pytest.fixture(scope="module")
def baselines(pair) -> dict[str, list[int]]:
    return {p: pair.target.generate(p, method="baseline", max_new_tokens=40).token_ids for p in PROMPTS}


# ---------------------------------------------------------------------------------------------
# greedy: bit-exact


@pytest.mark.parametrize("gamma", [1, 3, 6, "adaptive"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("acceptance", ACCEPTANCE)
def test_greedy_is_bit_exact_with_baseline(pair, baselines, acceptance, tree, gamma):
    options = {"gamma": 3, "adaptive": True} if gamma == "adaptive" else {"gamma": gamma}
    for prompt in PROMPTS:
        drafter = pair.drafter(acceptance, tree=tree, **options)
        result = pair.target.generate(prompt, method=drafter, tree=tree, max_new_tokens=40)
        assert result.token_ids == baselines[prompt], prompt


def test_the_pair_accepts_some_drafts_and_rejects_others(pair):
    accepted = drafted = 0
    for prompt in PROMPTS:
        stats = pair.target.generate(prompt, method=pair.drafter(gamma=4), max_new_tokens=40).stats
        accepted, drafted = accepted + stats["accepted"], drafted + stats["drafted"]
    assert 0.2 * drafted < accepted < 0.9 * drafted, (accepted, drafted)


# ---------------------------------------------------------------------------------------------
# the draft's KV cache stays aligned


class Checked:
    """A drafter wrapper that checks the draft cache around every step: after ``observe`` it holds
    a prefix of the context without its last token, at most two short (two after full acceptance:
    the last drafted token and the bonus); at ``propose`` the first drafted position's q (greedy:
    token) equals a fresh draft model's on the whole context."""

    def __init__(self, inner: DraftModelDrafter, fresh: OrtDraftModel):
        self.inner, self.fresh = inner, fresh
        self.context = np.zeros(0, np.int64)
        self.observed = self.forward_proposals = 0

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        self.inner.begin(prompt, hidden_states)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        self.forward_proposals += self.inner.open_levels > 0
        tree = self.inner.propose(context, budget)
        self.context = context
        self.fresh.reset(len(context) + 1)
        *_, last = prefill(self.fresh.decoder, context, 256)
        z = last.logits[-1]  # [vocab] the draft's logits after the whole context
        if tree.draft_probs is None:
            assert tree.token_ids[0] == np.argmax(z)
        else:
            np.testing.assert_allclose(tree.draft_probs[0], target_probs(z[None], self.inner.sampling)[0], atol=1e-5)
        return tree

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        self.inner.observe(emitted, feedback)
        context, past = np.concatenate([self.context, emitted]), self.inner.decoder.past
        assert len(context) - 2 <= past <= len(context) - 1, (len(context), past)
        assert self.inner.cached[:past].tolist() == context[:past].tolist()
        assert past == len(context) - 1 or len(feedback.path) > 0  # two short only after accepting drafts
        self.observed += 1


@pytest.mark.parametrize("sampling", [None, SAMPLING], ids=["greedy", "sampling"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("acceptance", ["sd", "hsd"])
def test_draft_cache_stays_aligned(pair, acceptance, tree, sampling):
    temperature, top_k = (0.0, 0) if sampling is None else (sampling.temperature, sampling.top_k)
    observed = forward_proposals = 0
    for i, prompt in enumerate(PROMPTS[:4]):  # prompt 2 ends at once under greedy decoding (EOS)
        drafter = Checked(pair.drafter(acceptance, tree=tree, sampling=sampling, seed=i, gamma=3), pair.fresh_draft())
        pair.target.generate(prompt, method=with_rule(drafter, acceptance), tree=tree, max_new_tokens=30,
                             temperature=temperature, top_k=top_k, seed=i)  # fmt: skip
        observed, forward_proposals = observed + drafter.observed, forward_proposals + drafter.forward_proposals
    assert observed > 20
    if acceptance == "hsd" and sampling is not None:
        assert forward_proposals > 0  # an HSD block was left open and finished by forward sampling


# ---------------------------------------------------------------------------------------------
# sampling: the emitted tokens follow the target


def target_law(pair: Pair, prompt_ids: np.ndarray, k: int) -> dict[tuple[int, ...], float]:
    """The target's law of its first k tokens after the prompt, by enumeration of its logits."""
    manifest = pair.target.manifest
    decoder = OrtDecoder(pair.target_folder / manifest.decoder, manifest.dims)
    law: dict[tuple[int, ...], float] = {}

    def visit(prefix: tuple[int, ...], mass: float) -> None:
        decoder.reset(len(prompt_ids) + k)
        *_, last = prefill(decoder, np.concatenate([prompt_ids, np.array(prefix, np.int64)]), 256)
        p = target_probs(last.logits[-1:], SAMPLING)[0]
        for y in np.flatnonzero(p):
            if len(prefix) + 1 == k:
                law[(*prefix, int(y))] = mass * p[y]
            else:
                visit((*prefix, int(y)), mass * p[y])

    visit((), 1.0)
    return law


@pytest.mark.parametrize("method", [*ACCEPTANCE, "pld"])
def test_sampling_emits_the_target_distribution(pair, method):
    # prompt 3 ("... Summary: speculative"): with gamma 2 the first block accepts 0, 1 and 2
    # drafted tokens about equally often; the first token comes from the prefill, the next two
    # from the first block (and, for hsd, from forward sampling after an early recovered token)
    prompt_ids = pair.target.encode(PROMPTS[3])
    law = target_law(pair, prompt_ids, 3)
    counts: Counter = Counter()
    for seed in range(SEEDS):
        drafter = "pld" if method == "pld" else with_rule(pair.drafter(method, sampling=SAMPLING, seed=seed, gamma=2),
                                                          method)
        ids, _ = pair.target.generate_ids(prompt_ids, method=drafter, max_new_tokens=4, temperature=1.0,
                                          top_k=SAMPLING.top_k, seed=seed)  # fmt: skip
        counts[tuple(ids[:3].tolist())] += 1
    assert chi2_pvalue(counts, law) > ALPHA, (counts.most_common(8), sorted(law.items(), key=lambda kv: -kv[1])[:8])


def test_a_drafter_instance_s_sampled_trees_get_the_sd_rule(pair):
    # a Drafter passed as method= names no rule: its sampled trees get the sd rule (multi-candidate
    # recursive rejection sampling), as a Method that names it: the same seeds give the same tokens
    prompt_ids = pair.target.encode(PROMPTS[3])
    for seed in range(4):
        runs = []
        for wrap in (lambda d: d, lambda d: with_rule(d, "sd")):
            drafter = wrap(pair.drafter("sd", tree=True, sampling=SAMPLING, seed=seed, gamma=3, branch_below=0.9))
            ids, _ = pair.target.generate_ids(prompt_ids, method=drafter, tree=True, max_new_tokens=12,
                                              temperature=1.0, top_k=SAMPLING.top_k, seed=seed)  # fmt: skip
            runs.append(ids.tolist())
        assert runs[0] == runs[1]


# ---------------------------------------------------------------------------------------------
# adaptive gamma


def test_expected_tokens_is_the_truncated_geometric_sum():
    np.testing.assert_allclose(expected_tokens(0.5, np.array([1, 2, 3])), [1.5, 1.75, 1.875])
    np.testing.assert_allclose(expected_tokens(1.0, np.array([4])), [5.0])  # all accepted: gamma + bonus


def test_best_gamma_trades_acceptance_against_cost():
    flat = lambda s: 1.0  # noqa: E731 - a verify pass costs the same at any size
    assert best_gamma(0.9, 1e-6, flat, 8) == 8  # free drafts, likely accepted: draft all the budget
    assert best_gamma(0.05, 0.5, flat, 8) == 0  # drafts rarely accepted and dear: a plain step
    assert best_gamma(0.05, 0.5, flat, 8, minimum=1) == 1  # (a probe must draft: the cheapest draft)
    # alpha 0.6, draft step 0.1, verify 1: E / cost = 1.6 / 1.1, 1.96 / 1.2, 2.18 / 1.3, 2.31 / 1.4 = 1.45,
    # 1.63, 1.67, 1.65: peak at 3
    assert best_gamma(0.6, 0.1, flat, 8) == 3
    assert best_gamma(0.6, 0.1, lambda s: 0.0, 8) is None  # nothing measured yet
    assert best_gamma(0.6, 0.1, lambda s: None, 8) is None


def test_adaptive_gamma_uses_measured_costs(pair):
    drafter = pair.drafter(gamma=2, adaptive=True)
    pair.target.generate(PROMPTS[0], method=drafter, max_new_tokens=30)
    assert drafter.estimate.draft_step_s is not None and drafter.estimate.draft_step_s > 0
    expected = best_gamma(drafter.alpha, drafter.estimate.draft_step_s, pair.target.verify_cost.estimate, 8)
    if expected == 0:  # the measured costs say back off (a loaded machine): the next probe is not due yet
        drafter.plain_steps = 0
    assert drafter.choose_gamma(8) == expected


def test_adaptive_gamma_backs_off_to_plain_steps_and_probes(pair):
    drafter = pair.drafter(gamma=2, adaptive=True)
    drafter.estimate.draft_step_s, drafter.verify_cost = 10.0, lambda s: 1.0  # a draft step costs 10 verify passes
    gammas = [drafter.choose_gamma(8) for _ in range(3 * PROBE_EVERY)]  # probes after 8, then 16 plain steps
    assert gammas == [0] * (PROBE_EVERY - 1) + [1] + [0] * (2 * PROBE_EVERY - 1) + [1]
    drafter.estimate.draft_step_s = 1e-6  # drafting is free again: the next step drafts at once
    assert drafter.choose_gamma(8) > 0 and drafter.plain_steps == 0 and drafter.estimate.probe_every == PROBE_EVERY


def test_adaptive_gamma_starts_from_the_last_request_s_estimate(pair):
    env = dataclasses.replace(pair.target.drafter_env(False), state={}, draft_model=pair.fresh_draft,
                              verify_cost=lambda s: 1.0)
    first = make_sd(env)
    first.estimate.draft_step_s = 10.0  # the last request measured a draft step at 10 verify passes
    second = make_sd(env)
    assert second.estimate is first.estimate and second.choose_gamma(8) == 0  # plain at once, no fixed gamma first
    # per method, decoding mode and chain or tree
    others = [make_hsd(env), make_sd(dataclasses.replace(env, tree=True)),
              make_sd(dataclasses.replace(env, sampling=SamplingParams(temperature=1.0)))]
    assert len({id(first.estimate), *(id(d.estimate) for d in others)}) == 4
    assert all(d.timed and d.estimate.draft_step_s is None and d.choose_gamma(8) == GAMMA for d in others)


def test_seeded_sampling_chooses_gamma_from_counts_and_keeps_no_estimate(pair):
    env = dataclasses.replace(pair.target.drafter_env(False), state={}, draft_model=pair.fresh_draft,
                              sampling=SamplingParams(temperature=1.0), seed=5, verify_cost=lambda s: 100.0 * s)
    drafter = make_sd(env)
    assert not drafter.timed and env.state == {}
    drafter.estimate.draft_step_s = 10.0  # measured times play no part
    for accepted, rejections in [(0.0, 0.0), (5.0, 1.0), (0.0, 6.0)]:
        drafter.estimate.accepted, drafter.estimate.rejections = accepted, rejections
        expected = best_gamma(drafter.alpha, DRAFT_TOKEN_COST, default_cost_ratio, 8)
        assert drafter.choose_gamma(8) == expected
    assert expected == 0 and best_gamma(6 / 7, DRAFT_TOKEN_COST, default_cost_ratio, 8) > 0


def test_a_seeded_request_repeats_whatever_the_measured_costs(pair):
    model = specrt.load(pair.target_folder, draft=pair.draft_folder)
    options = dict(temperature=1.0, seed=3, max_new_tokens=30)
    first = {m: model.generate(PROMPTS[0], method=m, **options).token_ids for m in ACCEPTANCE}
    for s in range(1, 10):  # verify windows now look dear: decisions from measured times would back off
        model.verify_cost.record(s, 10.0 * s)
    assert {m: model.generate(PROMPTS[0], method=m, **options).token_ids for m in ACCEPTANCE} == first


@pytest.mark.parametrize("method", ["sd", "hsd_capped"])
def test_backing_off_keeps_greedy_output_and_the_draft_cache_aligned(pair, baselines, method):
    drafter = pair.drafter(method, gamma=2, adaptive=True)
    real_step = drafter._step

    def dear_step(token):  # every draft forward looks expensive: the request backs off, then probes
        out = real_step(token)
        drafter.estimate.draft_step_s = 10.0
        return out

    sizes = []
    real_propose = drafter.propose

    def propose(context, budget):
        tree = real_propose(context, budget)
        sizes.append(len(tree))
        return tree

    drafter._step, drafter.propose = dear_step, propose
    for prompt in PROMPTS[:3]:
        result = pair.target.generate(prompt, method=drafter, max_new_tokens=40)
        assert result.token_ids == baselines[prompt]
    assert sizes.count(0) >= PROBE_EVERY and any(sizes[sizes.index(0):])  # backed off, then probed


# ---------------------------------------------------------------------------------------------
# factories and the vocabulary check


def test_factories_need_a_draft_model(pair):
    env = pair.target.drafter_env(False)
    for make in (make_sd, make_hsd, make_hsd_capped):
        with pytest.raises(InvalidRequestError, match="needs a draft model"):
            make(env)
    env = dataclasses.replace(env, draft_model=pair.fresh_draft)
    made = [make(env) for make in (make_sd, make_hsd, make_hsd_capped)]
    assert [d.acceptance for d in made] == list(ACCEPTANCE) and all(d.adaptive for d in made)


def test_drafter_options_are_checked():
    env = DrafterEnv(vocab=8, tree=False)
    for options, message in [({"gamma": 0}, "gamma must be >= 1"), ({"acceptance": "x"}, "acceptance must be one of")]:
        with pytest.raises(InvalidRequestError, match=message):
            DraftModelDrafter(None, env, **options)


def edited(source: Path, folder: Path, name: str, edit) -> Path:
    data = json.loads(source.read_text())
    edit(data)
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def test_vocab_check_accepts_identical_tokenizers(pair):
    check_vocab_compatible(pair.target_folder / "tokenizer.json", pair.draft_folder / "tokenizer.json")


def test_vocab_check_names_a_changed_special_token(pair, tmp_path):
    def rename_eos(data):
        data["added_tokens"][0]["content"] = "<end>"
        data["model"]["vocab"]["<end>"] = data["model"]["vocab"].pop("<eos>")

    draft = edited(pair.draft_folder / "tokenizer.json", tmp_path, "renamed.json", rename_eos)
    with pytest.raises(ArtifactError, match=r"1 ids differ .* first id 0: target '<eos>' \(special\), draft '<end>'"):
        check_vocab_compatible(pair.target_folder / "tokenizer.json", draft)


def test_vocab_check_names_an_extra_special_token(pair, tmp_path):
    tokenizer = Tokenizer.from_file(str(pair.draft_folder / "tokenizer.json"))
    tokenizer.add_special_tokens(["<extra>"])
    tokenizer.save(str(tmp_path / "extra.json"))
    with pytest.raises(ArtifactError, match=r"first id 320: target \(no token\), draft '<extra>' \(special\)"):
        check_vocab_compatible(pair.target_folder / "tokenizer.json", tmp_path / "extra.json")


def test_vocab_check_names_swapped_tokens(pair, tmp_path):
    def swap(data):
        vocab = data["model"]["vocab"]
        vocab["ken"], vocab["jum"] = vocab["jum"], vocab["ken"]  # ids 319 and 318

    draft = edited(pair.draft_folder / "tokenizer.json", tmp_path, "swapped.json", swap)
    with pytest.raises(ArtifactError, match=r"2 ids differ .* first id 318: target 'jum', draft 'ken'; id 319"):
        check_vocab_compatible(pair.target_folder / "tokenizer.json", draft)


def test_vocab_check_refuses_a_file_that_is_not_a_tokenizer(pair, tmp_path):
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ArtifactError, match="not a valid tokenizer.json"):
        check_vocab_compatible(pair.target_folder / "tokenizer.json", tmp_path / "bad.json")


def test_every_token_of_the_law_is_enumerated(pair):
    # the enumeration used by the sampling test covers top_k ** 3 sequences with total mass 1
    law = target_law(pair, pair.target.encode(PROMPTS[3]), 3)
    assert len(law) <= SAMPLING.top_k**3 and abs(sum(law.values()) - 1.0) < 1e-9
    assert set(itertools.chain.from_iterable(law)) <= set(range(pair.target.manifest.dims.vocab))


# ---------------------------------------------------------------------------------------------
# the public path: specrt.load(target, draft=...), methods by name, the CLI, the regression core


def test_load_with_draft_runs_registered_methods_bit_exact(pair, baselines):
    model = specrt.load(pair.target_folder, draft=pair.draft_folder)
    for method in ACCEPTANCE:
        for tree in (False, True):
            for prompt in PROMPTS[:3]:
                got = model.generate(prompt, method=method, tree=tree, max_new_tokens=40)
                assert got.token_ids == baselines[prompt], (method, tree, prompt)
    # what adaptive gamma learnt above may say back off (timings); a fresh estimate drafts GAMMA at once
    model.forget_history()
    assert model.generate(PROMPTS[0], method="sd", max_new_tokens=40).stats["accepted"] > 0


def test_draft_methods_without_a_draft_say_how_to_load_one(pair):
    with pytest.raises(InvalidRequestError, match=r"needs a draft model: load the target with a draft"):
        pair.target.generate(PROMPTS[0], method="sd", max_new_tokens=4)


def test_load_refuses_a_draft_with_another_vocabulary(pair, tmp_path):
    import shutil

    other = tmp_path / "draft"
    shutil.copytree(pair.draft_folder, other)
    raw = json.loads((other / "tokenizer.json").read_text())
    token, token_id = next(iter(raw["model"]["vocab"].items()))
    raw["model"]["vocab"][token + "\u00e9"] = raw["model"]["vocab"].pop(token)
    (other / "tokenizer.json").write_text(json.dumps(raw))
    manifest = json.loads((other / "manifest.json").read_text())  # a consistent folder: only the vocabulary differs
    manifest["files"]["tokenizer.json"] = dataclasses.asdict(file_entry(other / "tokenizer.json"))
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=rf"\b{token_id}\b"):
        specrt.load(pair.target_folder, draft=other)


def test_cli_generates_with_a_draft(pair, capsys):
    from specrt.cli import main

    code = main(["generate", "--model", str(pair.target_folder), "--draft", str(pair.draft_folder), "--method",
                 "hsd_capped", "--max-new-tokens", "12", "--json", PROMPTS[0]])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "hsd_capped" and len(out["token_ids"]) == 12


def test_regression_core_includes_draft_methods_only_with_a_draft(pair):
    from pipeline.lossless import compare_methods

    model = specrt.load(pair.target_folder, draft=pair.draft_folder)
    prompts = [model.encode(p) for p in PROMPTS[:2]]
    report = compare_methods(model, prompts, list(ACCEPTANCE), max_new_tokens=16, draft_budget=6)
    assert report["lossless"] and set(report["runs"]) == {f"{m}/{t}" for m in ACCEPTANCE for t in ("chain", "tree")}


def test_load_with_a_draft_and_a_datastore_runs_both_families(pair, tmp_path, baselines):
    from pipeline.corpora import build_from_texts
    from tests.helpers import TRAINING_TEXT

    store = tmp_path / "datastore"
    build_from_texts([("text", "tests.tiny", TRAINING_TEXT)], pair.target_folder / "tokenizer.json", store)
    model = specrt.load(pair.target_folder, draft=pair.draft_folder, datastore=store)
    for method in ("sd", "sam_decoding"):
        assert model.generate(PROMPTS[0], method=method, max_new_tokens=40).token_ids == baselines[PROMPTS[0]]
