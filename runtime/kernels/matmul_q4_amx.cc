// MatMulQ4 on AMX (Intel's tile matrix unit, Sapphire Rapids and later): the rows of a window go
// through the tile multiplier, one block of 32 k at a time.
//
// Per (tile of 16 columns, block b), for a pass of R <= 16 rows:
//   A [R, 32] int8      the rows' quantized activations of the block, read in place (stride K)
//   B [8, 64] int8      the block's codes, nibble - 8, unpacked: B row j holds k = 4j .. 4j + 3 of
//                       each column, which is matmul_q4.h's packed order with low and high nibbles split
//   C [R, 16] int32  =  tdpbssd(A, B): sum over the block of xq * (nibble - 8), per row and column,
//                       which is the definition's dot (sum of xq * nibble - offset, offset = 8 sum xq)
// then per row the definition's epilogue: acc = fma(float(dot), scale * dx, acc). C is an exact
// integer (products of 4 k at a time added into 32 bits, no rounding, no saturation), the same
// integer vpdpbusd and the scalar loop give, and the epilogue is the other units' in the same order: a row's output has the same bits as on every other instruction set,
// whatever the number of rows in its pass.
//
// Passes of 5 rows or more go through the tile unit, fewer through the AVX-512 VNNI loop
// (avx512vnni::matmul_q4, the same bits): verify windows of 5 rows or more and prefills gain, single
// steps and windows of 2 to 4 rows run as on avx512vnni.
#include <cstdint>
#include <cstring>

#include "amx.h"
#if defined(SPECRT_AMX_UNITS)
#include <immintrin.h>

#include "matmul_q4.h"

#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni,avx2,fma,f16c")  // only the code below

namespace specrt::amx {
namespace {

#include "amx_tiles.inc"

// Passes of fewer rows go through avx512vnni::matmul_q4: a block costs the tile unit about the same
// whatever the rows (B's unpack and load, the product, C's store), which fewer rows' vpdpbusd beat
// (whole decoder, 4 rows: 19.1 ms on VNNI, 19.6 on tiles; 5 rows: 21.4 and 21.0; command and
// figures: docs/kernels.md, "On AMX")
constexpr int64_t kTileMinRows = 5;
// B is unpacked kStageAhead blocks before its tile load: a tile load of bytes still in the store
// buffer waits for them to reach the cache, which stalled every block when B was unpacked just before
constexpr int64_t kStageAhead = 4, kStaged = 8;

// Tiles for a pass of r rows: consecutive blocks alternate between two sets, A 0 / B 1 / C 2 and
// A 3 / B 4 / C 5, so that a block's loads and product do not reuse the registers of the block
// before it, whose C is still being stored.
void configure(int64_t r) {
  const int64_t shapes[6][2] = {{r, 32}, {8, 64}, {r, 64}, {r, 32}, {8, 64}, {r, 64}};
  configure_tiles(shapes, 6);
}

// C = tdpbssd(A, B) for one block, in tile set kSet: A read from `a` (stride `stride` bytes), B from
// `b`, C stored to `c`. The tile intrinsics take literal tile numbers.
template <int kSet>
void block_product(const int8_t* a, int64_t stride, const int8_t* b, int32_t* c) {
  if constexpr (kSet == 0) {
    _tile_loadd(1, b, 64);
    _tile_loadd(0, a, stride);
    _tile_zero(2);
    _tile_dpbssd(2, 0, 1);
    _tile_stored(2, c, 64);
  } else {
    _tile_loadd(4, b, 64);
    _tile_loadd(3, a, stride);
    _tile_zero(5);
    _tile_dpbssd(5, 3, 4);
    _tile_stored(5, c, 64);
  }
}

// Block b of tile `packed` into B's layout as signed codes (nibble - 8): B row 2g holds group g's
// low nibbles, 2g + 1 its high ones.
void unpack_block(const uint8_t* packed, int64_t b, int8_t* unpacked) {
  const __m512i nibble = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  for (int g = 0; g < 4; ++g) {  // group g: k = 8g .. 8g + 3 in the low nibbles, 8g + 4 .. 8g + 7 in the high
    _mm_prefetch(reinterpret_cast<const char*>(packed + b * kQ4TileBytes + 64 * g + kQ4PrefetchAhead), _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512(packed + b * kQ4TileBytes + 64 * g);
    _mm512_store_si512(unpacked + 128 * g, _mm512_sub_epi8(_mm512_and_si512(v, nibble), eight));
    _mm512_store_si512(unpacked + 128 * g + 64, _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), nibble), eight));
  }
}

// Rows r0 .. r0 + R - 1 of tile t into y (tiles configured for R rows). Block b's product is
// issued before block b - 1's epilogue; the epilogues run in block order, as everywhere.
template <int R>
void tile_pass(const Q4Weights& w, const QuantizedRows& rows, int64_t r0, int64_t t, float* y) {
  const int64_t blocks = w.k / kQ4Block;
  const uint8_t* packed = w.packed + t * blocks * kQ4TileBytes;
  const uint16_t* scales = w.scales + t * blocks * kQ4Tile;
  const int8_t* xq = rows.xq + r0 * w.k;
  alignas(64) int8_t unpacked[kStaged][8 * 64];  // B of blocks b .. b + kStageAhead, a ring
  alignas(64) int32_t dots[2][R * 16];            // C, stored, per tile set
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  auto epilogue = [&](int64_t b) {
    const int32_t* c = dots[b & 1];
    const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + b * kQ4Tile)));
    for (int r = 0; r < R; ++r) {
      const __m512 dx = _mm512_set1_ps(rows.dx[(r0 + r) * blocks + b]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * r)), _mm512_mul_ps(scale, dx), acc[r]);
    }
  };
  for (int64_t b = 0; b < kStageAhead && b < blocks; ++b) unpack_block(packed, b, unpacked[b % kStaged]);
  for (int64_t b = 0; b < blocks; ++b) {
    if (b + kStageAhead < blocks) unpack_block(packed, b + kStageAhead, unpacked[(b + kStageAhead) % kStaged]);
    if (b & 1)
      block_product<1>(xq + b * kQ4Block, w.k, unpacked[b % kStaged], dots[1]);
    else
      block_product<0>(xq + b * kQ4Block, w.k, unpacked[b % kStaged], dots[0]);
    if (b) epilogue(b - 1);
  }
  epilogue(blocks - 1);
  const int64_t column = t * kQ4Tile, columns = w.n - column < kQ4Tile ? w.n - column : kQ4Tile;
  const __mmask16 keep = static_cast<__mmask16>((1u << columns) - 1u);
  if (w.bias) {
    const __m512 bias = _mm512_maskz_loadu_ps(keep, w.bias + column);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_add_ps(acc[r], bias);
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * w.n + column, keep, acc[r]);
}

// tile_pass<r> for a pass of r (kTileMinRows .. 16) rows.
template <int R = kRowsPerPass>
void pass(int r, const Q4Weights& w, const QuantizedRows& rows, int64_t r0, int64_t t, float* y) {
  if constexpr (R >= kTileMinRows) {
    if (r == R) return tile_pass<R>(w, rows, r0, t, y);
    return pass<R - 1>(r, w, rows, r0, t, y);
  }
}

}  // namespace

void matmul_q4(const Q4Weights& w, const QuantizedRows& rows, int64_t m, int64_t tile_begin, int64_t tile_end,
               float* y) {
  // passes of 16 rows, then the rest; one configuration per pass size (a weight tile read again by
  // a later pass comes from the cache)
  int64_t r0 = 0;
  while (m - r0 >= kTileMinRows) {
    const int r = static_cast<int>(m - r0 < kRowsPerPass ? m - r0 : kRowsPerPass);
    if (r0 == 0 || r != kRowsPerPass) configure(r);
    for (int64_t t = tile_begin; t < tile_end; ++t) pass(r, w, rows, r0, t, y);
    r0 += r;
  }
  if (r0) _tile_release();  // the thread's tile state back to its initial, empty one
  if (r0 < m) {
    const int64_t blocks = w.k / kQ4Block;
    const QuantizedRows rest{rows.xq + r0 * w.k, rows.dx + r0 * blocks, rows.offset + r0 * blocks};
    avx512vnni::matmul_q4(w, rest, m - r0, tile_begin, tile_end, y + r0 * w.n);
  }
}

}  // namespace specrt::amx
#endif
