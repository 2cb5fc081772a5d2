"""specrt's per-user cache folder (``$SPECRT_CACHE_DIR``, default ``~/.cache/specrt``): self-check
verdicts (``selfcheck/``, :mod:`specrt.verdict`) and verified stamps (``verified/``, :mod:`specrt.stamp`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    return Path(os.environ.get("SPECRT_CACHE_DIR") or Path.home() / ".cache" / "specrt")


def write_json_atomic(path: Path, value: Any) -> None:
    """``value`` as JSON at ``path``, renamed into place (a reader never sees half a file); OSError
    when the folder cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    tmp.replace(path)
