// The numerics kernels compiled for generic (4 fp32 lanes); the logic is in kernels_impl.h.
#define CONCORD_SIMD_NAMESPACE generic
#define CONCORD_SIMD_WIDTH 4
#define CONCORD_SIMD_NAME "generic"
#include "concord/numerics/simd/kernels_impl.h"

namespace concord::numerics::simd {
const Kernels& generic_kernels() { return generic::kernels(); }
}  // namespace concord::numerics::simd
