// Per-ISA kernel interface of the numerics fast paths: one table of plain function pointers.
//
// The kernels are written once (kernels_impl.h) as branch-free code over GCC vector extensions
// and compiled once per ISA (kernels_generic.cpp: SSE2, kernels_avx2.cpp, kernels_avx512.cpp),
// so the AVX-512 build shares every line of its logic with the builds verified on AVX2
// machines. Each table works on contiguous arrays and never spawns threads; convert.cpp and
// block_fast.cpp split work over OpenMP threads and pick the table at run time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "concord/numerics/philox.h"
#include "concord/numerics/rounding.h"

namespace concord::numerics::simd {

// Everything the branch-free float encoder needs about one element format, derived from the
// traits table (see convert.cpp: make_encode_params). Magnitudes are codes without sign bit.
struct EncodeParams {
  int mantissa_bits = 0;
  int bias = 0;                       // emin = 1 - bias for every accelerated format
  uint32_t max_magnitude = 0;         // magnitude code of the largest finite value
  uint32_t nan_magnitude = 0;         // NaN input (0 for formats without NaN: sign kept)
  uint32_t inf_magnitude = 0;         // +-Inf input under the overflow policy
  uint32_t finite_overflow_magnitude = 0;  // finite overflow (RTZ never reaches Inf)
  int sign_shift = 0;                 // bits - 1
  bool is_unsigned = false;           // ue4m3: negative nonzero -> NaN, -0 -> 0
  bool sixteen_bit = false;           // codes stored as uint16_t, else one uint8_t per code
};

struct DecodeParams {
  int mantissa_bits = 0;
  int bias = 0;
  float subnormal_unit = 0.0f;   // 2^(emin - mantissa_bits): the value of mantissa 1 at emin
  uint32_t magnitude_mask = 0;   // code bits below the sign
  int sign_shift = 0;
  bool is_unsigned = false;      // ue4m3: sign bit set decodes to NaN
  bool ieee_specials = false;    // top exponent is Inf/NaN
  bool fn_specials = false;      // all-ones magnitude is NaN
  bool sixteen_bit = false;
};

// How each input element is scaled before encoding: not at all, by one fp32 factor, by its
// own factor from an array, or by the factor of its block of 2^block_shift consecutive
// elements (element i uses block_scale[i >> block_shift]; a vector inside one block
// broadcasts it).
enum class ScaleMode : uint8_t { none, uniform, per_element, per_block };

struct EncodeRequest {
  EncodeParams params;
  Rounding rounding = Rounding::rne;
  ScaleMode scale_mode = ScaleMode::none;
  float uniform_scale = 1.0f;
  const float* element_scale = nullptr;  // per_element: one factor per input element
  const float* block_scale = nullptr;    // per_block: one factor per block of elements
  int block_shift = 0;                   // per_block: log2 of the elements per block
  RandomStream rng;                      // stochastic: element i uses rng.word(first_index + i)
  uint64_t first_index = 0;
};

struct DecodeRequest {
  DecodeParams params;
  const float* element_scale = nullptr;  // optional: out = decoded * element_scale[i]
  const float* uniform_scale = nullptr;  // optional, applied after element_scale
};

// One row of 1 x 2^k blocks in one pass (block amax, scale code, multiplier, encode), so
// that reading the row from memory overlaps the arithmetic. The block scale is either a
// table over amax's exponent field (MX FLOOR) or the ue4m3 encoding of amax * scale_factor
// (NVFP4); multiplier_table maps each scale code to the reference's element multiplier.
struct RowBlocksRequest {
  EncodeRequest element;              // rounding rne or rtz; params of the element format
  int block_shift = 5;                // elements per block: 2^block_shift, a multiple of W
  bool nibbles = false;               // 4-bit codes, two per byte (else one byte each)
  bool ue4m3_scale = false;           // NVFP4 block scales (else the exponent table)
  const uint8_t* exponent_table = nullptr;  // (256) MX scale code by amax exponent field
  const float* multiplier_table = nullptr;  // (256) multiplier by scale code
  EncodeParams scale_params;          // ue4m3, RNE, saturate
  float scale_factor = 1.0f;          // NVFP4: global encode scale / 6
};

struct Kernels {
  const char* name;
  // Lanes per vector: encode_row_blocks handles groups of `lanes` blocks.
  int lanes;
  // Encodes groups * lanes whole blocks from x: one scale code per block into scales, codes
  // into `codes` (byte 0 holds element 0; nibbles: element 2k in the low nibble).
  void (*encode_row_blocks)(const RowBlocksRequest& request, const float* x, size_t groups,
                            uint8_t* scales, uint8_t* codes);
  // codes: uint16_t per code for 16-bit formats, else one uint8_t per code (4-bit unpacked).
  void (*encode)(const EncodeRequest& request, const float* x, void* codes, size_t n);
  void (*decode)(const DecodeRequest& request, const void* codes, float* out, size_t n);
  // out[b] = bits of max |x| over x[b*block, min(n, (b+1)*block)); NaN (> 0x7F800000) wins.
  void (*block_abs_max)(const uint32_t* x_bits, size_t n, size_t block, uint32_t* out);
  // acc[i] = max(acc[i], |x[i]| bits): the column-wise amax of 2-D and column blocks.
  void (*abs_max_accumulate)(const uint32_t* x_bits, uint32_t* acc, size_t n);
  // Two 4-bit codes per byte, element 2k in the low nibble; n may be odd (last high nibble 0).
  void (*pack_nibbles)(const uint8_t* codes, uint8_t* packed, size_t n);
  void (*unpack_nibbles)(const uint8_t* packed, uint8_t* codes, size_t n);
};

const Kernels& generic_kernels();
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();
// The 16-lane (AVX-512) kernel logic compiled with AVX2 flags: the five instructions that need
// AVX-512 are replaced by plain lane loops. It lets the 16-lane code run, and be tested bit for
// bit, on CPUs without AVX-512; never chosen automatically.
const Kernels& wide16_kernels();

}  // namespace concord::numerics::simd
