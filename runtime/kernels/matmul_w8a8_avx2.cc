// MatMulW8A8 for AVX2 + FMA: the scalar definition's bits (matmul_w8a8.h), a tile's 16 columns in two
// registers. Rows go through a tile 4 at a time, sharing each group's weight load, so extra rows of a
// window cost their multiply-adds and little else.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)  // the whole unit: x86 only
#include <immintrin.h>

#include "matmul_w8a8.h"

#pragma GCC target("avx2,fma")  // after the headers: only the code below is built for it

namespace specrt::avx2 {
namespace {

// one copy per unit, in its namespace: no inline code is shared between instruction sets
int32_t load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

float hmax(__m256 v) {  // max: exact in any order
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// lanes [0, count) of 8 set
__m256i lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// xq * W of 4 k per lane: |xq| (u8) times W with xq's sign (s8), pairs in 16 bits (at most
// 2 * 127 * 127: no saturation), then pairs of pairs in 32
__m256i dots(__m256i w, __m256i a, __m256i magnitude) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w, a)), _mm256_set1_epi16(1));
}

// Rows r0 .. r0 + R - 1 of tile t into y. Each group's 64 weight bytes are loaded once for the R rows.
template <int R>
__attribute__((noinline)) void tile_rows(const W8Weights& w, const QuantizedTokens& tokens, int64_t r0, int64_t t,
                                         float* y) {
  const int64_t groups = w.k / kW8Group;
  const int8_t* packed = w.packed + t * groups * kW8GroupBytes;
  __m256i acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  for (int64_t q = 0; q < groups; ++q) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + q * kW8GroupBytes));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + q * kW8GroupBytes + 32));
    for (int r = 0; r < R; ++r) {
      const __m256i a = _mm256_set1_epi32(load32(tokens.xq + (r0 + r) * w.k + kW8Group * q));
      const __m256i magnitude = _mm256_abs_epi8(a);
      acc[r][0] = _mm256_add_epi32(acc[r][0], dots(w0, a, magnitude));
      acc[r][1] = _mm256_add_epi32(acc[r][1], dots(w1, a, magnitude));
    }
  }
  const int64_t column = t * kW8Tile, columns = w.n - column < kW8Tile ? w.n - column : kW8Tile;
  for (int h = 0; h < 2; ++h) {
    const int64_t first = column + 8 * h, count = columns - 8 * h;
    if (count <= 0) break;
    const __m256i keep = lanes(count);
    const __m256 scale = _mm256_maskload_ps(w.scale + first, keep);
    const __m256 bias = w.bias ? _mm256_maskload_ps(w.bias + first, keep) : _mm256_setzero_ps();
    for (int r = 0; r < R; ++r) {
      __m256 value = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][h]), _mm256_set1_ps(tokens.a_scale[r0 + r])),
                                   scale);
      if (w.bias) value = _mm256_add_ps(value, bias);
      _mm256_maskstore_ps(y + (r0 + r) * w.n + first, keep, value);
    }
  }
}

}  // namespace

void quantize_tokens(const float* x, int64_t k, int64_t row_begin, int64_t row_end, const QuantizedTokens& tokens) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* row = x + r * k;
    int8_t* q = tokens.xq + r * k;
    __m256 most = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) most = _mm256_max_ps(most, _mm256_and_ps(_mm256_loadu_ps(row + i), magnitude));
    float amax = hmax(most);
    for (; i < k; ++i) amax = amax > std::fabs(row[i]) ? amax : std::fabs(row[i]);
    const float scale = (amax > 1e-30f ? amax : 1e-30f) / 127.0f;
    const __m256 divisor = _mm256_set1_ps(scale);
    __m256i sums = _mm256_setzero_si256();
    alignas(32) int32_t lane[8];
    for (i = 0; i + 8 <= k; i += 8) {
      const __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(row + i), divisor));  // nearest-even
      sums = _mm256_add_epi32(sums, v);
      _mm256_store_si256(reinterpret_cast<__m256i*>(lane), v);
      for (int j = 0; j < 8; ++j) q[i + j] = static_cast<int8_t>(lane[j]);
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(lane), sums);
    int32_t sum = 0;
    for (int j = 0; j < 8; ++j) sum += lane[j];  // integer: exact in any order
    for (; i < k; ++i) {
      q[i] = static_cast<int8_t>(std::nearbyint(row[i] / scale));
      sum += q[i];
    }
    tokens.a_scale[r] = scale;
    tokens.offset[r] = 128 * sum;
  }
}

void matmul_w8a8(const W8Weights& w, const QuantizedTokens& tokens, int64_t m, int64_t tile_begin, int64_t tile_end,
                 float* y) {
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    int64_t r0 = 0;
    for (; r0 + 4 <= m; r0 += 4) tile_rows<4>(w, tokens, r0, t, y);
    switch (m - r0) {
      case 3: tile_rows<3>(w, tokens, r0, t, y); break;
      case 2: tile_rows<2>(w, tokens, r0, t, y); break;
      case 1: tile_rows<1>(w, tokens, r0, t, y); break;
      default: break;
    }
  }
}

}  // namespace specrt::avx2
#endif
