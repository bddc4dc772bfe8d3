// GEMMs on the GPU, Y (M x N) = X (M x K) · Wᵀ (W is N x K, a linear layer's weight), all
// row-major:
//
//   exact_gemm   the exact-product reference: fp32 operand values (quantized codes decoded —
//                exact), one accumulator per output, acc = +0, then for k = 0 .. K-1 in order
//                acc = fma(x, w, acc) — tensor::gemm's contract (tensor/gemm.h), so the same bits
//                as concord's CPU GEMM for every shape; optionally times (scale_x · scale_w), one
//                fp32 multiply of the two scales and one of the result (per-tensor FP8).
//   Blas         cuBLASLt as production engines call it: BF16 x BF16 and per-tensor-scaled
//                FP8 E4M3 x E4M3 (CUBLAS_COMPUTE_32F, "TN" layout, fp32 or bf16 output, FP8 fast
//                accumulation on or off), the algorithm picked by cuBLASLt's heuristic.
//
// The operands are what quantize.h makes: bf16 codes (uint16) and e4m3 codes (bytes) are the
// storage cuBLASLt reads; per-tensor decode scales are device floats (DeviceQuantized::scratch's
// second word, see tensor_scale_of).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "concord/cuda/codec.h"
#include "concord/cuda/quantize.h"

namespace concord::cuda {

// The exact-product reference (see above). scale_x / scale_w: device floats or nullptr (no scale).
void exact_gemm(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K,
                const float* scale_x = nullptr, const float* scale_w = nullptr);

// The device float holding a per-tensor or NVFP4 quantization's decode scale (1/S).
const float* tensor_scale_of(const DeviceQuantized& q);

enum class OutType : uint8_t { f32, bf16 };

class Blas {
 public:
  Blas();
  ~Blas();  // defined where Plan is complete
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // Y = X · Wᵀ over bf16 codes, fp32 accumulation.
  void gemm_bf16(const uint16_t* X, const uint16_t* W, void* Y, OutType out, int64_t M, int64_t N, int64_t K);
  // Y = (scale_x · scale_w) · X · Wᵀ over e4m3 codes with per-tensor decode scales (device floats).
  void gemm_fp8(const uint8_t* X, const float* scale_x, const uint8_t* W, const float* scale_w, void* Y,
                OutType out, int64_t M, int64_t N, int64_t K, bool fast_accum);

 private:
  struct Plan;
  const Plan& plan(bool fp8, OutType out, int64_t M, int64_t N, int64_t K, bool fast_accum);
  void* handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<std::tuple<bool, int, int64_t, int64_t, int64_t, bool>, std::unique_ptr<Plan>> plans_;
};

}  // namespace concord::cuda
