// MatMulQ4 for AVX-512 with VNNI: vpdpbusd sums the u8 x s8 products of a block straight into 32
// bits. Integer sums are exact, so the dot products, hence the outputs, equal matmul_q4_avx512.cc's.
// Activations are quantized by avx512::quantize_rows.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)  // the whole unit: x86 only
#include "intrinsics.h"

#include "matmul_q4.h"

#if !defined(SPECRT_EMULATED_AVX512)
#pragma GCC target("avx512f,avx512bw,avx512vnni,avx2,fma")  // after the headers: only the code below is built for it
#endif

namespace specrt::avx512vnni {
namespace {

// one copy per unit, in its namespace: no inline code is shared between instruction sets
int32_t load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

__m512i dots_add(__m512i sums, __m512i w, __m512i a) { return _mm512_dpbusd_epi32(sums, w, a); }
__m512i dots_finish(__m512i sums) { return sums; }

}  // namespace

#include "matmul_q4_avx512.inc"

}  // namespace specrt::avx512vnni
#endif
