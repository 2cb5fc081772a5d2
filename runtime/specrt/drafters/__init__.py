"""The drafter registry: method name -> :class:`Method` (factory ``(env: DrafterEnv) -> Drafter``,
accept rule, needs).

A method is listed here only when it is implemented; every listed method is checked against
plain decoding by the lossless stage and the test suite. Each module has one method (or one
family) and a module-level ``make`` factory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specrt.drafters import (
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
from specrt.drafters.base import Drafter, DrafterEnv, DraftModel, Feedback
from specrt.errors import InvalidRequestError

DrafterFactory = Callable[[DrafterEnv], Drafter]


@dataclass(frozen=True)
class Method:
    """A drafting method: its factory, the rule that accepts its drafts, and what it needs.

    ``accept``: the rule for drafts sampled from a q (specrt.engine.accept): ``sd`` (token-wise on a
    chain, multi-candidate recursive rejection sampling on a tree), ``hsd`` or ``hsd_capped``; drafts
    without q are walked by recursive rejection sampling whatever it is, and greedy decoding follows
    the argmax. A Method that is not registered may be passed as ``method=`` to a request."""

    make: DrafterFactory
    accept: str = "sd"
    needs_datastore: bool = False  # a retrieval corpus: specrt.load(..., datastore=...)
    needs_draft: bool = False  # a draft model: specrt.load(..., draft=...)
    backs_off: bool = False  # cuts its drafts to what pays itself (the engine's back-off stays off)


METHODS: dict[str, Method] = {
    "baseline": Method(baseline.make),
    "pld": Method(pld.make),
    "pld_plus": Method(pld_plus.make),
    "adapld": Method(adapld.make),
    "anpd": Method(anpd.make),
    "lookahead": Method(lookahead.make),
    "token_recycling": Method(token_recycling.make),
    "rest": Method(rest.make, needs_datastore=True),
    "sam_decoding": Method(sam.make, needs_datastore=True),
    "asam": Method(sam.make_asam, needs_datastore=True),
    "asam_verify": Method(sam.make_asam_verify, needs_datastore=True),
    "suffix_decoding": Method(suffix_decoding.make),
    "asd": Method(asd.make_asd),
    "asd_verify": Method(asd.make_asd_verify),
    "sd": Method(draft_model.make_sd, accept="sd", needs_draft=True),
    "hsd": Method(draft_model.make_hsd, accept="hsd", needs_draft=True),
    "hsd_capped": Method(draft_model.make_hsd_capped, accept="hsd_capped", needs_draft=True),
    # the cost-aware controller over the others (specrt.drafters.auto); its draft-model member drafts for sd
    "auto": Method(auto.make, accept="sd", backs_off=True),
}
NEEDS_DRAFT = frozenset(name for name, m in METHODS.items() if m.needs_draft)
NEEDS_DATASTORE = frozenset(name for name, m in METHODS.items() if m.needs_datastore)
SELF_BACKING_OFF = frozenset(name for name, m in METHODS.items() if m.backs_off)
DEFAULT_METHOD = "auto"  # of the API, the CLI and the server: the controller picks the draft per step


def make_drafter(method: str, env: DrafterEnv) -> Drafter:
    entry = METHODS.get(method)
    if entry is None:
        raise InvalidRequestError(f"unknown method {method!r}; valid methods: {', '.join(sorted(METHODS))}")
    return entry.make(env)


__all__ = [
    "Drafter", "DrafterEnv", "DraftModel", "Feedback", "Method", "DEFAULT_METHOD", "METHODS", "NEEDS_DATASTORE",
    "NEEDS_DRAFT", "SELF_BACKING_OFF", "make_drafter",
]
