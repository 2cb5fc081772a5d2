"""Stage outputs appear whole or not at all: written beside their final path, then renamed into place.

    with staged_dir(Path("artifacts/M/fp32")) as stage:   # artifacts/M/.fp32.partial-<pid>-<hex>/
        write_everything_into(stage)
    # on success: the stage replaces artifacts/M/fp32 (an old folder is swapped out, then removed);
    # on an exception: the stage is removed and an old artifacts/M/fp32 stays as it was

    write_text_atomic(Path("artifacts/M/export.json"), text)   # .export.json.<pid>-<hex>.tmp, then rename

A stage killed mid-write (SIGKILL, power cut of the process) leaves at most a hidden
``.<name>.partial-*`` sibling, which no reader looks at and the next ``staged_dir`` of the same
path removes; the final path holds the old output or nothing, never a half-written one.
(Renames guard against interrupted processes, not against a crash of the machine: nothing is
fsynced but the text files.)
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


def _sibling(final: Path, tag: str) -> Path:
    return final.parent / f".{final.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _remove_stale(final: Path) -> None:
    """Remove the stages and swapped-out folders that an interrupted earlier run left beside ``final``."""
    for tag in ("partial", "old"):
        for stale in final.parent.glob(f".{glob.escape(final.name)}.{tag}-*"):
            log.info("removing %s, left by an interrupted run", stale)
            shutil.rmtree(stale, ignore_errors=True)


def replace_dir(stage: Path, final: Path) -> None:
    """Move the folder ``stage`` to ``final``, replacing a folder already there.

    A directory cannot be renamed over a non-empty one, so the old folder is first renamed aside;
    ``final`` is missing for the moment between the two renames, never half-written."""
    old = None
    if final.exists():
        old = _sibling(final, "old")
        os.rename(final, old)
    try:
        os.rename(stage, final)
    except BaseException:
        if old is not None:
            os.rename(old, final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """An empty folder beside ``final`` to write into; renamed onto ``final`` when the block ends
    without an exception, removed (``final`` untouched) when it raises."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(final)
    stage = _sibling(final, "partial")
    stage.mkdir()
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    replace_dir(stage, final)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling and a rename: readers see the old
    file or the new one, never a truncated one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
