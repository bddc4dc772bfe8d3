// Array conversions and ISA dispatch: picks the kernel table, splits arrays over OpenMP
// threads, packs 4-bit codes, and falls back to the reference for formats without a fast path.
#include "concord/numerics/convert.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/scalar.h"
#include "concord/numerics/simd/dispatch.h"

namespace concord::numerics {
namespace {

const simd::Kernels& kernels_of(Isa isa) {
  switch (isa) {
    case Isa::avx512: return simd::avx512_kernels();
    case Isa::avx2: return simd::avx2_kernels();
    case Isa::wide16: return simd::wide16_kernels();
    case Isa::generic: break;
  }
  return simd::generic_kernels();
}

Isa best_supported_isa() {
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  return Isa::generic;
}

// The best ISA, lowered (never raised) by CONCORD_ISA.
Isa initial_isa() {
  const Isa best = best_supported_isa();
  const char* forced = std::getenv("CONCORD_ISA");
  if (forced == nullptr || *forced == '\0') return best;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
    if (isa_name(isa) == forced) return std::min(isa, best);
  }
  if (isa_name(Isa::wide16) == forced && isa_supported(Isa::wide16)) return Isa::wide16;
  throw InputError(std::string("[simd] CONCORD_ISA=") + forced +
                   " is not one of generic, avx2, avx512, wide16 (unset it to use the best the "
                   "CPU has)");
}

std::atomic<int>& active_isa_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_isa())};
  return slot;
}

uint32_t sign_free(Format f, uint32_t code) {
  const FormatTraits& t = traits(f);
  return t.is_signed ? code & ~(1u << (t.bits - 1)) : code;
}

// Runs body(begin, count, staging) over [0, n) in chunks of kChunkElements, on OpenMP threads
// when n is large. Chunk starts are multiples of kChunkElements.
template <class Body>
void for_each_chunk(size_t n, const Body& body) {
  const size_t chunk = simd::kChunkElements;
  const auto chunks = static_cast<int64_t>((n + chunk - 1) / chunk);
  if (n < simd::kParallelThreshold) {
    std::vector<uint8_t> staging(std::min(n, chunk));
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t begin = static_cast<size_t>(c) * chunk;
      body(begin, std::min(chunk, n - begin), staging.data());
    }
    return;
  }
#pragma omp parallel
  {
    std::vector<uint8_t> staging(chunk);
#pragma omp for schedule(dynamic)
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t begin = static_cast<size_t>(c) * chunk;
      body(begin, std::min(chunk, n - begin), staging.data());
    }
  }
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::generic: return "generic";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::wide16: return "wide16";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::generic: return true;
    case Isa::avx2:
    case Isa::wide16:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
}

Isa active_isa() { return static_cast<Isa>(active_isa_slot().load(std::memory_order_relaxed)); }
std::string_view active_isa_name() { return isa_name(active_isa()); }

void set_active_isa(Isa isa) {
  if (!isa_supported(isa)) {
    throw InputError("[simd] this CPU cannot run the " + std::string(isa_name(isa)) +
                     " kernels (supported up to " + std::string(isa_name(best_supported_isa())) +
                     ")");
  }
  active_isa_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

bool has_fast_codec(Format f) {
  switch (f) {
    case Format::bf16: case Format::fp16: case Format::e4m3: case Format::e5m2:
    case Format::e2m3: case Format::e3m2: case Format::e2m1: case Format::ue4m3:
      return true;
    default:
      return false;
  }
}

namespace simd {

const Kernels& active_kernels() { return kernels_of(active_isa()); }

EncodeParams encode_params(Format f, Rounding rounding, Overflow overflow) {
  CONCORD_CHECK(has_fast_codec(f), "encode_params: format has no fast codec");
  const FormatTraits& t = traits(f);
  CONCORD_CHECK(t.bias == 1 - t.emin, "encode_params: the kernels assume emin = 1 - bias");
  EncodeParams p;
  p.mantissa_bits = t.mantissa_bits;
  p.bias = t.bias;
  p.max_magnitude = max_finite_code(f);
  p.nan_magnitude = t.has_nan() ? sign_free(f, nan_code(f)) : 0u;
  // The reference's overflow_code(), once for Inf inputs and once for finite overflow
  // (round-toward-zero stops at the largest finite value).
  auto overflow_magnitude = [&](Overflow o) {
    if (o == Overflow::ieee && t.has_inf()) {
      return ((1u << t.exponent_bits) - 1u) << t.mantissa_bits;
    }
    if (o == Overflow::ieee && t.has_nan()) return p.nan_magnitude;
    return p.max_magnitude;
  };
  p.inf_magnitude = overflow_magnitude(overflow);
  p.finite_overflow_magnitude =
      overflow_magnitude(rounding == Rounding::rtz ? Overflow::saturate : overflow);
  p.sign_shift = t.bits - 1;
  p.is_unsigned = !t.is_signed;
  p.sixteen_bit = t.bits == 16;
  return p;
}

DecodeParams decode_params(Format f) {
  CONCORD_CHECK(has_fast_codec(f), "decode_params: format has no fast codec");
  const FormatTraits& t = traits(f);
  DecodeParams p;
  p.mantissa_bits = t.mantissa_bits;
  p.bias = t.bias;
  p.subnormal_unit = static_cast<float>(t.min_subnormal);
  p.magnitude_mask = (1u << (t.bits - 1)) - 1u;
  p.sign_shift = t.bits - 1;
  p.is_unsigned = !t.is_signed;
  p.ieee_specials = t.specials == Specials::ieee;
  p.fn_specials = t.specials == Specials::fn;
  p.sixteen_bit = t.bits == 16;
  return p;
}

void encode_span(Format f, const EncodeRequest& request, const float* x, uint8_t* codes,
                 size_t begin, size_t n, uint8_t* staging) {
  if (n == 0) return;
  const Kernels& k = active_kernels();
  const int bits = traits(f).bits;
  if (bits == 16) return k.encode(request, x, codes + 2 * begin, n);
  if (bits > 4) return k.encode(request, x, codes + begin, n);
  k.encode(request, x, staging, n);
  size_t done = 0;
  if (begin & 1) {  // the first code fills the high nibble of a byte shared with begin-1
    uint8_t& shared = codes[begin / 2];
    shared = static_cast<uint8_t>((shared & 0x0Fu) | ((staging[0] & 0xFu) << 4));
    done = 1;
  }
  const size_t rest = n - done;
  const size_t pairs = rest / 2;
  k.pack_nibbles(staging + done, codes + (begin + done) / 2, 2 * pairs);
  if (rest & 1) {  // the last code fills the low nibble of a byte shared with the next span
    uint8_t& shared = codes[(begin + n - 1) / 2];
    shared = static_cast<uint8_t>((shared & 0xF0u) | (staging[n - 1] & 0xFu));
  }
}

void decode_span(Format f, const DecodeRequest& request, const uint8_t* codes, float* out,
                 size_t begin, size_t n, uint8_t* staging) {
  if (n == 0) return;
  const Kernels& k = active_kernels();
  const int bits = traits(f).bits;
  if (bits == 16) return k.decode(request, codes + 2 * begin, out, n);
  if (bits > 4) return k.decode(request, codes + begin, out, n);
  size_t done = 0;
  if (begin & 1) {
    staging[0] = static_cast<uint8_t>(codes[begin / 2] >> 4);
    done = 1;
  }
  k.unpack_nibbles(codes + (begin + done) / 2, staging + done, n - done);
  k.decode(request, staging, out, n);
}

uint32_t abs_max_bits(const float* x, size_t n) {
  const auto* bits = reinterpret_cast<const uint32_t*>(x);  // read as fp32 bit patterns
  const Kernels& k = active_kernels();
  const size_t chunk = kChunkElements;
  const auto chunks = static_cast<int64_t>((n + chunk - 1) / chunk);
  uint32_t result = 0;
  if (n < kParallelThreshold) {
    if (n > 0) k.block_abs_max(bits, n, n, &result);
    return result;
  }
#pragma omp parallel for schedule(static) reduction(max : result)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * chunk;
    uint32_t m = 0;
    k.block_abs_max(bits + begin, std::min(chunk, n - begin), chunk, &m);
    result = std::max(result, m);
  }
  return result;
}

}  // namespace simd

void encode_array(Format f, Rounding rounding, Overflow overflow, const float* in,
                  void* codes_out, size_t n, RandomStream rng, uint64_t first_index) {
  auto* codes = static_cast<uint8_t*>(codes_out);
  if (!has_fast_codec(f)) {
    const std::span<uint8_t> all(codes, code_bytes(f, static_cast<int64_t>(n)));
    for_each_chunk(n, [&](size_t begin, size_t count, uint8_t*) {
      for (size_t i = begin; i < begin + count; ++i) {
        const uint32_t random =
            rounding == Rounding::stochastic ? rng.word(first_index + i) : 0u;
        set_code(f, all, static_cast<int64_t>(i), encode_ref(f, in[i], rounding, overflow, random));
      }
    });
    return;
  }
  simd::EncodeRequest request;
  request.params = simd::encode_params(f, rounding, overflow);
  request.rounding = rounding;
  request.rng = rng;
  for_each_chunk(n, [&](size_t begin, size_t count, uint8_t* staging) {
    simd::EncodeRequest local = request;
    local.first_index = first_index + begin;
    simd::encode_span(f, local, in + begin, codes, begin, count, staging);
  });
}

void decode_array(Format f, const void* codes_in, float* out, size_t n) {
  const auto* codes = static_cast<const uint8_t*>(codes_in);
  if (!has_fast_codec(f)) {
    const std::span<const uint8_t> all(codes, code_bytes(f, static_cast<int64_t>(n)));
    for_each_chunk(n, [&](size_t begin, size_t count, uint8_t*) {
      for (size_t i = begin; i < begin + count; ++i) {
        out[i] = decode_ref(f, get_code(f, all, static_cast<int64_t>(i)));
      }
    });
    return;
  }
  simd::DecodeRequest request;
  request.params = simd::decode_params(f);
  for_each_chunk(n, [&](size_t begin, size_t count, uint8_t* staging) {
    simd::decode_span(f, request, codes, out + begin, begin, count, staging);
  });
}

}  // namespace concord::numerics
