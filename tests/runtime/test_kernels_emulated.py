"""specrt's AVX-512 kernel units, run on any x86 CPU through SIMDe's portable AVX-512: the same bits
as the scalar units (tests/runtime/kernels/avx512_emulated.cc).

The AVX-512 paths are chosen at run time on CPUs that have AVX-512; on a machine without it,
tests/test_spec_attention.py, tests/test_matmul_q4.py and tests/test_matmul_w8a8.py cannot run
them. Here the same source files are compiled with -DSPECRT_EMULATED_AVX512, which swaps <immintrin.h> for SIMDe
(tests/runtime/kernels/simde_avx512.h) and drops the target pragmas, so a wrong lane, mask or layout in
the AVX-512 code shows as a difference from the scalar definition on every machine. SIMDe's headers
come from Debian's libsimde-dev (fetched by runtime/kernels/fetch_debian_package.sh into the cache
folder, as the onnxruntime headers are), or from $SIMDE_INCLUDE_DIR.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "runtime" / "kernels"
HARNESS = ROOT / "tests" / "runtime" / "kernels"
AVX512_UNITS = ("matmul_q4_avx512.cc", "matmul_q4_avx512vnni.cc", "matmul_w8a8_avx512.cc", "matmul_w8a8_avx512vnni.cc",
                "kernel_avx512.cc")
SCALAR_UNITS = ("kernel_scalar.cc", "matmul_q4_scalar.cc", "matmul_w8a8_scalar.cc", "rotary.cc")
FLAGS = ["-std=c++17", "-O1", "-ffp-contract=off", "-fno-math-errno"]  # as setup.py, bar -O3 (compile time)

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not shutil.which("g++"),
                                reason="the AVX-512 units are x86 code and need g++")


def simde_include() -> Path:
    """A folder holding simde/x86/avx512.h: $SIMDE_INCLUDE_DIR, /usr/include, or the cache (fetched)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specrt" / "simde"
    candidates = [Path(os.environ["SIMDE_INCLUDE_DIR"])] if os.environ.get("SIMDE_INCLUDE_DIR") else []
    candidates += [Path("/usr/include"), cache / "usr" / "include"]
    for folder in candidates:
        if (folder / "simde" / "x86" / "avx512.h").is_file():
            return folder
    fetch = subprocess.run(["bash", str(KERNELS / "fetch_debian_package.sh"), "libsimde-dev", str(cache)],
                           capture_output=True, text=True)
    if fetch.returncode or not (cache / "usr" / "include" / "simde" / "x86" / "avx512.h").is_file():
        pytest.skip(f"SIMDe headers not found in {[str(c) for c in candidates]} and not fetched: {fetch.stderr[-300:]}")
    return cache / "usr" / "include"


def test_avx512_units_give_the_scalar_bits_under_emulation(tmp_path):
    include = simde_include()
    objects = []
    for unit in AVX512_UNITS:
        obj = tmp_path / unit.replace(".cc", ".o")
        subprocess.run(["g++", *FLAGS, "-DSPECRT_EMULATED_AVX512", f"-I{KERNELS}", f"-I{HARNESS}", f"-I{include}",
                        "-c", str(KERNELS / unit), "-o", str(obj)], check=True)
        objects.append(str(obj))
    binary = tmp_path / "avx512_emulated"
    subprocess.run(["g++", *FLAGS, f"-I{KERNELS}", str(HARNESS / "avx512_emulated.cc"),
                    *(str(KERNELS / unit) for unit in SCALAR_UNITS), *objects, "-o", str(binary)], check=True)
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "all equal", run.stdout + run.stderr
