// Array conversions fp32 <-> element codes: the fast (SIMD, multi-threaded) counterparts of
// encode_ref/decode_ref, bit-identical to them for every input.
//
// Codes are laid out as in block.h: 16-bit formats 2 bytes little-endian, 8- and 6-bit formats
// one byte each, 4-bit formats two per byte with element 2k in the low nibble.
//
// Fast paths (one branch-free kernel source compiled for generic SSE2, AVX2 and AVX-512, see
// simd/kernels_impl.h): bf16, fp16, e4m3, e5m2, e2m3, e3m2, e2m1 and ue4m3, with RNE, RTZ and
// stochastic rounding and both overflow policies. e8m0, int8, int4 and f32 run a loop over
// encode_ref/decode_ref. The ISA is chosen at first use from the CPU's features
// (__builtin_cpu_supports); the environment variable CONCORD_ISA=generic|avx2|avx512 forces a
// lower path. Large arrays are split over OpenMP threads at element indices that are multiples
// of 4096; stochastic rounding draws element i's bits from rng.word(first_index + i), so the
// result never depends on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "concord/numerics/format.h"
#include "concord/numerics/philox.h"
#include "concord/numerics/rounding.h"

namespace concord::numerics {

// wide16: the AVX-512 kernels' 16-lane logic built for AVX2 (see simd/kernels.h), so that
// CPUs without AVX-512 still test that code; selectable, never picked automatically.
enum class Isa : uint8_t { generic = 0, avx2 = 1, avx512 = 2, wide16 = 3 };

std::string_view isa_name(Isa isa);
// Whether this CPU can run the given kernels (generic: always).
bool isa_supported(Isa isa);
// The kernels in use: the best the CPU supports, lowered by CONCORD_ISA.
Isa active_isa();
std::string_view active_isa_name();
// Switches the kernels in use (tests, benchmarks). Throws InputError if the CPU lacks the ISA.
// Not thread-safe against conversions running at the same time.
void set_active_isa(Isa isa);

// True when format f has a SIMD path (otherwise the array functions loop over the reference).
bool has_fast_codec(Format f);

// codes_out must hold code_bytes(f, n) bytes (block.h). Element i is the value in[i];
// stochastic rounding uses rng.word(first_index + i).
void encode_array(Format f, Rounding rounding, Overflow overflow, const float* in,
                  void* codes_out, size_t n, RandomStream rng = {}, uint64_t first_index = 0);
void decode_array(Format f, const void* codes, float* out, size_t n);

}  // namespace concord::numerics
