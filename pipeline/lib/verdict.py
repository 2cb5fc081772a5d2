"""The exit status of a stage that compares speculative output with plain decoding.

Greedy speculative decoding must give plain decoding's tokens on a spec-safe artifact; a variant
the spec-safety gate flagged (``spec_safe: false`` in its manifest) is expected to diverge, so its
divergence is reported, not failed. The lossless, benchmark and pair_bench stages end with it.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def exit_code(identical: bool, spec_safe: bool, variant: str, report: Path) -> int:
    """A stage's verdict on greedy runs: 1 if speculative output differs from plain decoding of a
    spec-safe artifact; a variant the gate flagged is reported, not failed (0)."""
    if identical:
        return 0
    if not spec_safe:
        log.warning("%s is flagged spec_safe=false and diverged, as the gate predicted: see %s", variant, report)
        return 0
    log.error("speculative output differs from plain decoding: see %s", report)
    return 1
