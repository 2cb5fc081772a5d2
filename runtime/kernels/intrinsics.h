// The x86 intrinsics of the AVX-512 units: <immintrin.h>, or, compiled with -DSPECRT_EMULATED_AVX512
// (tests/runtime/test_kernels_emulated.py), SIMDe's portable AVX-512, which runs the same code on any x86 CPU.
#pragma once

#if defined(SPECRT_EMULATED_AVX512)
#include "simde_avx512.h"
#else
#include <immintrin.h>
#endif
