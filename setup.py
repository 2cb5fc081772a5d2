"""Builds specrt's kernel library (runtime/kernels: onnxruntime custom operators) with the package.

The library is a plain shared object that onnxruntime loads with ``register_custom_ops_library``;
it is built as ``specrt/_kernels*.so`` by ``pip install .`` and ``pip install -e .``. It needs a C++17
compiler and onnxruntime's C API headers, looked for in this order: ``$ORT_INCLUDE_DIR``,
``pkg-config --cflags libonnxruntime``, ``/usr/include/onnxruntime``, and the cache folder that
``bash runtime/kernels/fetch_ort_headers.sh`` fills (Debian's libonnxruntime-dev).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNELS = Path("runtime/kernels")
HEADER = "onnxruntime_cxx_api.h"
FETCH = f"bash {KERNELS}/fetch_ort_headers.sh"


def header_candidates() -> list[Path]:
    found = []
    if os.environ.get("ORT_INCLUDE_DIR"):
        found.append(Path(os.environ["ORT_INCLUDE_DIR"]))
    if shutil.which("pkg-config"):
        flags = subprocess.run(["pkg-config", "--cflags-only-I", "libonnxruntime"], capture_output=True, text=True)
        if flags.returncode == 0:
            found += [Path(flag[2:]) for flag in flags.stdout.split() if flag.startswith("-I")]
    found.append(Path("/usr/include/onnxruntime"))
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    found.append(cache / "specrt/onnxruntime-headers/usr/include/onnxruntime")
    return found


def ort_include_dir() -> Path:
    candidates = header_candidates()
    for folder in candidates:
        if (folder / HEADER).is_file():
            return folder
    raise SystemExit(
        f"specrt: onnxruntime's C API headers ({HEADER}) were not found in {[str(c) for c in candidates]}. "
        f"Run `{FETCH}` (downloads Debian's libonnxruntime-dev into the last folder), or set ORT_INCLUDE_DIR "
        "to a folder that holds them, then install again."
    )


def compile_in_parallel(compiler, jobs: int) -> None:
    """Have ``compiler`` (a distutils CCompiler) compile an extension's sources ``jobs`` at a time:
    the library's units are independent, and on a 2-core machine a serial build is twice as long
    (it runs in every install: the README's commands build it twice and CI a third time). A
    compiler without distutils' _setup_compile/_compile steps keeps its serial compile."""
    if jobs < 2 or not all(hasattr(compiler, name) for name in ("_setup_compile", "_get_cc_args", "_compile")):
        return

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=False, extra_preargs=None,
                extra_postargs=None, depends=None):
        macros, objects, extra, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj: str) -> None:
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra, pp_opts)

        with ThreadPoolExecutor(jobs) as pool:  # list(): the first failure's error is raised here
            list(pool.map(one, [obj for obj in objects if obj in build]))
        return objects

    compiler.compile = compile


class BuildKernels(build_ext):
    """build_ext for the kernel library: finds the headers and says how to get a missing one."""

    def build_extensions(self) -> None:
        include = ort_include_dir()
        compiler = self.compiler.compiler_so[0] if getattr(self.compiler, "compiler_so", None) else "c++"
        if not shutil.which(compiler):
            raise SystemExit(f"specrt: no C++ compiler ({compiler!r}) to build the kernel library; install g++ "
                             "(Debian: apt-get install g++) and install again")
        for extension in self.extensions:
            extension.include_dirs.append(str(include))
        compile_in_parallel(self.compiler, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "specrt.backend._kernels",
            sources=[str(KERNELS / name) for name in (
                "ort_glue.cc", "spec_attention_op.cc", "rotary.cc", "kernel_scalar.cc", "kernel_avx2.cc", "kernel_avx512.cc",
                "matmul_q4_op.cc", "matmul_q4_scalar.cc", "matmul_q4_avx2.cc", "matmul_q4_avx512.cc",
                "matmul_q4_avx512vnni.cc", "matmul_q4_amx.cc", "matmul_w8a8_op.cc", "matmul_w8a8_amx.cc", "matmul_w8a8_scalar.cc", "matmul_w8a8_avx2.cc", "matmul_w8a8_avxvnni.cc",
                "matmul_w8a8_avx512.cc", "matmul_w8a8_avx512vnni.cc")],
            depends=[str(KERNELS / name) for name in (
                "ort_glue.h", "intrinsics.h", "attention.h", "canonical.h", "attention_impl.inc", "matmul_q4.h", "matmul_q4_avx512.inc",
                "matmul_w8a8.h", "matmul_w8a8_avx512.inc", "amx.h", "amx_tiles.inc")],
            language="c++",
            # -ffp-contract=off: no multiply-add is fused unless the code says so, in every unit alike
            extra_compile_args=["-std=c++17", "-O3", "-ffp-contract=off", "-fno-math-errno"],
            py_limited_api=False,
        )
    ],
    cmdclass={"build_ext": BuildKernels},
)
