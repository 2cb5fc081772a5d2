// SpecAttention's kernels compiled for avx512: canonical.h and attention_impl.inc in namespace
// specrt::avx512. Nothing from a header that defines inline functions is used in here but the
// intrinsics, so no code compiled for this instruction set is shared with another unit.
#define SPECRT_ISA_AVX512
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)  // the whole unit: x86 only
#include "intrinsics.h"

#include "attention.h"

#if !defined(SPECRT_EMULATED_AVX512)
#pragma GCC target("avx512f,avx512bw,avx2,fma")  // after the headers: only the code below is built for it
#endif

namespace specrt::avx512 {
#include "canonical.h"
#include "attention_impl.inc"
}  // namespace specrt::avx512
#endif
