// MatMulW8A8 on AMX (Intel's tile matrix unit, Sapphire Rapids and later): the whole dot product of
// a pass of rows over a tile of 16 columns in the tile multiplier.
//
// matmul_w8a8.h's packed tile is AMX's B layout as it is: group q (64 bytes) holds 4 consecutive k
// of each of the 16 columns, so 16 groups are one B tile [16, 64] int8, read in place. Per pass of
// R <= 16 rows and chunk of 64 k:
//   A [R, 64] int8    the rows' activations xq, read in place (stride K)
//   B [16, 64] int8   16 groups of the packed weights
//   C [R, 16] int32  += tdpbssd(A, B)
// with two accumulators C0, C1 for even and odd chunks (two chains in flight) and the last k % 64
// in a tile of their own shape. acc = C0 + C1 is sum over k of xq * W: an exact integer (products
// of 4 k at a time added into 32 bits; |partial sums| < 2^31 for K <= 32768, matmul_w8a8.h), the
// integer every other unit computes, and the epilogue is theirs, (float(acc) * a_scale) * w_scale
// (+ bias): a row's output has the same bits on every instruction set, in a pass of any size.
#include <cstdint>
#include <cstring>

#include "amx.h"
#if defined(SPECRT_AMX_UNITS)
#include <immintrin.h>

#include "matmul_w8a8.h"

#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni,avx2,fma")  // only the code below

namespace specrt::amx {
namespace {

#include "amx_tiles.inc"

// A single row goes through avx512vnni::matmul_w8a8 (the same bits): the weights' stream sets its
// pace, which the VNNI loop keeps better than tile loads (whole int8 decoder: 21.7-23.8 ms a single
// step against 24.2-26.7 on tiles; docs/kernels.md, "On AMX")
constexpr int64_t kTileMinRows = 2;
constexpr int64_t kChunk = 64;     // k per product: a row of A, 16 groups of B
// Bytes of B ahead of its tile loads asked of the cache: the int8 decoder's window of 8 rows took
// 30.4-30.7 ms with it, 33.2-33.6 without, 16 rows 35.1-35.2 and 38.6-39.2 (docs/kernels.md, "On AMX")
constexpr int64_t kPrefetchAhead = 4096;

// Tiles for a pass of r rows: 0, 1 C0 and C1; 2, 3 A and B of even chunks; 4, 5 of odd chunks;
// 6, 7 A and B of the last k % 64 (configured only when K has such a rest).
void configure(int64_t r, int64_t rest_k) {
  const int64_t shapes[8][2] = {{r, 64}, {r, 64}, {r, kChunk}, {16, 64}, {r, kChunk},
                                {16, 64}, {r, rest_k}, {rest_k / kW8Group, 64}};
  configure_tiles(shapes, 8);
}

// Rows r0 .. r0 + r - 1 of tile t into y (tiles configured for r rows).
void tile_pass(const W8Weights& w, const QuantizedTokens& tokens, int r, int64_t r0, int64_t t, float* y) {
  const int64_t groups = w.k / kW8Group, chunks = w.k / kChunk;
  const int8_t* packed = w.packed + t * groups * kW8GroupBytes;
  const int8_t* xq = tokens.xq + r0 * w.k;
  constexpr int64_t kChunkBytes = kChunk / kW8Group * kW8GroupBytes;  // B's bytes per chunk
  _tile_zero(0);
  _tile_zero(1);
  int64_t c = 0;
  for (; c + 2 <= chunks; c += 2) {
    for (int64_t line = 0; line < 2 * kChunkBytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(packed + c * kChunkBytes + line + kPrefetchAhead), _MM_HINT_T0);
    _tile_loadd(2, xq + c * kChunk, w.k);
    _tile_loadd(3, packed + c * kChunkBytes, 64);
    _tile_loadd(4, xq + (c + 1) * kChunk, w.k);
    _tile_loadd(5, packed + (c + 1) * kChunkBytes, 64);
    _tile_dpbssd(0, 2, 3);
    _tile_dpbssd(1, 4, 5);
  }
  if (c < chunks) {
    _tile_loadd(2, xq + c * kChunk, w.k);
    _tile_loadd(3, packed + c * kChunkBytes, 64);
    _tile_dpbssd(0, 2, 3);
  }
  if (w.k % kChunk) {
    _tile_loadd(6, xq + chunks * kChunk, w.k);
    _tile_loadd(7, packed + chunks * kChunkBytes, 64);
    _tile_dpbssd(1, 6, 7);
  }
  alignas(64) int32_t sums[2][kRowsPerPass * 16];
  _tile_stored(0, sums[0], 64);
  _tile_stored(1, sums[1], 64);
  const int64_t column = t * kW8Tile, columns = w.n - column < kW8Tile ? w.n - column : kW8Tile;
  const __mmask16 keep = static_cast<__mmask16>((1u << columns) - 1u);
  const __m512 scale = _mm512_maskz_loadu_ps(keep, w.scale + column);
  const __m512 bias = w.bias ? _mm512_maskz_loadu_ps(keep, w.bias + column) : _mm512_setzero_ps();
  for (int i = 0; i < r; ++i) {
    const __m512i acc = _mm512_add_epi32(_mm512_load_si512(sums[0] + 16 * i), _mm512_load_si512(sums[1] + 16 * i));
    __m512 value = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(tokens.a_scale[r0 + i])), scale);
    if (w.bias) value = _mm512_add_ps(value, bias);
    _mm512_mask_storeu_ps(y + (r0 + i) * w.n + column, keep, value);
  }
}

}  // namespace

void matmul_w8a8(const W8Weights& w, const QuantizedTokens& tokens, int64_t m, int64_t tile_begin, int64_t tile_end,
                 float* y) {
  if (m < kTileMinRows) return avx512vnni::matmul_w8a8(w, tokens, m, tile_begin, tile_end, y);
  // passes of 16 rows, then the rest; one configuration per pass size (a weight tile read again by
  // a later pass comes from the cache)
  for (int64_t r0 = 0; r0 < m; r0 += kRowsPerPass) {
    const int r = static_cast<int>(m - r0 < kRowsPerPass ? m - r0 : kRowsPerPass);
    if (r0 == 0 || r != kRowsPerPass) configure(r, w.k % kChunk);
    for (int64_t t = tile_begin; t < tile_end; ++t) tile_pass(w, tokens, r, r0, t, y);
  }
  _tile_release();  // the thread's tile state back to its initial, empty one
}

}  // namespace specrt::amx
#endif
