// Scalar encode: named corner cases (ties at max, FP4 midpoints, subnormals, -0, NaN, Inf,
// saturation, double rounding), round trips of every code, nearest-value property against a
// brute-force search, independent bf16/fp16 formulas, and stochastic rounding's law.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "concord/numerics/philox.h"
#include "concord/numerics/scalar.h"

namespace concord::numerics {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr Overflow kSat = Overflow::saturate;
constexpr Overflow kIeee = Overflow::ieee;

uint32_t rne(Format f, float x, Overflow o = kSat) { return encode_ref(f, x, Rounding::rne, o); }
float round_trip(Format f, float x, Overflow o = kSat) { return decode_ref(f, rne(f, x, o)); }

constexpr Format kSmallFormats[] = {Format::e4m3, Format::e5m2, Format::e2m3, Format::e3m2,
                                    Format::e2m1, Format::e8m0, Format::ue4m3, Format::int8,
                                    Format::int4};
constexpr Format kAllFormats[] = {Format::bf16, Format::fp16, Format::e4m3,  Format::e5m2,
                                  Format::e2m3, Format::e3m2, Format::e2m1,  Format::e8m0,
                                  Format::ue4m3, Format::int8, Format::int4};

TEST(ScalarEncode, TiesToEvenAtEachFormatsMax) {
  // E4M3: 464 is halfway between 448 (mantissa 110, even) and 480 (the NaN code): -> 448.
  EXPECT_EQ(rne(Format::e4m3, 464.0f, kSat), 0x7Eu);
  EXPECT_EQ(rne(Format::e4m3, 464.0f, kIeee), 0x7Eu);
  EXPECT_EQ(rne(Format::e4m3, -464.0f, kIeee), 0xFEu);
  // Just above the tie rounds up, past max: NaN under IEEE (no Inf in E4M3), 448 saturated.
  EXPECT_EQ(rne(Format::e4m3, 465.0f, kIeee), 0x7Fu);
  EXPECT_EQ(rne(Format::e4m3, 465.0f, kSat), 0x7Eu);
  // E5M2: 61440 is halfway between 57344 (mantissa 11, odd) and 65536 (even) -> overflow.
  EXPECT_EQ(rne(Format::e5m2, 61440.0f, kIeee), 0x7Cu);  // +Inf
  EXPECT_EQ(rne(Format::e5m2, 61440.0f, kSat), 0x7Bu);   // 57344
  EXPECT_EQ(rne(Format::e5m2, 61439.0f, kIeee), 0x7Bu);
  // bf16 and fp16 at their max.
  EXPECT_EQ(rne(Format::fp16, 65520.0f, kIeee), 0x7C00u);  // tie with 65536 -> Inf
  EXPECT_EQ(rne(Format::fp16, 65519.0f, kIeee), 0x7BFFu);
  EXPECT_EQ(rne(Format::fp16, 65520.0f, kSat), 0x7BFFu);
  EXPECT_EQ(rne(Format::bf16, std::numeric_limits<float>::max(), kIeee), 0x7F80u);
  EXPECT_EQ(rne(Format::bf16, std::numeric_limits<float>::max(), kSat), 0x7F7Fu);
  // FP6/FP4 have no Inf or NaN: overflow always saturates.
  EXPECT_EQ(rne(Format::e2m1, 7.0f, kIeee), 0x7u);
  EXPECT_EQ(rne(Format::e2m3, 7.75f, kIeee), 0x1Fu);
  EXPECT_EQ(rne(Format::e3m2, 30.0f, kIeee), 0x1Fu);
}

TEST(ScalarEncode, Fp4Midpoints) {
  const std::pair<float, float> cases[] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f},
                                           {1.75f, 2.0f}, {2.5f, 2.0f},  {3.5f, 4.0f},
                                           {5.0f, 4.0f},  {-0.25f, -0.0f}, {-5.0f, -4.0f}};
  for (auto [x, expected] : cases) {
    const float got = round_trip(Format::e2m1, x);
    EXPECT_EQ(got, expected) << x;
    EXPECT_EQ(std::signbit(got), std::signbit(expected)) << x;
  }
}

TEST(ScalarEncode, SubnormalsOfTheTargetAndOfFp32) {
  EXPECT_EQ(rne(Format::e4m3, std::ldexp(1.0f, -9)), 0x01u);           // min subnormal
  EXPECT_EQ(rne(Format::e4m3, std::ldexp(1.0f, -10)), 0x00u);          // tie -> even (0)
  EXPECT_EQ(rne(Format::e4m3, std::ldexp(1.5f, -10)), 0x01u);
  EXPECT_EQ(rne(Format::e4m3, std::ldexp(3.0f, -10)), 0x02u);          // 1.5 * 2^-9: tie -> 2
  EXPECT_EQ(rne(Format::e4m3, std::ldexp(7.0f, -9)), 0x07u);           // largest subnormal
  EXPECT_EQ(rne(Format::e4m3, std::ldexp(7.5f, -9)), 0x08u);           // tie -> min normal
  EXPECT_EQ(rne(Format::e5m2, std::ldexp(1.0f, -16)), 0x01u);
  // fp32 subnormal inputs: bf16 keeps them (no flush to zero).
  EXPECT_EQ(rne(Format::bf16, f32_from_bits(0x00010000u)), 0x0001u);  // 2^-133
  EXPECT_EQ(rne(Format::bf16, f32_from_bits(0x00018000u)), 0x0002u);  // tie -> even
  EXPECT_EQ(rne(Format::bf16, f32_from_bits(0x00008000u)), 0x0000u);  // tie -> even (0)
  EXPECT_EQ(rne(Format::bf16, f32_from_bits(0x00008001u)), 0x0001u);
  EXPECT_EQ(rne(Format::bf16, f32_from_bits(0x807FFFFFu)), 0x8080u);  // rounds up to -min normal
  EXPECT_EQ(rne(Format::e4m3, f32_from_bits(0x00000001u)), 0x00u);
  EXPECT_EQ(rne(Format::e4m3, f32_from_bits(0x80000001u)), 0x80u);    // -0
}

TEST(ScalarEncode, NegativeZeroNaNAndInf) {
  for (Format f : {Format::bf16, Format::fp16, Format::e4m3, Format::e5m2, Format::e2m3,
                   Format::e3m2, Format::e2m1}) {
    const FormatTraits& t = traits(f);
    EXPECT_EQ(rne(f, -0.0f), 1u << (t.bits - 1)) << t.name;
    EXPECT_EQ(rne(f, kInf, kSat), max_finite_code(f)) << t.name;
    EXPECT_EQ(rne(f, -kInf, kSat), max_finite_code(f, true)) << t.name;
    const float nan_back = round_trip(f, kNaN);
    if (t.has_nan()) {
      EXPECT_TRUE(std::isnan(nan_back)) << t.name;
      EXPECT_TRUE(std::isnan(round_trip(f, kInf, kIeee)) || std::isinf(round_trip(f, kInf, kIeee)));
    } else {
      EXPECT_EQ(nan_back, 0.0f) << t.name;  // no NaN code: NaN -> zero (documented)
      EXPECT_EQ(rne(f, kInf, kIeee), max_finite_code(f)) << t.name;
    }
  }
  EXPECT_EQ(rne(Format::e4m3, kInf, kIeee), 0x7Fu);  // E4M3 has no Inf: NaN
  EXPECT_EQ(rne(Format::e5m2, -kInf, kIeee), 0xFCu);
  EXPECT_EQ(rne(Format::e4m3, -kNaN), 0xFFu);
  EXPECT_EQ(rne(Format::bf16, kNaN), 0x7FC0u);
  // Unsigned formats: negative is a domain error (NaN); -0 is +0 for ue4m3.
  EXPECT_EQ(rne(Format::ue4m3, -1.0f), 0x7Fu);
  EXPECT_EQ(rne(Format::ue4m3, -0.0f), 0x00u);
  EXPECT_EQ(rne(Format::e8m0, -1.0f), 0xFFu);
  EXPECT_EQ(rne(Format::e8m0, 0.0f), 0xFFu);  // e8m0 has no zero
  // Integers have no specials: NaN -> 0, Inf saturates.
  EXPECT_EQ(rne(Format::int8, kNaN), 0u);
  EXPECT_EQ(rne(Format::int8, kInf, kIeee), 0x7Fu);
  EXPECT_EQ(rne(Format::int8, -kInf), 0x80u);
}

TEST(ScalarEncode, E8m0PowersOfTwo) {
  EXPECT_EQ(rne(Format::e8m0, 1.0f), 0x7Fu);
  EXPECT_EQ(rne(Format::e8m0, 3.0f), 0x81u);      // halfway 2..4 in value: ties to even -> 4
  EXPECT_EQ(rne(Format::e8m0, 1.5f), 0x80u);
  EXPECT_EQ(rne(Format::e8m0, 1.4999f), 0x7Fu);
  EXPECT_EQ(rne(Format::e8m0, 1e-45f), 0x00u);    // below 2^-127 clamps to the smallest
  EXPECT_EQ(rne(Format::e8m0, std::ldexp(1.5f, 127), kIeee), 0xFFu);
  EXPECT_EQ(rne(Format::e8m0, std::ldexp(1.5f, 127), kSat), 0xFEu);
  EXPECT_EQ(rne(Format::e8m0, std::ldexp(1.0f, -127)), 0x00u);
}

TEST(ScalarEncode, Integers) {
  EXPECT_EQ(decode_ref(Format::int8, rne(Format::int8, 2.5f)), 2.0f);
  EXPECT_EQ(decode_ref(Format::int8, rne(Format::int8, 3.5f)), 4.0f);
  EXPECT_EQ(decode_ref(Format::int8, rne(Format::int8, -2.5f)), -2.0f);
  EXPECT_EQ(decode_ref(Format::int8, rne(Format::int8, 127.6f)), 127.0f);
  EXPECT_EQ(decode_ref(Format::int8, rne(Format::int8, -128.4f)), -128.0f);
  EXPECT_EQ(decode_ref(Format::int8, rne(Format::int8, -200.0f)), -128.0f);
  EXPECT_EQ(decode_ref(Format::int8, rne(Format::int8, 1e30f)), 127.0f);
  EXPECT_EQ(decode_ref(Format::int4, rne(Format::int4, 7.5f)), 7.0f);
  EXPECT_EQ(decode_ref(Format::int4, rne(Format::int4, -8.5f)), -8.0f);
  EXPECT_EQ(decode_ref(Format::int4, encode_ref(Format::int4, -3.9f, Rounding::rtz)), -3.0f);
}

TEST(ScalarEncode, RoundTowardZeroStopsAtMaxFinite) {
  // IEEE 754: RTZ never overflows to Inf; the E4M3 NaN slot is never produced either.
  EXPECT_EQ(encode_ref(Format::e4m3, 500.0f, Rounding::rtz, kIeee), 0x7Eu);
  EXPECT_EQ(encode_ref(Format::e5m2, 65000.0f, Rounding::rtz, kIeee), 0x7Bu);
  EXPECT_EQ(encode_ref(Format::e5m2, 1e10f, Rounding::rtz, kIeee), 0x7Bu);
  EXPECT_EQ(encode_ref(Format::e4m3, 1.99f, Rounding::rtz), 0x3Fu);  // 1.875
  EXPECT_EQ(encode_ref(Format::e5m2, kInf, Rounding::rtz, kIeee), 0x7Cu);  // Inf stays Inf
}

TEST(ScalarEncode, DoubleRoundingThroughBf16DiffersFromDirect) {
  // x lies just above the E4M3 midpoint 1.0625 between 1.0 and 1.125. Directly it rounds up;
  // through bf16 it first becomes exactly the midpoint and then ties to even (1.0).
  const float x = 1.0625f + std::ldexp(1.0f, -20);
  const float direct = round_trip(Format::e4m3, x);
  const float via_bf16 = round_trip(Format::e4m3, round_trip(Format::bf16, x));
  EXPECT_EQ(direct, 1.125f);
  EXPECT_EQ(via_bf16, 1.0f);
}

TEST(ScalarEncode, EveryCodeRoundTrips) {
  for (Format f : kAllFormats) {
    const FormatTraits& t = traits(f);
    for (uint32_t code = 0; code < t.code_count(); ++code) {
      const float v = decode_ref(f, code);
      if (std::isnan(v)) continue;
      for (Rounding r : {Rounding::rne, Rounding::rtz, Rounding::stochastic}) {
        for (uint32_t random : {0u, 0xFFFFFFFFu}) {
          EXPECT_EQ(encode_ref(f, v, r, kIeee, random), code) << t.name << " code " << code;
        }
      }
    }
  }
}

// Brute force: the nearest finite value of the format (ties -> even code), in fp64.
struct Grid {
  std::vector<double> values;
  std::vector<uint32_t> codes;
};

Grid finite_grid(Format f) {
  Grid g;
  for (uint32_t code = 0; code < traits(f).code_count(); ++code) {
    const float v = decode_ref(f, code);
    if (std::isfinite(v) && !(v == 0.0f && std::signbit(v))) {
      g.values.push_back(v);
      g.codes.push_back(code);
    }
  }
  return g;
}

TEST(ScalarEncode, RneIsTheNearestValueByBruteForce) {
  std::mt19937 gen(20261202);
  for (Format f : kSmallFormats) {
    const FormatTraits& t = traits(f);
    const Grid g = finite_grid(f);
    const double max_finite = t.max_finite;
    std::uniform_real_distribution<double> log_magnitude(std::log2(t.min_subnormal) - 2,
                                                         std::log2(max_finite) + 0.5);
    for (int i = 0; i < 20000; ++i) {
      float x = static_cast<float>(std::exp2(log_magnitude(gen)));
      if (t.is_signed && (gen() & 1)) x = -x;
      if (std::fabs(x) > max_finite || (f == Format::e8m0 && x < t.min_subnormal)) continue;
      // nearest, ties to the even code (the code whose lowest bit is 0); e8m0 has no mantissa
      // bit, its ties go to the larger power of two (significand 1.1b rounds to 10b).
      const bool ties_up = f == Format::e8m0;
      double best = std::numeric_limits<double>::infinity();
      uint32_t best_code = 0;
      for (size_t k = 0; k < g.values.size(); ++k) {
        const double d = std::fabs(g.values[k] - static_cast<double>(x));
        if (d < best || (d == best && (ties_up || (g.codes[k] & 1) == 0))) {
          best = d;
          best_code = g.codes[k];
        }
      }
      const float got = decode_ref(f, rne(f, x));
      EXPECT_EQ(got, decode_ref(f, best_code)) << t.name << " x=" << x;
    }
  }
}

TEST(ScalarEncode, Bf16MatchesTheClassicBitFormula) {
  // Independent formula for finite inputs: (b + 0x7FFF + ((b >> 16) & 1)) >> 16.
  std::mt19937 gen(7);
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t b = gen();
    if (i < 1 << 16) b = static_cast<uint32_t>(i) << 8;  // includes every fp32 subnormal pattern class
    const float x = f32_from_bits(b);
    if (!std::isfinite(x)) continue;
    const uint32_t expected = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
    if ((expected & 0x7F80u) == 0x7F80u) continue;  // overflow to Inf: policy-dependent
    ASSERT_EQ(rne(Format::bf16, x, kIeee), expected) << std::hex << b;
  }
}

TEST(ScalarEncode, Fp16MatchesTheCompilersFloat16) {
  std::mt19937 gen(11);
  for (int i = 0; i < 2'000'000; ++i) {
    const float x = f32_from_bits(gen());
    if (std::isnan(x)) continue;
    const _Float16 h = static_cast<_Float16>(x);  // the compiler's own IEEE conversion (RNE)
    ASSERT_EQ(rne(Format::fp16, x, kIeee), std::bit_cast<uint16_t>(h)) << x;
  }
}

TEST(ScalarEncode, StochasticRoundingThresholdIsExact) {
  // x = 1 + 3/4 of an E4M3 quantum above 1.0: D = 0.75 * 2^32; round away iff D + r >= 2^32.
  const float x = 1.0f + 0.75f * 0.125f;
  const uint32_t d = 3u << 30;
  const uint32_t down = encode_ref(Format::e4m3, x, Rounding::stochastic, kSat, ~d);  // r = 2^32-D-1
  const uint32_t up = encode_ref(Format::e4m3, x, Rounding::stochastic, kSat, ~d + 1u);
  EXPECT_EQ(decode_ref(Format::e4m3, down), 1.0f);
  EXPECT_EQ(decode_ref(Format::e4m3, up), 1.125f);
  // Symmetric in sign: magnitude rounds away from zero.
  EXPECT_EQ(decode_ref(Format::e4m3, encode_ref(Format::e4m3, -x, Rounding::stochastic, kSat,
                                                ~d + 1u)),
            -1.125f);
}

TEST(ScalarEncode, StochasticRoundingIsUnbiased) {
  // For each x, N Philox draws; the count of round-ups is Binomial(N, p) with p the exact
  // fraction. We require |count - Np| <= 6 sqrt(Np(1-p)): false-failure probability < 2e-9
  // per value (normal tail), < 1e-7 over the values below. Seed fixed, so the test is
  // deterministic anyway.
  const RandomStream rng{42, 3};
  const int n = 200000;
  const std::pair<Format, float> cases[] = {
      {Format::bf16, 1.0f + std::ldexp(1.0f, -9)},   // p = 1/4 of a bf16 ulp
      {Format::bf16, 3.14159265f},
      {Format::e4m3, 0.3f},
      {Format::e4m3, std::ldexp(1.3f, -9)},           // subnormal region
      {Format::e5m2, 1000.0f},
      {Format::e2m1, 2.6f},
      {Format::e2m1, -0.2f},
      {Format::e2m3, 5.55f},
      {Format::int8, 10.3f},
  };
  uint64_t index = 0;
  for (auto [f, x] : cases) {
    const float lo = decode_ref(f, encode_ref(f, x, Rounding::rtz));
    const float hi_candidate = decode_ref(f, encode_ref(f, x, Rounding::stochastic, kSat, 0xFFFFFFFFu));
    const double p = (static_cast<double>(x) - lo) / (static_cast<double>(hi_candidate) - lo);
    double sum = 0, sum_sq = 0;
    int ups = 0;
    for (int i = 0; i < n; ++i) {
      const float v = decode_ref(f, encode_ref(f, x, Rounding::stochastic, kSat, rng.word(index++)));
      ups += v != lo;
      sum += v;
      sum_sq += static_cast<double>(v) * v;
    }
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(ups, n * p, 6 * sigma + 1) << traits(f).name << " x=" << x;
    // E[SR(x)] = x and Var = p(1-p) * gap^2, both within the same 6-sigma band.
    const double gap = std::fabs(static_cast<double>(hi_candidate) - lo);
    EXPECT_NEAR(sum / n, x, 6 * gap * std::sqrt(p * (1 - p) / n) + 1e-12) << traits(f).name;
    const double variance = sum_sq / n - (sum / n) * (sum / n);
    EXPECT_NEAR(variance, p * (1 - p) * gap * gap, 0.02 * gap * gap) << traits(f).name;
  }
}

TEST(ScalarEncode, ValueTypesUseTheReference) {
  EXPECT_EQ(E4m3::from_float(464.0f).bits(), 0x7Eu);
  EXPECT_EQ(Bf16::from_bits(0x3F80).to_float(), 1.0f);
  EXPECT_EQ(E2m1::from_float(5.0f).to_float(), 4.0f);
  EXPECT_EQ(E8m0::from_float(3.0f), E8m0::from_bits(0x81));
}

}  // namespace
}  // namespace concord::numerics
