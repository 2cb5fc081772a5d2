// The canonical float arithmetic of specrt's kernels: every result is defined as one sequence of
// IEEE operations, and each instruction set below performs exactly that sequence, so the scalar,
// AVX2 and AVX-512 builds give the same bits for the same input.
//
//   V16        16 float lanes; AVX-512: one zmm, AVX2: two ymm (lanes 0-7, 8-15), scalar: an array
//   fma        a * b + c with one rounding (std::fma / vfmadd)
//   reduce     lanes summed as a fixed tree: l + (l + 8), then + 4, + 2, + 1
//   reduce_block  out[i] = reduce(a[i]) * scale + bias[i] for kDotBlock vectors at once: the same
//              additions of the same pairs, done across the vectors (a transposing tree) instead of
//              one horizontal tree each, then one product and one sum per result, each rounded
//   max        per lane, b > a ? b : a (the first of equal values, as a scalar loop keeps it)
//   exp        Cephes' single-precision polynomial on fma, flushed to 0 below -87.33654
//
// This header is included once per instruction set, by a translation unit compiled for it, inside
// that unit's own namespace (kernel_scalar.cc, kernel_avx2.cc, kernel_avx512.cc), after <cmath>,
// <cstdint>, <cstring> and, for the vector units, <immintrin.h>: no inline function is shared
// between units, so the linker can never hand the scalar path an AVX instruction.
#pragma once

namespace canonical {

constexpr float kExpLow = -87.33654f;  // below: exp flushes to 0 (2^-126 is the least normal)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpC5 = 1.9875691500e-4f;
constexpr float kExpC4 = 1.3981999507e-3f;
constexpr float kExpC3 = 8.3334519073e-3f;
constexpr float kExpC2 = 4.1665795894e-2f;
constexpr float kExpC1 = 1.6666665459e-1f;
constexpr float kExpC0 = 5.0000001201e-1f;

#if defined(SPECRT_ISA_AVX512)

struct V16 {
  __m512 v;
};
inline V16 zero() { return {_mm512_setzero_ps()}; }
inline V16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
inline V16 splat(float x) { return {_mm512_set1_ps(x)}; }
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V16 add(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 mul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 sub(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V16 neg_abs(V16 a) { return {_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(INT32_MIN)))}; }
// lanes of x whose sign bit is set take if_negative, the others otherwise
inline V16 select_negative(V16 x, V16 if_negative, V16 otherwise) {
  const __mmask16 negative = _mm512_cmplt_epi32_mask(_mm512_castps_si512(x.v), _mm512_setzero_si512());
  return {_mm512_mask_blend_ps(negative, otherwise.v, if_negative.v)};
}
inline V16 div(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V16 max(V16 a, V16 b) { return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(b.v, a.v, _CMP_GT_OQ), a.v, b.v)}; }
inline float reduce(V16 a) {
  __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a.v),
                            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}
// out[i] = reduce(a[i]) * scale + bias[i] for 16 vectors. Each stage adds the pairs reduce adds, for several vectors
// per instruction (float addition is commutative, so a pair's order within an add is immaterial):
//   b[p]  quarters: a[2p] l + (l + 8) for l < 4, l = 4..7, then a[2p+1]'s      (s8 of two vectors)
//   c[r]  quarter i: s8 l + (l + 4) of vector 4r + i                           (s4 of four)
//   e[u]  per quarter: s4 0 + 2, 1 + 3 of two vectors; f: their sums, vector 4j + i in lane 4i + j
constexpr int kDotBlock = 16;
// heads whose weighted values share each value row's loads, and chunks of 16 lanes a pass over the
// rows: 8 x 2 accumulators, 2 values and a weight fit the 32 registers, so a group of up to 8 heads
// reads each value row once
constexpr int kValueHeads = 8;
constexpr int kValueChunks = 2;
inline void reduce_block(const V16* a, float scale, const float* bias, float* out) {
  __m512 b[8], c[4];
  for (int p = 0; p < 8; ++p)
    b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p].v, a[2 * p + 1].v, 0x44),
                         _mm512_shuffle_f32x4(a[2 * p].v, a[2 * p + 1].v, 0xEE));
  for (int r = 0; r < 4; ++r)
    c[r] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * r], b[2 * r + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * r], b[2 * r + 1], 0xDD));
  const __m512 e0 = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x44), _mm512_shuffle_ps(c[0], c[1], 0xEE));
  const __m512 e1 = _mm512_add_ps(_mm512_shuffle_ps(c[2], c[3], 0x44), _mm512_shuffle_ps(c[2], c[3], 0xEE));
  const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(e0, e1, 0x88), _mm512_shuffle_ps(e0, e1, 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 sums = _mm512_permutexvar_ps(order, f);
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_mul_ps(sums, _mm512_set1_ps(scale)), _mm512_loadu_ps(bias)));
}
inline V16 exp_nonpositive(V16 x) {
  const __m512 t = _mm512_mul_ps(x.v, _mm512_set1_ps(kLog2e));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x.v);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpC5);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpC4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpC3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpC2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpC1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpC0));
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 y = _mm512_fmadd_ps(p, z, r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
  const __mmask16 low = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(kExpLow), _CMP_LT_OQ);
  return {_mm512_mask_blend_ps(low, y, _mm512_setzero_ps())};
}

#elif defined(SPECRT_ISA_AVX2)

struct V16 {
  __m256 lo, hi;
};
inline V16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store(float* p, V16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline V16 splat(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V16 add(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V16 mul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V16 sub(V16 a, V16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V16 neg_abs(V16 a) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  return {_mm256_or_ps(a.lo, sign), _mm256_or_ps(a.hi, sign)};
}
inline V16 select_negative(V16 x, V16 if_negative, V16 otherwise) {  // blendv reads the sign bit
  return {_mm256_blendv_ps(otherwise.lo, if_negative.lo, x.lo), _mm256_blendv_ps(otherwise.hi, if_negative.hi, x.hi)};
}
inline V16 div(V16 a, V16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V16 max(V16 a, V16 b) {
  return {_mm256_blendv_ps(a.lo, b.lo, _mm256_cmp_ps(b.lo, a.lo, _CMP_GT_OQ)),
          _mm256_blendv_ps(a.hi, b.hi, _mm256_cmp_ps(b.hi, a.hi, _CMP_GT_OQ))};
}
inline float reduce(V16 a) {
  __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}
// out[i] = reduce(a[i]) * scale + bias[i] for 4 vectors, the pairs reduce adds, across the vectors
// (see AVX-512's): s8 per vector, s4 of two per register, s2 and the sums of all four (in the lane
// order 0, 2 | 1, 3 of the two halves, which the unpack puts back in order)
constexpr int kDotBlock = 4;
// 6 x 1 accumulators (two registers each), a value and a weight fit the 16 registers
constexpr int kValueHeads = 6;
constexpr int kValueChunks = 1;
inline void reduce_block(const V16* a, float scale, const float* bias, float* out) {
  __m256 s8[4];
  for (int i = 0; i < 4; ++i) s8[i] = _mm256_add_ps(a[i].lo, a[i].hi);
  const __m256 s4a = _mm256_add_ps(_mm256_permute2f128_ps(s8[0], s8[1], 0x20), _mm256_permute2f128_ps(s8[0], s8[1], 0x31));
  const __m256 s4b = _mm256_add_ps(_mm256_permute2f128_ps(s8[2], s8[3], 0x20), _mm256_permute2f128_ps(s8[2], s8[3], 0x31));
  const __m256 s2 = _mm256_add_ps(_mm256_shuffle_ps(s4a, s4b, 0x44), _mm256_shuffle_ps(s4a, s4b, 0xEE));
  const __m256 s1 = _mm256_add_ps(_mm256_shuffle_ps(s2, s2, 0x88), _mm256_shuffle_ps(s2, s2, 0xDD));
  const __m128 sums = _mm_unpacklo_ps(_mm256_castps256_ps128(s1), _mm256_extractf128_ps(s1, 1));
  _mm_storeu_ps(out, _mm_add_ps(_mm_mul_ps(sums, _mm_set1_ps(scale)), _mm_loadu_ps(bias)));
}
inline __m256 exp8(__m256 x) {
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(kLog2e));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpC5);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpC1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpC0));
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 y = _mm256_fmadd_ps(p, z, r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
  const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLow), _CMP_LT_OQ);
  return _mm256_blendv_ps(y, _mm256_setzero_ps(), low);
}
inline V16 exp_nonpositive(V16 x) { return {exp8(x.lo), exp8(x.hi)}; }

#else  // scalar: the definition the vector units reproduce

struct V16 {
  float v[16];
};
inline V16 zero() { return V16{}; }
inline V16 load(const float* p) {
  V16 a;
  std::memcpy(a.v, p, sizeof a.v);
  return a;
}
inline void store(float* p, V16 a) { std::memcpy(p, a.v, sizeof a.v); }
inline V16 splat(float x) {
  V16 a;
  for (float& lane : a.v) lane = x;
  return a;
}
inline V16 fma(V16 a, V16 b, V16 c) {
  for (int l = 0; l < 16; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
  return c;
}
inline V16 add(V16 a, V16 b) {
  for (int l = 0; l < 16; ++l) a.v[l] = a.v[l] + b.v[l];
  return a;
}
inline V16 mul(V16 a, V16 b) {
  for (int l = 0; l < 16; ++l) a.v[l] = a.v[l] * b.v[l];
  return a;
}
inline V16 sub(V16 a, V16 b) {
  for (int l = 0; l < 16; ++l) a.v[l] = a.v[l] - b.v[l];
  return a;
}
inline V16 div(V16 a, V16 b) {
  for (int l = 0; l < 16; ++l) a.v[l] = a.v[l] / b.v[l];
  return a;
}
inline V16 max(V16 a, V16 b) {
  for (int l = 0; l < 16; ++l) a.v[l] = b.v[l] > a.v[l] ? b.v[l] : a.v[l];
  return a;
}
inline V16 neg_abs(V16 a) {
  for (float& lane : a.v) lane = -std::fabs(lane);
  return a;
}
inline V16 select_negative(V16 x, V16 if_negative, V16 otherwise) {
  for (int l = 0; l < 16; ++l) otherwise.v[l] = std::signbit(x.v[l]) ? if_negative.v[l] : otherwise.v[l];
  return otherwise;
}
inline float reduce(V16 a) {
  float s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = a.v[l] + a.v[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  const float s2a = s4[0] + s4[2], s2b = s4[1] + s4[3];
  return s2a + s2b;
}
constexpr int kDotBlock = 4;
constexpr int kValueHeads = 2;
constexpr int kValueChunks = 4;
inline void reduce_block(const V16* a, float scale, const float* bias, float* out) {
  for (int i = 0; i < kDotBlock; ++i) out[i] = reduce(a[i]) * scale + bias[i];
}
inline float exp1(float x) {
  if (x < kExpLow) return 0.0f;
  if (x != x) return x;  // NaN stays NaN, as in the vector units
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpC5;
  p = std::fma(p, r, kExpC4);
  p = std::fma(p, r, kExpC3);
  p = std::fma(p, r, kExpC2);
  p = std::fma(p, r, kExpC1);
  p = std::fma(p, r, kExpC0);
  float y = std::fma(p, r * r, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}
inline V16 exp_nonpositive(V16 x) {
  for (float& lane : x.v) lane = exp1(lane);
  return x;
}

#endif

}  // namespace canonical
