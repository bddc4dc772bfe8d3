// MX scale rules (FLOOR, CEIL, EVEN, RCEIL) over the whole fp32 exponent range: amax subnormal,
// amax near FLT_MAX, the RCEIL descale exactly 2^-127 (the e8m0 code 0 itself, an fp32
// subnormal) and its neighbours, exact powers of two and the EVEN rule's half-up ties. The
// expected exponents are computed here from docs/numerics.md's definitions in fp64 (frexp; the
// element constants written out), not by the code under test; then the reference quantizer
// and every SIMD path this CPU has must store exactly that scale code. (The random sweeps of
// simd_test keep amax within 2^±100 and never reach these cases.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "concord/numerics/block.h"
#include "concord/numerics/convert.h"
#include "concord/numerics/scalar.h"

namespace concord::numerics {
namespace {

// The element constants of docs/numerics.md, written out: top binade, mantissa bits, max.
struct Element {
  Format format;
  int emax, mantissa_bits;
  float max_finite;
};
const Element kElements[] = {{Format::e4m3, 8, 3, 448.0f},   {Format::e5m2, 15, 2, 57344.0f},
                             {Format::e2m3, 2, 3, 7.5f},     {Format::e3m2, 4, 2, 28.0f},
                             {Format::e2m1, 2, 1, 6.0f}};
const ScaleRule kRules[] = {ScaleRule::floor, ScaleRule::ceil, ScaleRule::even, ScaleRule::rceil};

constexpr double kMinNormal = 0x1p-126;

// E(a): the unbiased exponent field of fp32 a, fp32 subnormals (and 0) read as -127.
int exponent_of(double a) {
  if (a < kMinNormal) return -127;
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  return e - 1;
}
bool power_of_two(double a) {
  int e = 0;
  return std::frexp(a, &e) == 0.5;
}
// ceil(log2(d)) for d >= 0 in fp64 (exact: d is an fp32 value); -inf for 0.
double ceil_log2(double d) {
  if (d == 0) return -INFINITY;
  int e = 0;
  const double m = std::frexp(d, &e);
  return m == 0.5 ? e - 1 : e;
}

// The shared exponent X for a finite amax a >= 0, from the definitions.
int expected_exponent(float amax, const Element& el, ScaleRule rule) {
  const double a = amax;
  double x = 0;
  switch (rule) {
    case ScaleRule::floor:
      x = exponent_of(a) - el.emax;
      break;
    case ScaleRule::ceil:  // E + [mantissa != 0]; a subnormal's mantissa is never 0
      x = exponent_of(a) + ((a < kMinNormal && a > 0) || (a >= kMinNormal && !power_of_two(a)) ? 1 : 0) - el.emax;
      break;
    case ScaleRule::even: {  // amax rounded half-up to the element's mantissa width
      if (a < kMinNormal) {
        x = -127 - el.emax;  // below the clamp whatever the rounding does
        break;
      }
      const int e = exponent_of(a);
      const double m = std::ldexp(a, -e);  // [1, 2)
      const double r = std::floor(std::ldexp(m, el.mantissa_bits) + 0.5);
      x = e + (r >= std::ldexp(2.0, el.mantissa_bits) ? 1 : 0) - el.emax;
      break;
    }
    case ScaleRule::rceil: {  // ceil(log2(fp32(amax * fp32(1/max))))
      volatile float inverse = 1.0f / el.max_finite;
      volatile float descale = amax * inverse;
      x = ceil_log2(static_cast<double>(descale));
      break;
    }
  }
  if (x < -127) x = -127;
  if (x > 127) x = 127;
  return static_cast<int>(x);
}

std::string what(float amax, const Element& el, ScaleRule rule) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "amax %a (bits 0x%08x), element %s, rule %s", static_cast<double>(amax),
                f32_bits(amax), std::string(traits(el.format).name).c_str(),
                std::string(scale_rule_name(rule)).c_str());
  return buf;
}

// amax values: every exponent field with mantissas 0, 1, half, all ones and each element's
// half-up tie (and the value just below it), every kind of subnormal, FLT_MAX.
std::vector<float> sweep_amax() {
  std::vector<float> out;
  for (uint32_t field = 0; field <= 254; ++field) {
    for (uint32_t mantissa : {0x000000u, 0x000001u, 0x400000u, 0x7FFFFFu, 0x7FFFFEu, 0x3FFFFFu,
                              0x780000u, 0x77FFFFu,   // 3-bit tie 1.1111b, and just below
                              0x700000u, 0x6FFFFFu,   // 2-bit tie 1.111b
                              0x600000u, 0x5FFFFFu}) {  // 1-bit tie 1.11b
      const uint32_t bits = field << 23 | mantissa;
      if (bits != 0) out.push_back(f32_from_bits(bits));
    }
  }
  out.push_back(std::numeric_limits<float>::max());
  out.push_back(std::numeric_limits<float>::denorm_min());
  return out;
}

// amax values whose RCEIL descale fp32(amax * fp32(1/max)) is exactly `target` (any fp32 value
// > 0, subnormal ones included): the fp32 neighbours of target / fp32(1/max) that hit it.
std::vector<float> amax_giving_descale(const Element& el, float target) {
  volatile float inverse = 1.0f / el.max_finite;
  const float guess = static_cast<float>(static_cast<double>(target) / static_cast<double>(inverse));
  std::vector<float> hits;
  float a = guess;
  for (int i = 0; i < 64; ++i) a = std::nextafter(a, 0.0f);
  for (int i = 0; i < 128; ++i, a = std::nextafter(a, INFINITY)) {
    volatile float d = a * inverse;
    if (f32_bits(d) == f32_bits(target)) hits.push_back(a);
  }
  return hits;
}

// One 2 x 32 tensor: block 0 holds amax (with smaller values), block 1 holds -amax.
std::vector<float> two_blocks(float amax) {
  std::vector<float> x(64);
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = amax * (static_cast<float>(i % 7) / 8.0f);
  x[5] = amax;
  for (int i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = -x[static_cast<size_t>(i - 32)];
  return x;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::wide16})
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

// mx_scale_exponent, the reference quantizer's stored code and every ISA's fast path, against
// the expected exponent for each amax.
void expect_scales(const std::vector<float>& amaxes, size_t& checked) {
  const Isa saved = active_isa();
  for (const Element& el : kElements) {
    for (ScaleRule rule : kRules) {
      const QuantDesc desc = QuantDesc::mx(el.format, rule);
      for (const float amax : amaxes) {
        const int want = expected_exponent(amax, el, rule);
        const auto code = static_cast<uint8_t>(want + 127);
        ASSERT_EQ(mx_scale_exponent(amax, el.format, rule), want) << what(amax, el, rule);
        ASSERT_EQ(mx_scale_exponent(-amax, el.format, rule), want) << what(-amax, el, rule);
        const std::vector<float> x = two_blocks(amax);
        const QuantizedTensor ref = quantize_ref(desc, x.data(), 2, 32);
        ASSERT_EQ(ref.scales, std::vector<uint8_t>({code, code})) << "quantize_ref, " << what(amax, el, rule);
        // No element saturates under CEIL / RCEIL (the scaled amax fits the element); FLOOR
        // and EVEN keep it below the element's next binade. Where X is clamped at -127 the
        // scaled values are tiny anyway.
        const double scaled = std::ldexp(static_cast<double>(amax), -want);
        if (rule == ScaleRule::ceil) {
          ASSERT_LE(scaled, el.max_finite) << what(amax, el, rule);
        } else if (rule == ScaleRule::rceil) {  // fp32(1/max) may round down by half an ulp
          ASSERT_LE(scaled, el.max_finite * (1 + 0x1p-22)) << what(amax, el, rule);
        } else if (want > -127) {
          ASSERT_LT(scaled, std::ldexp(2.0, el.emax + (rule == ScaleRule::even ? 1 : 0))) << what(amax, el, rule);
        }
        for (Isa isa : supported_isas()) {
          set_active_isa(isa);
          const QuantizedTensor fast = quantize(desc, x.data(), 2, 32);
          set_active_isa(saved);
          ASSERT_EQ(fast.scales, ref.scales) << isa_name(isa) << ", " << what(amax, el, rule);
          ASSERT_EQ(fast.codes, ref.codes) << isa_name(isa) << ", " << what(amax, el, rule);
        }
        ++checked;
      }
    }
  }
}

TEST(MxScaleExtremes, EveryExponentFieldSubnormalsAndFltMax) {
  size_t checked = 0;
  expect_scales(sweep_amax(), checked);
  EXPECT_GT(checked, 50000u);
}

TEST(MxScaleExtremes, RceilDescaleAtTheSubnormalBoundary) {
  // descale exactly 2^-127 (e8m0 code 0, an fp32 subnormal): X = -127, code 0x00 — not rounded
  // up; one subnormal step above it: X = -126; below it: clamped to -127. 2^-126 (the smallest
  // normal) exactly: -126; 2^-128: -128, clamped.
  const float boundary = 0x1p-127f, step = std::numeric_limits<float>::denorm_min();
  const struct {
    float descale;
    int want;
  } cases[] = {{boundary, -127}, {boundary + step, -126}, {boundary - step, -127},
               {0x1p-126f, -126}, {0x1p-126f + 0x1p-149f, -125}, {0x1p-128f, -127},
               {0x1p-128f + step, -127}};
  size_t checked = 0;
  for (const Element& el : kElements) {
    for (const auto& c : cases) {
      const std::vector<float> amaxes = amax_giving_descale(el, c.descale);
      if (c.descale < 0x1p-126f) {  // subnormal targets: the products are finer than their grid
        ASSERT_FALSE(amaxes.empty()) << "no fp32 amax gives descale " << c.descale << " for "
                                     << traits(el.format).name;
      }
      for (const float amax : amaxes) {
        ASSERT_EQ(expected_exponent(amax, el, ScaleRule::rceil), c.want) << what(amax, el, ScaleRule::rceil);
        ASSERT_EQ(mx_scale_exponent(amax, el.format, ScaleRule::rceil), c.want) << what(amax, el, ScaleRule::rceil);
      }
      size_t n = 0;
      // Through the quantizers too (every rule: the other rules' expectations hold here as well).
      std::vector<float> one(amaxes.begin(), amaxes.end());
      expect_scales(one, n);
      checked += amaxes.size();
    }
  }
  EXPECT_GT(checked, 30u);
}

TEST(MxScaleExtremes, RceilExactPowersOfTwoAreNotRoundedUp) {
  // descale exactly 2^k for every k an fp32 amax can reach: X = k (clamped), one fp32 ulp above:
  // k + 1.
  size_t checked = 0;
  for (const Element& el : kElements) {
    for (int k = -149; k <= 125; ++k) {
      const float p = std::ldexp(1.0f, k);
      for (const float target : {p, std::nextafter(p, INFINITY)}) {
        const std::vector<float> amaxes = amax_giving_descale(el, target);
        for (const float amax : amaxes) {
          const int want = std::clamp(target == p ? k : k + 1, -127, 127);
          ASSERT_EQ(mx_scale_exponent(amax, el.format, ScaleRule::rceil), want) << what(amax, el, ScaleRule::rceil);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000u);
}

TEST(MxScaleExtremes, NamedCases) {
  // Written out by hand from the table in docs/numerics.md (e4m3: emax 8, max 448).
  const float fmax = std::numeric_limits<float>::max();
  EXPECT_EQ(mx_scale_exponent(fmax, Format::e4m3, ScaleRule::floor), 127 - 8);
  EXPECT_EQ(mx_scale_exponent(fmax, Format::e4m3, ScaleRule::ceil), 128 - 8);
  EXPECT_EQ(mx_scale_exponent(fmax, Format::e4m3, ScaleRule::even), 128 - 8);
  // FLT_MAX / 448 = 2^128 (1 - 2^-24) / (1.75 * 2^8) ~ 2^119.19: ceil 120.
  EXPECT_EQ(mx_scale_exponent(fmax, Format::e4m3, ScaleRule::rceil), 120);
  // e2m1 (max 6): FLT_MAX * fp32(1/6) ~ 2^125.4: 126.
  EXPECT_EQ(mx_scale_exponent(fmax, Format::e2m1, ScaleRule::rceil), 126);
  for (ScaleRule rule : kRules) {
    EXPECT_EQ(mx_scale_code(std::numeric_limits<float>::denorm_min(), Format::e4m3, rule), 0x00);
    EXPECT_EQ(mx_scale_code(0x1p-127f, Format::e2m1, rule), 0x00);
    EXPECT_EQ(mx_scale_code(INFINITY, Format::e4m3, rule), 0xFF);
  }
  // EVEN ties (e4m3, 3 mantissa bits): 1.1111b rounds half up to 10.000b: 2^1 -> X = -7;
  // just below it stays in 2^0 -> X = -8.
  EXPECT_EQ(mx_scale_exponent(1.9375f, Format::e4m3, ScaleRule::even), -7);
  EXPECT_EQ(mx_scale_exponent(std::nextafter(1.9375f, 0.0f), Format::e4m3, ScaleRule::even), -8);
  // And at the top of the range: FLT_MAX's exponent field with mantissa 1.1111b.
  EXPECT_EQ(mx_scale_exponent(f32_from_bits(0xFE << 23 | 0x780000u), Format::e4m3, ScaleRule::even), 128 - 8);
  EXPECT_EQ(mx_scale_exponent(f32_from_bits(0xFE << 23 | 0x77FFFFu), Format::e4m3, ScaleRule::even), 127 - 8);
}

}  // namespace
}  // namespace concord::numerics
