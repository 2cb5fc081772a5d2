// SIMDe's portable AVX-512 under the intrinsics' own names, for the kernel units compiled with
// -DSPECRT_EMULATED_AVX512 (tests/test_kernels_emulated.py): the AVX-512 code then runs on any x86
// CPU, through SIMDe's lane-by-lane definitions. What a SIMDe release lacks, and the fused
// multiply-add (SIMDe rounds twice where the compiler has no FMA), are defined here lane by lane.
#pragma once

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cmath>
#include <cstdint>

// constants SIMDe names with its own prefix only, where the compiler has no native SSE4.1 / AVX
#ifndef _MM_FROUND_TO_NEAREST_INT
#define _MM_FROUND_TO_NEAREST_INT SIMDE_MM_FROUND_TO_NEAREST_INT
#endif
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#endif
#ifndef _CMP_LT_OQ
#define _CMP_LT_OQ SIMDE_CMP_LT_OQ
#endif

namespace emulated {

inline simde__m512i cvtps_epi32(simde__m512 a) {  // rounds as the MXCSR default does: nearest, ties even
  float f[16];
  int32_t i[16];
  simde_mm512_storeu_ps(f, a);
  for (int l = 0; l < 16; ++l) i[l] = static_cast<int32_t>(std::nearbyint(f[l]));
  return simde_mm512_loadu_si512(i);
}

inline float reduce_max_ps(simde__m512 a) {
  float f[16];
  simde_mm512_storeu_ps(f, a);
  float m = f[0];
  for (int l = 1; l < 16; ++l) m = m > f[l] ? m : f[l];
  return m;
}

inline int32_t reduce_add_epi32(simde__m512i a) {
  int32_t i[16];
  simde_mm512_storeu_si512(i, a);
  int32_t s = 0;
  for (int l = 0; l < 16; ++l) s += i[l];
  return s;
}

inline void mask_storeu_ps(void* p, uint16_t mask, simde__m512 v) {
  float f[16];
  simde_mm512_storeu_ps(f, v);
  for (int l = 0; l < 16; ++l)
    if (mask >> l & 1) static_cast<float*>(p)[l] = f[l];
}

inline uint16_t cmplt_epi32_mask(simde__m512i a, simde__m512i b) {
  int32_t x[16], y[16];
  simde_mm512_storeu_si512(x, a);
  simde_mm512_storeu_si512(y, b);
  uint16_t mask = 0;
  for (int l = 0; l < 16; ++l)
    if (x[l] < y[l]) mask = static_cast<uint16_t>(mask | 1u << l);
  return mask;
}

inline simde__m512 fmadd_ps(simde__m512 a, simde__m512 b, simde__m512 c) {  // one rounding, with or without FMA
  float x[16], y[16], z[16];
  simde_mm512_storeu_ps(x, a);
  simde_mm512_storeu_ps(y, b);
  simde_mm512_storeu_ps(z, c);
  for (int l = 0; l < 16; ++l) z[l] = std::fma(x[l], y[l], z[l]);
  return simde_mm512_loadu_ps(z);
}

}  // namespace emulated

#undef _mm512_cvtps_epi32
#define _mm512_cvtps_epi32 emulated::cvtps_epi32
#undef _mm512_reduce_max_ps
#define _mm512_reduce_max_ps emulated::reduce_max_ps
#undef _mm512_reduce_add_epi32
#define _mm512_reduce_add_epi32 emulated::reduce_add_epi32
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps emulated::mask_storeu_ps
#undef _mm512_cmplt_epi32_mask
#define _mm512_cmplt_epi32_mask emulated::cmplt_epi32_mask
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps emulated::fmadd_ps
