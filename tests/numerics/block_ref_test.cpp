// Block reference: MX scale rules at powers of two, why floor(log2f) is wrong, special blocks
// (zero, NaN, Inf, subnormal amax), grid values round-tripping, NVFP4's Transformer Engine
// arithmetic recomputed here in fp64, and the 16x16 transpose identity.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/scalar.h"

namespace concord::numerics {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

float round_trip_e4m3(float v) {
  return decode_ref(Format::ue4m3, encode_ref(Format::ue4m3, v, Rounding::rne, Overflow::saturate));
}
float below(float x) { return std::nextafter(x, 0.0f); }
float above(float x) { return std::nextafter(x, kInf); }

TEST(MxScale, EachRuleJustBelowAndAbovePowersOfTwo) {
  // E4M3 (emax 8). amax = 2^k exactly, just below, just above.
  for (int k = -20; k <= 20; ++k) {
    const float p = std::ldexp(1.0f, k);
    EXPECT_EQ(mx_scale_exponent(p, Format::e4m3, ScaleRule::floor), k - 8);
    EXPECT_EQ(mx_scale_exponent(below(p), Format::e4m3, ScaleRule::floor), k - 9);
    EXPECT_EQ(mx_scale_exponent(above(p), Format::e4m3, ScaleRule::floor), k - 8);

    EXPECT_EQ(mx_scale_exponent(p, Format::e4m3, ScaleRule::ceil), k - 8);
    EXPECT_EQ(mx_scale_exponent(below(p), Format::e4m3, ScaleRule::ceil), k - 8);
    EXPECT_EQ(mx_scale_exponent(above(p), Format::e4m3, ScaleRule::ceil), k - 7);

    // even: amax rounded to 3 mantissa bits (half up) first; just below 2^k rounds to 2^k.
    EXPECT_EQ(mx_scale_exponent(p, Format::e4m3, ScaleRule::even), k - 8);
    EXPECT_EQ(mx_scale_exponent(below(p), Format::e4m3, ScaleRule::even), k - 8);
    EXPECT_EQ(mx_scale_exponent(1.9375f * p, Format::e4m3, ScaleRule::even), k - 7);  // 1.1111b
    EXPECT_EQ(mx_scale_exponent(1.875f * p, Format::e4m3, ScaleRule::even), k - 8);   // 1.111b
  }
  // rceil = ceil(log2(fp32(amax * fp32(1/448)))), recomputed here in fp64 from the same two
  // fp32 roundings.
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int i = 0; i < 100000; ++i) {
    const float amax = std::ldexp(mantissa(gen), static_cast<int>(gen() % 200) - 100);
    const float descale = amax * (1.0f / 448.0f);
    const int expected = static_cast<int>(std::ceil(std::log2(static_cast<double>(descale))));
    // log2 of a double is exact at powers of two, and far from an integer otherwise.
    ASSERT_EQ(mx_scale_exponent(amax, Format::e4m3, ScaleRule::rceil), std::clamp(expected, -127, 127))
        << amax;
  }
  // At amax = 448 * 2^k the fp32 product may land a hair above 2^k: then RCEIL picks 2^(k+1).
  const float d448 = 448.0f * (1.0f / 448.0f);
  EXPECT_EQ(mx_scale_exponent(448.0f, Format::e4m3, ScaleRule::rceil),
            static_cast<int>(std::ceil(std::log2(static_cast<double>(d448)))));
}

TEST(MxScale, Log2fIsOffByOneJustBelowAPowerOfTwo) {
  // floor(log2f(x)) rounds before flooring: for x = 2^k - ulp the exact log2 is k - tiny,
  // which log2f returns as exactly k. The exponent bits give the right answer, k - 1.
  int wrong = 0;
  for (int k = 1; k < 127; ++k) {
    const float x = below(std::ldexp(1.0f, k));
    const int from_log2f = static_cast<int>(std::floor(std::log2f(x)));
    const int from_bits = mx_scale_exponent(x, Format::e4m3, ScaleRule::floor) + 8;
    EXPECT_EQ(from_bits, k - 1);
    wrong += from_log2f != k - 1;
  }
  EXPECT_GT(wrong, 0) << "expected at least one k where floor(log2f(2^k - ulp)) == k";
  const float x = below(16777216.0f);  // 2^24 - 1
  EXPECT_EQ(std::floor(std::log2f(x)), 24.0f);
  EXPECT_EQ(mx_scale_exponent(x, Format::e4m3, ScaleRule::floor), 23 - 8);
}

TEST(MxScale, SpecialAmax) {
  for (ScaleRule r : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::even, ScaleRule::rceil}) {
    EXPECT_EQ(mx_scale_code(0.0f, Format::e4m3, r), 0x00) << scale_rule_name(r);
    EXPECT_EQ(mx_scale_code(kNaN, Format::e4m3, r), 0xFF);
    EXPECT_EQ(mx_scale_code(kInf, Format::e2m1, r), 0xFF);
    EXPECT_EQ(mx_scale_code(f32_from_bits(0x00000123u), Format::e4m3, r), 0x00);  // subnormal
  }
  EXPECT_EQ(mx_scale_code(std::numeric_limits<float>::max(), Format::e4m3, ScaleRule::floor),
            127 + 127 - 8);
}

std::vector<float> quantize_round_trip(const QuantDesc& d, const std::vector<float>& x, int64_t rows,
                                       int64_t cols, QuantizedTensor* out_q = nullptr) {
  QuantizedTensor q = quantize_ref(d, x.data(), rows, cols);
  std::vector<float> y(x.size());
  dequantize_ref(q, y.data());
  if (out_q) *out_q = q;
  return y;
}

TEST(MxBlock, AllZeroNaNInfAndSubnormalBlocks) {
  const QuantDesc d = QuantDesc::mx(Format::e4m3);
  std::vector<float> x(64, 0.0f);
  for (int i = 32; i < 64; ++i) x[i] = 0.5f * static_cast<float>(i - 40);
  x[40] = kNaN;
  QuantizedTensor q;
  auto y = quantize_round_trip(d, x, 1, 64, &q);
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_EQ(q.scales[0], 0x00);  // all-zero block: 2^-127, codes 0
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.0f);
  EXPECT_EQ(q.scales[1], 0xFF);  // NaN in block: NaN scale, whole block NaN
  for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(y[i]));

  x.assign(32, 1.0f);
  x[3] = -kInf;
  y = quantize_round_trip(d, x, 1, 32, &q);
  EXPECT_EQ(q.scales[0], 0xFF);
  EXPECT_TRUE(std::isnan(y[0]));

  // fp32-subnormal amax: scale 2^-127, elements scaled by 2^127 keep what E4M3 can hold.
  x.assign(32, 0.0f);
  x[0] = f32_from_bits(0x00400000u);  // 2^-127
  x[1] = f32_from_bits(0x00000001u);  // 2^-149: below 2^-127 * 2^-9, lost
  y = quantize_round_trip(d, x, 1, 32, &q);
  EXPECT_EQ(q.scales[0], 0x00);
  EXPECT_EQ(y[0], x[0]);
  EXPECT_EQ(y[1], 0.0f);
}

TEST(MxBlock, ValuesOnTheGridRoundTripExactly) {
  std::mt19937 gen(99);
  for (Format f : {Format::e4m3, Format::e5m2, Format::e2m3, Format::e3m2, Format::e2m1}) {
    const FormatTraits& t = traits(f);
    for (int trial = 0; trial < 200; ++trial) {
      const int scale = static_cast<int>(gen() % 60) - 30;
      std::vector<float> x(32);
      for (float& v : x) {
        uint32_t code;
        do code = gen() & t.code_mask();
        while (!std::isfinite(decode_ref(f, code)));
        v = std::ldexp(decode_ref(f, code), scale);
      }
      // Put the block amax in the top binade so that FLOOR picks exactly 2^scale.
      x[static_cast<size_t>(gen() % 32)] = std::ldexp(static_cast<float>(t.max_finite), scale);
      for (ScaleRule r : {ScaleRule::floor, ScaleRule::even}) {
        QuantDesc d = QuantDesc::mx(f, r);
        QuantizedTensor q;
        const auto y = quantize_round_trip(d, x, 1, 32, &q);
        EXPECT_EQ(q.scales[0], scale + 127) << t.name;
        for (size_t i = 0; i < 32; ++i) ASSERT_EQ(y[i], x[i]) << t.name << " i=" << i;
      }
    }
  }
}

TEST(MxBlock, PartialEdgeBlocksAndAxisZero) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  const int64_t rows = 5, cols = 37;
  std::vector<float> x(rows * cols);
  for (float& v : x) v = normal(gen);
  // Along rows (axis 1): 5 x 2 blocks, the second 5 wide. Each block's scale from its own amax.
  QuantDesc d = QuantDesc::mx(Format::e4m3);
  QuantizedTensor q = quantize_ref(d, x.data(), rows, cols);
  ASSERT_EQ(q.block_grid_rows(), 5);
  ASSERT_EQ(q.block_grid_cols(), 2);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(q.scales[r * 2 + 1], mx_scale_code(amax_ref(&x[r * cols + 32], 5), Format::e4m3, ScaleRule::floor));
  }
  // Down columns (axis 0): equals quantizing the transpose along rows.
  d.axis = 0;
  QuantizedTensor qc = quantize_ref(d, x.data(), rows, cols);
  std::vector<float> xt(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
  d.axis = 1;
  QuantizedTensor qt = quantize_ref(d, xt.data(), cols, rows);
  ASSERT_EQ(qc.scales.size(), qt.scales.size());
  EXPECT_EQ(qc.scales, qt.scales);  // grid 1 x 37 vs 37 x 1: same row-major order
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_EQ(get_code(Format::e4m3, qc.codes, r * cols + c), get_code(Format::e4m3, qt.codes, c * rows + r));
}

TEST(Nvfp4, MatchesTransformerEngineArithmeticRecomputedHere) {
  std::mt19937 gen(17);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t n = 16 * 40;
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen);
  x[5] = 0.0f;
  for (int i = 16; i < 32; ++i) x[i] = 0.0f;  // an all-zero block
  const QuantDesc d = QuantDesc::nvfp4();
  QuantizedTensor q;
  const auto y = quantize_round_trip(d, x, 1, n, &q);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float s_enc = 448.0f * 6.0f / amax;
  EXPECT_EQ(q.tensor_scale, 1.0f / s_enc);
  for (int64_t b = 0; b < n / 16; ++b) {
    float bmax = 0;
    for (int i = 0; i < 16; ++i) bmax = std::max(bmax, std::fabs(x[b * 16 + i]));
    const float s_dec_b = bmax * (s_enc * (1.0f / 6.0f));
    EXPECT_EQ(decode_ref(Format::ue4m3, q.scales[b]), round_trip_e4m3(s_dec_b)) << b;
    const float scale_b = decode_ref(Format::ue4m3, q.scales[b]);
    const float multiplier = std::fmin(1.0f / (scale_b * (1.0f / s_enc)), std::numeric_limits<float>::max());
    for (int i = 0; i < 16; ++i) {
      const float v = x[b * 16 + i] * multiplier;
      EXPECT_EQ(get_code(Format::e2m1, q.codes, b * 16 + i), encode_ref(Format::e2m1, v)) << b;
      // the decoded value is within half an e2m1 step (at most 1 near the top) of v, scaled
      if (scale_b > 0) {
        EXPECT_LE(std::fabs(y[b * 16 + i] / (scale_b / s_enc) - std::clamp(v, -6.0f, 6.0f)), 1.0f);
      }
    }
  }
  for (int i = 16; i < 32; ++i) EXPECT_EQ(y[i], 0.0f);
}

TEST(Nvfp4, TwoDimensionalBlocksQuantizeWAndWTransposeIdentically) {
  std::mt19937 gen(23);
  std::normal_distribution<float> normal;
  const int64_t rows = 48, cols = 80;
  std::vector<float> w(rows * cols), wt(rows * cols);
  for (float& v : w) v = normal(gen) * (1 + (gen() % 7));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) wt[c * rows + r] = w[r * cols + c];
  const QuantDesc d = QuantDesc::nvfp4({16, 16});
  const QuantizedTensor q = quantize_ref(d, w.data(), rows, cols);
  const QuantizedTensor qt = quantize_ref(d, wt.data(), cols, rows);
  EXPECT_EQ(q.tensor_scale, qt.tensor_scale);
  ASSERT_EQ(q.block_grid_rows(), qt.block_grid_cols());
  for (int64_t i = 0; i < q.block_grid_rows(); ++i)
    for (int64_t j = 0; j < q.block_grid_cols(); ++j)
      EXPECT_EQ(q.scales[i * q.block_grid_cols() + j], qt.scales[j * qt.block_grid_cols() + i]);
  std::vector<float> y(w.size()), yt(w.size());
  dequantize_ref(q, y.data());
  dequantize_ref(qt, yt.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(y[r * cols + c], yt[c * rows + r]);
}

TEST(PerTensor, Fp8TensorScaling) {
  std::vector<float> x = {0.1f, -2.0f, 3.5f, 0.0f, 1e-4f};
  QuantizedTensor q;
  const auto y = quantize_round_trip(QuantDesc::per_tensor(Format::e4m3), x, 1, 5, &q);
  EXPECT_EQ(q.tensor_scale, 1.0f / (448.0f / 3.5f));
  EXPECT_EQ(get_code(Format::e4m3, q.codes, 2), 0x7Eu);  // amax maps to 448
  EXPECT_NEAR(y[1], -2.0f, 2.0f / 16);
}

TEST(QuantDescText, PresetsRoundTripThroughText) {
  for (const char* name : {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp4", "nvfp4",
                           "nvfp4-2d", "fp8-tensor", "bf16", "e4m3", "int8"}) {
    auto d = QuantDesc::from_name(name);
    ASSERT_TRUE(d.has_value()) << name;
    d->rounding = Rounding::stochastic;
    const auto back = QuantDesc::parse(d->to_string());
    ASSERT_TRUE(back.has_value()) << d->to_string();
    EXPECT_EQ(*back, *d) << d->to_string();
  }
  EXPECT_FALSE(QuantDesc::parse("element=e9m9").has_value());
  EXPECT_FALSE(QuantDesc::from_name("mxfp3").has_value());
}

TEST(QuantDescValidation, RejectsImpossibleCombinations) {
  QuantDesc d = QuantDesc::nvfp4();
  d.element = Format::e4m3;
  const float x[4] = {};
  EXPECT_THROW(quantize_ref(d, x, 1, 4), InputError);
  d = QuantDesc::mx(Format::int8);
  EXPECT_THROW(quantize_ref(d, x, 1, 4), InputError);
}

TEST(CodePacking, Fp4TwoPerByteLowNibbleFirst) {
  std::vector<uint8_t> codes(2, 0);
  set_code(Format::e2m1, codes, 0, 0x3);
  set_code(Format::e2m1, codes, 1, 0xC);
  set_code(Format::e2m1, codes, 2, 0x7);
  EXPECT_EQ(codes[0], 0xC3);
  EXPECT_EQ(codes[1], 0x07);
  EXPECT_EQ(get_code(Format::e2m1, codes, 1), 0xCu);
  EXPECT_EQ(code_bytes(Format::e2m1, 3), 2u);
  EXPECT_EQ(code_bytes(Format::bf16, 3), 6u);
}

}  // namespace
}  // namespace concord::numerics
