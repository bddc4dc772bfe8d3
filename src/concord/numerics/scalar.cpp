// Scalar reference codec (see scalar.h): integer-significand rounding, one value at a time.
#include "concord/numerics/scalar.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "concord/numerics/check.h"

namespace concord::numerics {
namespace {

// |x| = significand * 2^exponent with an integer significand (< 2^24), for finite nonzero x.
struct Magnitude {
  uint64_t significand;
  int exponent;
  int log2_floor() const { return exponent + static_cast<int>(std::bit_width(significand)) - 1; }
};

Magnitude magnitude_of(uint32_t bits) {
  const uint32_t exponent_field = (bits >> 23) & 0xFFu;
  const uint32_t fraction = bits & 0x7FFFFFu;
  if (exponent_field == 0) return {fraction, -149};
  return {fraction | 0x800000u, static_cast<int>(exponent_field) - 150};
}

// Rounds significand * 2^exponent to an integer multiple of 2^quantum_exponent; returns the
// multiple. The discarded part is rem / 2^shift with shift = quantum_exponent - exponent.
uint64_t round_to_quantum(Magnitude m, int quantum_exponent, Rounding rounding,
                          uint32_t random_bits) {
  int shift = quantum_exponent - m.exponent;
  if (shift <= 0) return m.significand << -shift;  // exact: the target is finer than the input
  // significand < 2^24, so beyond a shift of 60 every rule gives the same answer as at 60.
  shift = std::min(shift, 60);
  const uint64_t kept = m.significand >> shift;
  const uint64_t rem = m.significand & ((uint64_t{1} << shift) - 1);
  if (rem == 0) return kept;
  switch (rounding) {
    case Rounding::rtz:
      return kept;
    case Rounding::rne: {
      const uint64_t half = uint64_t{1} << (shift - 1);
      return kept + ((rem > half || (rem == half && (kept & 1))) ? 1 : 0);
    }
    case Rounding::stochastic: {
      // D = RNE(rem / 2^shift * 2^32): the discarded fraction as 32-bit fixed point.
      uint64_t d;
      if (shift <= 32) {
        d = rem << (32 - shift);
      } else {
        const int s = shift - 32;
        d = rem >> s;
        const uint64_t r = rem & ((uint64_t{1} << s) - 1), half = uint64_t{1} << (s - 1);
        d += (r > half || (r == half && (d & 1))) ? 1 : 0;
      }
      return kept + ((d + random_bits >= (uint64_t{1} << 32)) ? 1 : 0);
    }
  }
  return kept;
}

uint32_t sign_bit(const FormatTraits& t, bool negative) {
  return (t.is_signed && negative) ? (1u << (t.bits - 1)) : 0u;
}

// Largest mantissa field allowed at the top finite exponent.
uint32_t top_mantissa(const FormatTraits& t) {
  const uint32_t all_ones = (1u << t.mantissa_bits) - 1u;
  return t.specials == Specials::fn ? all_ones - 1u : all_ones;
}

uint32_t inf_code(const FormatTraits& t, bool negative) {
  return sign_bit(t, negative) | (((1u << t.exponent_bits) - 1u) << t.mantissa_bits);
}

uint32_t overflow_code(const FormatTraits& t, bool negative, Overflow overflow) {
  if (overflow == Overflow::ieee) {
    if (t.has_inf()) return inf_code(t, negative);
    if (t.has_nan()) return nan_code(t.format, negative);
  }
  return max_finite_code(t.format, negative);
}

uint32_t encode_integer(const FormatTraits& t, uint32_t bits, Rounding rounding,
                        uint32_t random_bits) {
  const bool negative = (bits >> 31) != 0;
  const uint32_t exponent_field = (bits >> 23) & 0xFFu;
  if (exponent_field == 0xFF && (bits & 0x7FFFFFu) != 0) return 0;  // NaN -> 0 (no NaN code)
  const int64_t max_positive = (int64_t{1} << (t.bits - 1)) - 1;
  const int64_t max_negative = int64_t{1} << (t.bits - 1);  // magnitude of the minimum
  const int64_t limit = negative ? max_negative : max_positive;
  int64_t n;
  if (exponent_field == 0xFF) {
    n = limit;  // +-Inf saturates
  } else if ((bits & 0x7FFFFFFFu) == 0) {
    n = 0;
  } else {
    const Magnitude m = magnitude_of(bits);
    n = m.log2_floor() >= 32 ? limit
                             : static_cast<int64_t>(round_to_quantum(m, 0, rounding, random_bits));
    n = std::min(n, limit);
  }
  const int64_t value = negative ? -n : n;
  return static_cast<uint32_t>(value) & t.code_mask();
}

}  // namespace

uint32_t max_finite_code(Format f, bool negative) {
  const FormatTraits& t = traits(f);
  switch (t.specials) {
    case Specials::integer:
      return negative ? (1u << (t.bits - 1)) : ((1u << (t.bits - 1)) - 1u);
    case Specials::ieee:
      return sign_bit(t, negative) | ((((1u << t.exponent_bits) - 2u) << t.mantissa_bits) |
                                      ((1u << t.mantissa_bits) - 1u));
    case Specials::fn:
    case Specials::none:
      return sign_bit(t, negative) |
             (((1u << t.exponent_bits) - 1u) << t.mantissa_bits) | top_mantissa(t);
    case Specials::e8m0:
      return 0xFEu;
  }
  return 0;
}

uint32_t nan_code(Format f, bool negative) {
  const FormatTraits& t = traits(f);
  CONCORD_CHECK(t.has_nan(), "nan_code: format has no NaN");
  switch (t.specials) {
    case Specials::e8m0:
      return 0xFFu;
    case Specials::fn:  // S.1111.111
      return sign_bit(t, negative) | (((1u << t.exponent_bits) - 1u) << t.mantissa_bits) |
             ((1u << t.mantissa_bits) - 1u);
    default:  // ieee: quiet NaN, top mantissa bit set
      return inf_code(t, negative) | (1u << (t.mantissa_bits - 1));
  }
}

uint32_t encode_ref(Format f, float x, Rounding rounding, Overflow overflow,
                    uint32_t random_bits) {
  const FormatTraits& t = traits(f);
  const uint32_t bits = f32_bits(x);
  if (f == Format::f32) return bits;
  if (t.is_integer()) return encode_integer(t, bits, rounding, random_bits);

  const bool negative = (bits >> 31) != 0;
  const uint32_t exponent_field = (bits >> 23) & 0xFFu;
  const bool is_nan = exponent_field == 0xFF && (bits & 0x7FFFFFu) != 0;
  const bool is_zero = (bits & 0x7FFFFFFFu) == 0;

  if (is_nan) return t.has_nan() ? nan_code(f, negative) : sign_bit(t, negative);
  if (!t.is_signed) {
    if (negative && !is_zero) return nan_code(f);  // unsigned formats: negative is a domain error
    if (is_zero) return f == Format::e8m0 ? nan_code(f) : 0u;  // e8m0 has no zero
  }
  if (exponent_field == 0xFF) return overflow_code(t, negative, overflow);  // +-Inf
  if (is_zero) return sign_bit(t, negative);

  const Magnitude m = magnitude_of(bits);
  // The quantum is 2^(e - mantissa_bits) where e is the value's binade, never below emin
  // (below emin the format is subnormal and its quantum stays fixed).
  int e = std::max(m.log2_floor(), t.emin);
  // IEEE 754: round-toward-zero never overflows to Inf; it stops at the largest finite value.
  const Overflow finite_overflow = rounding == Rounding::rtz ? Overflow::saturate : overflow;
  if (e > t.emax + 1) return overflow_code(t, negative, finite_overflow);
  uint64_t n = round_to_quantum(m, e - t.mantissa_bits, rounding, random_bits);
  const uint64_t implicit_one = uint64_t{1} << t.mantissa_bits;
  if (n >= 2 * implicit_one) {  // rounding carried into the next binade
    n >>= 1;
    ++e;
  }
  if (n == 0) {
    // Underflow to zero; e8m0 has no zero, its smallest value 2^-127 absorbs the underflow.
    return f == Format::e8m0 ? 0u : sign_bit(t, negative);
  }
  const bool normal = n >= implicit_one || t.specials == Specials::e8m0;
  const uint32_t mantissa = static_cast<uint32_t>(normal ? n - implicit_one : n) &
                            ((1u << t.mantissa_bits) - 1u);
  if (e > t.emax || (e == t.emax && mantissa > top_mantissa(t))) {
    return overflow_code(t, negative, finite_overflow);
  }
  const uint32_t exponent_code = normal ? static_cast<uint32_t>(e + t.bias) : 0u;
  return sign_bit(t, negative) | (exponent_code << t.mantissa_bits) | mantissa;
}

float decode_ref(Format f, uint32_t code) {
  const FormatTraits& t = traits(f);
  if (f == Format::f32) return f32_from_bits(code);
  code &= t.code_mask();
  if (t.is_integer()) {
    const int shift = 32 - t.bits;  // sign-extend the two's complement code
    return static_cast<float>(static_cast<int32_t>(code << shift) >> shift);
  }
  const bool negative = t.is_signed && ((code >> (t.bits - 1)) & 1u);
  const float sign = negative ? -1.0f : 1.0f;
  const uint32_t exponent_field = (code >> t.mantissa_bits) & ((1u << t.exponent_bits) - 1u);
  const uint32_t mantissa = code & ((1u << t.mantissa_bits) - 1u);
  const uint32_t top_exponent = (1u << t.exponent_bits) - 1u;
  const float quiet_nan = std::numeric_limits<float>::quiet_NaN();
  switch (t.specials) {
    case Specials::e8m0:
      if (code == 0xFFu) return quiet_nan;
      return static_cast<float>(std::ldexp(1.0, static_cast<int>(code) - 127));
    case Specials::ieee:
      if (exponent_field == top_exponent) {
        if (mantissa == 0) return sign * std::numeric_limits<float>::infinity();
        return std::copysign(quiet_nan, sign);
      }
      break;
    case Specials::fn:
      if (!t.is_signed && (code >> (t.bits - 1)) != 0) return quiet_nan;  // ue4m3: sign bit set
      if (exponent_field == top_exponent && mantissa == (1u << t.mantissa_bits) - 1u) {
        return std::copysign(quiet_nan, sign);
      }
      break;
    default:
      break;
  }
  double value;
  if (exponent_field == 0) {
    value = std::ldexp(static_cast<double>(mantissa), t.emin - t.mantissa_bits);
  } else {
    value = std::ldexp(static_cast<double>((1u << t.mantissa_bits) | mantissa),
                       static_cast<int>(exponent_field) - t.bias - t.mantissa_bits);
  }
  return sign * static_cast<float>(value);
}

}  // namespace concord::numerics
