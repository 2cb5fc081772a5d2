// MatMulW8A8 for AVX-512 with VNNI: vpdpbusd sums u8 x s8 products of 4 k straight into 32 bits. It
// takes the weights as W + 128 (u8) and the activations as they are (s8), so the sum carries
// 128 * sum(xq) too, which is subtracted at the end. Integer sums are exact, so the outputs equal
// matmul_w8a8_avx512.cc's. Activations are quantized by avx512::quantize_tokens.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)  // the whole unit: x86 only
#include "intrinsics.h"

#include "matmul_w8a8.h"

#if !defined(SPECRT_EMULATED_AVX512)
#pragma GCC target("avx512f,avx512bw,avx512vnni,avx2,fma")  // after the headers: only the code below is built for it
#endif

namespace specrt::avx512vnni {
namespace {

// one copy per unit, in its namespace: no inline code is shared between instruction sets
int32_t load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

__m512i weights(__m512i w) { return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80))); }  // W + 128
__m512i dots_add(__m512i sums, __m512i w, __m512i a) { return _mm512_dpbusd_epi32(sums, w, a); }
__m512i dots_finish(__m512i sums, int32_t offset) { return _mm512_sub_epi32(sums, _mm512_set1_epi32(offset)); }

}  // namespace

#include "matmul_w8a8_avx512.inc"

}  // namespace specrt::avx512vnni
#endif
