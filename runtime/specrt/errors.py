"""Errors the runtime raises at its boundary: each names the field or file and what was expected."""

from __future__ import annotations

import math

import numpy as np


class SpecrtError(Exception):
    """Base class of every error specrt raises on purpose."""


class ArtifactError(SpecrtError):
    """An artifact folder is missing, incomplete, corrupt, or does not match its manifest."""


class InvalidRequestError(SpecrtError, ValueError):
    """A generation request (prompt, option or method name) is not acceptable."""


class MissingDependencyError(SpecrtError, ImportError):
    """An optional feature whose extra is not installed; names the extra (e.g. ``specrt[chat]``)."""


class DrafterError(SpecrtError):
    """A drafter raised, or proposed a malformed draft tree; names the drafter. The model stays usable."""


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` as an int, or :class:`InvalidRequestError` naming ``name``: a bool, a float or a
    string is refused (``max_new_tokens=True`` or ``=8.0`` is a caller's bug, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidRequestError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidRequestError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_number(name: str, value: object) -> float:
    """``value`` as a finite float, or :class:`InvalidRequestError` naming ``name`` (bools, strings,
    NaN and infinities are refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidRequestError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be a finite number, got {value}")
    return float(value)
