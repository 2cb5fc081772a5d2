// The rotary embedding of SpecAttention's keys and queries (attention.h), apart from onnxruntime so
// that the kernel units can be tested without it (tests/runtime/test_kernels_emulated.py).
#include <cstdint>

#include "attention.h"

namespace specrt {

void rotate_half(const float* x, const float* cos, const float* sin, int64_t d, float* y) {
  const int64_t half = d / 2;
  for (int64_t c = 0; c < half; ++c) {
    const float a = x[c] * cos[c], b = x[c + half] * sin[c];
    y[c] = a - b;
  }
  for (int64_t c = half; c < d; ++c) {
    const float a = x[c] * cos[c], b = x[c - half] * sin[c];
    y[c] = a + b;
  }
}

}  // namespace specrt
