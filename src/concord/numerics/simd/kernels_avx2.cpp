// The numerics kernels compiled for avx2 (8 fp32 lanes); the logic is in kernels_impl.h.
#define CONCORD_SIMD_NAMESPACE avx2
#define CONCORD_SIMD_WIDTH 8
#define CONCORD_SIMD_NAME "avx2"
#include "concord/numerics/simd/kernels_impl.h"

namespace concord::numerics::simd {
const Kernels& avx2_kernels() { return avx2::kernels(); }
}  // namespace concord::numerics::simd
