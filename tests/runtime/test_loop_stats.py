"""What a request's stats count (specrt.engine.loop.LoopStats.as_dict), on a tiny model."""

from __future__ import annotations

import specrt
from tests.helpers import PROMPTS


def test_tokens_per_step_counts_the_bonus_token_and_accepted_drafts_do_not(runtime_qwen2):
    model = specrt.load(runtime_qwen2)
    prompt = PROMPTS[0] * 3  # repeated text: prompt lookup finds drafts that the model accepts
    # the back-off off: whether it verifies depends on measured pass times, which a busy machine skews
    stats = model.generate(prompt, method="pld", max_new_tokens=40, backoff=False).stats
    assert stats["accepted"] > 0 and stats["steps"] > 0
    assert stats["mean_tokens_per_step"] == round((stats["new_tokens"] - 1) / stats["steps"], 4)  # tau
    assert stats["mean_accepted_drafts_per_step"] == round(stats["accepted"] / stats["steps"], 4)
    # greedy chain: a step emits its accepted drafts and one more token (recovered or bonus), the
    # last step possibly cut by max_new_tokens
    assert 0 <= stats["steps"] + stats["accepted"] - (stats["new_tokens"] - 1) < stats["steps"] + 1
    plain = model.generate(prompt, method="baseline", max_new_tokens=40).stats
    assert plain["mean_tokens_per_step"] == 1.0 and plain["mean_accepted_drafts_per_step"] == 0.0
    assert plain["fully_accepted_steps"] == 0  # no draft, no bonus counted


def test_fully_accepted_steps_are_the_steps_whose_walk_reached_a_leaf(runtime_qwen2):
    # a chain of d drafts fully accepted emits d + 1 tokens: every such step's accepted count is its
    # draft's length; greedy chains of at most 2 drafts over repeated text
    model = specrt.load(runtime_qwen2)
    _, loop = model.generate_ids(model.encode(PROMPTS[0] * 3), method="pld", max_new_tokens=40, draft_budget=2,
                                 backoff=False)  # fmt: skip
    stats = loop.stats
    assert 0 < stats.fully_accepted < stats.steps
    assert stats.fully_accepted <= sum(1 for n in stats.accepted_lengths if n > 0)

