// MatMulQ4 for AVX-512 (F + BW): the scalar definition's bits (matmul_q4.h), a whole tile of 16
// columns per register. matmul_q4_avx512vnni.cc is the same loop with vpdpbusd.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)  // the whole unit: x86 only
#include "intrinsics.h"

#include "matmul_q4.h"

#if !defined(SPECRT_EMULATED_AVX512)
#pragma GCC target("avx512f,avx512bw,avx2,fma")  // after the headers: only the code below is built for it
#endif

namespace specrt::avx512 {
namespace {

// one copy per unit, in its namespace: no inline code is shared between instruction sets
int32_t load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// u8 x s8 pairs summed in 16 bits (a block's stay below 30480, matmul_q4.h), then pairs of pairs in 32
__m512i dots_add(__m512i sums, __m512i w, __m512i a) { return _mm512_add_epi16(sums, _mm512_maddubs_epi16(w, a)); }
__m512i dots_finish(__m512i sums) { return _mm512_madd_epi16(sums, _mm512_set1_epi16(1)); }

}  // namespace

#include "matmul_q4_avx512.inc"

void quantize_rows(const float* x, int64_t k, int64_t row_begin, int64_t row_end, const QuantizedRows& rows) {
  const int64_t blocks = k / kQ4Block;
  for (int64_t r = row_begin; r < row_end; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + r * k + b * kQ4Block;
      const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));  // exact
      __m256i q8 = _mm256_setzero_si256();
      int32_t sum = 0;
      if (amax > 0.0f) {
        const __m512 inv = _mm512_set1_ps(127.0f / amax);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
        sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));  // integer: exact
        q8 = _mm256_setr_m128i(_mm512_cvtsepi32_epi8(q0), _mm512_cvtsepi32_epi8(q1));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows.xq + r * k + b * kQ4Block), q8);
      rows.dx[r * blocks + b] = amax / 127.0f;
      rows.offset[r * blocks + b] = 8 * sum;
    }
}

}  // namespace specrt::avx512
#endif
