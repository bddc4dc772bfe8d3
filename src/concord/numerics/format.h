// Element formats: one stable enum and one constexpr traits table (ggml's pattern).
//
// Every low-precision number concord stores is one of these element formats. The numbers of
// the enum are stable on disk (safetensors metadata, sync manifests) and are never reused.
//
// Special values per format (OCP OFP8 v1.0, OCP MX v1.0, IEEE 754):
//
// | format | bits | E/M  | bias | Inf         | NaN                 | max finite | min subnormal | -0  |
// |--------|------|------|------|-------------|---------------------|------------|---------------|-----|
// | f32    | 32   | 8/23 | 127  | yes         | yes                 | 3.40e38    | 2^-149        | yes |
// | bf16   | 16   | 8/7  | 127  | yes         | yes                 | 3.39e38    | 2^-133        | yes |
// | fp16   | 16   | 5/10 | 15   | yes         | yes                 | 65504      | 2^-24         | yes |
// | e4m3   | 8    | 4/3  | 7    | no          | S.1111.111 only     | 448        | 2^-9          | yes |
// | e5m2   | 8    | 5/2  | 15   | S.11111.00  | S.11111.{01,10,11}  | 57344      | 2^-16         | yes |
// | e2m3   | 6    | 2/3  | 1    | no          | no                  | 7.5        | 2^-3          | yes |
// | e3m2   | 6    | 3/2  | 3    | no          | no                  | 28         | 2^-4          | yes |
// | e2m1   | 4    | 2/1  | 1    | no          | no                  | 6          | 2^-1 (0.5)    | yes |
// | e8m0   | 8    | 8/0  | 127  | no          | 0xFF                | 2^127      | none: 0x00 = 2^-127, no zero | no |
// | ue4m3  | 8    | 4/3  | 7    | no          | 0x7F (sign bit must be 0) | 448  | 2^-9          | no  |
// | int8   | 8    | two's complement integers -128..127                                          |
// | int4   | 4    | two's complement integers -8..7 (low nibble of the code)                      |
//
// Codes are stored right-aligned in the smallest unsigned integer that holds them: the 6-bit
// and 4-bit formats use the low bits of a byte, the sign is the top bit of the format's width.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace concord::numerics {

enum class Format : uint8_t {
  f32 = 0,
  bf16 = 1,
  fp16 = 2,
  e4m3 = 3,
  e5m2 = 4,
  e2m3 = 5,
  e3m2 = 6,
  e2m1 = 7,
  e8m0 = 8,
  ue4m3 = 9,
  int8 = 10,
  int4 = 11,
};
inline constexpr int kFormatCount = 12;

// How a floating format spends its top exponent field.
enum class Specials : uint8_t {
  ieee,       // top exponent = Inf (mantissa 0) or NaN (mantissa != 0)
  fn,         // "finite": top exponent holds numbers; only all-ones mantissa there is NaN
  none,       // every code is a finite number (OCP FP6/FP4)
  e8m0,       // unsigned power of two; 0xFF is NaN; no zero, no subnormals
  integer,    // two's complement integer, no specials
};

struct FormatTraits {
  Format format;
  std::string_view name;
  int bits;            // width of one code
  bool is_signed;      // has a sign bit (integers: two's complement)
  int exponent_bits;   // 0 for integers
  int mantissa_bits;   // explicit fraction bits; 0 for integers and e8m0
  int bias;
  Specials specials;
  double max_finite;
  double min_normal;     // smallest positive normal (integers: 1)
  double min_subnormal;  // smallest positive value
  int emax;              // unbiased exponent of max_finite (integers: 0)
  int emin;              // unbiased exponent of the smallest normal (integers: 0)

  constexpr bool has_inf() const { return specials == Specials::ieee; }
  constexpr bool has_nan() const {
    return specials == Specials::ieee || specials == Specials::fn || specials == Specials::e8m0;
  }
  constexpr bool is_integer() const { return specials == Specials::integer; }
  constexpr uint32_t code_count() const { return 1u << bits; }
  constexpr uint32_t code_mask() const { return (1u << bits) - 1u; }
  constexpr int storage_bytes() const { return bits <= 8 ? 1 : bits <= 16 ? 2 : 4; }
};

// The table, indexed by the enum value.
inline constexpr std::array<FormatTraits, kFormatCount> kFormatTable = {{
    {Format::f32, "f32", 32, true, 8, 23, 127, Specials::ieee, 3.4028234663852886e38,
     1.1754943508222875e-38, 1.401298464324817e-45, 127, -126},
    {Format::bf16, "bf16", 16, true, 8, 7, 127, Specials::ieee, 3.3895313892515355e38,
     1.1754943508222875e-38, 9.183549615799121e-41, 127, -126},
    {Format::fp16, "fp16", 16, true, 5, 10, 15, Specials::ieee, 65504.0, 6.103515625e-05,
     5.960464477539063e-08, 15, -14},
    {Format::e4m3, "e4m3", 8, true, 4, 3, 7, Specials::fn, 448.0, 0.015625, 0.001953125, 8, -6},
    {Format::e5m2, "e5m2", 8, true, 5, 2, 15, Specials::ieee, 57344.0, 6.103515625e-05,
     1.52587890625e-05, 15, -14},
    {Format::e2m3, "e2m3", 6, true, 2, 3, 1, Specials::none, 7.5, 1.0, 0.125, 2, 0},
    {Format::e3m2, "e3m2", 6, true, 3, 2, 3, Specials::none, 28.0, 0.25, 0.0625, 4, -2},
    {Format::e2m1, "e2m1", 4, true, 2, 1, 1, Specials::none, 6.0, 1.0, 0.5, 2, 0},
    {Format::e8m0, "e8m0", 8, false, 8, 0, 127, Specials::e8m0, 1.7014118346046923e38,
     5.877471754111438e-39, 5.877471754111438e-39, 127, -127},
    {Format::ue4m3, "ue4m3", 8, false, 4, 3, 7, Specials::fn, 448.0, 0.015625, 0.001953125, 8,
     -6},
    {Format::int8, "int8", 8, true, 0, 0, 0, Specials::integer, 127.0, 1.0, 1.0, 0, 0},
    {Format::int4, "int4", 4, true, 0, 0, 0, Specials::integer, 7.0, 1.0, 1.0, 0, 0},
}};

constexpr const FormatTraits& traits(Format f) { return kFormatTable[static_cast<int>(f)]; }

// Lower-case name -> format ("e4m3", "bf16", ...); nullopt when unknown.
std::optional<Format> format_from_name(std::string_view name);

}  // namespace concord::numerics
