"""Lossless, once for every method: on each tiny architecture, every registered method that needs
no draft model, chain and tree, at a short and a long draft budget, emits plain greedy decoding's
tokens, text and finish reason, against baselines decoded once per model. The draft-model methods
need a draft/target pair and run the same comparison in tests/test_draft_model.py.

The tiny models memorised their training text, which the datastore holds too, so every method but
``auto`` (whose choices follow measured times) must also have some drafts accepted: a method that
never drafts would pass the comparison by doing nothing."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

import specrt
from specrt.drafters import METHODS
from specrt.drafters.indexes.datastore import write_datastore
from specrt.files import sha256_file
from tests.helpers import PROMPTS, TRAINING_TEXT

MAX_NEW_TOKENS = 30
UNDER_TEST = sorted(name for name, m in METHODS.items() if not m.needs_draft and name != "baseline")
TIMED = {"auto", "asd_verify"}  # decisions from measured times: which drafts they verify depend on the machine
# (asd_verify sizes its tree by the measured verify cost: on a busy machine it may verify none)


@pytest.fixture(scope="module")
def matrix_model(runtime_artifact, tmp_path_factory) -> specrt.SpecModel:
    """The tiny model with a datastore of its training text (what the corpora stage would build)."""
    tokenizer_json = runtime_artifact / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    documents = [np.array(e.ids, np.int32) for e in tokenizer.encode_batch(TRAINING_TEXT, add_special_tokens=False)]
    store = tmp_path_factory.mktemp("matrix-datastore")
    write_datastore(store, [("train", "tests.helpers.TRAINING_TEXT", documents)], sha256_file(tokenizer_json))
    return specrt.load(runtime_artifact, datastore=store)


@pytest.fixture(scope="module")
def baselines(matrix_model) -> dict[str, specrt.GenerationResult]:
    return {p: matrix_model.generate(p, method="baseline", max_new_tokens=MAX_NEW_TOKENS) for p in PROMPTS}


def test_the_matrix_covers_every_model_free_method():
    assert set(UNDER_TEST) | {"baseline", "sd", "hsd", "hsd_capped"} == set(METHODS)


@pytest.mark.parametrize("budget", [2, 8])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("method", UNDER_TEST)
def test_every_method_equals_plain_decoding(matrix_model, baselines, method, tree, budget):
    matrix_model.forget_history()  # no suffix history or adjacency table from another test
    accepted = 0
    for prompt, base in baselines.items():
        spec = matrix_model.generate(prompt, method=method, tree=tree, max_new_tokens=MAX_NEW_TOKENS,
                                     draft_budget=budget, backoff=False)  # fmt: skip
        want = (base.token_ids, base.text, base.finish_reason)
        assert (spec.token_ids, spec.text, spec.finish_reason) == want, prompt
        assert spec.stats["drafted"] <= spec.stats["steps"] * budget  # the budget held
        accepted += spec.stats["accepted"]
    assert accepted > 0 or method in TIMED, f"{method}: no draft accepted over {len(PROMPTS)} prompts"
