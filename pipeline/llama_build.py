"""Stage `llama_cpp`: build llama-cpp-python from source into a folder, for the peers stage.

    params.yaml <section>.llama_cpp {enabled, version, cmake_args, skip_common}
        | CMAKE_ARGS="<cmake_args> [<skip_common hook>]" pip install --target STAGE --no-deps
        |     --no-binary llama-cpp-python --no-cache-dir llama-cpp-python==<version>   (CMake builds llama.cpp)
        v
    OUT/llama_cpp/...              the package and its shared libraries (llama_cpp/lib/*.so)
    OUT/diskcache/...              pip install --target OUT --no-deps diskcache==5.6.3 (BESIDE)
    OUT/llama_build.json           what was built and how: version, cmake_args, command, seconds, bytes
        | a fresh interpreter with OUT first on sys.path imports llama_cpp: the libraries load
        v
    the peers stage's llama.cpp worker puts OUT on sys.path (pipeline/lib/peer_worker.py)

Nothing is installed into the running environment. ``--no-deps``: llama_cpp's own dependencies
numpy, jinja2 and typing-extensions come from the environment (the pipeline's), diskcache, which
it lacks, is installed beside llama_cpp (:data:`BESIDE`); the smoke import checks them all.
``--no-cache-dir``: pip's wheel cache is keyed by the source, not by ``CMAKE_ARGS``, and could
hand back a wheel built with other options.

``skip_common``: llama-cpp-python loads libllama and libggml* (libmtmd only for multimodal chat),
never llama.cpp's ``common`` library (the helpers of its command-line tools: argument parsing,
chat templates, Jinja), yet its CMakeLists forces ``LLAMA_BUILD_COMMON`` on, a cache variable set
with ``FORCE`` that no ``-D`` overrides. CMake's ``CMAKE_PROJECT_<name>_INCLUDE`` hook runs a file
right after ``project(llama.cpp)``; :data:`SKIP_COMMON` there sets a normal variable of the same
name in llama.cpp's directory scope, which ``option()`` keeps (policy CMP0077) and ``if()`` reads
before the cache: the library and its install rule drop out (about 50 of 127 compile units).

``--section`` names the params.yaml section (``peers``, ``peers_full``); with its ``llama_cpp``
absent or ``enabled: false`` OUT holds the record alone (``"built": false``) and that peers run
has no llama.cpp peer.

Run without DVC:

    python -m pipeline.llama_build --params params.yaml --section peers_full --out artifacts/peers/llama_cpp \\
        [--source llama_cpp_python-0.3.36.tar.gz]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .lib.atomic import staged_dir, write_text_atomic
from .lib.llama_record import RECORD, cpu_model
from .lib.params import stage_params

log = logging.getLogger(__name__)

PACKAGE = "llama-cpp-python"
SKIP_COMMON = "set(LLAMA_BUILD_COMMON OFF)  # pipeline/llama_build.py: llama_cpp never loads libllama-common\n"
# llama_cpp's own dependencies that the build environment lacks, installed beside it (pure Python);
# numpy, jinja2 and typing-extensions come from the environment
BESIDE = ("diskcache==5.6.3",)
MIN_CMAKE = (3, 21)  # llama-cpp-python's CMakeLists: cmake_minimum_required(VERSION 3.21)
_VERSION = re.compile(r"^\d+(\.\d+)*$")


@dataclass(frozen=True)
class LlamaBuild:
    """params.yaml ``<section>.llama_cpp`` with ``enabled: true``: the build's inputs (the peers
    stage reads its other keys)."""

    version: str  # exact llama-cpp-python version, e.g. "0.3.36"
    cmake_args: tuple[str, ...]  # each "-DNAME=VALUE", joined into CMAKE_ARGS
    skip_common: bool = False  # leave out llama.cpp's common library (see the module docstring)

    def __post_init__(self) -> None:
        if not _VERSION.match(self.version):
            raise ValueError(f"llama_cpp.version must be an exact version such as '0.3.36' (a quoted "
                             f"string), got {self.version!r}")
        bad = [a for a in self.cmake_args if not a.startswith("-D") or "=" not in a or " " in a]
        if bad:
            raise ValueError(f"llama_cpp.cmake_args: every entry must be -DNAME=VALUE without spaces, "
                             f"got {bad[0]!r}")


def read_build(params_path: Path, section: str = "peers_full") -> LlamaBuild | None:
    """``<section>.llama_cpp`` of ``params_path``: None when it is absent or ``enabled: false``;
    errors name the missing or wrong key."""
    where = f"{params_path}: {section}.llama_cpp"
    value = stage_params(params_path, section).get("llama_cpp")
    if value is None:
        return None
    if not isinstance(value, dict) or "enabled" not in value:
        raise ValueError(f"{where} must be a mapping with `enabled`, got {value!r}")
    if not value["enabled"]:
        return None
    for key in ("version", "cmake_args"):
        if key not in value:
            raise ValueError(f"{where}.{key} is missing")
    if not isinstance(value["version"], str):
        raise ValueError(f"{where}.version must be a quoted string, got {value['version']!r}")
    if not isinstance(value["cmake_args"], list):
        raise ValueError(f"{where}.cmake_args must be a list")
    return LlamaBuild(value["version"], tuple(str(a) for a in value["cmake_args"]),
                      bool(value.get("skip_common", False)))


def pip_command(build: LlamaBuild, target: Path, source: Path | None = None) -> list[str]:
    """The ``pip install --target`` command line (run with ``CMAKE_ARGS`` = :func:`cmake_env`).
    ``source``: a local sdist of the same version instead of PyPI's."""
    spec = str(source) if source is not None else f"{PACKAGE}=={build.version}"
    return [sys.executable, "-m", "pip", "install", "--target", str(target), "--no-deps", "--no-binary", PACKAGE,
            "--no-cache-dir", "--disable-pip-version-check", "--no-input", spec]


def beside_command(target: Path) -> list[str]:
    """The ``pip install --target`` command line of :data:`BESIDE` (wheels, no build)."""
    return [sys.executable, "-m", "pip", "install", "--target", str(target), "--no-deps", "--only-binary", ":all:",
            "--disable-pip-version-check", "--no-input", *BESIDE]


def cmake_env(build: LlamaBuild, hook: Path) -> dict[str, str]:
    """The environment additions of the build: ``CMAKE_ARGS``, read by llama-cpp-python's build
    backend; with ``skip_common``, ``hook`` (a file holding :data:`SKIP_COMMON`) as llama.cpp's
    project include."""
    args = [*build.cmake_args, *([f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={hook}"] if build.skip_common else [])]
    return {"CMAKE_ARGS": " ".join(args)}


def check_source(build: LlamaBuild, source: Path) -> None:
    """A local sdist must exist and be of the pinned version (by its file name, as pip names sdists)."""
    if not source.is_file():
        raise FileNotFoundError(f"--source {source}: no such file")
    if f"-{build.version}.tar.gz" not in source.name:
        raise ValueError(f"--source {source.name} is not llama-cpp-python {build.version} "
                         f"(peers_full.llama_cpp.version); expected a name ending in -{build.version}.tar.gz")


def _cmake_version(cmake: str) -> tuple[int, ...] | None:
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"cmake version (\d+)\.(\d+)", out)
    return tuple(int(x) for x in found.groups()) if found else None


def check_toolchain(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What the build needs from the machine: a C and a C++ compiler (``CC``/``CXX`` or cc/gcc/clang,
    c++/g++/clang++), raised as one clear error when missing. CMake and Ninja are reported: when
    missing or too old, pip's build isolation fetches them from PyPI (scikit-build-core does)."""
    env = dict(os.environ if env is None else env)
    found: dict[str, Any] = {}
    missing = []
    for lang, var, names in (("C", "CC", ("cc", "gcc", "clang")), ("C++", "CXX", ("c++", "g++", "clang++"))):
        candidates = [env[var]] if env.get(var) else list(names)
        path = next((p for p in (shutil.which(c, path=env.get("PATH")) for c in candidates) if p), None)
        if path is None:
            missing.append(f"a {lang} compiler ({var} or one of {', '.join(candidates)})")
        found[var] = path
    if missing:
        raise RuntimeError(f"building llama.cpp needs {' and '.join(missing)} on PATH; none was found "
                           "(Debian/Ubuntu: apt-get install build-essential)")
    cmake = shutil.which("cmake", path=env.get("PATH"))
    version = _cmake_version(cmake) if cmake else None
    found["cmake"] = ".".join(map(str, version)) if version else None
    if version is None or version < MIN_CMAKE:
        log.info("cmake %s: pip will fetch cmake >= %s from PyPI for the build",
                 found["cmake"] or "not found", ".".join(map(str, MIN_CMAKE)))
    found["ninja"] = shutil.which("ninja", path=env.get("PATH"))
    return found


# (what pip's output says, what it means)
_DIAGNOSES = (
    ("No CMAKE_C_COMPILER could be found", "CMake found no C compiler"),
    ("No CMAKE_CXX_COMPILER could be found", "CMake found no C++ compiler"),
    ("CMake Error", "CMake failed to configure or build llama.cpp (see the CMake error above)"),
    ("No matching distribution found", "pip found no such llama-cpp-python version (or no index is reachable)"),
    ("Could not find a version that satisfies", "pip found no such version (or no index is reachable)"),
    ("Failed to establish a new connection", "no package index is reachable (the build needs "
     "llama-cpp-python's sdist and its build backend, scikit-build-core)"),
)


def diagnose(log_text: str) -> str:
    """One line naming why a pip build failed, from its output (the first known cause found)."""
    for needle, meaning in _DIAGNOSES:
        if needle in log_text:
            return meaning
    return "pip failed (see the end of its output)"


def smoke_import(folder: Path) -> str:
    """Import llama_cpp from ``folder`` in a fresh interpreter (its shared libraries load); its version."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); import llama_cpp; print(llama_cpp.__version__)"
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the built llama_cpp does not import from {folder}:\n{done.stderr[-2000:]}")
    return done.stdout.strip()


def build_llama_cpp(build: LlamaBuild | None, out: Path, source: Path | None = None) -> dict[str, Any]:
    """Build and install llama-cpp-python into ``out`` (written whole or not at all); the record.
    ``build`` None (llama.cpp disabled): ``out`` holds the record alone."""
    out = Path(out)
    record: dict[str, Any] = {"enabled": build is not None, **(asdict(build) if build else {}), "built": False}
    if build is None:
        with staged_dir(out) as stage:
            write_text_atomic(stage / RECORD, json.dumps(record, indent=2) + "\n")
        return record
    if source is not None:
        check_source(build, source)
    toolchain = check_toolchain()
    with staged_dir(out) as stage, tempfile.TemporaryDirectory() as tmp:
        hook = Path(tmp) / "skip_common.cmake"
        hook.write_text(SKIP_COMMON)
        cmd = pip_command(build, stage, source)
        env = {**os.environ, **cmake_env(build, hook)}
        shown = f"CMAKE_ARGS={shlex.quote(env['CMAKE_ARGS'])} " + shlex.join(
            ["python", *pip_command(build, out, source)[1:]])  # as run, but into OUT rather than its stage
        log.info("building: %s", shown)
        t0 = time.perf_counter()
        log_path = out.parent / f".{out.name}.build.log"
        with open(log_path, "w", encoding="utf-8") as build_log:
            done = subprocess.run(cmd, stdout=build_log, stderr=subprocess.STDOUT, env=env, check=False)
        seconds = time.perf_counter() - t0
        text = log_path.read_text(encoding="utf-8", errors="replace")
        if done.returncode != 0:
            raise RuntimeError(f"building {PACKAGE} {build.version} failed: {diagnose(text)}. pip exited "
                               f"{done.returncode}; its output is in {log_path}; the end:\n{text[-3000:]}")
        shutil.move(log_path, stage / "build.log")
        beside = beside_command(stage)
        done = subprocess.run(beside, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            said = done.stdout + done.stderr
            raise RuntimeError(f"installing {', '.join(BESIDE)} into {out} failed: {diagnose(said)}; "
                               f"the end of pip's output:\n{said[-3000:]}")
        version = smoke_import(stage)
        if version != build.version:
            raise RuntimeError(f"built llama_cpp reports version {version}, llama_cpp.version is {build.version}")
        record.update({
            "built": True,
            "command_line": shown,
            "source": str(source) if source is not None else "PyPI",
            "toolchain": toolchain,
            "cpu": cpu_model(),  # GGML_NATIVE: the code targets this CPU
            "python": sys.version.split()[0],
            "build_s": round(seconds, 1),
            "bytes": sum(p.stat().st_size for p in stage.rglob("*") if p.is_file()),
        })
        write_text_atomic(stage / RECORD, json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=Path, required=True, help="params.yaml (its <section>.llama_cpp mapping)")
    parser.add_argument("--section", default="peers_full", help="the params.yaml section whose llama_cpp is built "
                        "(peers_full: the full run's)")
    parser.add_argument("--out", type=Path, required=True, help="folder to install the package into")
    parser.add_argument("--source", type=Path, help="a local llama_cpp_python-<version>.tar.gz instead of PyPI's")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    record = build_llama_cpp(read_build(args.params, args.section), args.out, args.source)
    if record["built"]:
        log.info("built llama-cpp-python %s in %.0f s (%.1f MB) into %s", record["version"], record["build_s"],
                 record["bytes"] / 1e6, args.out)
    else:
        log.info("%s.llama_cpp is disabled: %s holds the record only", args.section, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
