// MatMulW8A8 for AVX-512 (F + BW): the scalar definition's bits (matmul_w8a8.h), a whole tile of 16
// columns per register. matmul_w8a8_avx512vnni.cc is the same loop with vpdpbusd.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)  // the whole unit: x86 only
#include "intrinsics.h"

#include "matmul_w8a8.h"

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

__m512i weights(__m512i w) { return w; }
// |xq| (u8) times W with xq's sign (s8) in 16-bit pairs (at most 2 * 127 * 127: no saturation), then
// pairs of pairs in 32 bits
__m512i dots_add(__m512i sums, __m512i w, __m512i a) {
  const __m512i signed_w = _mm512_mask_sub_epi8(w, _mm512_movepi8_mask(a), _mm512_setzero_si512(), w);
  const __m512i pairs = _mm512_maddubs_epi16(_mm512_abs_epi8(a), signed_w);
  return _mm512_add_epi32(sums, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
}
__m512i dots_finish(__m512i sums, int32_t) { return sums; }

}  // namespace

#include "matmul_w8a8_avx512.inc"

void quantize_tokens(const float* x, int64_t k, int64_t row_begin, int64_t row_end, const QuantizedTokens& tokens) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* row = x + r * k;
    int8_t* q = tokens.xq + r * k;
    __m512 most = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) most = _mm512_max_ps(most, _mm512_abs_ps(_mm512_loadu_ps(row + i)));
    float amax = _mm512_reduce_max_ps(most);  // max: exact in any order
    for (; i < k; ++i) amax = amax > std::fabs(row[i]) ? amax : std::fabs(row[i]);
    const float scale = (amax > 1e-30f ? amax : 1e-30f) / 127.0f;
    const __m512 divisor = _mm512_set1_ps(scale);
    __m512i sums = _mm512_setzero_si512();
    for (i = 0; i + 16 <= k; i += 16) {
      const __m512i v = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(row + i), divisor));  // nearest-even
      sums = _mm512_add_epi32(sums, v);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtsepi32_epi8(v));
    }
    int32_t sum = _mm512_reduce_add_epi32(sums);  // integer: exact in any order
    for (; i < k; ++i) {
      q[i] = static_cast<int8_t>(std::nearbyint(row[i] / scale));
      sum += q[i];
    }
    tokens.a_scale[r] = scale;
    tokens.offset[r] = 128 * sum;
  }
}

}  // namespace specrt::avx512
#endif
