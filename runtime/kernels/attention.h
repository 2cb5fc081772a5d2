// SpecAttention's arithmetic, apart from onnxruntime: the arguments of one pass and the kernels
// that compute one query row's heads. Every instruction set implements the same kernels
// (attention_impl.inc, included by kernel_scalar.cc, kernel_avx2.cc and kernel_avx512.cc).
#pragma once

#include <cstdint>

namespace specrt {

// Keys whose bias is at or below this are not attended (the contract's MASK_VALUE is float32's
// lowest value); they are left out of the sums, not added as zeros.
constexpr float kMaskedAtOrBelow = -1e30f;

struct AttentionPass {
  int64_t s = 0;          // new positions (the window's rows)
  int64_t past = 0;       // cached positions before them
  int64_t heads = 0;      // query heads
  int64_t kv_heads = 0;   // key/value heads; heads % kv_heads == 0
  int64_t head_dim = 0;   // d; a multiple of 16
  float scale = 1.0f;     // score = (q . k) * scale + bias
  int64_t query_stride = 0;           // floats from one row's query to the next's (heads * d, or more when packed)
  const float* query = nullptr;       // [s, query_stride] before the rotary embedding
  const float* cos = nullptr;         // [s, d]           rotary tables of each row's position
  const float* sin = nullptr;         // [s, d]
  const float* bias = nullptr;        // [s, past + s]    additive; <= kMaskedAtOrBelow: not attended
  const float* past_key = nullptr;    // [past, kv_heads, d]  after the rotary embedding
  const float* past_value = nullptr;  // [past, kv_heads, d]
  const float* new_key = nullptr;     // [s, kv_heads, d]     after the rotary embedding
  const float* new_value = nullptr;   // [s, kv_heads, d]
  float* out = nullptr;               // [s, heads * d]

  const float* key(int64_t slot, int64_t kv) const {
    return slot < past ? past_key + (slot * kv_heads + kv) * head_dim
                       : new_key + ((slot - past) * kv_heads + kv) * head_dim;
  }
  const float* value(int64_t slot, int64_t kv) const {
    return slot < past ? past_value + (slot * kv_heads + kv) * head_dim
                       : new_value + ((slot - past) * kv_heads + kv) * head_dim;
  }
};

// x rotated by the rotary embedding, rotate-half form: y[c] = x[c] cos[c] - x[c + d/2] sin[c] for
// c < d/2, y[c] = x[c] cos[c] + x[c - d/2] sin[c] after (two products and one sum, each rounded).
void rotate_half(const float* x, const float* cos, const float* sin, int64_t d, float* y);

// Scratch memory of one task, owned by the caller: visible [past + s], scores [heads in the task,
// (past + s) rounded up to 16], query [heads in the task, d].
struct Workspace {
  int64_t* visible;
  float* scores;
  float* query;
};

// Query row `row`, heads [head_begin, head_end) of key/value head `kv`: rotary, scores over the
// row's visible keys in slot order, softmax, weighted sum of values into pass.out.
using AttendFn = void (*)(const AttentionPass& pass, int64_t row, int64_t kv, int64_t head_begin, int64_t head_end,
                          const Workspace& work);

// SwiGLU of `rows` rows of `inner` pairs: out[r, c] = silu(x[r, c]) * x[r, inner + c], where
// silu(g) = g * sigmoid(g) and sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) below, e = exp(-|g|).
// inner: a multiple of 16.
using SwiGLUFn = void (*)(const float* x, int64_t inner, float* out);

namespace scalar { void swiglu(const float*, int64_t, float*); }
namespace avx2 { void swiglu(const float*, int64_t, float*); }
namespace avx512 { void swiglu(const float*, int64_t, float*); }

namespace scalar { void attend(const AttentionPass&, int64_t, int64_t, int64_t, int64_t, const Workspace&); }
namespace avx2 { void attend(const AttentionPass&, int64_t, int64_t, int64_t, int64_t, const Workspace&); }
namespace avx512 { void attend(const AttentionPass&, int64_t, int64_t, int64_t, int64_t, const Workspace&); }

}  // namespace specrt
