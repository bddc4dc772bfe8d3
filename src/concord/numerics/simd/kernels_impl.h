// The numerics kernels, written once over GCC vector extensions and compiled once per ISA.
//
// Include this file from exactly one .cpp per ISA after defining CONCORD_SIMD_NAMESPACE (a
// unique namespace name) and CONCORD_SIMD_WIDTH (32-bit lanes per vector: 4, 8 or 16). Every
// helper has internal linkage and nothing here calls an inline library function, so no code
// compiled with AVX-512 flags can be merged by the linker into the generic path (ODR).
//
// The encoder mirrors encode_ref's integer-significand rounding without branches: the binade
// e = max(floor(log2|x|), emin) fixes the quantum 2^(e - mantissa_bits); the fp32 significand
// is shifted right by the quantum's distance s >= 13, the discarded bits decide the rounding,
// and the magnitude code ((e + bias - 1) << mantissa_bits) + kept lets a carry out of the
// mantissa step into the next binade (and from subnormal to normal) by plain addition. The hot
// formats are specialised at compile time (bf16: one add and shift; e2m1 RNE: a count of the
// midpoints below |x|), each bit-identical to the general method.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "concord/numerics/simd/kernels.h"

#ifndef CONCORD_SIMD_NAMESPACE
#error "define CONCORD_SIMD_NAMESPACE and CONCORD_SIMD_WIDTH before including kernels_impl.h"
#endif

namespace concord::numerics::simd::CONCORD_SIMD_NAMESPACE {
namespace {

constexpr int W = CONCORD_SIMD_WIDTH;  // lanes per vector
constexpr int G = 4 * W;               // elements per group: W Philox blocks of 4 words

typedef uint32_t u32v __attribute__((vector_size(4 * W)));
typedef int32_t i32v __attribute__((vector_size(4 * W)));
typedef float f32v __attribute__((vector_size(4 * W)));
typedef uint64_t u64v __attribute__((vector_size(4 * W)));

inline u32v splat(uint32_t v) { return u32v{} + v; }
inline i32v splat_i(int32_t v) { return i32v{} + v; }
inline f32v splat_f(float v) { return f32v{} + v; }
inline u32v as_u(i32v v) { return reinterpret_cast<u32v>(v); }
inline u32v as_u(f32v v) { return reinterpret_cast<u32v>(v); }
inline f32v as_f(u32v v) { return reinterpret_cast<f32v>(v); }
inline i32v as_i(u32v v) { return reinterpret_cast<i32v>(v); }
inline i32v max_i(i32v a, i32v b) { return a > b ? a : b; }
inline i32v min_i(i32v a, i32v b) { return a < b ? a : b; }
inline u32v max_u(u32v a, u32v b) { return a > b ? a : b; }
// Comparison masks are -1/0; as 0/1 integers for arithmetic.
inline u32v bit(i32v mask) { return as_u(mask) & 1u; }

template <class T>
inline T load(const void* p) {
  T v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
inline void store(void* p, T v) {
  __builtin_memcpy(p, &v, sizeof v);
}

inline u32v iota() {
  u32v v{};
  for (int i = 0; i < W; ++i) v[i] = static_cast<uint32_t>(i);
  return v;
}

// ---- Philox4x32-10 over W counters at once (lanes = blocks of 4 elements) ----

// 32x32 -> 64-bit products of the even lanes (the pmuludq family), the one place where an
// intrinsic is needed: GCC's vector extensions have no widening multiply.
inline u64v mul_even_lanes(u32v a, u32v b) {
#if CONCORD_SIMD_WIDTH == 16 && !defined(__AVX512F__)
  // 16 lanes without AVX-512 (the "wide16" test build): the same products, lane by lane.
  u64v out;
  for (int i = 0; i < W / 2; ++i) out[i] = uint64_t{a[2 * i]} * b[2 * i];
  return out;
#elif CONCORD_SIMD_WIDTH == 16
  // maskz with every lane set: the plain intrinsic trips GCC 12's -Wmaybe-uninitialized.
  return reinterpret_cast<u64v>(_mm512_maskz_mul_epu32(static_cast<__mmask8>(0xFF),
                                                       reinterpret_cast<__m512i>(a),
                                                       reinterpret_cast<__m512i>(b)));
#elif CONCORD_SIMD_WIDTH == 8
  return reinterpret_cast<u64v>(
      _mm256_mul_epu32(reinterpret_cast<__m256i>(a), reinterpret_cast<__m256i>(b)));
#else
  return reinterpret_cast<u64v>(
      _mm_mul_epu32(reinterpret_cast<__m128i>(a), reinterpret_cast<__m128i>(b)));
#endif
}

// Shuffle index helpers (constant expressions for __builtin_shufflevector).
constexpr int hi_index(int i) { return (i & 1) ? W + i : i + 1; }
constexpr int zip_lo_index(int i) { return (i & 1) ? W + i / 2 : i / 2; }
constexpr int zip_hi_index(int i) { return (i & 1) ? W + W / 2 + i / 2 : W / 2 + i / 2; }

template <int... I>
inline void mul_hi_lo(u32v a, u32v b, u32v& hi, u32v& lo, std::integer_sequence<int, I...>) {
  const u32v even = reinterpret_cast<u32v>(mul_even_lanes(a, b));
  const u32v odd = reinterpret_cast<u32v>(
      mul_even_lanes(reinterpret_cast<u32v>(reinterpret_cast<u64v>(a) >> 32), b));
  hi = __builtin_shufflevector(even, odd, hi_index(I)...);
  lo = a * b;  // the low halves: one multiply instead of a shuffle and a blend
}

template <int... I>
inline u32v zip_lo(u32v a, u32v b, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(a, b, zip_lo_index(I)...);
}
template <int... I>
inline u32v zip_hi(u32v a, u32v b, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(a, b, zip_hi_index(I)...);
}

using Lanes = std::make_integer_sequence<int, W>;

// The random words of elements first_block*4 .. first_block*4 + K*G - 1, in element order:
// words[k] holds elements k*W .. k*W + W - 1 (RandomStream::word, philox.h, bit for bit).
// K independent sets of W counters run through the rounds together: one set is a chain of
// dependent multiplies, so more sets fill the pipeline.
constexpr int kPhiloxSets = 4;  // counter sets per Philox call on full groups

template <int K>
inline void philox_groups(const RandomStream& rng, uint64_t first_block, u32v words[4 * K]) {
  u32v c0[K], c1[K], c2[K], c3[K];
  for (int k = 0; k < K; ++k) {
    const uint64_t block = first_block + static_cast<uint64_t>(k * W);
    const u32v lo = splat(static_cast<uint32_t>(block));
    c0[k] = lo + iota();
    c1[k] = splat(static_cast<uint32_t>(block >> 32)) + bit(c0[k] < lo);
    c2[k] = splat(rng.stream);
    c3[k] = splat(0u);
  }
  uint32_t k0 = static_cast<uint32_t>(rng.seed), k1 = static_cast<uint32_t>(rng.seed >> 32);
  const u32v m0 = splat(0xD2511F53u), m1 = splat(0xCD9E8D57u);
  for (int round = 0; round < 10; ++round) {
    for (int k = 0; k < K; ++k) {
      u32v hi0, lo0, hi1, lo1;
      mul_hi_lo(c0[k], m0, hi0, lo0, Lanes{});
      mul_hi_lo(c2[k], m1, hi1, lo1, Lanes{});
      const u32v n0 = hi1 ^ c1[k] ^ k0, n2 = hi0 ^ c3[k] ^ k1;
      c0[k] = n0;
      c1[k] = lo1;
      c2[k] = n2;
      c3[k] = lo0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Lane b holds block b's words (c0..c3); element 4b+j takes word j: a 4 x W transpose.
  for (int k = 0; k < K; ++k) {
    const u32v a = zip_lo(c0[k], c2[k], Lanes{}), b = zip_lo(c1[k], c3[k], Lanes{});
    const u32v c = zip_hi(c0[k], c2[k], Lanes{}), d = zip_hi(c1[k], c3[k], Lanes{});
    words[4 * k + 0] = zip_lo(a, b, Lanes{});
    words[4 * k + 1] = zip_hi(a, b, Lanes{});
    words[4 * k + 2] = zip_lo(c, d, Lanes{});
    words[4 * k + 3] = zip_hi(c, d, Lanes{});
  }
}

// ---- fp32 -> element code ----

// Format knowledge at compile time: the hot formats get their mantissa width and bias as
// constants (immediate shifts, folded constants); RuntimeFormat reads them from EncodeParams.
// Bf16Format marks the one format whose quantum is always 2^16 fp32 units (bf16 is fp32's top
// half, subnormals included), where the whole rounding is one add and one shift.
struct RuntimeFormat {
  static constexpr bool fixed = false;
};
template <int MantissaBits, int Bias>
struct FixedFormat {
  static constexpr bool fixed = true;
  static constexpr int mantissa_bits = MantissaBits;
  static constexpr int bias = Bias;
};
struct Bf16Format {
  static constexpr bool fixed = true;
  static constexpr int mantissa_bits = 7;
  static constexpr int bias = 127;
};

// Overflow, specials and sign, shared by every format: `magnitude` is the rounded magnitude
// code of a finite input (possibly past the largest finite code).
template <class F>
inline u32v finish_code(const EncodeParams& p, u32v sign, u32v a, u32v magnitude) {
  // Every operand below is < 2^31: signed compares are single instructions on x86.
  const i32v ai = as_i(a);
  u32v code = as_i(magnitude) > static_cast<int32_t>(p.max_magnitude)
                  ? splat(p.finite_overflow_magnitude)
                  : magnitude;
  const u32v special = ai == 0x7F800000 ? splat(p.inf_magnitude) : splat(p.nan_magnitude);
  code = ai >= 0x7F800000 ? special : code;
  if (!F::fixed && p.is_unsigned) {
    return (sign != 0u) & (a != 0u) & (a <= 0x7F800000u) ? splat(p.nan_magnitude) : code;
  }
  return code | (sign << static_cast<uint32_t>(p.sign_shift));
}

// bf16: the quantum is 2^16 fp32 units for every finite input, so the rounded magnitude code
// is (|x| bits + increment) >> 16 (a carry steps into the next binade, the top one into Inf,
// which finish_code treats as overflow). Stochastic: D = rem << 16 carries with r exactly
// when rem + (r >> 16) >= 2^16, as r's low 16 bits cannot complete a carry.
template <Rounding R>
inline u32v encode_bf16_vector(const EncodeParams& p, u32v bits, u32v random) {
  const u32v sign = bits >> 31;
  const u32v a = bits & 0x7FFFFFFFu;
  u32v n;
  if constexpr (R == Rounding::rne) {
    n = (a + 0x7FFFu + ((a >> 16) & 1u)) >> 16;
  } else if constexpr (R == Rounding::rtz) {
    n = a >> 16;
  } else {
    n = (a + (random >> 16)) >> 16;
  }
  return finish_code<Bf16Format>(p, sign, a, n);
}

// e2m1 has eight magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}: under RNE the magnitude code is the
// number of midpoints below |x|, a midpoint counting when reached exactly only if the code
// above it is even (0.75, 1.75 and 3.5 round up; 0.25, 1.25, 2.5 and 5 round down). Past 6
// the count stops at 7, the largest finite code, which is also e2m1's overflow code.
struct E2m1Format {
  static constexpr bool fixed = true;
  static constexpr int mantissa_bits = 1;
  static constexpr int bias = 1;
};

inline u32v encode_e2m1_rne_vector(const EncodeParams& p, u32v bits) {
  const u32v sign = bits >> 31;
  const u32v a = bits & 0x7FFFFFFFu;
  const i32v ai = as_i(a);  // fp32 bits of |x| order like the values
  const i32v count = (ai > 0x3E800000) + (ai > 0x3F3FFFFF) + (ai > 0x3FA00000) +
                     (ai > 0x3FDFFFFF) + (ai > 0x40200000) + (ai > 0x405FFFFF) +
                     (ai > 0x40A00000);  // each true compare is -1
  return finish_code<E2m1Format>(p, sign, a, as_u(-count));
}

template <Rounding R, class F>
inline u32v encode_vector(const EncodeParams& p, u32v bits, u32v random) {
  if constexpr (std::is_same_v<F, Bf16Format>) {
    return encode_bf16_vector<R>(p, bits, random);
  } else if constexpr (std::is_same_v<F, E2m1Format> && R == Rounding::rne) {
    return encode_e2m1_rne_vector(p, bits);
  } else {
  int M = 0, bias = 0;
  if constexpr (F::fixed) {
    M = F::mantissa_bits;
    bias = F::bias;
  } else {
    M = p.mantissa_bits;
    bias = p.bias;
  }
  const u32v sign = bits >> 31;
  const u32v a = bits & 0x7FFFFFFFu;
  const i32v exponent_field = as_i(a >> 23);
  const i32v effective_field = max_i(exponent_field, splat_i(1));  // fp32 subnormals: 1
  const u32v significand =
      (a & 0x7FFFFFu) | (as_u(exponent_field > 0) & 0x800000u);
  const i32v e = max_i(effective_field - 127, splat_i(1 - bias));  // binade, >= emin
  const i32v shift = e - M - effective_field + 150;                // >= 13
  const u32v s = as_u(min_i(shift, splat_i(31)));  // beyond 31 every rule agrees (sig < 2^24)
  u32v n;
  if constexpr (R == Rounding::rne) {
    // Adding half a quantum minus one, plus the kept lsb, carries exactly when RNE rounds up.
    const u32v lsb = (significand >> s) & 1u;
    n = (significand + ((splat(1u) << (s - 1u)) - 1u) + lsb) >> s;
  } else if constexpr (R == Rounding::rtz) {
    n = significand >> s;
  } else {
    const u32v kept = significand >> s;
    const u32v rem = significand & ((splat(1u) << s) - 1u);
    // D = the discarded fraction as 32-bit fixed point, RNE'd when it has more than 32 bits.
    const u32v left = as_u(max_i(32 - shift, splat_i(0)));
    const u32v t = as_u(min_i(max_i(shift - 32, splat_i(0)), splat_i(25)));
    const u32v coarse = rem >> t;
    const u32v dropped = rem & ((splat(1u) << t) - 1u);
    const u32v half_t = (splat(1u) << t) >> 1;
    const u32v coarse_up = bit((t > 0u) & ((dropped > half_t) |
                                           ((dropped == half_t) & ((coarse & 1u) != 0))));
    const u32v d = (as_u(shift <= 32) & (rem << left)) | (as_u(shift > 32) & (coarse + coarse_up));
    n = kept + bit(d + random < d);  // d + r >= 2^32: the 32-bit sum carried out
  }
  const u32v magnitude = (as_u(e + (bias - 1)) << static_cast<uint32_t>(M)) + n;
  return finish_code<F>(p, sign, a, magnitude);
  }
}

template <ScaleMode S>
inline u32v scaled_input(const EncodeRequest& r, const float* x, size_t offset) {
  f32v v = load<f32v>(x + offset);
  if constexpr (S == ScaleMode::uniform) v = v * r.uniform_scale;
  if constexpr (S == ScaleMode::per_element) v = v * load<f32v>(r.element_scale + offset);
  if constexpr (S == ScaleMode::per_block) {
    const auto shift = static_cast<unsigned>(r.block_shift);
    const size_t block_mask = (size_t{1} << shift) - 1;
    if ((offset & block_mask) + W <= block_mask + 1) {
      v = v * r.block_scale[offset >> shift];
    } else {  // the vector straddles blocks (small blocks or an unaligned start)
      f32v scale;
      for (int j = 0; j < W; ++j) {
        scale[j] = r.block_scale[(offset + static_cast<size_t>(j)) >> shift];
      }
      v = v * scale;
    }
  }
  return as_u(v);
}

// ---- narrowing and widening of code vectors ----
// GCC scalarizes __builtin_convertvector between 32-bit and 8/16-bit lanes on x86, so these
// use the pack / zero-extend instructions of each width. Inputs are codes below 2^16 (16-bit)
// or 2^8 (8-bit).

// Codes of two vectors (2W elements) as 2W uint16_t, in element order.
inline void store_u16(void* out, u32v a, u32v b) {
#if CONCORD_SIMD_WIDTH == 16 && !defined(__AVX512F__)
  uint16_t o[2 * W];
  for (int i = 0; i < W; ++i) o[i] = static_cast<uint16_t>(a[i]), o[W + i] = static_cast<uint16_t>(b[i]);
  __builtin_memcpy(out, o, sizeof o);
#elif CONCORD_SIMD_WIDTH == 16
  store(out, _mm512_maskz_cvtepi32_epi16(static_cast<__mmask16>(0xFFFF),
                                        reinterpret_cast<__m512i>(a)));
  store(static_cast<uint8_t*>(out) + 32,
        _mm512_maskz_cvtepi32_epi16(static_cast<__mmask16>(0xFFFF),
                                    reinterpret_cast<__m512i>(b)));
#elif CONCORD_SIMD_WIDTH == 8
  // packus interleaves the 128-bit lanes: [a0..3 b0..3 | a4..7 b4..7]; vpermq restores order.
  const __m256i packed =
      _mm256_packus_epi32(reinterpret_cast<__m256i>(a), reinterpret_cast<__m256i>(b));
  store(out, _mm256_permute4x64_epi64(packed, 0xD8));
#else
  // SSE2 has only the signed pack: bias into int16 range and back.
  const __m128i bias = _mm_set1_epi32(0x8000);
  const __m128i packed = _mm_packs_epi32(_mm_sub_epi32(reinterpret_cast<__m128i>(a), bias),
                                         _mm_sub_epi32(reinterpret_cast<__m128i>(b), bias));
  store(out, _mm_xor_si128(packed, _mm_set1_epi16(static_cast<short>(0x8000))));
#endif
}

// Codes of four vectors (4W elements) as 4W bytes, in element order.
inline void store_u8(void* out, u32v a, u32v b, u32v c, u32v d) {
#if CONCORD_SIMD_WIDTH == 16 && !defined(__AVX512F__)
  uint8_t o[4 * W];
  for (int i = 0; i < W; ++i) {
    o[i] = static_cast<uint8_t>(a[i]);
    o[W + i] = static_cast<uint8_t>(b[i]);
    o[2 * W + i] = static_cast<uint8_t>(c[i]);
    o[3 * W + i] = static_cast<uint8_t>(d[i]);
  }
  __builtin_memcpy(out, o, sizeof o);
#elif CONCORD_SIMD_WIDTH == 16
  const __mmask16 all = static_cast<__mmask16>(0xFFFF);
  auto* o = static_cast<uint8_t*>(out);
  store(o, _mm512_maskz_cvtepi32_epi8(all, reinterpret_cast<__m512i>(a)));
  store(o + 16, _mm512_maskz_cvtepi32_epi8(all, reinterpret_cast<__m512i>(b)));
  store(o + 32, _mm512_maskz_cvtepi32_epi8(all, reinterpret_cast<__m512i>(c)));
  store(o + 48, _mm512_maskz_cvtepi32_epi8(all, reinterpret_cast<__m512i>(d)));
#elif CONCORD_SIMD_WIDTH == 8
  // Per 128-bit lane the packs give [a0..3 b0..3 c0..3 d0..3 | a4..7 b4..7 c4..7 d4..7].
  const __m256i ab =
      _mm256_packus_epi32(reinterpret_cast<__m256i>(a), reinterpret_cast<__m256i>(b));
  const __m256i cd =
      _mm256_packus_epi32(reinterpret_cast<__m256i>(c), reinterpret_cast<__m256i>(d));
  const __m256i bytes = _mm256_packus_epi16(ab, cd);
  store(out, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
  const __m128i ab = _mm_packs_epi32(reinterpret_cast<__m128i>(a), reinterpret_cast<__m128i>(b));
  const __m128i cd = _mm_packs_epi32(reinterpret_cast<__m128i>(c), reinterpret_cast<__m128i>(d));
  store(out, _mm_packus_epi16(ab, cd));
#endif
}

#if CONCORD_SIMD_WIDTH == 16 && !defined(__AVX512F__)
// The wide16 build's zero-extension: W narrow codes, lane by lane.
template <class Narrow>
inline u32v widen_lanes(const void* in) {
  Narrow v[W];
  __builtin_memcpy(v, in, sizeof v);
  u32v out;
  for (int i = 0; i < W; ++i) out[i] = v[i];
  return out;
}
#endif

// W codes from W uint16_t / W bytes, zero-extended.
inline u32v load_u16(const void* in) {
#if CONCORD_SIMD_WIDTH == 16 && !defined(__AVX512F__)
  return widen_lanes<uint16_t>(in);
#elif CONCORD_SIMD_WIDTH == 16
  return reinterpret_cast<u32v>(
      _mm512_maskz_cvtepu16_epi32(static_cast<__mmask16>(0xFFFF), load<__m256i>(in)));
#elif CONCORD_SIMD_WIDTH == 8
  return reinterpret_cast<u32v>(_mm256_cvtepu16_epi32(load<__m128i>(in)));
#else
  return reinterpret_cast<u32v>(
      _mm_unpacklo_epi16(_mm_loadl_epi64(static_cast<const __m128i*>(in)), _mm_setzero_si128()));
#endif
}
inline u32v load_u8(const void* in) {
#if CONCORD_SIMD_WIDTH == 16 && !defined(__AVX512F__)
  return widen_lanes<uint8_t>(in);
#elif CONCORD_SIMD_WIDTH == 16
  return reinterpret_cast<u32v>(
      _mm512_maskz_cvtepu8_epi32(static_cast<__mmask16>(0xFFFF), load<__m128i>(in)));
#elif CONCORD_SIMD_WIDTH == 8
  return reinterpret_cast<u32v>(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(in))));
#else
  const __m128i zero = _mm_setzero_si128();
  const __m128i bytes = _mm_cvtsi32_si128(static_cast<int>(load<uint32_t>(in)));
  return reinterpret_cast<u32v>(_mm_unpacklo_epi16(_mm_unpacklo_epi8(bytes, zero), zero));
#endif
}

template <class Code>
inline void store_codes4(Code* out, const u32v code[4]) {
  if constexpr (sizeof(Code) == 2) {
    store_u16(out, code[0], code[1]);
    store_u16(out + 2 * W, code[2], code[3]);
  } else {
    store_u8(out, code[0], code[1], code[2], code[3]);
  }
}

// K groups of G elements each, the first global index a multiple of 4.
template <Rounding R, ScaleMode S, class F, int K = 1, class Code>
inline void encode_group(const EncodeRequest& r, const float* x, Code* out, size_t offset,
                         uint64_t global_first) {
  u32v random[4 * K] = {};
  if constexpr (R == Rounding::stochastic) philox_groups<K>(r.rng, global_first >> 2, random);
  for (int g = 0; g < K; ++g) {
    u32v codes[4];
    for (int k = 0; k < 4; ++k) {
      const size_t at = offset + static_cast<size_t>(g * G + k * W);
      codes[k] = encode_vector<R, F>(r.params, scaled_input<S>(r, x, at), random[4 * g + k]);
    }
    store_codes4(out + offset + static_cast<size_t>(g * G), codes);
  }
}

// Groups are aligned to global indices (multiples of 4, for Philox); a partial group at
// either end runs through zero-padded copies of its inputs.
template <Rounding R, ScaleMode S, class F, class Code>
void encode_run(const EncodeRequest& r, const float* x, Code* out, size_t n) {
  const size_t head = static_cast<size_t>(r.first_index & 3u);
  size_t i = 0;  // next element to produce
  while (i < n) {
    const size_t lane0 = i == 0 ? head : 0;  // only the first group may start mid-block
    const size_t room = static_cast<size_t>(G) - lane0;
    const size_t count = n - i < room ? n - i : room;
    const uint64_t global_first = r.first_index + i - lane0;
    if constexpr (R == Rounding::stochastic) {
      if (lane0 == 0 && n - i >= static_cast<size_t>(kPhiloxSets * G)) {
        encode_group<R, S, F, kPhiloxSets>(r, x, out, i, global_first);
        i += static_cast<size_t>(kPhiloxSets * G);
        continue;
      }
    }
    if (count == static_cast<size_t>(G)) {
      encode_group<R, S, F>(r, x, out, i, global_first);
    } else {
      float xs[G] = {}, scales[G] = {};
      Code codes[G] = {};
      for (size_t j = 0; j < count; ++j) {
        xs[lane0 + j] = x[i + j];
        if constexpr (S == ScaleMode::per_element) scales[lane0 + j] = r.element_scale[i + j];
        if constexpr (S == ScaleMode::per_block) {
          scales[lane0 + j] = r.block_scale[(i + j) >> static_cast<unsigned>(r.block_shift)];
        }
      }
      EncodeRequest local = r;
      local.element_scale = scales;
      // Per-block factors travel as per-element ones through the padded copy.
      constexpr ScaleMode padded_mode = S == ScaleMode::per_block ? ScaleMode::per_element : S;
      encode_group<R, padded_mode, F>(local, xs, codes, 0, global_first);
      for (size_t j = 0; j < count; ++j) out[i + j] = codes[lane0 + j];
    }
    i += count;
  }
}

template <Rounding R, class F, class Code>
void encode_scale_mode(const EncodeRequest& r, const float* x, Code* out, size_t n) {
  switch (r.scale_mode) {
    case ScaleMode::none: return encode_run<R, ScaleMode::none, F>(r, x, out, n);
    case ScaleMode::uniform: return encode_run<R, ScaleMode::uniform, F>(r, x, out, n);
    case ScaleMode::per_element: return encode_run<R, ScaleMode::per_element, F>(r, x, out, n);
    case ScaleMode::per_block: return encode_run<R, ScaleMode::per_block, F>(r, x, out, n);
  }
}

template <class F, class Code>
void encode_format(const EncodeRequest& r, const float* x, Code* out, size_t n) {
  switch (r.rounding) {
    case Rounding::rne: return encode_scale_mode<Rounding::rne, F>(r, x, out, n);
    case Rounding::rtz: return encode_scale_mode<Rounding::rtz, F>(r, x, out, n);
    case Rounding::stochastic: return encode_scale_mode<Rounding::stochastic, F>(r, x, out, n);
  }
}

// The formats of the hot paths (bf16; e4m3 for MXFP8; e2m1 for MXFP4 and NVFP4) run with
// compile-time constants; every other format reads its parameters at run time.
void encode(const EncodeRequest& r, const float* x, void* codes, size_t n) {
  const EncodeParams& p = r.params;
  if (p.sixteen_bit) {
    auto* out = static_cast<uint16_t*>(codes);
    if (p.mantissa_bits == 7 && p.bias == 127) return encode_format<Bf16Format>(r, x, out, n);
    return encode_format<RuntimeFormat>(r, x, out, n);
  }
  auto* out = static_cast<uint8_t*>(codes);
  if (!p.is_unsigned && p.mantissa_bits == 3 && p.bias == 7) {
    return encode_format<FixedFormat<3, 7>>(r, x, out, n);
  }
  if (!p.is_unsigned && p.mantissa_bits == 1 && p.bias == 1) {
    return encode_format<E2m1Format>(r, x, out, n);
  }
  encode_format<RuntimeFormat>(r, x, out, n);
}

// ---- element code -> fp32 ----

inline f32v decode_vector(const DecodeParams& p, u32v code) {
  const uint32_t M = static_cast<uint32_t>(p.mantissa_bits);
  const u32v magnitude = code & p.magnitude_mask;
  const u32v exponent_field = magnitude >> M;
  const u32v mantissa = magnitude & ((1u << M) - 1u);
  const u32v normal = (magnitude << (23u - M)) + static_cast<uint32_t>((127 - p.bias) << 23);
  // Subnormal: mantissa * 2^(emin - M), exact in fp32 (emin = 1 - bias).
  const f32v subnormal = __builtin_convertvector(as_i(mantissa), f32v) * p.subnormal_unit;
  u32v bits = exponent_field == 0u ? as_u(subnormal) : normal;
  const u32v sign = (code >> static_cast<uint32_t>(p.sign_shift)) & 1u;
  if (p.ieee_specials) {
    const u32v top = splat(p.magnitude_mask >> M);
    bits = exponent_field == top ? (mantissa == 0u ? splat(0x7F800000u) : splat(0x7FC00000u))
                                 : bits;
  }
  if (p.fn_specials) bits = magnitude == p.magnitude_mask ? splat(0x7FC00000u) : bits;
  if (p.is_unsigned) return as_f(sign != 0u ? splat(0x7FC00000u) : bits);
  return as_f(bits | (sign << 31));
}

template <class Code>
inline u32v load_codes(const Code* in) {
  if constexpr (sizeof(Code) == 2) {
    return load_u16(in);
  } else {
    return load_u8(in);
  }
}

template <class Code>
inline void decode_vector_at(const DecodeRequest& r, const Code* codes, float* out,
                             size_t at) {
  f32v v = decode_vector(r.params, load_codes(codes + at));
  if (r.element_scale != nullptr) v = v * load<f32v>(r.element_scale + at);
  if (r.uniform_scale != nullptr) v = v * *r.uniform_scale;
  store(out + at, v);
}

template <class Code>
void decode_run(const DecodeRequest& r, const Code* codes, float* out, size_t n) {
  size_t i = 0;
  for (; i + W <= n; i += W) decode_vector_at(r, codes, out, i);
  if (i == n) return;
  Code padded[W] = {};
  float scales[W] = {}, values[W];
  for (size_t j = 0; i + j < n; ++j) {
    padded[j] = codes[i + j];
    if (r.element_scale != nullptr) scales[j] = r.element_scale[i + j];
  }
  DecodeRequest local = r;
  if (r.element_scale != nullptr) local.element_scale = scales;
  decode_vector_at(local, padded, values, 0);
  for (size_t j = 0; i + j < n; ++j) out[i + j] = values[j];
}

void decode(const DecodeRequest& r, const void* codes, float* out, size_t n) {
  if (r.params.sixteen_bit) {
    decode_run(r, static_cast<const uint16_t*>(codes), out, n);
  } else {
    decode_run(r, static_cast<const uint8_t*>(codes), out, n);
  }
}

// ---- amax, nibble packing ----

// |x| bits order like the values (NaN above Inf above finite), so an unsigned max is a
// NaN-propagating max of |x|.
constexpr int rotate_index(int i, int by) { return (i + by) % W; }

template <int... I>
inline uint32_t reduce_max(u32v v, std::integer_sequence<int, I...>) {
  if constexpr (W >= 16) v = max_u(v, __builtin_shufflevector(v, v, rotate_index(I, 8)...));
  if constexpr (W >= 8) v = max_u(v, __builtin_shufflevector(v, v, rotate_index(I, 4)...));
  v = max_u(v, __builtin_shufflevector(v, v, rotate_index(I, 2)...));
  v = max_u(v, __builtin_shufflevector(v, v, rotate_index(I, 1)...));
  return v[0];
}

// One step of a transposing reduction: lanes come in chunks of d; the result keeps a's even
// chunks and b's odd chunks, each the max of a chunk and its neighbour.
constexpr int fold_lo_index(int i, int d) { return (i / d) % 2 == 0 ? i : W + i - d; }
constexpr int fold_hi_index(int i, int d) { return (i / d) % 2 == 0 ? i + d : W + i; }
template <int D, int... I>
inline u32v fold(u32v a, u32v b, std::integer_sequence<int, I...>) {
  return max_u(__builtin_shufflevector(a, b, fold_lo_index(I, D)...),
               __builtin_shufflevector(a, b, fold_hi_index(I, D)...));
}
// Lane b of the result = max over the lanes of v[b] (W vectors in, one out).
template <int D = 1>
inline u32v transpose_max(u32v* v) {
  if constexpr (D >= W) {
    return v[0];
  } else {
    for (int k = 0; k < W / (2 * D); ++k) v[k] = fold<D>(v[2 * k], v[2 * k + 1], Lanes{});
    return transpose_max<2 * D>(v);
  }
}

void block_abs_max(const uint32_t* x, size_t n, size_t block, uint32_t* out) {
  size_t start = 0, b = 0;
  if (block % W == 0) {
    // W whole blocks at a time: one vector of maxima per block, then one transposing
    // reduction for all W instead of a horizontal one per block.
    for (; start + W * block <= n; start += W * block, b += W) {
      u32v acc[W];
      for (int k = 0; k < W; ++k) {
        const uint32_t* p = x + start + static_cast<size_t>(k) * block;
        u32v m = load<u32v>(p) & 0x7FFFFFFFu;
        for (size_t i = W; i < block; i += W) m = max_u(m, load<u32v>(p + i) & 0x7FFFFFFFu);
        acc[k] = m;
      }
      store(out + b, transpose_max(acc));
    }
  }
  for (; start < n; start += block, ++b) {
    const size_t end = start + block < n ? start + block : n;
    u32v acc = splat(0u);
    size_t i = start;
    // Long blocks (a whole tensor's amax): four vectors a step, prefetching ahead, to keep
    // more cache lines in flight than the hardware prefetcher alone.
    u32v acc1 = acc, acc2 = acc, acc3 = acc;
    for (; i + 4 * W <= end; i += 4 * W) {
      for (size_t line = 0; line < 4 * W; line += 16) __builtin_prefetch(x + i + 2048 + line);
      acc = max_u(acc, load<u32v>(x + i) & 0x7FFFFFFFu);
      acc1 = max_u(acc1, load<u32v>(x + i + W) & 0x7FFFFFFFu);
      acc2 = max_u(acc2, load<u32v>(x + i + 2 * W) & 0x7FFFFFFFu);
      acc3 = max_u(acc3, load<u32v>(x + i + 3 * W) & 0x7FFFFFFFu);
    }
    acc = max_u(max_u(acc, acc1), max_u(acc2, acc3));
    for (; i + W <= end; i += W) acc = max_u(acc, load<u32v>(x + i) & 0x7FFFFFFFu);
    uint32_t m = reduce_max(acc, Lanes{});
    for (; i < end; ++i) {
      const uint32_t v = x[i] & 0x7FFFFFFFu;
      m = v > m ? v : m;
    }
    out[b] = m;
  }
}

void abs_max_accumulate(const uint32_t* x, uint32_t* acc, size_t n) {
  size_t i = 0;
  for (; i + W <= n; i += W) {
    store(acc + i, max_u(load<u32v>(acc + i), load<u32v>(x + i) & 0x7FFFFFFFu));
  }
  for (; i < n; ++i) {
    const uint32_t v = x[i] & 0x7FFFFFFFu;
    acc[i] = v > acc[i] ? v : acc[i];
  }
}

void pack_nibbles(const uint8_t* codes, uint8_t* packed, size_t n) {
  const size_t pairs = n / 2;
  for (size_t k = 0; k < pairs; ++k) {
    packed[k] = static_cast<uint8_t>((codes[2 * k] & 0xFu) | ((codes[2 * k + 1] & 0xFu) << 4));
  }
  if (n & 1) packed[pairs] = static_cast<uint8_t>(codes[n - 1] & 0xFu);
}

void unpack_nibbles(const uint8_t* packed, uint8_t* codes, size_t n) {
  const size_t pairs = n / 2;
  for (size_t k = 0; k < pairs; ++k) {
    codes[2 * k] = static_cast<uint8_t>(packed[k] & 0xFu);
    codes[2 * k + 1] = static_cast<uint8_t>(packed[k] >> 4);
  }
  if (n & 1) codes[n - 1] = static_cast<uint8_t>(packed[pairs] & 0xFu);
}

}  // namespace

namespace {

// ---- fused row-block quantization ----

// Packs the 4-bit codes of 2*4 vectors (8W codes) into 4W bytes, element 2k in the low nibble:
// lanes 2k and 2k+1 meet in one 64-bit lane, then the even 32-bit lanes are gathered.
template <int... I>
inline u32v pair_nibbles(u32v a, u32v b, std::integer_sequence<int, I...>) {
  const u64v pa = (reinterpret_cast<u64v>(a) & 0xFu) | ((reinterpret_cast<u64v>(a) >> 32) << 4);
  const u64v pb = (reinterpret_cast<u64v>(b) & 0xFu) | ((reinterpret_cast<u64v>(b) >> 32) << 4);
  return __builtin_shufflevector(reinterpret_cast<u32v>(pa), reinterpret_cast<u32v>(pb),
                                 (2 * I)...);
}

constexpr size_t kPrefetchGroups = 4;

template <Rounding R, class F, bool Nibbles>
void encode_row_blocks_impl(const RowBlocksRequest& r, const float* x, size_t groups,
                            uint8_t* scales, uint8_t* codes) {
  const auto shift = static_cast<unsigned>(r.block_shift);
  const size_t block = size_t{1} << shift;
  const size_t vectors = block;  // W blocks of `block` elements: `block` vectors of W
  const auto* bits = reinterpret_cast<const uint32_t*>(x);  // fp32 bit patterns
  for (size_t g = 0; g < groups; ++g) {
    const uint32_t* in = bits + g * W * block;
    // Request the group kPrefetchGroups ahead: the arithmetic of this group then overlaps
    // the memory reads of later ones (prefetches past the end of the array do not fault).
    for (size_t line = 0; line < W * block; line += 16) {
      __builtin_prefetch(in + kPrefetchGroups * W * block + line);
    }
    u32v acc[W];
    for (int k = 0; k < W; ++k) {
      const uint32_t* p = in + static_cast<size_t>(k) * block;
      u32v m = load<u32v>(p) & 0x7FFFFFFFu;
      for (size_t i = W; i < block; i += W) m = max_u(m, load<u32v>(p + i) & 0x7FFFFFFFu);
      acc[k] = m;
    }
    const u32v amax = transpose_max(acc);
    uint32_t scale_codes[W];
    if (r.ue4m3_scale) {
      const u32v code = encode_vector<Rounding::rne, RuntimeFormat>(
          r.scale_params, as_u(as_f(amax) * r.scale_factor), splat(0u));
      for (int k = 0; k < W; ++k) scale_codes[k] = code[k];
    } else {
      for (int k = 0; k < W; ++k) scale_codes[k] = r.exponent_table[amax[k] >> 23];
    }
    float multiplier[W];
    for (int k = 0; k < W; ++k) {
      scales[g * W + static_cast<size_t>(k)] = static_cast<uint8_t>(scale_codes[k]);
      multiplier[k] = r.multiplier_table[scale_codes[k] & 0xFFu];
    }
    const float* group_x = x + g * W * block;
    // Four vectors (8-bit codes) or eight (nibbles) per store.
    constexpr size_t step = Nibbles ? 8 : 4;
    for (size_t v = 0; v < vectors; v += step) {
      u32v c[step];
      for (size_t j = 0; j < step; ++j) {
        const size_t at = (v + j) * W;
        const f32v value = load<f32v>(group_x + at) * multiplier[at >> shift];
        c[j] = encode_vector<R, F>(r.element.params, as_u(value), splat(0u));
      }
      if constexpr (Nibbles) {
        store_u8(codes + (g * W * block + v * W) / 2, pair_nibbles(c[0], c[1], Lanes{}),
                 pair_nibbles(c[2], c[3], Lanes{}), pair_nibbles(c[4], c[5], Lanes{}),
                 pair_nibbles(c[6], c[7], Lanes{}));
      } else {
        store_u8(codes + g * W * block + v * W, c[0], c[1], c[2], c[3]);
      }
    }
  }
}

template <class F, bool Nibbles>
void encode_row_blocks_rounding(const RowBlocksRequest& r, const float* x, size_t groups,
                                uint8_t* scales, uint8_t* codes) {
  if (r.element.rounding == Rounding::rtz) {
    return encode_row_blocks_impl<Rounding::rtz, F, Nibbles>(r, x, groups, scales, codes);
  }
  encode_row_blocks_impl<Rounding::rne, F, Nibbles>(r, x, groups, scales, codes);
}

void encode_row_blocks(const RowBlocksRequest& r, const float* x, size_t groups,
                       uint8_t* scales, uint8_t* codes) {
  const EncodeParams& p = r.element.params;
  if (r.nibbles) {
    if (p.mantissa_bits == 1 && p.bias == 1) {
      return encode_row_blocks_rounding<E2m1Format, true>(r, x, groups, scales, codes);
    }
    return encode_row_blocks_rounding<RuntimeFormat, true>(r, x, groups, scales, codes);
  }
  if (p.mantissa_bits == 3 && p.bias == 7) {
    return encode_row_blocks_rounding<FixedFormat<3, 7>, false>(r, x, groups, scales, codes);
  }
  encode_row_blocks_rounding<RuntimeFormat, false>(r, x, groups, scales, codes);
}

}  // namespace

const Kernels& kernels() {
  static const Kernels table = {CONCORD_SIMD_NAME, W,
                                encode_row_blocks,  encode,       decode,        block_abs_max,
                                abs_max_accumulate, pack_nibbles, unpack_nibbles};
  return table;
}

}  // namespace concord::numerics::simd::CONCORD_SIMD_NAMESPACE
