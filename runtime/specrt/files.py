"""Files every layer writes or checks: the hashes an artifact's manifest records (a decoder's,
specrt.backend.manifest; a datastore's, specrt.drafters.indexes.datastore), JSON objects read with a
clear error, and specrt's per-user cache folder (``$SPECRT_CACHE_DIR``, default ``~/.cache/specrt``):
self-check verdicts (``selfcheck/``, :mod:`specrt.backend.verdict`) and verified stamps (``verified/``,
:mod:`specrt.backend.stamp`)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specrt.errors import ArtifactError

_HASH_CHUNK = 1 << 24


def cache_root() -> Path:
    return Path(os.environ.get("SPECRT_CACHE_DIR") or Path.home() / ".cache" / "specrt")


def write_json_atomic(path: Path, value: Any) -> None:
    """``value`` as JSON at ``path``, renamed into place (a reader never sees half a file); OSError
    when the folder cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    tmp.replace(path)





@dataclass(frozen=True)
class FileEntry:
    sha256: str
    bytes: int


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_entry(path: Path) -> FileEntry:
    return FileEntry(sha256=sha256_file(path), bytes=path.stat().st_size)


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (a manifest), or ArtifactError naming the file and the defect."""
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ArtifactError(f"{path}: expected a JSON object at the top level")
    return raw
