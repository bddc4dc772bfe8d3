// Internal glue between the public fast paths (convert.cpp, block_fast.cpp) and the per-ISA
// kernel tables: the active table, format parameters, and span helpers that handle packed
// 4-bit codes starting at any element index.
#pragma once

#include <cstddef>
#include <cstdint>

#include "concord/numerics/format.h"
#include "concord/numerics/simd/kernels.h"

namespace concord::numerics::simd {

const Kernels& active_kernels();

// Parameters of the branch-free codec for a format with has_fast_codec(f).
EncodeParams encode_params(Format f, Rounding rounding, Overflow overflow);
DecodeParams decode_params(Format f);

// Encodes n inputs as elements begin .. begin+n-1 of a code buffer in block.h's layout.
// request.first_index and request.element_scale refer to x[0] (element `begin`). Packed 4-bit
// codes sharing a byte with elements outside the span are merged, so spans running one after
// the other on the same thread may start and end at odd indices; spans on different threads
// must start at even indices. staging must hold n bytes (used only by 4-bit formats).
void encode_span(Format f, const EncodeRequest& request, const float* x, uint8_t* codes,
                 size_t begin, size_t n, uint8_t* staging);
// Decodes elements begin .. begin+n-1 of a code buffer; staging as above.
void decode_span(Format f, const DecodeRequest& request, const uint8_t* codes, float* out,
                 size_t begin, size_t n, uint8_t* staging);

// NaN-propagating max |x| over n values, as fp32 bits (any NaN gives a NaN); OpenMP inside.
uint32_t abs_max_bits(const float* x, size_t n);

// Element counts per OpenMP work item: a multiple of 4 (Philox blocks) and of 2 (nibbles).
inline constexpr size_t kChunkElements = 1 << 14;
// Below this many elements one thread does the whole job.
inline constexpr size_t kParallelThreshold = 1 << 16;

}  // namespace concord::numerics::simd
