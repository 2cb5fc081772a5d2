"""The drafter registry: method name -> factory ``(env: DrafterEnv) -> Drafter``.

A method is listed here only when it is implemented; every listed method is checked against
plain decoding by the lossless stage and the test suite. Each module has one method (or one
family) and a module-level ``make`` factory.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InvalidRequestError
from . import (
    adapld,
    anpd,
    asd,
    auto,
    baseline,
    draft_model,
    lookahead,
    pld,
    pld_plus,
    rest,
    sam,
    suffix_decoding,
    token_recycling,
)
from .base import Drafter, DrafterEnv, Feedback

DrafterFactory = Callable[[DrafterEnv], Drafter]

METHODS: dict[str, DrafterFactory] = {
    "baseline": baseline.make,
    "pld": pld.make,
    "pld_plus": pld_plus.make,
    "adapld": adapld.make,
    "anpd": anpd.make,
    "lookahead": lookahead.make,
    "token_recycling": token_recycling.make,
    "rest": rest.make,
    "sam_decoding": sam.make,
    "asam": sam.make_asam,
    "asam_verify": sam.make_asam_verify,
    "suffix_decoding": suffix_decoding.make,
    "asd": asd.make_asd,
    "asd_verify": asd.make_asd_verify,
    "sd": draft_model.make_sd,
    "hsd": draft_model.make_hsd,
    "hsd_capped": draft_model.make_hsd_capped,
    "auto": auto.make,  # the cost-aware controller over the others (specrt.drafters.auto)
}
NEEDS_DRAFT = frozenset({"sd", "hsd", "hsd_capped"})  # methods that need specrt.load(..., draft=...)
SELF_BACKING_OFF = frozenset({"auto"})  # methods that cut their drafts to what pays themselves
DEFAULT_METHOD = "auto"  # of the API, the CLI and the server: the controller picks the draft per step


def make_drafter(method: str, env: DrafterEnv) -> Drafter:
    factory = METHODS.get(method)
    if factory is None:
        raise InvalidRequestError(f"unknown method {method!r}; valid methods: {', '.join(sorted(METHODS))}")
    return factory(env)


__all__ = [
    "Drafter", "DrafterEnv", "Feedback", "DEFAULT_METHOD", "METHODS", "NEEDS_DRAFT", "SELF_BACKING_OFF", "make_drafter",
]
