// MatMulW8A8's arithmetic, apart from onnxruntime: y = x W for int8 W with int8 activations per token,
// the same bits for a row whatever the number of rows, the thread split and the instruction set.
// It is pipeline/lib/w8a8.py's ONNX rewrite (Abs, ReduceMax, Max, Div, Div, Round, Add, Cast,
// MatMulInteger, Cast, Mul, Mul) in one operator.
//
//   x [M, K] float ──quantize_tokens──► xq [M, K] int8, a_scale [M] float, offset [M] int32
//   W [K, N] int8 ──(pipeline/lib/w8a8.py: pack_w8)──► packed [N/16 tiles, K/4, 64] int8, w_scale [N] float
//
// Activations, per row (each an IEEE operation, so every ISA agrees):
//   range = max(max_k |x|, 1e-30),  a_scale = range / 127,  xq = nearbyint(x / a_scale)  (|xq| <= 127),
//   offset = 128 * sum(xq)
// Output, per row r and column n:
//   acc = sum over k of xq[r, k] * W[k, n]              (int32: exact in any order)
//   y   = (float(acc) * a_scale[r]) * w_scale[n]       (two roundings, in that order)
//   y   = y + bias[n]                                  (with a bias: one float addition, as an Add after it)
// The weights hold |W| <= 127 (never -128). K is a multiple of 4, at most 32768, so that every
// partial sum of 255 * 127 * K fits in 32 bits.
//
// Packed layout of one tile of 16 columns: K/4 groups q of 64 bytes; byte 4c + i of group q holds
// W[4q + i, 16t + c]: 4 consecutive k of a column in one 32-bit lane, which the vector units
// multiply with 4 broadcast activations and sum per lane, with no horizontal reduction.
// VNNI's vpdpbusd multiplies u8 by s8: it takes the weights as W + 128 (one xor a load) and the
// activations as they are, and subtracts `offset` = 128 * sum(xq) at the end. AVX2 and AVX-512 BW
// multiply |xq| (u8) by W with xq's sign (s8) in 16-bit pairs: 2 * 127 * 127 never saturates.
#pragma once

#include <cstdint>

#include "amx.h"

namespace specrt {

constexpr int64_t kW8Tile = 16;        // columns per tile
constexpr int64_t kW8Group = 4;        // k per lane
constexpr int64_t kW8GroupBytes = 64;  // packed bytes of one (tile, group)
constexpr int64_t kW8MaxK = 32768;     // 255 * 127 * K < 2^31

struct QuantizedTokens {
  int8_t* xq;       // [M, K]
  float* a_scale;   // [M]
  int32_t* offset;  // [M]
};

struct W8Weights {
  int64_t k = 0, n = 0;            // K a multiple of 4; N any (tiles = ceil(N / 16), the last zero-padded)
  const int8_t* packed = nullptr;  // [tiles, K / 4, 64]
  const float* scale = nullptr;    // [N]
  const float* bias = nullptr;     // [N] or nullptr
};

// Rows [row_begin, row_end) of x [M, K] into `tokens`.
using QuantizeTokensFn = void (*)(const float* x, int64_t k, int64_t row_begin, int64_t row_end,
                                  const QuantizedTokens& tokens);

// Tiles [tile_begin, tile_end) of y [M, N] for all M rows.
using MatMulW8A8Fn = void (*)(const W8Weights& w, const QuantizedTokens& tokens, int64_t m, int64_t tile_begin,
                              int64_t tile_end, float* y);

namespace scalar {
void quantize_tokens(const float*, int64_t, int64_t, int64_t, const QuantizedTokens&);
void matmul_w8a8(const W8Weights&, const QuantizedTokens&, int64_t, int64_t, int64_t, float*);
}  // namespace scalar
namespace avx2 {
void quantize_tokens(const float*, int64_t, int64_t, int64_t, const QuantizedTokens&);
void matmul_w8a8(const W8Weights&, const QuantizedTokens&, int64_t, int64_t, int64_t, float*);
}  // namespace avx2
namespace avxvnni {  // AVX2 with AVX-VNNI; its activations: avx2::quantize_tokens
void matmul_w8a8(const W8Weights&, const QuantizedTokens&, int64_t, int64_t, int64_t, float*);
}  // namespace avxvnni
namespace avx512 {
void quantize_tokens(const float*, int64_t, int64_t, int64_t, const QuantizedTokens&);
void matmul_w8a8(const W8Weights&, const QuantizedTokens&, int64_t, int64_t, int64_t, float*);
}  // namespace avx512
namespace avx512vnni {
void matmul_w8a8(const W8Weights&, const QuantizedTokens&, int64_t, int64_t, int64_t, float*);
}  // namespace avx512vnni
#if defined(SPECRT_AMX_UNITS)
namespace amx {  // its activations: avx512::quantize_tokens
void matmul_w8a8(const W8Weights&, const QuantizedTokens&, int64_t, int64_t, int64_t, float*);
}  // namespace amx
#endif

}  // namespace specrt
