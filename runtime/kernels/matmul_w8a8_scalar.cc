// MatMulW8A8 in portable C++: the definition (matmul_w8a8.h) that the vector units reproduce bit for bit.
#include <cmath>
#include <cstdint>

#include "matmul_w8a8.h"

namespace specrt::scalar {

void quantize_tokens(const float* x, int64_t k, int64_t row_begin, int64_t row_end, const QuantizedTokens& tokens) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* row = x + r * k;
    int8_t* q = tokens.xq + r * k;
    float amax = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const float v = std::fabs(row[i]);
      amax = amax > v ? amax : v;
    }
    const float scale = (amax > 1e-30f ? amax : 1e-30f) / 127.0f;
    int32_t sum = 0;
    for (int64_t i = 0; i < k; ++i) {
      q[i] = static_cast<int8_t>(std::nearbyint(row[i] / scale));
      sum += q[i];
    }
    tokens.a_scale[r] = scale;
    tokens.offset[r] = 128 * sum;
  }
}

void matmul_w8a8(const W8Weights& w, const QuantizedTokens& tokens, int64_t m, int64_t tile_begin, int64_t tile_end,
                 float* y) {
  const int64_t groups = w.k / kW8Group;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t columns = w.n - t * kW8Tile < kW8Tile ? w.n - t * kW8Tile : kW8Tile;
    const int8_t* tile = w.packed + t * groups * kW8GroupBytes;
    for (int64_t r = 0; r < m; ++r) {
      const int8_t* a = tokens.xq + r * w.k;
      for (int64_t c = 0; c < columns; ++c) {
        int32_t acc = 0;
        for (int64_t q = 0; q < groups; ++q)
          for (int64_t i = 0; i < kW8Group; ++i) acc += a[4 * q + i] * tile[q * kW8GroupBytes + 4 * c + i];
        const int64_t n = t * kW8Tile + c;
        const float value = static_cast<float>(acc) * tokens.a_scale[r] * w.scale[n];
        y[r * w.n + n] = w.bias ? value + w.bias[n] : value;
      }
    }
  }
}

}  // namespace specrt::scalar
