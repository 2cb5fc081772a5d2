"""Request bodies of /v1/completions and /v1/chat/completions, checked into frozen dataclasses.

Every refusal is an :class:`~specrt.serve.errors.ApiError` (400) naming the body field in
``param``. The prompt is encoded here, so a prompt longer than the model's context is refused
before any work. Chat messages (system prompt and any number of turns) go through the model's own
chat template (:meth:`specrt.model.SpecModel.encode_chat`); an artifact exported before templates
were stored takes one user message, and says so for more.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from specrt.chat import messages
from specrt.drafters import METHODS, NEEDS_DRAFT
from specrt.errors import InvalidRequestError
from specrt.model import SpecModel
from specrt.serve.errors import invalid

MAX_STOPS = 4  # OpenAI's limit on stop strings
MAX_LOGPROBS = 5  # OpenAI's limits: completions' logprobs, chat's top_logprobs
MAX_TOP_LOGPROBS = 20
SPECRT_FIELDS = ("method", "tree", "draft_budget", "timeout_s")
# OpenAI fields this server cannot honour: refused unless absent or at their neutral value
UNSUPPORTED = ("echo", "suffix", "presence_penalty", "frequency_penalty",
               "logit_bias", "tools", "functions", "response_format")
NEUTRAL = (None, False, 0, 0.0, {}, [])


@dataclass(frozen=True)
class Speculation:
    """How one request drafts (the server's defaults unless its body's ``specrt`` object says)."""

    method: str  # a registered method, specrt.METHODS
    tree: bool  # verify a draft tree instead of a chain
    draft_budget: int  # draft nodes per verify step


@dataclass(frozen=True)
class GenerationRequest:
    chat: bool  # /v1/chat/completions (True) or /v1/completions
    prompt_ids: tuple[int, ...]  # [t] the prompt's tokens, chat template applied
    max_tokens: int  # new tokens at most (the context's end may stop it earlier: finish_reason "length")
    temperature: float  # 0: greedy
    top_p: float
    seed: int | None
    stop: tuple[str, ...]  # cut before the first of these, never emitted
    stop_token_ids: tuple[int, ...]  # end at the first of these tokens (counted, its text not emitted)
    logprobs: int | None  # None: none; k: each token's logprob and its k most likely alternatives
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage counts
    speculation: Speculation
    timeout_s: float | None  # seconds from the generation's start (prefill included) to its deadline; None: none


def parse_request(
    body: Any, *, chat: bool, model: SpecModel, default: Speculation, has_draft: bool,
    default_timeout_s: float | None = None,
) -> GenerationRequest:
    """``body`` (parsed JSON) as a request, or ApiError naming the field. ``default_timeout_s``: the
    deadline of a request whose ``specrt`` object names none (None: no deadline)."""
    if not isinstance(body, dict):
        raise invalid(None, f"the request body must be a JSON object, got {type(body).__name__}")
    for name in UNSUPPORTED:
        if body.get(name) not in NEUTRAL:
            raise invalid(name, f"{name} is not supported by this server", code="unsupported_parameter")
    if body.get("n", 1) != 1 or isinstance(body.get("n"), bool):
        raise invalid("n", f"n must be 1 (one choice per request), got {body.get('n')!r}")
    if body.get("best_of", 1) != 1:
        raise invalid("best_of", f"best_of must be 1, got {body.get('best_of')!r}")
    context = model.manifest.dims.max_context
    ids = _chat_prompt(body, model) if chat else _completion_prompt(body, model)
    if len(ids) == 0:
        raise invalid("messages" if chat else "prompt", "the prompt is empty: need at least one token")
    if len(ids) >= context:
        raise invalid("messages" if chat else "prompt",
                      f"the prompt has {len(ids)} tokens; this model's context is {context} tokens "
                      f"(at most {context - 1} prompt tokens)", code="context_length_exceeded")
    max_key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(max_key)
    if max_tokens is None:
        max_tokens = context - len(ids)
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens < context:
        raise invalid(max_key, f"{max_key} must be an integer in [1, {context - 1}] (the model's context is "
                      f"{context} tokens), got {max_tokens!r}")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise invalid("stream_options", "stream_options must be an object")
    return GenerationRequest(
        chat=chat,
        prompt_ids=tuple(int(t) for t in ids),
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, open_low=True),
        seed=_seed(body.get("seed")),
        stop=_stops(body.get("stop")),
        stop_token_ids=_stop_ids(body.get("stop_token_ids"), model.manifest.dims.vocab),
        logprobs=_logprobs(body, chat),
        stream=_bool(body, "stream", False),
        include_usage=_bool(stream_options, "include_usage", False, prefix="stream_options."),
        speculation=_speculation(body.get("specrt"), default, has_draft),
        timeout_s=_timeout(body.get("specrt"), default_timeout_s),
    )


def _encode(model: SpecModel, text: str, param: str, *, chat: bool) -> list[int]:
    try:
        return model.encode(text, chat=chat).tolist()
    except InvalidRequestError as e:
        raise invalid(param, str(e)) from None


def _completion_prompt(body: dict, model: SpecModel) -> list[int]:
    if "prompt" not in body:
        raise invalid("prompt", "missing required field: prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _encode(model, prompt, "prompt", chat=False)
    vocab = model.manifest.dims.vocab
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(not 0 <= t < vocab for t in prompt):
            raise invalid("prompt", f"prompt token ids must lie in [0, {vocab})")
        return list(prompt)
    raise invalid("prompt", "prompt must be a string, a list of one string, or a list of token ids")


def _chat_prompt(body: dict, model: SpecModel) -> list[int]:
    if "messages" not in body:
        raise invalid("messages", "missing required field: messages")
    try:
        msgs = messages(body["messages"])
        return model.encode_chat(msgs).tolist()
    except InvalidRequestError as e:
        found = re.match(r"(messages\[\d+\]\.\w+)", str(e))  # the field the runtime named, if any
        raise invalid(found.group(1) if found else "messages", str(e)) from None


def _number(body: dict, name: str, default: float, low: float, high: float, *, open_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not (low < value if open_low else low <= value) or value > high:
        interval = f"({low}, {high}]" if open_low else f"[{low}, {high}]"
        raise invalid(name, f"{name} must be a number in {interval}, got {value!r}")
    return float(value)


def _bool(body: dict, name: str, default: bool, prefix: str = "") -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(prefix + name, f"{prefix}{name} must be true or false, got {value!r}")
    return value


def _logprobs(body: dict, chat: bool) -> int | None:
    """Completions: ``logprobs`` k in [0, MAX_LOGPROBS]; chat: ``logprobs`` true and ``top_logprobs`` k in
    [0, MAX_TOP_LOGPROBS] (OpenAI's limits)."""
    if chat:
        top = body.get("top_logprobs")
        if not _bool(body, "logprobs", False):
            if top is not None:
                raise invalid("top_logprobs", "top_logprobs needs logprobs: true")
            return None
        name, value, limit = "top_logprobs", 0 if top is None else top, MAX_TOP_LOGPROBS
    else:
        name, value, limit = "logprobs", body.get("logprobs"), MAX_LOGPROBS
        if value is None:
            return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise invalid(name, f"{name} must be an integer in [0, {limit}], got {value!r}")
    return value


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid("seed", f"seed must be a non-negative integer, got {value!r}")
    return value


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or \
            not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop", f"stop must be a non-empty string or a list of at most {MAX_STOPS} non-empty strings")
    return tuple(stops)


def _stop_ids(value: Any, vocab: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                              for t in value):
        raise invalid("stop_token_ids", f"stop_token_ids must be a list of token ids in [0, {vocab})")
    return tuple(value)


def _speculation(value: Any, default: Speculation, has_draft: bool) -> Speculation:
    if value is None:
        return default
    if not isinstance(value, dict):
        raise invalid("specrt", f"specrt must be an object with {', '.join(SPECRT_FIELDS)}")
    unknown = sorted(set(value) - set(SPECRT_FIELDS))
    if unknown:
        raise invalid(f"specrt.{unknown[0]}", f"unknown field specrt.{unknown[0]}; known: {', '.join(SPECRT_FIELDS)}")
    method = value.get("method", default.method)
    if method not in METHODS:
        raise invalid("specrt.method", f"unknown method {method!r}; valid methods: {', '.join(sorted(METHODS))}",
                      code="unknown_method")
    if method in NEEDS_DRAFT and not has_draft:
        raise invalid("specrt.method", f"method {method!r} needs a draft model: start the server with --draft")
    tree = _bool(value, "tree", default.tree, prefix="specrt.")
    budget = value.get("draft_budget", default.draft_budget)
    if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget <= 64:
        raise invalid("specrt.draft_budget", f"specrt.draft_budget must be an integer in [0, 64], got {budget!r}")
    return Speculation(method=method, tree=tree, draft_budget=budget)


def _timeout(value: Any, default: float | None) -> float | None:
    """``specrt.timeout_s``: a positive finite number of seconds (``value`` is the checked ``specrt`` object)."""
    seconds = value.get("timeout_s") if isinstance(value, dict) else None
    if seconds is None:
        return default
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise invalid("specrt.timeout_s", f"specrt.timeout_s must be a positive finite number of seconds, "
                      f"got {seconds!r}")
    return float(seconds)
