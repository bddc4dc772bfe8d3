// Quantized GEMM: preparing operands on their grid (numerics' quantizer, blocks along the
// reduction dimension, optional Hadamard) and multiplying them on the fp32 or bf16 path. The
// exactness argument for the bf16 path is in qgemm.h.
#include "concord/tensor/qgemm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "concord/numerics/check.h"
#include "concord/tensor/hadamard.h"

namespace concord::tensor {
namespace {

// The temporary for C = fma(s, Σ, C): grow-only, one per thread.
std::vector<float>& scratch() {
  static thread_local std::vector<float> buffer;
  return buffer;
}

bool is_one_d_block(const numerics::QuantDesc& d) {
  return d.has_scale && !d.block.per_tensor() && (d.block.rows == 1 || d.block.cols == 1);
}

}  // namespace

int reduction_axis(Operand side, Trans t) {
  if (side == Operand::a) return t == Trans::no ? 1 : 0;
  return t == Trans::no ? 0 : 1;
}

bool values_bf16_exact(const float* x, int64_t n) {
  // Nonzero magnitudes in [2^-60, 2^63): biased exponent field in [67, 190). NaN and Inf fail.
  constexpr uint32_t kLowest = 127 - 60, kPastHighest = 127 + 63;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(x[i]);
    if ((bits & 0xFFFFu) != 0) return false;
    const uint32_t magnitude = bits & 0x7FFFFFFFu;
    if (magnitude == 0) continue;
    const uint32_t exponent = magnitude >> 23;
    if (exponent < kLowest || exponent >= kPastHighest) return false;
  }
  return true;
}

void prepare_operand(PreparedOperand& out, const std::optional<numerics::QuantDesc>& desc,
                     Operand side, Trans t, const float* x, int64_t rows, int64_t cols,
                     numerics::RandomStream rng, bool hadamard, uint64_t hadamard_seed) {
  if (rows < 0 || cols < 0) {
    throw InputError("[prepare_operand] negative shape " + std::to_string(rows) + " x " +
                     std::to_string(cols));
  }
  const int64_t n = rows * cols;
  if (n > 0 && x == nullptr) throw InputError("[prepare_operand] null input for a non-empty shape");
  const int axis = reduction_axis(side, t);
  out.rows = rows;
  out.cols = cols;
  out.packed.clear();
  out.tensor_scale = 1.0f;
  out.desc = desc;

  const float* source = x;
  if (hadamard) {
    out.storage.assign(x, x + n);
    hadamard16(out.storage.data(), rows, cols, axis, hadamard_seed);
    source = out.storage.data();
  }
  if (!desc) {
    out.quantized = {};
    out.data = hadamard ? out.storage.data() : x;  // the fp32 operand itself: no copy
    out.bf16_exact = values_bf16_exact(out.data, n);
    return;
  }

  numerics::QuantDesc oriented = *desc;
  if (is_one_d_block(oriented)) {
    // Store the block as 1 x len along `axis`, the form numerics::effective_block re-orients.
    const int len = std::max(oriented.block.rows, oriented.block.cols);
    oriented.block = {1, len};
    oriented.axis = axis;
  }
  out.desc = oriented;
  numerics::quantize_into(out.quantized, oriented, source, rows, cols, rng);
  // Dequantize without the per-tensor scale; keep the real one beside it (and in `quantized`).
  const float tensor_scale = out.quantized.tensor_scale;
  out.quantized.tensor_scale = 1.0f;
  out.storage.resize(static_cast<size_t>(n));  // the Hadamard copy, if any, is consumed
  numerics::dequantize(out.quantized, out.storage.data());
  out.quantized.tensor_scale = tensor_scale;
  out.tensor_scale = tensor_scale;
  out.data = out.storage.data();
  out.bf16_exact = values_bf16_exact(out.data, n);
}

void prepack_b(PreparedOperand& b, Trans tb) {
  const int64_t K = tb == Trans::no ? b.rows : b.cols, N = tb == Trans::no ? b.cols : b.rows;
  pack_b(b.packed, tb, K, N, b.data, b.cols, b.bf16_exact);
}

GemmPath gemm_prepared(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K,
                       const PreparedOperand& a, const PreparedOperand& b, float* C, int64_t ldc,
                       bool accumulate) {
  const int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
  const int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
  if (a.rows != a_rows || a.cols != a_cols || b.rows != b_rows || b.cols != b_cols) {
    throw InputError("[gemm_prepared] operand shapes a " + std::to_string(a.rows) + "x" +
                     std::to_string(a.cols) + ", b " + std::to_string(b.rows) + "x" +
                     std::to_string(b.cols) + " do not fit M=" + std::to_string(M) +
                     " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                     " with these transposes (prepare them with the GEMM's own shapes)");
  }
  const GemmPath path = a.bf16_exact && b.bf16_exact ? GemmPath::bf16 : GemmPath::fp32;
  // Prepacked b: its panels are bf16 exactly when b is bf16_exact, and gemm_packed widens them
  // exactly and uses a as it is — the fp32 product, which equals the bf16 path's bits.
  const bool use_packed = b.packed.valid && b.packed.tb == tb && b.packed.K == K &&
                          b.packed.N == N;
  const auto product = [&](float* out, int64_t ld, bool acc) {
    if (use_packed) {
      gemm_packed(ta, M, N, K, a.data, a.cols, b.packed, out, ld, acc);
    } else {
      (path == GemmPath::bf16 ? gemm_bf16 : gemm)(ta, tb, M, N, K, a.data, a.cols, b.data, b.cols,
                                                  out, ld, acc);
    }
  };
  const float s = a.tensor_scale * b.tensor_scale;
  if (s == 1.0f) {
    product(C, ldc, accumulate);
    return path;
  }
  if (M == 0 || N == 0) return path;
  if (!accumulate) {
    product(C, ldc, false);
    for (int64_t i = 0; i < M; ++i) {
      float* row = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) row[j] = s * row[j];
    }
    return path;
  }
  std::vector<float>& sum = scratch();
  sum.resize(static_cast<size_t>(M * N));
  product(sum.data(), N, false);
  for (int64_t i = 0; i < M; ++i) {
    float* row = C + i * ldc;
    const float* sum_row = sum.data() + i * N;
    for (int64_t j = 0; j < N; ++j) row[j] = std::fma(s, sum_row[j], row[j]);
  }
  return path;
}

}  // namespace concord::tensor
