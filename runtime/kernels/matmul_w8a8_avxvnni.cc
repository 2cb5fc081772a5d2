// MatMulW8A8 for AVX2 with AVX-VNNI (the 256-bit vpdpbusd of CPUs that have it without AVX-512, such as
// Intel's Alder Lake and later client cores): a tile's 16 columns in two registers, vpdpbusd summing
// u8 x s8 products of 4 k straight into 32 bits. As matmul_w8a8_avx512vnni.cc, it takes the weights
// as W + 128 (u8) and the activations as they are (s8) and subtracts 128 * sum(xq) at the end; the
// AVX2 unit's sign trick spends a sign, a 16-bit multiply-add, a widening multiply-add and an add
// where this spends one instruction. Integer sums are exact, so the outputs equal the AVX2 unit's.
// Activations are quantized by avx2::quantize_tokens.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)  // the whole unit: x86 only
#include <immintrin.h>

#include "matmul_w8a8.h"

#pragma GCC target("avx2,fma,avxvnni")  // after the headers: only the code below is built for it

namespace specrt::avxvnni {
namespace {

// one copy per unit, in its namespace: no inline code is shared between instruction sets
int32_t load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// lanes [0, count) of 8 set
__m256i lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Rows r0 .. r0 + R - 1 of tile t into y. Each group's 64 weight bytes are loaded and offset once for
// the R rows; with U = 2, each row keeps two sums per half (even and odd groups), so a single row
// has four chains of vpdpbusd in flight instead of two.
template <int R, int U>
__attribute__((noinline)) void tile_rows(const W8Weights& w, const QuantizedTokens& tokens, int64_t r0, int64_t t,
                                         float* y) {
  const int64_t groups = w.k / kW8Group;
  const int8_t* packed = w.packed + t * groups * kW8GroupBytes;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));  // W + 128 as u8: W xor 0x80
  __m256i sums[R][2][U];  // row, half, chain
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h)
      for (int u = 0; u < U; ++u) sums[r][h][u] = _mm256_setzero_si256();
  int64_t q = 0;
  for (; q + U <= groups; q += U)
    for (int u = 0; u < U; ++u) {
      const int8_t* group = packed + (q + u) * kW8GroupBytes;
      const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group)), flip);
      const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32)), flip);
      for (int r = 0; r < R; ++r) {
        const __m256i a = _mm256_set1_epi32(load32(tokens.xq + (r0 + r) * w.k + kW8Group * (q + u)));
        sums[r][0][u] = _mm256_dpbusd_avx_epi32(sums[r][0][u], w0, a);
        sums[r][1][u] = _mm256_dpbusd_avx_epi32(sums[r][1][u], w1, a);
      }
    }
  for (; q < groups; ++q) {
    const int8_t* group = packed + q * kW8GroupBytes;
    const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group)), flip);
    const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32)), flip);
    for (int r = 0; r < R; ++r) {
      const __m256i a = _mm256_set1_epi32(load32(tokens.xq + (r0 + r) * w.k + kW8Group * q));
      sums[r][0][0] = _mm256_dpbusd_avx_epi32(sums[r][0][0], w0, a);
      sums[r][1][0] = _mm256_dpbusd_avx_epi32(sums[r][1][0], w1, a);
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
      __m256i total = sums[r][h][0];
      for (int u = 1; u < U; ++u) total = _mm256_add_epi32(total, sums[r][h][u]);
      const __m256i acc = _mm256_sub_epi32(total, _mm256_set1_epi32(tokens.offset[r0 + r]));
      __m256 value = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(tokens.a_scale[r0 + r])),
                                   scale);
      if (w.bias) value = _mm256_add_ps(value, bias);
      _mm256_maskstore_ps(y + (r0 + r) * w.n + first, keep, value);
    }
  }
}

}  // namespace

void matmul_w8a8(const W8Weights& w, const QuantizedTokens& tokens, int64_t m, int64_t tile_begin, int64_t tile_end,
                 float* y) {
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    int64_t r0 = 0;
    for (; r0 + 4 <= m; r0 += 4) tile_rows<4, 1>(w, tokens, r0, t, y);
    switch (m - r0) {
      case 3: tile_rows<3, 1>(w, tokens, r0, t, y); break;
      case 2: tile_rows<2, 2>(w, tokens, r0, t, y); break;
      case 1: tile_rows<1, 2>(w, tokens, r0, t, y); break;
      default: break;
    }
  }
}

}  // namespace specrt::avxvnni
#endif
