// Quantized GEMM: "the exact product of the quantized values, accumulated in fp32".
//
// prepare_operand puts an operand on its format's grid (numerics' quantizer, blocks along the
// GEMM's reduction dimension, optionally after the random Hadamard transform); gemm_prepared
// multiplies two prepared operands with the batch-invariant gemm (gemm.h) and applies the two
// per-tensor scales after the sum.
//
// Why the bf16 path is exact (and equal to the fp32 path, bit for bit):
//   Significant bits of one operand value v (the dequantized value WITHOUT the per-tensor scale):
//     MXFP8/MXFP6/MXFP4: element × 2^k — e4m3 4, e5m2 3, e2m3 4, e3m2 3, e2m1 2 bits;
//     NVFP4: e2m1 × ue4m3 — at most 2 + 4 = 6 bits (the 1/S_enc tensor scale is factored out);
//     per-tensor FP8: the e4m3/e5m2 code value, ≤ 4 bits; bf16: 8 bits.
//   So every v has ≤ 8 significant bits. bf16_exact also demands that a nonzero |v| lie in
//   [2^-60, 2^63): then v's lowest bit is ≥ 2^-60 · 2^-7 = 2^-67 and v is a normal bf16 value.
//   A product of two such values has ≤ 16 significant bits, lowest bit ≥ 2^-134 ≥ 2^-149 (the
//   fp32 quantum) and magnitude < 2^126 — it is representable in fp32, i.e. exact. Therefore
//   fma(a, b, acc) = round(a·b + acc) = round(fl(a·b) + acc): the same bits a bf16×bf16→fp32
//   GEMM (exact products, one rounding per addition) gives with the same summation order.
//   Extreme block scales break the range condition (an e8m0 scale of 2^-127 gives values below
//   2^-60, or fp32 subnormals that dequantize inexactly); they are detected when preparing
//   (bf16_exact = false) and such operands take the fp32 path.
//   The bf16 path stores B's packed panels as bf16 (half the bandwidth) and widens them in the
//   kernel, A is widened while packing (both exact), so its result equals the fp32 path's bit
//   for bit whenever the values are bf16-representable.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "concord/numerics/block.h"
#include "concord/numerics/philox.h"
#include "concord/numerics/quant_desc.h"
#include "concord/tensor/gemm.h"

namespace concord::tensor {

enum class Operand : uint8_t { a, b };

struct PreparedOperand {
  const float* data = nullptr;   // values on the quantization grid, dequantized WITHOUT the
                                 // per-tensor scale, same layout as the input (rows x cols
                                 // row-major, contiguous)
  int64_t rows = 0, cols = 0;
  float tensor_scale = 1.0f;     // NVFP4's 1/S_enc, per-tensor FP8's 1/S; factored out of the sum
  bool bf16_exact = true;        // every value bf16-representable and nonzero |v| in [2^-60, 2^63)
  std::optional<numerics::QuantDesc> desc;  // nullopt: fp32 operand (data may alias the input)
  numerics::QuantizedTensor quantized;      // codes + scales when desc is set (with its real
                                            // tensor_scale)
  std::vector<float> storage;               // owns the values when it does not alias; reused
  PackedB packed;  // op(B) prepacked by prepack_b (a weight reused across GEMMs); cleared by
                   // prepare_operand. data stays valid beside it (observers read it).
};

// The axis (0 or 1) of the stored operand that a GEMM with transpose t reduces over:
// a/no → 1, a/yes → 0, b/no → 0, b/yes → 1.
int reduction_axis(Operand side, Trans t);

// Put x (rows x cols, contiguous) on operand `side`'s grid for a GEMM with transpose t. A 1-D
// block desc is re-oriented to run along the reduction dimension (overriding desc->axis); 2-D
// blocks are used as they are. hadamard: first apply hadamard16 along the reduction dimension,
// seeded by hadamard_seed. rng feeds stochastic rounding. With no desc and no Hadamard, data
// aliases x (no copy): x must outlive the prepared operand.
void prepare_operand(PreparedOperand& out, const std::optional<numerics::QuantDesc>& desc,
                     Operand side, Trans t, const float* x, int64_t rows, int64_t cols,
                     numerics::RandomStream rng = {}, bool hadamard = false,
                     uint64_t hadamard_seed = 0);

// Packs a prepared b operand once for GEMMs with transpose tb (gemm.h's PackedB): bf16 panels
// when the values are bf16_exact (half the bytes, widened exactly), else fp32. gemm_prepared
// then streams the panels instead of re-packing b on every call (same bits). Costs one more
// copy of the values: panels_words ≈ rows·cols floats (fp32) or half of that (bf16).
void prepack_b(PreparedOperand& b, Trans tb);

// Whether every value is bf16-representable with nonzero magnitudes in [2^-60, 2^63).
bool values_bf16_exact(const float* x, int64_t n);

enum class GemmPath : uint8_t { fp32, bf16 };

// C = op(a)·op(b) · (a.tensor_scale · b.tensor_scale)  (+ C). a must be M x K after op (stored
// (M, K) for ta == no, (K, M) for yes), b K x N after op. The sum Σ is the gemm() contract on
// the prepared values; then, with s = fl(a.tensor_scale · b.tensor_scale):
//   s == 1: C = Σ (accumulate: Σ starts from C, exactly as gemm());
//   else:   C = fl(s · Σ), or with accumulate C = fma(s, Σ, C).
// Takes the bf16 path when both operands are bf16_exact, else fp32; returns the path taken.
// When b was prepacked (prepack_b with this tb) the product runs on its panels (gemm_packed;
// the same bits either way).
GemmPath gemm_prepared(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K,
                       const PreparedOperand& a, const PreparedOperand& b, float* C, int64_t ldc,
                       bool accumulate = false);

}  // namespace concord::tensor
