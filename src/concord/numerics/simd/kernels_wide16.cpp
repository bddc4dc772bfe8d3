// The 16-lane (AVX-512) kernel logic compiled for AVX2, to test it where AVX-512 is absent.
#define CONCORD_SIMD_NAMESPACE wide16
#define CONCORD_SIMD_WIDTH 16
#define CONCORD_SIMD_NAME "wide16"
#include "concord/numerics/simd/kernels_impl.h"

namespace concord::numerics::simd {
const Kernels& wide16_kernels() { return wide16::kernels(); }
}  // namespace concord::numerics::simd
