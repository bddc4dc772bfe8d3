// The numerics kernels compiled for avx512 (16 fp32 lanes); the logic is in kernels_impl.h.
#define CONCORD_SIMD_NAMESPACE avx512
#define CONCORD_SIMD_WIDTH 16
#define CONCORD_SIMD_NAME "avx512"
#include "concord/numerics/simd/kernels_impl.h"

namespace concord::numerics::simd {
const Kernels& avx512_kernels() { return avx512::kernels(); }
}  // namespace concord::numerics::simd
