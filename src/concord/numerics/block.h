// Block (microscaling) quantization of a 2-D fp32 tensor: the scalar reference, and the fast
// dispatching entry points that must equal it bit for bit.
//
// Storage of the result (QuantizedTensor):
//   codes   row-major element codes. 16-bit formats: 2 bytes little-endian; 8-bit and 6-bit
//           formats: 1 byte each (6-bit codes in the low bits); 4-bit formats: two per byte,
//           element 2k in the low nibble, 2k+1 in the high nibble (over the row-major index).
//   scales  one byte per block (e8m0 or ue4m3 code), row-major over the grid of blocks
//           (ceil(rows/block.rows) x ceil(cols/block.cols)); empty without block scales.
//   tensor_scale  fp32 decode multiplier applied after the block scale (NVFP4: 1/S_enc;
//           per-tensor FP8: 1/S); 1 otherwise.
// Dequantization: x = element * block_scale * tensor_scale, evaluated in fp32 in that order
// (element * block scale is exact for every MX and NVFP4 combination).
//
// Special cases (each is tested):
//   all-zero block      MX: scale code 0x00 (2^-127), elements 0. NVFP4: scale 0, elements 0.
//   NaN or Inf in block MX: scale 0xFF (NaN) and the block dequantizes to NaN.
//                       NVFP4 (TE's rules): a NaN tensor amax gives S_enc = FLT_MAX, an Inf
//                       one S_enc = 1; the block scale saturates (Inf) or is NaN; e2m1 has no
//                       NaN, so NaN elements encode as 0.
//   subnormal amax      MX: an fp32-subnormal amax has exponent field 0, read as 2^-127, so
//                       the scale clamps to 2^-127 (code 0x00); elements keep what they can.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "concord/numerics/philox.h"
#include "concord/numerics/quant_desc.h"

namespace concord::numerics {

struct QuantizedTensor {
  QuantDesc desc;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
  float tensor_scale = 1.0f;

  int64_t numel() const { return rows * cols; }
  int64_t block_grid_rows() const;
  int64_t block_grid_cols() const;
};

// The block shape in tensor coordinates after applying desc.axis to a 1-D block.
BlockShape effective_block(const QuantDesc& desc);
// Throws InputError naming the problem when desc cannot quantize a rows x cols tensor.
void validate(const QuantDesc& desc, int64_t rows, int64_t cols);

// Bytes needed for n codes of format f (4-bit formats pack two per byte).
size_t code_bytes(Format f, int64_t n);
// Read / write code i of a packed code buffer.
uint32_t get_code(Format f, std::span<const uint8_t> codes, int64_t i);
void set_code(Format f, std::span<uint8_t> codes, int64_t i, uint32_t code);

// The scalar reference: plain loops over blocks and elements, through encode_ref/decode_ref.
// rng supplies the random words for stochastic rounding: element (r, c) uses word r*cols + c.
QuantizedTensor quantize_ref(const QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
                             RandomStream rng = {});
void dequantize_ref(const QuantizedTensor& q, float* out);

// The MX shared exponent (unbiased, or 128 for NaN) for one block amax under a scale rule.
int mx_scale_exponent(float amax, Format element, ScaleRule rule);
// The e8m0 code for that exponent (0xFF for NaN).
uint8_t mx_scale_code(float amax, Format element, ScaleRule rule);
// NVFP4 (Transformer Engine): global encode scale from the tensor amax, and the ue4m3 block
// decode scale from a block amax.
float nvfp4_global_encode_scale(float tensor_amax);
uint8_t nvfp4_block_scale_code(float block_amax, float global_encode_scale);
// NaN-propagating max of |x| over n values.
float amax_ref(const float* x, int64_t n);

// Fast paths (SIMD, runtime-dispatched; OpenMP over blocks for large tensors). Bit-identical
// to the reference for every descriptor; descriptors without a fast path fall back to it.
QuantizedTensor quantize(const QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
                         RandomStream rng = {});
// The same into q, reusing its buffers (a weight re-quantized every step faults no fresh pages).
void quantize_into(QuantizedTensor& q, const QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
                   RandomStream rng = {});
void dequantize(const QuantizedTensor& q, float* out);

// Quantize then dequantize (the values a quantized GEMM would see).
void fake_quantize(const QuantDesc& desc, const float* x, float* out, int64_t rows,
                   int64_t cols, RandomStream rng = {});

}  // namespace concord::numerics
