// Quantized GEMM: prepared values on the grid of each format with blocks along the reduction
// dimension (checked against numerics' scalar reference on an explicitly transposed copy), the
// product against fp64, bf16_exact detection, and the bf16 path equal to the fp32 path.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/quant_desc.h"
#include "concord/tensor/gemm.h"
#include "concord/tensor/hadamard.h"
#include "concord/tensor/qgemm.h"

namespace concord::tensor {
namespace {

using numerics::QuantDesc;

const char* const kDescNames[] = {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp4",
                                  "nvfp4",      "nvfp4-2d",   "fp8-tensor", "bf16"};

QuantDesc desc_named(const char* name) {
  const auto d = QuantDesc::from_name(name);
  EXPECT_TRUE(d.has_value()) << name;
  return *d;
}

// Rows whose magnitudes differ by large powers of two from row to row and column to column, so
// that 1-D blocks along a row and down a column quantize differently.
std::vector<float> skewed_values(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      v[r * cols + c] = normal(gen) * std::ldexp(1.0f, static_cast<int>((r * 5 + c * 3) % 13) - 6);
    }
  }
  return v;
}

std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  }
  return t;
}

// The grid values (without the tensor scale) an operand must hold, built independently of the
// axis handling under test: bring the reduction dimension to axis 1 by transposing, quantize
// with the scalar reference (blocks along rows), dequantize, transpose back.
std::vector<float> expected_grid(const QuantDesc& desc, const std::vector<float>& x, int64_t rows,
                                 int64_t cols, int reduction_axis, float* tensor_scale) {
  QuantDesc d = desc;
  d.axis = 1;
  const bool flip = reduction_axis == 0;
  const std::vector<float> src = flip ? transposed(x, rows, cols) : x;
  const int64_t r = flip ? cols : rows, c = flip ? rows : cols;
  numerics::QuantizedTensor q = numerics::quantize_ref(d, src.data(), r, c);
  *tensor_scale = q.tensor_scale;
  q.tensor_scale = 1.0f;
  std::vector<float> out(src.size());
  numerics::dequantize_ref(q, out.data());
  return flip ? transposed(out, r, c) : out;
}

bool bitwise_equal(const float* x, const float* y, size_t n) {
  return std::memcmp(x, y, n * sizeof(float)) == 0;
}

TEST(QgemmTest, PreparedValuesLieOnTheGridWithBlocksAlongTheReduction) {
  const int64_t rows = 48, cols = 64;  // 1-D blocks of 32 / 16 fit both ways
  const std::vector<float> x = skewed_values(rows, cols, 1);
  for (const char* name : kDescNames) {
    const QuantDesc desc = desc_named(name);
    const bool one_d = desc.has_scale && !desc.block.per_tensor() &&
                       (desc.block.rows == 1 || desc.block.cols == 1);
    std::vector<float> along[2];
    for (Operand side : {Operand::a, Operand::b}) {
      for (Trans t : {Trans::no, Trans::yes}) {
        const int axis = reduction_axis(side, t);
        PreparedOperand p;
        prepare_operand(p, desc, side, t, x.data(), rows, cols);
        float want_scale = 0.0f;
        const std::vector<float> want = expected_grid(desc, x, rows, cols, axis, &want_scale);
        ASSERT_EQ(p.rows, rows);
        ASSERT_EQ(p.cols, cols);
        ASSERT_TRUE(bitwise_equal(p.data, want.data(), want.size()))
            << name << " side " << (side == Operand::a ? "a" : "b") << " t "
            << (t == Trans::yes ? "yes" : "no");
        EXPECT_EQ(p.tensor_scale, want_scale) << name;
        EXPECT_EQ(p.quantized.tensor_scale, want_scale) << name;  // the real one is kept
        EXPECT_TRUE(p.bf16_exact) << name << ": ordinary data is bf16-exact";
        along[axis] = std::vector<float>(p.data, p.data + rows * cols);
        // Quantizing the prepared values again changes nothing (they are on the grid).
        std::vector<float> scaled(p.data, p.data + rows * cols);
        for (float& v : scaled) v *= p.tensor_scale;
        std::vector<float> again(scaled.size());
        numerics::fake_quantize(*p.desc, scaled.data(), again.data(), rows, cols);
        // (MX and plain casts; a per-tensor or NVFP4 scale is recomputed from the new amax.)
        const bool idempotent = desc.is_mx() || !desc.has_scale;
        for (size_t i = 0; i < again.size() && idempotent; ++i) {
          ASSERT_EQ(again[i], scaled[i]) << name << " at " << i;
        }
      }
    }
    // The orientation check above can fail: with 1-D blocks the two axes give different grids.
    if (one_d) {
      EXPECT_NE(along[0], along[1]) << name;
    } else {
      EXPECT_EQ(along[0], along[1]) << name;
    }
  }
}

// |C - s·Σ a b| <= γ_{K+2} · |s| · Σ|a||b| in fp64 (K roundings of the sum, one of the scale
// product, one of the final multiply).
void expect_close_to_fp64(const PreparedOperand& a, const PreparedOperand& b, Trans ta, Trans tb,
                          int64_t M, int64_t N, int64_t K, const std::vector<float>& C,
                          const std::string& what) {
  const double u = std::ldexp(1.0, -24), k = static_cast<double>(K + 2);
  const double gamma = k * u / (1.0 - k * u);
  const double s = static_cast<double>(a.tensor_scale) * b.tensor_scale;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t kk = 0; kk < K; ++kk) {
        const double av = ta == Trans::no ? a.data[i * a.cols + kk] : a.data[kk * a.cols + i];
        const double bv = tb == Trans::no ? b.data[kk * b.cols + j] : b.data[j * b.cols + kk];
        exact += av * bv;
        magnitude += std::fabs(av * bv);
      }
      ASSERT_LE(std::fabs(C[i * N + j] - s * exact), gamma * std::fabs(s) * magnitude + 1e-37)
          << what << " at " << i << "," << j;
    }
  }
}

TEST(QgemmTest, ProductMatchesFp64AndBf16PathEqualsFp32Path) {
  const int64_t M = 37, N = 29, K = 96;
  for (const char* name : kDescNames) {
    const QuantDesc desc = desc_named(name);
    for (Trans ta : {Trans::no, Trans::yes}) {
      for (Trans tb : {Trans::no, Trans::yes}) {
        const std::string what = std::string(name) + (ta == Trans::yes ? " T" : " N") +
                                 (tb == Trans::yes ? "T" : "N");
        const std::vector<float> xa = skewed_values(ta == Trans::no ? M : K,
                                                    ta == Trans::no ? K : M, 2);
        const std::vector<float> xb = skewed_values(tb == Trans::no ? K : N,
                                                    tb == Trans::no ? N : K, 3);
        PreparedOperand a, b;
        prepare_operand(a, desc, Operand::a, ta, xa.data(), ta == Trans::no ? M : K,
                        ta == Trans::no ? K : M);
        prepare_operand(b, desc, Operand::b, tb, xb.data(), tb == Trans::no ? K : N,
                        tb == Trans::no ? N : K);
        ASSERT_TRUE(a.bf16_exact && b.bf16_exact) << what;
        for (bool accumulate : {false, true}) {
          std::vector<float> c_bf16(M * N, 0.5f), c_fp32(M * N, 0.5f);
          EXPECT_EQ(gemm_prepared(ta, tb, M, N, K, a, b, c_bf16.data(), N, accumulate),
                    GemmPath::bf16);
          PreparedOperand a_fp32 = a;  // the same values, forced onto the fp32 path
          a_fp32.data = a.storage.data();
          a_fp32.bf16_exact = false;
          EXPECT_EQ(gemm_prepared(ta, tb, M, N, K, a_fp32, b, c_fp32.data(), N, accumulate),
                    GemmPath::fp32);
          ASSERT_TRUE(bitwise_equal(c_bf16.data(), c_fp32.data(), c_bf16.size())) << what;
          if (!accumulate) expect_close_to_fp64(a, b, ta, tb, M, N, K, c_bf16, what);
        }
      }
    }
  }
}

TEST(QgemmTest, ScaledAccumulateIsOneFmaOntoC) {
  const int64_t M = 5, N = 7, K = 32;
  const std::vector<float> xa = skewed_values(M, K, 4), xb = skewed_values(N, K, 5);
  PreparedOperand a, b;
  prepare_operand(a, desc_named("nvfp4"), Operand::a, Trans::no, xa.data(), M, K);
  prepare_operand(b, desc_named("nvfp4"), Operand::b, Trans::yes, xb.data(), N, K);
  ASSERT_NE(a.tensor_scale * b.tensor_scale, 1.0f);
  std::vector<float> sum(M * N), c(M * N, 0.25f);
  gemm_reference(Trans::no, Trans::yes, M, N, K, a.data, K, b.data, K, sum.data(), N);
  gemm_prepared(Trans::no, Trans::yes, M, N, K, a, b, c.data(), N, true);
  const float s = a.tensor_scale * b.tensor_scale;
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], std::fma(s, sum[i], 0.25f)) << i;
  gemm_prepared(Trans::no, Trans::yes, M, N, K, a, b, c.data(), N, false);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], s * sum[i]) << i;
}

TEST(QgemmTest, ExtremeBlockScalesAreNotBf16ExactAndTakeTheFp32Path) {
  const int64_t M = 4, N = 3, K = 64;
  std::vector<float> ordinary = skewed_values(N, K, 6);
  PreparedOperand b;
  prepare_operand(b, desc_named("mxfp8-e4m3"), Operand::b, Trans::yes, ordinary.data(), N, K);
  ASSERT_TRUE(b.bf16_exact);
  for (float magnitude : {1e-38f, 1e-25f, 1e30f}) {
    for (const char* name : {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3", "mxfp4", "bf16"}) {
      std::vector<float> x = skewed_values(M, K, 7);
      for (int64_t k = 0; k < 32; ++k) x[k] = magnitude * (1.0f + 0.125f * static_cast<float>(k % 4));
      PreparedOperand a;
      prepare_operand(a, desc_named(name), Operand::a, Trans::no, x.data(), M, K);
      EXPECT_FALSE(a.bf16_exact) << name << " block amax " << magnitude;
      std::vector<float> c(M * N), want(M * N);
      EXPECT_EQ(gemm_prepared(Trans::no, Trans::yes, M, N, K, a, b, c.data(), N), GemmPath::fp32);
      gemm_reference(Trans::no, Trans::yes, M, N, K, a.data, K, b.data, K, want.data(), N);
      EXPECT_TRUE(bitwise_equal(c.data(), want.data(), c.size())) << name;
    }
  }
  EXPECT_FALSE(values_bf16_exact(std::vector<float>{1.0f, std::nanf("")}.data(), 2));
  EXPECT_FALSE(values_bf16_exact(std::vector<float>{1.0f + 0x1p-20f}.data(), 1));
  EXPECT_TRUE(values_bf16_exact(std::vector<float>{0.0f, -0.0f, 0x1p-60f, 0x1.fep62f}.data(), 4));
  EXPECT_FALSE(values_bf16_exact(std::vector<float>{0x1p63f}.data(), 1));
  EXPECT_FALSE(values_bf16_exact(std::vector<float>{0x1p-61f}.data(), 1));
}

TEST(QgemmTest, Fp32OperandAliasesItsInputAndHadamardRotatesBeforeQuantizing) {
  const int64_t rows = 32, cols = 48;
  const std::vector<float> x = skewed_values(rows, cols, 8);
  PreparedOperand p;
  prepare_operand(p, std::nullopt, Operand::a, Trans::yes, x.data(), rows, cols);
  EXPECT_EQ(p.data, x.data());
  EXPECT_FALSE(p.bf16_exact);  // random fp32 values are not bf16
  EXPECT_EQ(p.tensor_scale, 1.0f);

  // fp32 + Hadamard: a transformed copy along the reduction axis (axis 0 for a with t == yes).
  std::vector<float> rotated = x;
  hadamard16(rotated.data(), rows, cols, 0, 17);
  prepare_operand(p, std::nullopt, Operand::a, Trans::yes, x.data(), rows, cols, {}, true, 17);
  EXPECT_NE(p.data, x.data());
  EXPECT_TRUE(bitwise_equal(p.data, rotated.data(), rotated.size()));

  // nvfp4 + Hadamard = nvfp4 of the rotated tensor.
  const QuantDesc nvfp4 = desc_named("nvfp4");
  prepare_operand(p, nvfp4, Operand::b, Trans::no, x.data(), rows, cols, {}, true, 17);
  float want_scale = 0.0f;
  const std::vector<float> want = expected_grid(nvfp4, rotated, rows, cols, 0, &want_scale);
  EXPECT_TRUE(bitwise_equal(p.data, want.data(), want.size()));
  EXPECT_EQ(p.tensor_scale, want_scale);
}

TEST(QgemmTest, StochasticRoundingIsDrivenByTheStream) {
  const int64_t rows = 16, cols = 64;
  const std::vector<float> x = skewed_values(rows, cols, 9);
  QuantDesc desc = desc_named("mxfp4");
  desc.rounding = numerics::Rounding::stochastic;
  PreparedOperand p1, p2, p3;
  prepare_operand(p1, desc, Operand::a, Trans::no, x.data(), rows, cols, {1, 0});
  prepare_operand(p2, desc, Operand::a, Trans::no, x.data(), rows, cols, {1, 0});
  prepare_operand(p3, desc, Operand::a, Trans::no, x.data(), rows, cols, {2, 0});
  EXPECT_EQ(p1.storage, p2.storage);
  EXPECT_NE(p1.storage, p3.storage);
}

TEST(QgemmTest, PrepackedBGivesTheSameBitsAsPackingPerCall) {
  // fp32 (not bf16-exact: fp32 panels), bf16 and mxfp8 (bf16 panels) weights; decode-sized and
  // prefill-sized M; a on the bf16 path and forced onto the fp32 path.
  const int64_t N = 70, K = 96;
  const std::vector<float> w = skewed_values(N, K, 11);
  for (const char* name : {"fp32", "bf16", "mxfp8-e4m3", "nvfp4"}) {
    const std::optional<QuantDesc> desc =
        std::string(name) == "fp32" ? std::nullopt : std::optional<QuantDesc>(desc_named(name));
    PreparedOperand plain, packed;
    prepare_operand(plain, desc, Operand::b, Trans::yes, w.data(), N, K);
    prepare_operand(packed, desc, Operand::b, Trans::yes, w.data(), N, K);
    prepack_b(packed, Trans::yes);
    ASSERT_TRUE(packed.packed.valid);
    EXPECT_EQ(packed.packed.bf16, packed.bf16_exact) << name;
    for (int64_t M : {1, 3, 8, 9, 40}) {
      const std::vector<float> x = skewed_values(M, K, static_cast<uint32_t>(M));
      PreparedOperand a;
      prepare_operand(a, desc, Operand::a, Trans::no, x.data(), M, K);
      for (bool force_fp32 : {false, true}) {
        PreparedOperand a_used = a;  // data still points at a's values
        if (force_fp32) a_used.bf16_exact = false;
        for (bool accumulate : {false, true}) {
          std::vector<float> c_plain(M * N, 0.5f), c_packed(M * N, 0.5f);
          const GemmPath p1 = gemm_prepared(Trans::no, Trans::yes, M, N, K, a_used, plain,
                                            c_plain.data(), N, accumulate);
          const GemmPath p2 = gemm_prepared(Trans::no, Trans::yes, M, N, K, a_used, packed,
                                            c_packed.data(), N, accumulate);
          EXPECT_EQ(p1, p2);
          ASSERT_TRUE(bitwise_equal(c_plain.data(), c_packed.data(), c_plain.size()))
              << name << " M=" << M << " force_fp32=" << force_fp32 << " acc=" << accumulate;
        }
      }
    }
    // Re-preparing drops the packing (stale panels are never used).
    prepare_operand(packed, desc, Operand::b, Trans::yes, w.data(), N, K);
    EXPECT_FALSE(packed.packed.valid);
  }
}

TEST(QgemmTest, RejectsMismatchedShapes) {
  const std::vector<float> x(12, 1.0f);
  PreparedOperand a, b;
  prepare_operand(a, std::nullopt, Operand::a, Trans::no, x.data(), 3, 4);
  prepare_operand(b, std::nullopt, Operand::b, Trans::no, x.data(), 3, 4);
  std::vector<float> c(16);
  EXPECT_THROW(gemm_prepared(Trans::no, Trans::no, 3, 4, 4, a, b, c.data(), 4), InputError);
  EXPECT_THROW(prepare_operand(a, std::nullopt, Operand::a, Trans::no, x.data(), -1, 4),
               InputError);
}

}  // namespace
}  // namespace concord::tensor
