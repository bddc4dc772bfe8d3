// Rounding and overflow policies: separate named enums, combined where a conversion happens.
//
// Rounding acts on the magnitude; the sign is carried through.
//   rne         round to nearest, ties to even (the default everywhere)
//   rtz         round toward zero (truncate)
//   stochastic  round away from zero with probability equal to the discarded fraction. The
//               definition is gfloat's RoundMode.Stochastic with 32 random bits: the fraction
//               delta in [0,1) between the two neighbouring codes is rounded (RNE) to a 32-bit
//               fixed-point number D, and the value rounds away iff D + r >= 2^32, where r is a
//               uniform 32-bit word from Philox4x32-10 keyed by (seed, stream, element index).
//               Hence P(away) = D / 2^32, which equals delta exactly whenever delta has at most 32
//               fraction bits (always, unless the input is >2^32 times finer than the target's
//               smallest subnormal) — E[SR(x)] = x.
//
// Overflow acts on finite values beyond max_finite after rounding, and on infinities:
//   saturate    finite overflow and +-Inf -> +-max_finite; NaN stays NaN (the MX/TE choice)
//   ieee        -> +-Inf where the format has Inf, else NaN where it has NaN, else +-max_finite
//               (FP6/FP4 have neither, so they always saturate). This is ml_dtypes' behaviour.
//
// NaN input: NaN code where the format has one; formats without NaN (e2m3, e3m2, e2m1, int8,
// int4) encode NaN as zero (sign of the NaN kept for the float ones). Unsigned formats (e8m0,
// ue4m3) encode negative numbers as NaN; e8m0 has no zero either, so 0 -> NaN.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace concord::numerics {

enum class Rounding : uint8_t { rne = 0, rtz = 1, stochastic = 2 };
enum class Overflow : uint8_t { saturate = 0, ieee = 1 };

std::string_view rounding_name(Rounding r);
std::string_view overflow_name(Overflow o);
std::optional<Rounding> rounding_from_name(std::string_view name);  // "rne", "rtz", "sr"
std::optional<Overflow> overflow_from_name(std::string_view name);  // "saturate", "ieee"

}  // namespace concord::numerics
