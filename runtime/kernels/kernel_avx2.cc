// SpecAttention's kernels compiled for avx2: canonical.h and attention_impl.inc in namespace
// specrt::avx2. Nothing from a header that defines inline functions is used in here but the
// intrinsics, so no code compiled for this instruction set is shared with another unit.
#define SPECRT_ISA_AVX2
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)  // the whole unit: x86 only
#include <immintrin.h>

#include "attention.h"

#pragma GCC target("avx2,fma")  // after the headers: only the code below is built for it

namespace specrt::avx2 {
#include "canonical.h"
#include "attention_impl.inc"
}  // namespace specrt::avx2
#endif
