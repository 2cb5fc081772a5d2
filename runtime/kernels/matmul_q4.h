// MatMulQ4's arithmetic, apart from onnxruntime: y = x W for 4-bit W, the same bits for a row
// whatever the number of rows, the thread split and the instruction set.
//
//   x [M, K] float ──quantize_rows──► xq [M, K] int8, dx [M, K/32] float, offset [M, K/32] int32
//   W [K, N] ──(pipeline/lib/q4_pack.py)──► packed [N/16 tiles, K/32 blocks, 256] uint8, scales [N/16, K/32, 16] float16
//
// Activations, per row and block of 32 (each an IEEE operation, so every ISA agrees):
//   amax = max |x|,  dx = amax / 127,  xq = nearbyint(x * (127 / amax)) (0 when amax is 0),
//   offset = 8 * sum(xq)
// Weights: w = (nibble - 8) * scale, nibble in 0..15, one scale per column and block, stored as IEEE
// binary16 (2 bytes: a step streams 10% fewer bytes than with float32 scales); `scale` below is its
// float32 value, which the conversion gives exactly (every binary16 is a binary32), on every ISA.
// Output, per row r and column n, blocks b in order from acc = 0:
//   dot_b = sum over the block of nibble * xq  -  offset[r, b]          (int32: exact in any order)
//   acc   = fma(float(dot_b), scale[n, b] * dx[r, b], acc)
//   y     = acc + bias[n]                    (with a bias: one float addition, as an Add node after it)
//
// Packed layout of one (tile, block): 4 groups g of 64 bytes; byte 4c + i of group g holds column c
// of the tile (0..15) at k = 8g + i in its low nibble and at k = 8g + 4 + i in its high one (i < 4).
// So 32 bytes hold 8 columns x 4 consecutive k twice over: one 32-bit lane per column, which the
// vector units multiply with 4 broadcast activations (u8 x s8 pairs) and sum per lane, with no
// horizontal reduction; the 16-bit pair sums of a block stay below 8 * 2 * 15 * 127 = 30480.
#pragma once

#include <cstdint>

#include "amx.h"

namespace specrt {

constexpr int64_t kQ4Block = 32;       // k per scale
constexpr int64_t kQ4Tile = 16;        // columns per tile
constexpr int64_t kQ4TileBytes = 256;  // packed bytes of one (tile, block)
// Bytes ahead of a weight load that the vector kernels ask the cache for (a prefetch per 64-byte
// line): the hardware prefetcher alone left single steps and windows waiting on memory (figures
// and command: docs/kernels.md, MatMulQ4). A prefetch never changes a result.
constexpr int64_t kQ4PrefetchAhead = 4096;

struct QuantizedRows {
  int8_t* xq;       // [M, K]
  float* dx;        // [M, K / 32]
  int32_t* offset;  // [M, K / 32]
};

struct Q4Weights {
  int64_t k = 0, n = 0;           // K a multiple of 32; N any (tiles = ceil(N / 16), the last zero-padded)
  const uint8_t* packed = nullptr;  // [tiles, K / 32, 256]
  const uint16_t* scales = nullptr;  // [tiles, K / 32, 16] binary16 bits
  const float* bias = nullptr;       // [N] or nullptr
};

// Rows [row_begin, row_end) of x [M, K] into `rows`.
using QuantizeRowsFn = void (*)(const float* x, int64_t k, int64_t row_begin, int64_t row_end, const QuantizedRows& rows);

// Tiles [tile_begin, tile_end) of y [M, N] for all M rows.
using MatMulQ4Fn = void (*)(const Q4Weights& w, const QuantizedRows& rows, int64_t m, int64_t tile_begin,
                            int64_t tile_end, float* y);

namespace scalar {
void quantize_rows(const float*, int64_t, int64_t, int64_t, const QuantizedRows&);
void matmul_q4(const Q4Weights&, const QuantizedRows&, int64_t, int64_t, int64_t, float*);
}  // namespace scalar
namespace avx2 {
void quantize_rows(const float*, int64_t, int64_t, int64_t, const QuantizedRows&);
void matmul_q4(const Q4Weights&, const QuantizedRows&, int64_t, int64_t, int64_t, float*);
}  // namespace avx2
namespace avx512 {
void quantize_rows(const float*, int64_t, int64_t, int64_t, const QuantizedRows&);
void matmul_q4(const Q4Weights&, const QuantizedRows&, int64_t, int64_t, int64_t, float*);
}  // namespace avx512
namespace avx512vnni {
void matmul_q4(const Q4Weights&, const QuantizedRows&, int64_t, int64_t, int64_t, float*);
}  // namespace avx512vnni
#if defined(SPECRT_AMX_UNITS)
namespace amx {
void matmul_q4(const Q4Weights&, const QuantizedRows&, int64_t, int64_t, int64_t, float*);
}  // namespace amx
#endif

}  // namespace specrt
