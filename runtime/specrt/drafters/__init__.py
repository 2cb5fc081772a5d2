"""The drafter registry: method name -> factory ``(tree: bool) -> Drafter``."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InvalidRequestError
from .base import Drafter
from .baseline import NoDraft
from .pld import PromptLookup

DrafterFactory = Callable[..., Drafter]

METHODS: dict[str, DrafterFactory] = {
    "baseline": NoDraft,
    "pld": PromptLookup,
}


def make_drafter(method: str, *, tree: bool = False) -> Drafter:
    factory = METHODS.get(method)
    if factory is None:
        raise InvalidRequestError(f"unknown method {method!r}; valid methods: {', '.join(sorted(METHODS))}")
    return factory(tree=tree)


__all__ = ["Drafter", "METHODS", "make_drafter"]
