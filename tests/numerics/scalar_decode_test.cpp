// Exhaustive decode: every code of every format up to 16 bits against a value computed here,
// in fp64, from the format's definition (sign, exponent, mantissa) — not from the code under
// test. Also the named special codes of each format.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "concord/numerics/scalar.h"

namespace concord::numerics {
namespace {

struct Definition {
  Format format;
  int exponent_bits, mantissa_bits, bias;
  bool has_sign;
  enum Kind { ieee, fn, finite, e8m0, unsigned_fn, integer } kind;
};

// The definitions, restated independently of format.h.
constexpr Definition kDefinitions[] = {
    {Format::bf16, 8, 7, 127, true, Definition::ieee},
    {Format::fp16, 5, 10, 15, true, Definition::ieee},
    {Format::e4m3, 4, 3, 7, true, Definition::fn},
    {Format::e5m2, 5, 2, 15, true, Definition::ieee},
    {Format::e2m3, 2, 3, 1, true, Definition::finite},
    {Format::e3m2, 3, 2, 3, true, Definition::finite},
    {Format::e2m1, 2, 1, 1, true, Definition::finite},
    {Format::e8m0, 8, 0, 127, false, Definition::e8m0},
    {Format::ue4m3, 4, 3, 7, false, Definition::unsigned_fn},
    {Format::int8, 0, 0, 0, true, Definition::integer},
    {Format::int4, 0, 0, 0, true, Definition::integer},
};

// NaN is returned as a quiet NaN; +-Inf as infinities.
double value_from_definition(const Definition& d, uint32_t code) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  if (d.kind == Definition::integer) {
    const int width = d.format == Format::int8 ? 8 : 4;
    const int v = static_cast<int>(code);
    return v >= (1 << (width - 1)) ? v - (1 << width) : v;
  }
  if (d.kind == Definition::e8m0) return code == 0xFF ? nan : std::pow(2.0, int(code) - 127);
  const int width = d.exponent_bits + d.mantissa_bits + 1;
  if (d.kind == Definition::unsigned_fn && (code >> 7) != 0) return nan;
  const bool negative = d.has_sign && ((code >> (width - 1)) & 1);
  const int e = static_cast<int>((code >> d.mantissa_bits) & ((1u << d.exponent_bits) - 1));
  const int m = static_cast<int>(code & ((1u << d.mantissa_bits) - 1));
  const int top = (1 << d.exponent_bits) - 1;
  if (d.kind == Definition::ieee && e == top) return m == 0 ? (negative ? -inf : inf) : nan;
  if ((d.kind == Definition::fn || d.kind == Definition::unsigned_fn) && e == top &&
      m == (1 << d.mantissa_bits) - 1) {
    return nan;
  }
  const double fraction = m / std::pow(2.0, d.mantissa_bits);
  const double magnitude = e == 0 ? fraction * std::pow(2.0, 1 - d.bias)
                                  : (1.0 + fraction) * std::pow(2.0, e - d.bias);
  return negative ? -magnitude : magnitude;
}

uint32_t code_count(const Definition& d) {
  switch (d.format) {
    case Format::bf16: case Format::fp16: return 1u << 16;
    case Format::e2m3: case Format::e3m2: return 64;
    case Format::e2m1: case Format::int4: return 16;
    default: return 256;
  }
}

TEST(ScalarDecode, EveryCodeOfEveryFormatMatchesTheDefinition) {
  for (const Definition& d : kDefinitions) {
    int nan_count = 0;
    for (uint32_t code = 0; code < code_count(d); ++code) {
      const double expected = value_from_definition(d, code);
      const float got = decode_ref(d.format, code);
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(got)) << traits(d.format).name << " code " << code;
        ++nan_count;
      } else {
        // The exact value, including the sign of zero.
        EXPECT_EQ(static_cast<double>(got), expected) << traits(d.format).name << " code " << code;
        EXPECT_EQ(std::signbit(got), std::signbit(expected)) << traits(d.format).name << " code " << code;
      }
    }
    const int expected_nans = d.format == Format::bf16   ? 2 * 127
                              : d.format == Format::fp16 ? 2 * 1023
                              : d.format == Format::e4m3 ? 2
                              : d.format == Format::e5m2 ? 6
                              : d.format == Format::e8m0 ? 1
                              : d.format == Format::ue4m3 ? 129  // 0x7F and every code >= 0x80
                                                          : 0;
    EXPECT_EQ(nan_count, expected_nans) << traits(d.format).name;
  }
}

TEST(ScalarDecode, TraitsTableAgreesWithTheCodes) {
  for (const Definition& d : kDefinitions) {
    const FormatTraits& t = traits(d.format);
    EXPECT_EQ(decode_ref(d.format, max_finite_code(d.format)), t.max_finite) << t.name;
    if (t.is_signed) {
      EXPECT_EQ(decode_ref(d.format, max_finite_code(d.format, true)),
                t.is_integer() ? -t.max_finite - 1 : -t.max_finite)
          << t.name;
    }
    if (t.has_nan()) {
      EXPECT_TRUE(std::isnan(decode_ref(d.format, nan_code(d.format)))) << t.name;
    }
    // Smallest positive value is code 1 for every format (e8m0: code 0).
    EXPECT_EQ(decode_ref(d.format, d.format == Format::e8m0 ? 0 : 1), t.min_subnormal) << t.name;
  }
}

TEST(ScalarDecode, NamedSpecialCodes) {
  EXPECT_EQ(decode_ref(Format::e4m3, 0x7E), 448.0f);
  EXPECT_TRUE(std::isnan(decode_ref(Format::e4m3, 0x7F)));
  EXPECT_TRUE(std::isnan(decode_ref(Format::e4m3, 0xFF)));
  EXPECT_EQ(decode_ref(Format::e4m3, 0x78), 256.0f);  // S.1111.000 is a number in E4M3FN
  EXPECT_EQ(decode_ref(Format::e5m2, 0x7B), 57344.0f);
  EXPECT_EQ(decode_ref(Format::e5m2, 0x7C), std::numeric_limits<float>::infinity());
  EXPECT_EQ(decode_ref(Format::e5m2, 0xFC), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(decode_ref(Format::e2m1, 0x7), 6.0f);
  EXPECT_EQ(decode_ref(Format::e2m1, 0x1), 0.5f);
  EXPECT_EQ(decode_ref(Format::e2m3, 0x1F), 7.5f);
  EXPECT_EQ(decode_ref(Format::e3m2, 0x1F), 28.0f);
  EXPECT_EQ(decode_ref(Format::e8m0, 0x7F), 1.0f);
  EXPECT_EQ(decode_ref(Format::e8m0, 0x00), std::ldexp(1.0f, -127));
  EXPECT_EQ(decode_ref(Format::e8m0, 0xFE), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(decode_ref(Format::e8m0, 0xFF)));
  EXPECT_EQ(decode_ref(Format::ue4m3, 0x7E), 448.0f);
  EXPECT_TRUE(std::signbit(decode_ref(Format::bf16, 0x8000)));
  EXPECT_EQ(decode_ref(Format::bf16, 0x0001), std::ldexp(1.0f, -133));  // bf16 subnormal
  EXPECT_EQ(decode_ref(Format::int8, 0x80), -128.0f);
  EXPECT_EQ(decode_ref(Format::int4, 0x8), -8.0f);
  EXPECT_EQ(decode_ref(Format::int4, 0x7), 7.0f);
}

}  // namespace
}  // namespace concord::numerics
