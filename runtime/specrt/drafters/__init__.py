"""The drafter registry: method name -> factory ``(env: DrafterEnv) -> Drafter``.

A method is listed here only when it is implemented; every listed method is checked against
plain decoding by the lossless stage and the test suite.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InvalidRequestError
from .base import Drafter, DrafterEnv, Feedback
from .baseline import NoDraft
from .pld import PromptLookup

DrafterFactory = Callable[[DrafterEnv], Drafter]


def _baseline(env: DrafterEnv) -> Drafter:
    return NoDraft()


def _pld(env: DrafterEnv) -> Drafter:
    return PromptLookup(tree=env.tree)


METHODS: dict[str, DrafterFactory] = {
    "baseline": _baseline,
    "pld": _pld,
}


def make_drafter(method: str, env: DrafterEnv) -> Drafter:
    factory = METHODS.get(method)
    if factory is None:
        raise InvalidRequestError(f"unknown method {method!r}; valid methods: {', '.join(sorted(METHODS))}")
    return factory(env)


__all__ = ["Drafter", "DrafterEnv", "Feedback", "METHODS", "make_drafter"]
