// The device codec: concord's element formats, scale rules and Philox stream written once for
// both sides of the bus — every function here compiles as __host__ __device__ under nvcc and as
// plain inline C++ under g++. The GPU quantizers (quantize.cu) are built from it; on the CPU,
// tests/cuda/codec_test.cpp checks every function against the numerics layer's reference
// (encode_ref, mx_scale_code, nvfp4_*, RandomStream) on edge values, random values and whole
// slices of the fp32 line, so a CPU-only machine already proves the arithmetic the GPU runs. What
// only the GPU can show (nvcc's code generation, the launch geometry, packing across threads) is
// tools/gpu_check.sh's work.
//
// Deliberately free of the numerics headers (std::array, std::string_view, the traits table):
// nothing here needs more than integers and IEEE fp32 multiplies and divides, written with the
// _rn intrinsics on the device so that no FMA contraction or fast-math flag can change a bit. The
// rules are the ones stated in numerics/rounding.h, format.h, quant_desc.h and block.h.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__CUDACC__)
#define CONCORD_HD __host__ __device__ __forceinline__
#else
#define CONCORD_HD inline
#endif

namespace concord::cuda {

// The element formats the GPU encodes (ids equal numerics::Format's; codec_test.cpp checks).
enum class Elem : uint8_t { bf16 = 1, fp16 = 2, e4m3 = 3, e5m2 = 4, e2m3 = 5, e3m2 = 6, e2m1 = 7, ue4m3 = 9 };
// numerics::Rounding and Overflow, same ids.
enum class Round : uint8_t { rne = 0, rtz = 1, sr = 2 };
enum class Over : uint8_t { saturate = 0, ieee = 1 };
// numerics::ScaleRule, same ids.
enum class MxRule : uint8_t { floor = 0, ceil = 1, even = 2, rceil = 3 };

// --- fp32 bits -------------------------------------------------------------------------------

CONCORD_HD uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<uint32_t>(x);
#endif
}
CONCORD_HD float float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  return std::bit_cast<float>(b);
#endif
}
CONCORD_HD int leading_zeros(uint32_t v) {  // v != 0
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(v));
#else
  return std::countl_zero(v);
#endif
}
// IEEE fp32 multiply and divide, round to nearest even, subnormals kept.
CONCORD_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
CONCORD_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// x * m as the CPU reference computes it, NaNs included: x86's multiply returns its first NaN
// operand (quieted, sign kept) where an NVIDIA GPU returns the canonical NaN 0x7FFFFFFF — and the
// sign of a NaN decides its code (e4m3 0xFF vs 0x7F; e2m1 has no NaN and keeps the sign: -0).
CONCORD_HD float mul_as_cpu(float x, float m) {
#if defined(__CUDA_ARCH__)
  const uint32_t xb = __float_as_uint(x), mb = __float_as_uint(m);
  if ((xb & 0x7FFFFFFFu) > 0x7F800000u) return __uint_as_float(xb | 0x400000u);
  if ((mb & 0x7FFFFFFFu) > 0x7F800000u) return __uint_as_float(mb | 0x400000u);
  return __fmul_rn(x, m);
#else
  return x * m;
#endif
}
// fmin with C's rule: a NaN operand loses to a number.
CONCORD_HD float fmin_num(float a, float b) {
  if (a != a) return b;
  if (b != b) return a;
  return a < b ? a : b;
}
CONCORD_HD bool is_nan_bits(uint32_t b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }
CONCORD_HD bool is_finite_bits(uint32_t b) { return (b & 0x7F800000u) != 0x7F800000u; }
constexpr float kFloatMax = 3.4028234663852886e38f;

// --- Formats ---------------------------------------------------------------------------------

// How a format spends its top exponent field (numerics::Specials without e8m0 and integers).
enum class Top : uint8_t { ieee, fn, none };

struct ElemSpec {
  int bits;          // code width
  int ebits, mbits;  // exponent and mantissa field widths
  int bias;
  Top top;
  bool is_signed;
  CONCORD_HD int emin() const { return 1 - bias; }
  CONCORD_HD int emax() const { return (1 << ebits) - (top == Top::ieee ? 2 : 1) - bias; }
  // The largest mantissa field at emax (fn formats keep all-ones for NaN).
  CONCORD_HD uint32_t top_mantissa() const { return (1u << mbits) - (top == Top::fn ? 2u : 1u); }
  CONCORD_HD uint32_t sign_code(bool negative) const {
    return (is_signed && negative) ? (1u << (bits - 1)) : 0u;
  }
  CONCORD_HD uint32_t max_code(bool negative) const {
    return sign_code(negative) | (static_cast<uint32_t>(emax() + bias) << mbits) | top_mantissa();
  }
  CONCORD_HD uint32_t inf_code(bool negative) const {  // top == ieee
    return sign_code(negative) | (((1u << ebits) - 1u) << mbits);
  }
  CONCORD_HD uint32_t nan_code(bool negative) const {  // top != none
    if (top == Top::ieee) return inf_code(negative) | (1u << (mbits - 1));
    return sign_code(negative) | (((1u << ebits) - 1u) << mbits) | ((1u << mbits) - 1u);
  }
};

CONCORD_HD ElemSpec spec_of(Elem f) {
  switch (f) {
    case Elem::bf16: return {16, 8, 7, 127, Top::ieee, true};
    case Elem::fp16: return {16, 5, 10, 15, Top::ieee, true};
    case Elem::e4m3: return {8, 4, 3, 7, Top::fn, true};
    case Elem::e5m2: return {8, 5, 2, 15, Top::ieee, true};
    case Elem::e2m3: return {6, 2, 3, 1, Top::none, true};
    case Elem::e3m2: return {6, 3, 2, 3, Top::none, true};
    case Elem::e2m1: return {4, 2, 1, 1, Top::none, true};
    case Elem::ue4m3: return {8, 4, 3, 7, Top::fn, false};
  }
  return {4, 2, 1, 1, Top::none, true};
}

// Bits of storage per code as concord packs them (block.h): 4-bit formats two to a byte.
CONCORD_HD int storage_bits(Elem f) {
  const int b = spec_of(f).bits;
  return b <= 4 ? 4 : b <= 8 ? 8 : 16;
}

// --- The encoder -----------------------------------------------------------------------------

CONCORD_HD uint32_t overflow_code(const ElemSpec& s, bool negative, Over over) {
  if (over == Over::ieee) {
    if (s.top == Top::ieee) return s.inf_code(negative);
    if (s.top == Top::fn) return s.nan_code(negative);
  }
  return s.max_code(negative);
}

// fp32 -> one code of format f (rounding.h's rules; random is used by Round::sr only).
CONCORD_HD uint32_t encode(Elem f, float x, Round round, Over over, uint32_t random = 0) {
  const ElemSpec s = spec_of(f);
  const uint32_t b = bits_of(x);
  const bool negative = (b >> 31) != 0;
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return s.top == Top::none ? s.sign_code(negative) : s.nan_code(negative);
  if (!s.is_signed && negative && a != 0) return s.nan_code(false);
  if (a == 0x7F800000u) return overflow_code(s, negative, over);
  if (a == 0) return s.sign_code(negative);

  // |x| = sig * 2^e2 with an integer sig < 2^24; lg = floor(log2 |x|).
  const uint32_t field = a >> 23;
  const uint64_t sig = field != 0 ? ((a & 0x7FFFFFu) | 0x800000u) : a;
  const int e2 = field != 0 ? static_cast<int>(field) - 150 : -149;
  const int lg = e2 + 31 - leading_zeros(static_cast<uint32_t>(sig));
  // Round toward zero stops at the largest finite value (IEEE 754), whatever the policy.
  const Over finite_over = round == Round::rtz ? Over::saturate : over;
  if (lg > s.emax()) return overflow_code(s, negative, finite_over);  // >= 2^(emax+1): past max

  int e = lg > s.emin() ? lg : s.emin();  // the binade; below emin the quantum stays fixed
  int shift = (e - s.mbits) - e2;          // bits of sig below the quantum
  uint64_t n;
  if (shift <= 0) {
    n = sig << -shift;
  } else {
    if (shift > 60) shift = 60;  // sig < 2^24: every rule answers at 60 as beyond it
    n = sig >> shift;
    const uint64_t rem = sig & ((uint64_t{1} << shift) - 1u);
    if (rem != 0) {
      if (round == Round::rne) {
        const uint64_t half = uint64_t{1} << (shift - 1);
        n += (rem > half || (rem == half && (n & 1u))) ? 1u : 0u;
      } else if (round == Round::sr) {
        // The discarded fraction as a 32-bit fixed-point D (itself rounded to nearest even when
        // finer than 2^-32); away from zero iff D + random >= 2^32.
        uint64_t d;
        if (shift <= 32) {
          d = rem << (32 - shift);
        } else {
          const int t = shift - 32;
          d = rem >> t;
          const uint64_t r = rem & ((uint64_t{1} << t) - 1u), half = uint64_t{1} << (t - 1);
          d += (r > half || (r == half && (d & 1u))) ? 1u : 0u;
        }
        n += (d + random >= (uint64_t{1} << 32)) ? 1u : 0u;
      }
    }
  }
  const uint64_t one = uint64_t{1} << s.mbits;
  if (n >= 2 * one) {  // carried into the next binade (n is exactly 2^(mbits+1))
    n >>= 1;
    ++e;
  }
  if (n == 0) return s.sign_code(negative);
  const bool normal = n >= one;
  const uint32_t mantissa = static_cast<uint32_t>(n & (one - 1u));
  if (e > s.emax() || (e == s.emax() && mantissa > s.top_mantissa())) {
    return overflow_code(s, negative, finite_over);
  }
  return s.sign_code(negative) | (static_cast<uint32_t>(normal ? e + s.bias : 0) << s.mbits) | mantissa;
}

// One code of format f -> fp32 (exact; NaN codes give a quiet NaN with the code's sign).
CONCORD_HD float decode(Elem f, uint32_t code) {
  const ElemSpec s = spec_of(f);
  code &= (1u << s.bits) - 1u;
  const bool negative = s.is_signed && ((code >> (s.bits - 1)) & 1u);
  const uint32_t sign = negative ? 0x80000000u : 0u;
  const uint32_t field = (code >> s.mbits) & ((1u << s.ebits) - 1u);
  const uint32_t mantissa = code & ((1u << s.mbits) - 1u);
  const uint32_t top_field = (1u << s.ebits) - 1u;
  if (!s.is_signed && (code >> (s.bits - 1)) != 0) return float_of(0x7FC00000u);
  if (s.top == Top::ieee && field == top_field) {
    return float_of(sign | (mantissa == 0 ? 0x7F800000u : 0x7FC00000u));
  }
  if (s.top == Top::fn && field == top_field && mantissa == (1u << s.mbits) - 1u) {
    return float_of(sign | 0x7FC00000u);
  }
  if (field == 0) {
    if (mantissa == 0) return float_of(sign);
    // mantissa * 2^(emin - mbits): an fp32 subnormal for bf16 (its subnormals are fp32's, the
    // code shifted), an fp32 normal for every narrower format.
    const int top = 31 - leading_zeros(mantissa);
    const int exponent = s.emin() - s.mbits + top;
    if (exponent < -126) return float_of(sign | (mantissa << (s.emin() - s.mbits + 149)));
    const uint32_t frac = (mantissa << (23 - top)) & 0x7FFFFFu;
    return float_of(sign | (static_cast<uint32_t>(exponent + 127) << 23) | frac);
  }
  const int exponent = static_cast<int>(field) - s.bias;  // >= -126 for every format here
  return float_of(sign | (static_cast<uint32_t>(exponent + 127) << 23) | (mantissa << (23 - s.mbits)));
}

// --- Philox4x32-10 (numerics/philox.h's stream) ---------------------------------------------

struct Words4 {
  uint32_t w[4];
};

CONCORD_HD uint32_t mul_hi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// The four words of block `index` of stream (seed, stream): element i of a tensor takes word
// i % 4 of block i / 4.
CONCORD_HD Words4 philox_block(uint64_t seed, uint32_t stream, uint64_t index) {
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32), c2 = stream,
           c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mul_hi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = mul_hi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// --- Scales ----------------------------------------------------------------------------------

// The exponent of the element format's largest binade and its largest value (MX rules).
CONCORD_HD int elem_emax(Elem f) { return spec_of(f).emax(); }
CONCORD_HD float elem_max(Elem f) { return decode(f, spec_of(f).max_code(false)); }

// The MX block's e8m0 scale code for a block amax (quant_desc.h's ScaleRule; 0xFF = NaN).
CONCORD_HD uint8_t mx_scale_code(float amax, Elem f, MxRule rule) {
  const uint32_t a = bits_of(amax) & 0x7FFFFFFFu;
  if (!is_finite_bits(a)) return 0xFF;
  const int field = static_cast<int>(a >> 23);
  const int emax = elem_emax(f);
  int x = 0;
  switch (rule) {
    case MxRule::floor:
      x = field - 127 - emax;
      break;
    case MxRule::ceil:
      x = field - 127 + ((a & 0x7FFFFFu) != 0 ? 1 : 0) - emax;
      break;
    case MxRule::even: {  // amax rounded half up to the element's mantissa width
      const uint32_t up = a + (1u << (22 - spec_of(f).mbits));
      x = static_cast<int>(up >> 23) - 127 - emax;
      break;
    }
    case MxRule::rceil: {  // ceil(log2(amax * (1 / max_elem))) in fp32
      const uint32_t d = bits_of(mul_rn(float_of(a), div_rn(1.0f, elem_max(f))));
      const uint32_t dfield = d >> 23, dm = d & 0x7FFFFFu;
      const bool up = dfield == 0 ? dm > 0x400000u : dm != 0;  // 2^-127 is the smallest scale
      x = static_cast<int>(dfield + (up ? 1u : 0u)) - 127;
      break;
    }
  }
  x = x < -127 ? -127 : x > 127 ? 127 : x;
  return static_cast<uint8_t>(x + 127);
}

// What an MX block's elements are multiplied by before their cast: 2^(127 - code), exact
// (2^-127 is an fp32 subnormal); NaN for the NaN scale.
CONCORD_HD float mx_multiplier(uint8_t code) {
  if (code == 0xFF) return float_of(0x7FC00000u);
  const int e = 127 - static_cast<int>(code);
  return e >= -126 ? float_of(static_cast<uint32_t>(e + 127) << 23) : float_of(1u << (e + 149));
}

// The value an e8m0 scale code stands for, 2^(code - 127) (2^-127 an fp32 subnormal); NaN for
// 0xFF — numerics::decode_ref(Format::e8m0, code), what a dequantized MX element is multiplied by.
CONCORD_HD float e8m0_value(uint8_t code) {
  if (code == 0xFF) return float_of(0x7FC00000u);
  return code >= 1 ? float_of(static_cast<uint32_t>(code) << 23) : float_of(0x00400000u);
}

// NVFP4 (Transformer Engine): the fp32 global encode scale 448*6/amax (1 for a zero amax, FLT_MAX
// for a NaN one), the ue4m3 block scale, and the elements' multiplier.
CONCORD_HD float nvfp4_global_encode(float tensor_amax) {
  const float s = fmin_num(div_rn(2688.0f, tensor_amax), kFloatMax);
  if (tensor_amax == 0.0f || s == 0.0f) return 1.0f;
  return s;
}
CONCORD_HD uint8_t nvfp4_scale_code(float block_amax, float global_encode) {
  const float decode_scale = mul_rn(block_amax, mul_rn(global_encode, 1.0f / 6.0f));
  return static_cast<uint8_t>(encode(Elem::ue4m3, decode_scale, Round::rne, Over::saturate));
}
CONCORD_HD float nvfp4_multiplier(uint8_t scale_code, float tensor_scale) {
  const float block_decode = decode(Elem::ue4m3, scale_code);
  return fmin_num(div_rn(1.0f, mul_rn(block_decode, tensor_scale)), kFloatMax);
}

// The per-tensor (fp8-tensor) encode scale S = max_elem / amax (1 for a zero or non-finite amax).
CONCORD_HD float per_tensor_encode(float amax, Elem f) {
  return (amax > 0.0f && is_finite_bits(bits_of(amax))) ? div_rn(elem_max(f), amax) : 1.0f;
}

// NaN-propagating max of magnitudes, as ordered fp32 bits: |x| bits order like their values and
// every NaN's bits exceed Inf's, so an integer max of (bits & 0x7FFFFFFF) is amax_ref's answer
// (any NaN reads as NaN).
CONCORD_HD uint32_t abs_bits(float x) { return bits_of(x) & 0x7FFFFFFFu; }

}  // namespace concord::cuda
