"""Errors the runtime raises at its boundary: each names the field or file and what was expected."""

from __future__ import annotations


class SpecrtError(Exception):
    """Base class of every error specrt raises on purpose."""


class ArtifactError(SpecrtError):
    """An artifact folder is missing, incomplete, corrupt, or does not match its manifest."""


class InvalidRequestError(SpecrtError, ValueError):
    """A generation request (prompt, option or method name) is not acceptable."""
