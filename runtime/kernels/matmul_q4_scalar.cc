// MatMulQ4 in portable C++: the definition (matmul_q4.h) that the vector units reproduce bit for bit.
#include <cmath>
#include <cstdint>

#include "matmul_q4.h"

namespace specrt::scalar {
namespace {

// IEEE binary16 bits -> the float32 of the same value (exact: binary32 holds every binary16)
float half_to_float(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero and subnormals: mantissa * 2^-24
  } else if (exponent == 31) {
    magnitude = mantissa ? std::nanf("") : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);  // 1.m * 2^(e - 15)
  }
  return sign ? -magnitude : magnitude;
}

}  // namespace

void quantize_rows(const float* x, int64_t k, int64_t row_begin, int64_t row_end, const QuantizedRows& rows) {
  const int64_t blocks = k / kQ4Block;
  for (int64_t r = row_begin; r < row_end; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + r * k + b * kQ4Block;
      int8_t* q = rows.xq + r * k + b * kQ4Block;
      float amax = 0.0f;
      for (int64_t i = 0; i < kQ4Block; ++i) {
        const float v = std::fabs(xb[i]);
        amax = amax > v ? amax : v;
      }
      int32_t sum = 0;
      if (amax > 0.0f) {
        const float inv = 127.0f / amax;
        for (int64_t i = 0; i < kQ4Block; ++i) {
          q[i] = static_cast<int8_t>(std::nearbyint(xb[i] * inv));
          sum += q[i];
        }
      } else {
        for (int64_t i = 0; i < kQ4Block; ++i) q[i] = 0;
      }
      rows.dx[r * blocks + b] = amax / 127.0f;
      rows.offset[r * blocks + b] = 8 * sum;
    }
}

void matmul_q4(const Q4Weights& w, const QuantizedRows& rows, int64_t m, int64_t tile_begin, int64_t tile_end,
               float* y) {
  const int64_t blocks = w.k / kQ4Block;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t columns = w.n - t * kQ4Tile < kQ4Tile ? w.n - t * kQ4Tile : kQ4Tile;
    for (int64_t r = 0; r < m; ++r) {
      float acc[kQ4Tile] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* wb = w.packed + (t * blocks + b) * kQ4TileBytes;
        const uint16_t* scale = w.scales + (t * blocks + b) * kQ4Tile;
        const int8_t* a = rows.xq + r * w.k + b * kQ4Block;
        const float dx = rows.dx[r * blocks + b];
        for (int64_t c = 0; c < kQ4Tile; ++c) {
          int32_t dot = 0;
          for (int g = 0; g < 4; ++g)
            for (int i = 0; i < 4; ++i) {
              const uint8_t byte = wb[64 * g + 4 * c + i];
              dot += (byte & 15) * a[8 * g + i] + (byte >> 4) * a[8 * g + 4 + i];
            }
          dot -= rows.offset[r * blocks + b];
          acc[c] = std::fma(static_cast<float>(dot), half_to_float(scale[c]) * dx, acc[c]);
        }
      }
      for (int64_t c = 0; c < columns; ++c)
        y[r * w.n + t * kQ4Tile + c] = w.bias ? acc[c] + w.bias[t * kQ4Tile + c] : acc[c];
    }
  }
}

}  // namespace specrt::scalar
