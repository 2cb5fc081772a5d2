"""Verified stamps: an artifact file whose sha256 was checked is not hashed again on the next load
while it is provably the same file.

A stamp lives in specrt's cache folder (``$SPECRT_CACHE_DIR/verified/``, default
``~/.cache/specrt``), never in the artifact folder (which may be read-only, or a DVC output that a
new file would dirty); one per artifact folder, keyed by its resolved path. Per file it records the
sha256 the manifest expected and the file's state: size, mtime and ctime in nanoseconds, inode and
device. A file is trusted without hashing only when all of them are unchanged; any write to a file
changes its ctime, which no user can set back, so a file rewritten in place with its mtime restored
is hashed again. A manifest that now expects another sha256 also means hashing again. A stamp that
cannot be read is ignored; one that cannot be written (a read-only home) only costs the hashing
next time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from specrt.files import cache_root, write_json_atomic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileState:
    bytes: int
    mtime_ns: int
    ctime_ns: int  # set by the kernel on every write, chmod or link: cannot be restored by hand
    inode: int
    device: int

    @classmethod
    def of(cls, path: Path) -> FileState:
        st = os.stat(path)
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


@dataclass(frozen=True)
class Verified:
    sha256: str  # what the manifest expected, and the file had
    state: FileState


def stamp_path(folder: Path) -> Path:
    key = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()
    return cache_root() / "verified" / f"{key[:32]}.json"


def read_stamp(folder: Path) -> dict[str, Verified]:
    """File name -> what was verified, or {} when there is no readable stamp."""
    try:
        raw = json.loads(stamp_path(folder).read_text())
        return {name: Verified(v["sha256"], FileState(**v["state"])) for name, v in raw["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_stamp(folder: Path, verified: dict[str, Verified]) -> None:
    try:
        write_json_atomic(stamp_path(folder), {"folder": str(folder.resolve()),
                                               "files": {name: asdict(v) for name, v in verified.items()}})
    except OSError as e:
        log.info("%s: verified stamp not written (%s); the next load hashes the files again", folder, e)
