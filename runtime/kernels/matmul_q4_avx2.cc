// MatMulQ4 for AVX2 + FMA: the scalar definition's bits (matmul_q4.h), 8 columns per register.
// Per block, the 8 unpacked weight vectors of a half tile are shared by every row of the pass, so
// extra rows cost their multiply-adds only.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)  // the whole unit: x86 only
#include <immintrin.h>

#include "matmul_q4.h"

#pragma GCC target("avx2,fma")  // after the headers: only the code below is built for it

namespace specrt::avx2 {
namespace {

int32_t load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

int32_t hsum(__m256i v) {  // integer: exact in any order
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

float hmax(__m256 v) {  // max: exact in any order
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

}  // namespace

void quantize_rows(const float* x, int64_t k, int64_t row_begin, int64_t row_end, const QuantizedRows& rows) {
  const int64_t blocks = k / kQ4Block;
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // packs work within 128-bit halves
  for (int64_t r = row_begin; r < row_end; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + r * k + b * kQ4Block;
      __m256 v[4];
      for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(xb + 8 * j);
      const __m256 m01 = _mm256_max_ps(_mm256_and_ps(v[0], magnitude), _mm256_and_ps(v[1], magnitude));
      const __m256 m23 = _mm256_max_ps(_mm256_and_ps(v[2], magnitude), _mm256_and_ps(v[3], magnitude));
      const float amax = hmax(_mm256_max_ps(m01, m23));
      __m256i q8 = _mm256_setzero_si256();
      int32_t sum = 0;
      if (amax > 0.0f) {
        const __m256 inv = _mm256_set1_ps(127.0f / amax);
        __m256i q[4];
        for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));  // nearest-even
        sum = hsum(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        const __m256i q16 = _mm256_packs_epi32(q[0], q[1]), q16b = _mm256_packs_epi32(q[2], q[3]);
        q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16, q16b), order);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows.xq + r * k + b * kQ4Block), q8);
      rows.dx[r * blocks + b] = amax / 127.0f;
      rows.offset[r * blocks + b] = 8 * sum;
    }
}

void matmul_q4(const Q4Weights& w, const QuantizedRows& rows, int64_t m, int64_t tile_begin, int64_t tile_end,
               float* acc, float* y) {
  const int64_t blocks = w.k / kQ4Block;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t columns = w.n - t * kQ4Tile < kQ4Tile ? w.n - t * kQ4Tile : kQ4Tile;
    for (int64_t half = 0; half * 8 < columns; ++half) {
      for (int64_t r = 0; r < m; ++r) _mm256_storeu_ps(acc + r * kQ4Tile + 8 * half, _mm256_setzero_ps());
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* wb = w.packed + (t * blocks + b) * kQ4TileBytes + 32 * half;
        __m256i wq[8];  // wq[j]: 8 columns x k = 4j .. 4j + 3 of the block, one 32-bit lane per column
        for (int g = 0; g < 4; ++g) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * g));
          wq[2 * g] = _mm256_and_si256(v, nibble);
          wq[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        }
        const __m256 scale = _mm256_loadu_ps(w.scales + (t * blocks + b) * kQ4Tile + 8 * half);
        for (int64_t r = 0; r < m; ++r) {
          const int8_t* a = rows.xq + r * w.k + b * kQ4Block;
          __m256i s = _mm256_maddubs_epi16(wq[0], _mm256_set1_epi32(load32(a)));
          for (int j = 1; j < 8; ++j)
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(wq[j], _mm256_set1_epi32(load32(a + 4 * j))));
          const __m256i dot = _mm256_sub_epi32(_mm256_madd_epi16(s, ones),
                                               _mm256_set1_epi32(rows.offset[r * blocks + b]));
          float* out = acc + r * kQ4Tile + 8 * half;
          const __m256 step = _mm256_mul_ps(scale, _mm256_set1_ps(rows.dx[r * blocks + b]));
          _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), step, _mm256_loadu_ps(out)));
        }
      }
    }
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(y + r * w.n + t * kQ4Tile, acc + r * kQ4Tile, static_cast<size_t>(columns) * sizeof(float));
  }
}

}  // namespace specrt::avx2
#endif
