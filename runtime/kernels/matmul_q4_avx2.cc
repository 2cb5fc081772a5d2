// MatMulQ4 for AVX2 + FMA + F16C: the scalar definition's bits (matmul_q4.h), 8 columns per register.
// Rows go through a whole tile (16 columns, two registers a row) 4 at a time, sharing each block's
// weight load and unpack, so extra rows of a window cost their multiply-adds and little else, and
// each row's activation broadcasts and epilogue operands serve both halves of the tile. The last
// 1 to 3 rows (a single step among them) take a pass of their own.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)  // the whole unit: x86 only
#include <immintrin.h>

#include "matmul_q4.h"

#pragma GCC target("avx2,fma,f16c")  // after the headers: only the code below is built for it

namespace specrt::avx2 {
namespace {

// one copy per unit, in its namespace: no inline code is shared between instruction sets
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

namespace {

// acc[i * stride] (+ bias) into columns column .. column + 7 (those below N) of rows r0 + i, i < count.
void store_half(const Q4Weights& w, const __m256* acc, int count, int stride, int64_t r0, int64_t column, float* y) {
  const int64_t columns = w.n - column < 8 ? w.n - column : 8;
  alignas(32) float lanes[8] = {};
  if (w.bias) std::memcpy(lanes, w.bias + column, static_cast<size_t>(columns) * sizeof(float));
  const __m256 bias = _mm256_load_ps(lanes);
  for (int r = 0; r < count; ++r) {
    const __m256 out = w.bias ? _mm256_add_ps(acc[r * stride], bias) : acc[r * stride];
    float* dst = y + (r0 + r) * w.n + column;
    if (columns == 8) {
      _mm256_storeu_ps(dst, out);
    } else {
      _mm256_store_ps(lanes, out);
      std::memcpy(dst, lanes, static_cast<size_t>(columns) * sizeof(float));
    }
  }
}

// Rows r0 .. r0 + R - 1 (R <= 4), both halves of tile t, into y: per block the weights are loaded and
// unpacked once for the R rows, and each row's activation broadcasts and epilogue operands serve both
// halves. The 16 registers hold the R x 2 integer sums and the unpacked weights; from R = 3 on the
// float accumulators live on the stack (a load and a store beside each block's multiply-add). Against
// half tiles of 4 rows, which kept them in registers but loaded every broadcast and epilogue operand
// once per half, a row of a window takes ~18% fewer instructions (docs/kernels.md, MatMulQ4).
// Not inlined: each row count gets its own tight loop, which profiles name.
template <int R>
__attribute__((noinline)) void whole_tile(const Q4Weights& w, const QuantizedRows& rows, int64_t r0, int64_t t,
                                          float* y) {
  const int64_t blocks = w.k / kQ4Block;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* packed = w.packed + t * blocks * kQ4TileBytes;
  const uint16_t* scales = w.scales + t * blocks * kQ4Tile;
  __m256 acc[2 * R];  // row r, half h: acc[2 * r + h]
  for (int i = 0; i < 2 * R; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i sums[R][2];  // 16-bit pair sums of the block per half, below 30480 (matmul_q4.h)
    for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
    for (int g = 0; g < 4; ++g) {
      const uint8_t* line = packed + b * kQ4TileBytes + 64 * g;
      _mm_prefetch(reinterpret_cast<const char*>(line + kQ4PrefetchAhead), _MM_HINT_T0);
      __m256i low[2], high[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32 * h));
        low[h] = _mm256_and_si256(v, nibble);
        high[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* a = rows.xq + (r0 + r) * w.k + b * kQ4Block + 8 * g;
        const __m256i a_low = _mm256_set1_epi32(load32(a)), a_high = _mm256_set1_epi32(load32(a + 4));
        for (int h = 0; h < 2; ++h)  // integer sums: exact in any order
          sums[r][h] = _mm256_add_epi16(sums[r][h], _mm256_add_epi16(_mm256_maddubs_epi16(low[h], a_low),
                                                                     _mm256_maddubs_epi16(high[h], a_high)));
        // keeps each row's running sums in their registers: left alone, GCC reassociates the integer
        // adds into trees over all the products of all R rows and spills them to the stack (2x slower)
        asm("" : "+x"(sums[r][0]), "+x"(sums[r][1]));
      }
    }
    __m256 scale[2];
    for (int h = 0; h < 2; ++h)
      scale[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + b * kQ4Tile + 8 * h)));
    for (int r = 0; r < R; ++r) {
      const int64_t at = (r0 + r) * blocks + b;
      const __m256i offset = _mm256_set1_epi32(rows.offset[at]);
      const __m256 dx = _mm256_set1_ps(rows.dx[at]);
      for (int h = 0; h < 2; ++h) {
        const __m256i dot = _mm256_sub_epi32(_mm256_madd_epi16(sums[r][h], ones), offset);
        acc[2 * r + h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale[h], dx), acc[2 * r + h]);
      }
    }
  }
  for (int h = 0; h < 2 && t * kQ4Tile + 8 * h < w.n; ++h) store_half(w, acc + h, R, 2, r0, t * kQ4Tile + 8 * h, y);
}

}  // namespace

void matmul_q4(const Q4Weights& w, const QuantizedRows& rows, int64_t m, int64_t tile_begin, int64_t tile_end,
               float* y) {
  const int64_t fours = m / 4 * 4, rest = m - fours;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    for (int64_t r0 = 0; r0 < fours; r0 += 4) whole_tile<4>(w, rows, r0, t, y);
    if (rest == 3) whole_tile<3>(w, rows, fours, t, y);
    if (rest == 2) whole_tile<2>(w, rows, fours, t, y);
    if (rest == 1) whole_tile<1>(w, rows, fours, t, y);
  }
}

}  // namespace specrt::avx2
#endif
