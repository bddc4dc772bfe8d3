// GGUF tensor types: ggml's size table, and the codecs (see gguf.h): f32, f16, bf16, the legacy
// quants Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, the k-quants Q2_K..Q6_K and Q8_K, and MXFP4.
//
// The codecs reproduce the PyPI gguf package (gguf/quants.py, itself bit-exact with ggml's
// reference quantizers in ggml-quants.c) byte for byte; tests/python/test_gguf_interop.py checks
// it. Element formats come from concord's numerics; what is GGUF-specific lives here:
//   - MXFP4 layout: GGUF puts element j (0..15) of a 32-element block in the low nibble of byte j
//     and element j+16 in the high nibble; concord's own MX storage packs element 2k low, 2k+1
//     high (numerics/block.h). The scale byte comes first in each 17-byte block.
//   - MXFP4 scale: ggml reads the E8M0 byte as 2^(e-127) for every e, 0xFF included (2^128, not
//     NaN as OCP MX says), and multiplies half of it by doubled E2M1 values, so code 8 is +0.
//   - MXFP4 encode: e = floor(log2(amax)) - 2 + 127 with log2 rounded to fp32 (ggml's
//     floorf(log2f(amax)); concord evaluates log2 in double and rounds once, which equals a
//     correctly rounded log2f), then each element takes the first code of minimal |error|
//     (ties go to the smaller magnitude, not to even). Below amax = 2^-125 the reference's e
//     is negative and its uint8 cast wraps (undefined in C); concord clamps e to 0.
//   - Q8_0: d = amax/127 in fp32, q = round-half-away(x * (1/d)); d is stored as f16. When 1/d
//     overflows (amax below about 3.7e-37) the reference multiplies by Inf and casts NaN to
//     int8, which NumPy turns into 0; concord writes the zero codes directly.
//   - Dequantization of the legacy and k-quants is ggml's dequantize_row_* (ggml-quants.c) with
//     the same fp32 operations in the same order (no FMA: the build has -ffp-contract=off), so
//     every value equals gguf-py's numpy port bit for bit, NaN payloads included (an f16 scale
//     widens exactly, its NaN payload unchanged; Inf and NaN scales propagate as IEEE says):
//       Q4_0 (q*d, q = nibble-8), Q4_1 (q*d + m), Q5_0 (q*d, q = 5 bits - 16), Q5_1 (q*d + m),
//       Q2_K ((d*sc)*q - dmin*m, 4-bit sc and m per 16), Q3_K ((d*(sc-32))*q, 6-bit sc per 16,
//       q = 2 low bits - (high bit ? 0 : 4)), Q4_K/Q5_K ((d*sc)*q - dmin*m, 6-bit sc and m per
//       32), Q6_K ((d*sc)*q, int8 sc per 16, q = 6 bits - 32), Q8_K (d*q with an fp32 d).
//   - Q4_0 / Q4_1 encode: quantize_row_q4_0_ref / _q4_1_ref. Q4_0: max = the first element of
//     largest |x|, d = max/-8, q = min(15, trunc(x*(1/d) + 8.5)); Q4_1: d = (max-min)/15, m = min,
//     q = min(15, trunc((x-min)*(1/d) + 0.5)). d and m are stored as f16 (round to nearest even;
//     beyond 65504 they become Inf, as in ggml). When 1/d overflows (|d| below 2^-128) the
//     reference casts Inf/NaN to an integer (undefined in C); NumPy gives 0, and so does concord.
//   - Non-finite input: Q4_0, Q4_1, Q8_0 and MXFP4 reject NaN and Inf (InputError). F16 and BF16 keep them:
//     NaN payloads follow the reference (f16: NumPy's conversion; bf16: ggml's, which sets the
//     quiet bit), and decoding widens payloads unchanged, as the reference does.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "concord/io/gguf.h"
#include "concord/numerics/check.h"
#include "concord/numerics/scalar.h"

namespace concord::io {
namespace {

using numerics::Format;

struct GgmlTypeEntry {
  uint32_t number;
  GgmlTypeTraits traits;
};

// ggml's type_traits (ggml.c), as the PyPI gguf package lists them in GGML_QUANT_SIZES.
// Numbers 4, 5, 31-33 and 36-38 belonged to removed types and stay unknown.
constexpr int64_t kQK = 256;  // ggml's QK_K, the super-block of the k-quants
constexpr std::array<GgmlTypeEntry, 34> kGgmlTypes = {{
    {0, {"F32", 1, 4}},
    {1, {"F16", 1, 2}},
    {2, {"Q4_0", 32, 2 + 16}},
    {3, {"Q4_1", 32, 2 + 2 + 16}},
    {6, {"Q5_0", 32, 2 + 4 + 16}},
    {7, {"Q5_1", 32, 2 + 2 + 4 + 16}},
    {8, {"Q8_0", 32, 2 + 32}},
    {9, {"Q8_1", 32, 4 + 4 + 32}},
    {10, {"Q2_K", kQK, 2 + 2 + kQK / 16 + kQK / 4}},
    {11, {"Q3_K", kQK, 2 + kQK / 4 + kQK / 8 + 12}},
    {12, {"Q4_K", kQK, 2 + 2 + kQK / 2 + 12}},
    {13, {"Q5_K", kQK, 2 + 2 + kQK / 2 + kQK / 8 + 12}},
    {14, {"Q6_K", kQK, 2 + kQK / 2 + kQK / 4 + kQK / 16}},
    {15, {"Q8_K", kQK, 4 + kQK + kQK / 8}},
    {16, {"IQ2_XXS", kQK, 2 + kQK / 4}},
    {17, {"IQ2_XS", kQK, 2 + kQK / 4 + kQK / 32}},
    {18, {"IQ3_XXS", kQK, 2 + kQK / 4 + kQK / 8}},
    {19, {"IQ1_S", kQK, 2 + kQK / 8 + kQK / 16}},
    {20, {"IQ4_NL", 32, 2 + 16}},
    {21, {"IQ3_S", kQK, 2 + kQK / 4 + kQK / 8 + kQK / 32 + 4}},
    {22, {"IQ2_S", kQK, 2 + kQK / 4 + kQK / 16}},
    {23, {"IQ4_XS", kQK, 2 + 2 + kQK / 2 + kQK / 64}},
    {24, {"I8", 1, 1}},
    {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},
    {27, {"I64", 1, 8}},
    {28, {"F64", 1, 8}},
    {29, {"IQ1_M", kQK, kQK / 8 + kQK / 16 + kQK / 32}},
    {30, {"BF16", 1, 2}},
    {34, {"TQ1_0", kQK, 2 + 4 * 13}},
    {35, {"TQ2_0", kQK, 2 + 64}},
    {39, {"MXFP4", 32, 1 + 16}},
    {40, {"NVFP4", 64, 4 + 32}},
    {41, {"Q1_0", 128, 2 + 16}},
}};

constexpr int kQ8Block = 32;
constexpr int kMxBlock = 32;
constexpr int kQ4Block = 32;  // QK4_0 = QK4_1 = QK5_0 = QK5_1 = 32

const GgmlTypeTraits& traits_of(GgmlType type) {
  for (const GgmlTypeEntry& e : kGgmlTypes) {
    if (e.number == static_cast<uint32_t>(type)) return e.traits;
  }
  CONCORD_CHECK(false, "GgmlType without a traits entry");
  return kGgmlTypes[0].traits;
}

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t load_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// f16 -> f32 through the numerics codec; NaN payloads widen unchanged (NumPy's rule).
float f16_to_f32(uint16_t h) {
  if ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0) {
    const uint32_t bits = (static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7F800000u |
                          (static_cast<uint32_t>(h & 0x03FFu) << 13);
    return numerics::f32_from_bits(bits);
  }
  return numerics::decode_ref(Format::fp16, h);
}

// f32 -> f16, round to nearest even, overflow to Inf; NaN as NumPy converts it (payload
// truncated, kept nonzero).
uint16_t f32_to_f16(float x) {
  const uint32_t bits = numerics::f32_bits(x);
  if (std::isnan(x)) {
    uint32_t mantissa = (bits & 0x7FFFFFu) >> 13;
    if (mantissa == 0) mantissa = 1;
    return static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7C00u | mantissa);
  }
  return static_cast<uint16_t>(
      numerics::encode_ref(Format::fp16, x, numerics::Rounding::rne, numerics::Overflow::ieee));
}

// f32 -> bf16, round to nearest even, overflow to Inf; NaN keeps its top bits with the quiet
// bit set (ggml_compute_fp32_to_bf16).
uint16_t f32_to_bf16(float x) {
  const uint32_t bits = numerics::f32_bits(x);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>(
      numerics::encode_ref(Format::bf16, x, numerics::Rounding::rne, numerics::Overflow::ieee));
}

// The 16 MXFP4 codes as ggml's kvalues_mxfp4: E2M1 values doubled (integers), code 8 = +0.
std::array<float, 16> mxfp4_doubled_values() {
  std::array<float, 16> v{};
  for (uint32_t code = 0; code < 16; ++code) {
    v[code] = 2.0f * numerics::decode_ref(Format::e2m1, code) + 0.0f;  // + 0 turns -0 into +0
  }
  return v;
}

// Half of the block scale, 2^(e-128): E8M0 is 2^(e-127) for e < 255; ggml reads 0xFF as
// 2^128 too (no NaN), whose half is still a finite fp32.
float mxfp4_half_scale(uint8_t e) {
  if (e == 0xFF) return std::ldexp(1.0f, 127);
  return numerics::decode_ref(Format::e8m0, e) * 0.5f;
}

void check_finite(GgmlType type, std::span<const float> values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      throw InputError(fmt::format("[gguf] cannot encode {}: element {} is {} ({} blocks must "
                                   "be finite; F32, F16 and BF16 keep NaN and Inf)",
                                   traits_of(type).name, i, values[i], traits_of(type).name));
    }
  }
}

void encode_q8_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int j = 0; j < kQ8Block; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  out[0] = static_cast<uint8_t>(dh & 0xFF);
  out[1] = static_cast<uint8_t>(dh >> 8);
  for (int j = 0; j < kQ8Block; ++j) {
    // |x * id| <= 127 (+ rounding), so the cast cannot overflow; an infinite id gives zeros.
    const float q = std::isfinite(id) ? std::round(x[j] * id) : 0.0f;
    out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
  }
}

void store_f16(uint8_t* out, float x) {
  const uint16_t h = f32_to_f16(x);
  out[0] = static_cast<uint8_t>(h & 0xFF);
  out[1] = static_cast<uint8_t>(h >> 8);
}

// A 4-bit code from v = x*id + offset as the reference computes it: truncation toward zero, at
// most 15. v >= 0 for every finite input; a non-finite v (1/d overflowed) gives 0, as NumPy's
// cast does (the C reference's cast is undefined there).
uint8_t q4_code(float v) {
  if (!std::isfinite(v)) return 0;
  const auto t = static_cast<uint8_t>(static_cast<int32_t>(v));
  return std::min<uint8_t>(t, 15);
}

void encode_q4_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQ4Block; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(out, d);
  for (int j = 0; j < kQ4Block / 2; ++j) {
    const uint8_t lo = q4_code(x[j] * id + 8.5f);
    const uint8_t hi = q4_code(x[j + kQ4Block / 2] * id + 8.5f);
    out[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void encode_q4_1_block(const float* x, uint8_t* out) {
  float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
  for (int j = 0; j < kQ4Block; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  const float d = (max - min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(out, d);
  store_f16(out + 2, min);
  for (int j = 0; j < kQ4Block / 2; ++j) {
    const uint8_t lo = q4_code((x[j] - min) * id + 0.5f);
    const uint8_t hi = q4_code((x[j + kQ4Block / 2] - min) * id + 0.5f);
    out[4 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// ---- dequantizers: one block from `b` into `y`, as ggml's dequantize_row_* computes it.

void decode_q4_0(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void decode_q4_1(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const float m = f16_to_f32(load_u16(b + 2));
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0/Q5_1: element j's fifth bit is bit j of the little-endian uint32 qh.
void decode_q5_0(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int x0 = static_cast<int>((qs[j] & 0x0Fu) | (((qh >> j) & 1u) << 4)) - 16;
    const int x1 = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}

void decode_q5_1(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const float m = f16_to_f32(load_u16(b + 2));
  const uint32_t qh = load_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const uint32_t x0 = (qs[j] & 0x0Fu) | (((qh >> j) & 1u) << 4);
    const uint32_t x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(x0) * d + m;
    y[j + 16] = static_cast<float>(x1) * d + m;
  }
}

// The k-quants' 256 elements run in two halves of 128; within half h, four groups r of 32
// (element e = 128h + 32r + l) take bits 2r..2r+1 of qs[32h + l] (Q2_K, Q3_K). Scales cover 16
// elements (index e/16) in Q2_K, Q3_K and Q6_K, 32 elements in Q4_K and Q5_K.
void decode_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = f16_to_f32(load_u16(b + 80));
  const float dmin = f16_to_f32(load_u16(b + 82));
  for (int s = 0; s < 16; ++s) {
    const float dl = d * static_cast<float>(scales[s] & 0x0F);
    const float ml = dmin * static_cast<float>(scales[s] >> 4);
    for (int k = 0; k < 16; ++k) {
      const int e = 16 * s + k, h = e / 128, r = (e % 128) / 32, l = e % 32;
      const int q = (qs[32 * h + l] >> (2 * r)) & 3;
      y[e] = dl * static_cast<float>(q) - ml;
    }
  }
}

// Q3_K: 16 6-bit scales in 12 bytes: scale s has low 4 bits from byte s (s < 8) or the high
// nibble of byte s-8, and high 2 bits from bits 2(s/4).. of byte 8 + s%4; the value is scale-32.
// Element e's third bit is bit 4h + r of hmask[l]; a clear bit subtracts 4.
void decode_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = f16_to_f32(load_u16(b + 108));
  for (int s = 0; s < 16; ++s) {
    const int low = s < 8 ? (sc[s] & 0x0F) : (sc[s - 8] >> 4);
    const int high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    const float dl = d * static_cast<float>((low | (high << 4)) - 32);
    for (int k = 0; k < 16; ++k) {
      const int e = 16 * s + k, h = e / 128, r = (e % 128) / 32, l = e % 32;
      const int hbit = (hmask[l] >> (4 * h + r)) & 1;
      const int q = ((qs[32 * h + l] >> (2 * r)) & 3) - (hbit != 0 ? 0 : 4);
      y[e] = dl * static_cast<float>(q);
    }
  }
}

// Q4_K/Q5_K: 8 6-bit (scale, min) pairs in 12 bytes (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K: sub-block t (32 elements, e = 32t + l) takes the low nibble (t even) or high nibble
// (t odd) of qs[32(t/2) + l]. Q5_K adds bit t of qh[l] as the fifth bit.
template <bool kFive>
void decode_q45_k(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const float dmin = f16_to_f32(load_u16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = kFive ? b + 48 : b + 16;
  for (int t = 0; t < 8; ++t) {
    int sc = 0, m = 0;
    scale_min_k4(t, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = qs[32 * (t / 2) + l];
      int q = t % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
      if (kFive) q += ((qh[l] >> t) & 1) << 4;
      y[32 * t + l] = d1 * static_cast<float>(q) - m1;
    }
  }
}

// Q6_K: element e = 128h + 32r + l has low 4 bits from ql[64h + 32(r%2) + l] (low nibble for
// r < 2, high for r >= 2) and high 2 bits from bits 2r.. of qh[32h + l]; q = 6 bits - 32.
void decode_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const uint8_t* scales = b + 192;  // int8
  const float d = f16_to_f32(load_u16(b + 208));
  for (int s = 0; s < 16; ++s) {
    const float ds = d * static_cast<float>(static_cast<int8_t>(scales[s]));
    for (int k = 0; k < 16; ++k) {
      const int e = 16 * s + k, h = e / 128, r = (e % 128) / 32, l = e % 32;
      const uint8_t lowbyte = ql[64 * h + 32 * (r % 2) + l];
      const int low = r < 2 ? (lowbyte & 0x0F) : (lowbyte >> 4);
      const int high = (qh[32 * h + l] >> (2 * r)) & 3;
      y[e] = ds * static_cast<float>((low | (high << 4)) - 32);
    }
  }
}

// Q8_K: an fp32 scale, 256 int8 codes, 16 int16 group sums (for dot products; unused here).
void decode_q8_k(const uint8_t* b, float* y) {
  float d = 0.0f;
  std::memcpy(&d, b, sizeof d);
  for (int j = 0; j < 256; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(b[4 + j]));
}

// TQ2_0 (ggml-common.h block_tq2_0 {u8 qs[64]; f16 d}): element 128h + 32l + m is
// (((qs[32h + m] >> 2l) & 3) - 1) * d, as ggml's dequantize_row_tq2_0 (codes 0, 1, 2 are -1, 0, +1;
// 3 decodes to 2d).
void decode_tq2_0(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b + 64));
  for (int e = 0; e < 256; ++e) y[e] = static_cast<float>(tq2_0_code(b, e) - 1) * d;
}

// TQ2_0 from 256 values, as ggml's quantize_row_tq2_0_ref: d = max |x|, code lround(x / d) + 1.
void encode_tq2_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
  std::memset(out, 0, 64);
  for (int e = 0; e < 256; ++e) {
    const auto q = static_cast<int>(std::lround(x[e] * id)) + 1;
    out[(e / 128) * 32 + e % 32] = static_cast<uint8_t>(out[(e / 128) * 32 + e % 32] | ((q & 3) << (2 * ((e % 128) / 32))));
  }
  store_f16(out + 64, amax);
}

using BlockDecoder = void (*)(const uint8_t*, float*);

BlockDecoder block_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::q4_0: return decode_q4_0;
    case GgmlType::q4_1: return decode_q4_1;
    case GgmlType::q5_0: return decode_q5_0;
    case GgmlType::q5_1: return decode_q5_1;
    case GgmlType::q2_k: return decode_q2_k;
    case GgmlType::q3_k: return decode_q3_k;
    case GgmlType::q4_k: return decode_q45_k<false>;
    case GgmlType::q5_k: return decode_q45_k<true>;
    case GgmlType::q6_k: return decode_q6_k;
    case GgmlType::q8_k: return decode_q8_k;
    case GgmlType::tq2_0: return decode_tq2_0;
    default: return nullptr;
  }
}

void encode_mxfp4_block(const float* x, uint8_t* out, const std::array<float, 16>& doubled) {
  float amax = 0.0f;
  for (int j = 0; j < kMxBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  int e = 0;
  if (amax > 0.0f) {
    const float log2_amax = static_cast<float>(std::log2(static_cast<double>(amax)));
    e = std::clamp(static_cast<int>(std::floor(log2_amax)) - 2 + 127, 0, 254);
  }
  out[0] = static_cast<uint8_t>(e);
  const float d = mxfp4_half_scale(static_cast<uint8_t>(e));
  auto best_code = [&](float v) {
    uint8_t best = 0;
    float best_err = std::fabs(doubled[0] * d - v);
    for (uint8_t code = 1; code < 16; ++code) {
      const float err = std::fabs(doubled[code] * d - v);
      if (err < best_err) {
        best = code;
        best_err = err;
      }
    }
    return best;
  };
  for (int j = 0; j < kMxBlock / 2; ++j) {
    out[1 + j] = static_cast<uint8_t>(best_code(x[j]) | (best_code(x[j + kMxBlock / 2]) << 4));
  }
}

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type) {
  for (const GgmlTypeEntry& e : kGgmlTypes) {
    if (e.number == type) return e.traits;
  }
  return std::nullopt;
}

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
  auto same = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::toupper(static_cast<unsigned char>(a[i])) !=
          std::toupper(static_cast<unsigned char>(b[i]))) {
        return false;
      }
    }
    return true;
  };
  for (const GgmlTypeEntry& e : kGgmlTypes) {
    if (same(e.traits.name, name)) return static_cast<GgmlType>(e.number);
  }
  return std::nullopt;
}

std::optional<uint64_t> gguf_tensor_byte_size(GgmlType type, std::span<const int64_t> dims) {
  const auto traits = ggml_type_traits(static_cast<uint32_t>(type));
  if (!traits || dims.empty()) return std::nullopt;
  uint64_t rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) {
    if (dims[i] <= 0) return std::nullopt;
    if (__builtin_mul_overflow(rows, static_cast<uint64_t>(dims[i]), &rows)) return std::nullopt;
  }
  if (dims[0] <= 0 || dims[0] % traits->block_size != 0) return std::nullopt;
  uint64_t numel = 0, bytes = 0;
  if (__builtin_mul_overflow(rows, static_cast<uint64_t>(dims[0]), &numel) ||
      numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::nullopt;
  }
  uint64_t row_bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(dims[0] / traits->block_size),
                             static_cast<uint64_t>(traits->type_size), &row_bytes) ||
      __builtin_mul_overflow(rows, row_bytes, &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

bool gguf_type_converts_to_floats(GgmlType type) {
  return type == GgmlType::f32 || type == GgmlType::f16 || type == GgmlType::bf16 ||
         type == GgmlType::q8_0 || type == GgmlType::mxfp4 || block_decoder(type) != nullptr;
}

std::string_view gguf_float_type_list() {
  return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, TQ2_0 and "
         "MXFP4";
}

std::vector<float> gguf_tensor_to_floats(const GgufTensorInfo& tensor) {
  const GgmlTypeTraits& traits = traits_of(tensor.type);
  const auto expected = gguf_tensor_byte_size(tensor.type, tensor.dims);
  if (!expected || *expected != tensor.bytes.size()) {
    throw InputError(fmt::format("[gguf] tensor '{}': {} bytes do not match dims [{}] of {}",
                                 tensor.name, tensor.bytes.size(), fmt::join(tensor.dims, ", "),
                                 traits.name));
  }
  const auto n = static_cast<size_t>(tensor.numel());
  const uint8_t* p = tensor.bytes.data();
  std::vector<float> out(n);
  switch (tensor.type) {
    case GgmlType::f32:
      if (n > 0) std::memcpy(out.data(), p, n * sizeof(float));
      break;
    case GgmlType::f16:
      for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_u16(p + 2 * i));
      break;
    case GgmlType::bf16:  // bf16 is the top half of an fp32: widening is exact, NaN included
      for (size_t i = 0; i < n; ++i) {
        out[i] = numerics::f32_from_bits(static_cast<uint32_t>(load_u16(p + 2 * i)) << 16);
      }
      break;
    case GgmlType::q8_0:
      for (size_t b = 0; b < n / kQ8Block; ++b) {
        const uint8_t* block = p + b * static_cast<size_t>(traits.type_size);
        const float d = f16_to_f32(load_u16(block));
        for (size_t j = 0; j < kQ8Block; ++j) {
          out[b * kQ8Block + j] = static_cast<float>(static_cast<int8_t>(block[2 + j])) * d;
        }
      }
      break;
    case GgmlType::mxfp4: {
      const std::array<float, 16> doubled = mxfp4_doubled_values();
      for (size_t b = 0; b < n / kMxBlock; ++b) {
        const uint8_t* block = p + b * static_cast<size_t>(traits.type_size);
        const float d = mxfp4_half_scale(block[0]);
        float* y = out.data() + b * kMxBlock;
        for (size_t j = 0; j < kMxBlock / 2; ++j) {
          y[j] = doubled[block[1 + j] & 0x0F] * d;
          y[j + kMxBlock / 2] = doubled[block[1 + j] >> 4] * d;
        }
      }
      break;
    }
    default: {
      const BlockDecoder decode = block_decoder(tensor.type);
      if (decode == nullptr) {
        throw InputError(fmt::format("[gguf] tensor '{}' has type {}; only {} tensors convert "
                                     "to fp32",
                                     tensor.name, traits.name, gguf_float_type_list()));
      }
      const auto block = static_cast<size_t>(traits.block_size);
      const auto size = static_cast<size_t>(traits.type_size);
      for (size_t b = 0; b < n / block; ++b) decode(p + b * size, out.data() + b * block);
      break;
    }
  }
  return out;
}

std::vector<uint8_t> encode_gguf_tensor(GgmlType type, std::span<const float> values) {
  const GgmlTypeTraits& traits = traits_of(type);
  const size_t n = values.size();
  if (n % static_cast<size_t>(traits.block_size) != 0) {
    throw InputError(fmt::format("[gguf] cannot encode {} values as {}: not a multiple of its "
                                 "{}-element block",
                                 n, traits.name, traits.block_size));
  }
  const size_t blocks = n / static_cast<size_t>(traits.block_size);
  std::vector<uint8_t> out(blocks * static_cast<size_t>(traits.type_size));
  switch (type) {
    case GgmlType::f32:
      if (n > 0) std::memcpy(out.data(), values.data(), n * sizeof(float));
      break;
    case GgmlType::f16:
    case GgmlType::bf16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = type == GgmlType::f16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
        out[2 * i] = static_cast<uint8_t>(h & 0xFF);
        out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
      }
      break;
    case GgmlType::q8_0:
      check_finite(type, values);
      for (size_t b = 0; b < blocks; ++b) {
        encode_q8_0_block(values.data() + b * kQ8Block, out.data() + b * 34);
      }
      break;
    case GgmlType::q4_0:
      check_finite(type, values);
      for (size_t b = 0; b < blocks; ++b) {
        encode_q4_0_block(values.data() + b * kQ4Block, out.data() + b * 18);
      }
      break;
    case GgmlType::q4_1:
      check_finite(type, values);
      for (size_t b = 0; b < blocks; ++b) {
        encode_q4_1_block(values.data() + b * kQ4Block, out.data() + b * 20);
      }
      break;
    case GgmlType::mxfp4: {
      check_finite(type, values);
      const std::array<float, 16> doubled = mxfp4_doubled_values();
      for (size_t b = 0; b < blocks; ++b) {
        encode_mxfp4_block(values.data() + b * kMxBlock, out.data() + b * 17, doubled);
      }
      break;
    }
    case GgmlType::tq2_0:
      check_finite(type, values);
      for (size_t b = 0; b < blocks; ++b) encode_tq2_0_block(values.data() + b * 256, out.data() + b * 66);
      break;
    default:
      throw InputError(fmt::format("[gguf] cannot encode {}: concord encodes F32, F16, BF16, Q4_0, "
                                   "Q4_1, Q8_0, MXFP4 and TQ2_0",
                                   traits.name));
  }
  return out;
}

}  // namespace concord::io
