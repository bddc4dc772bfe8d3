// Scalar reference codec: fp32 <-> every element format, one value at a time.
//
// This is the plain reference that every fast path is checked against bit for bit. It is
// written for a reader, not for speed: the input is split into an integer significand and a
// power of two, rounded to the target's quantum with integer arithmetic, and reassembled.
// The special-value rules (NaN, Inf, -0, subnormals, overflow) are in rounding.h and format.h.
#pragma once

#include <bit>
#include <cstdint>

#include "concord/numerics/format.h"
#include "concord/numerics/rounding.h"

namespace concord::numerics {

// Encodes one fp32 value into format f. random_bits is used only by Rounding::stochastic.
// The code is right-aligned (bits above the format's width are zero).
uint32_t encode_ref(Format f, float x, Rounding rounding = Rounding::rne,
                    Overflow overflow = Overflow::saturate, uint32_t random_bits = 0);

// Decodes one code of format f. Exact: every value of every format is an fp32 value. Bits
// above the format's width are ignored. NaN codes decode to a quiet NaN with the code's sign.
float decode_ref(Format f, uint32_t code);

// Code of the largest finite value (sign 0), of +0, and of the canonical NaN (format must have
// one). For ue4m3 and e8m0 the "sign" argument is ignored.
uint32_t max_finite_code(Format f, bool negative = false);
uint32_t nan_code(Format f, bool negative = false);

// A value type over one format's raw bits (ml_dtypes' pattern): from_bits()/bits(), and
// conversions through the reference codec.
template <Format F>
class Scalar {
 public:
  constexpr Scalar() = default;
  static constexpr Scalar from_bits(uint32_t bits) {
    Scalar s;
    s.bits_ = bits & traits(F).code_mask();
    return s;
  }
  static Scalar from_float(float x, Rounding r = Rounding::rne, Overflow o = Overflow::saturate,
                           uint32_t random_bits = 0) {
    return from_bits(encode_ref(F, x, r, o, random_bits));
  }
  constexpr uint32_t bits() const { return bits_; }
  float to_float() const { return decode_ref(F, bits_); }
  friend constexpr bool operator==(Scalar a, Scalar b) { return a.bits_ == b.bits_; }

 private:
  uint32_t bits_ = 0;
};

using Bf16 = Scalar<Format::bf16>;
using Fp16 = Scalar<Format::fp16>;
using E4m3 = Scalar<Format::e4m3>;
using E5m2 = Scalar<Format::e5m2>;
using E2m3 = Scalar<Format::e2m3>;
using E3m2 = Scalar<Format::e3m2>;
using E2m1 = Scalar<Format::e2m1>;
using E8m0 = Scalar<Format::e8m0>;
using Ue4m3 = Scalar<Format::ue4m3>;

// fp32 <-> raw bits, always through std::bit_cast.
inline uint32_t f32_bits(float x) { return std::bit_cast<uint32_t>(x); }
inline float f32_from_bits(uint32_t b) { return std::bit_cast<float>(b); }

}  // namespace concord::numerics
