// SpecAttention's kernels compiled for scalar: canonical.h and attention_impl.inc in namespace
// specrt::scalar. Nothing from a header that defines inline functions is used in here but the
// intrinsics, so no code compiled for this instruction set is shared with another unit.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "attention.h"

namespace specrt::scalar {
#include "canonical.h"
#include "attention_impl.inc"
}  // namespace specrt::scalar
