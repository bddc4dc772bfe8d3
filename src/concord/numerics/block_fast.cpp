// Fast block quantization: the reference's arithmetic (block.h) on the SIMD kernels, with
// OpenMP over block rows. Every descriptor validate() accepts is accelerated except element-
// wise casts to formats without a fast codec (int8, int4, e8m0, f32), which use the reference.
//
// Per block row: the block amaxes (an unsigned max over |x| bit patterns, which propagates NaN
// like amax_ref), the scale codes (MX: mx_scale_code, or its FLOOR table by exponent field;
// NVFP4: the vector ue4m3 encoder), each block's fp32 multiplier from a table built with the
// reference's exact expression, and the row encoded as x * multiplier. Rows of 1 x 2^k blocks
// under RNE/RTZ with FLOOR or NVFP4 scales do all of this in one pass per group of blocks
// (Kernels::encode_row_blocks); the rest of such a row, and every other layout, take the
// general steps.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/convert.h"
#include "concord/numerics/scalar.h"
#include "concord/numerics/simd/dispatch.h"

namespace concord::numerics {
namespace {

constexpr float kFloatMax = std::numeric_limits<float>::max();

// Indexed by e8m0 code: what quantize_ref multiplies elements by, and what dequantize_ref does.
const std::array<float, 256>& mx_encode_multipliers() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int code = 0; code < 256; ++code) {
      t[code] = code == 0xFF ? std::numeric_limits<float>::quiet_NaN()
                             : std::ldexp(1.0f, 127 - code);
    }
    return t;
  }();
  return table;
}

// decode_ref of every code of an 8-bit scale format.
template <Format F>
const std::array<float, 256>& scale_decode_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (uint32_t code = 0; code < 256; ++code) t[code] = decode_ref(F, code);
    return t;
  }();
  return table;
}

// Per-thread scratch for one block row.
struct RowScratch {
  std::vector<uint32_t> column_amax;  // (cols) for blocks taller than one row
  std::vector<uint32_t> block_amax;   // (grid_cols)
  std::vector<float> block_values;    // (grid_cols) NVFP4 decode scales before encoding
  std::vector<float> block_multiplier;  // (grid_cols)
  std::vector<float> column_multiplier;  // (cols)
  std::vector<uint8_t> staging;        // (cols) unpacked 4-bit codes
  RowScratch(int64_t cols, int64_t grid_cols)
      : column_amax(static_cast<size_t>(cols)),
        block_amax(static_cast<size_t>(grid_cols)),
        block_values(static_cast<size_t>(grid_cols)),
        block_multiplier(static_cast<size_t>(grid_cols)),
        column_multiplier(static_cast<size_t>(cols)),
        staging(static_cast<size_t>(cols)) {}
};

// Runs body(unit, scratch) for unit in [0, units), on OpenMP threads when the tensor is large.
template <class Body>
void for_each_unit(int64_t units, int64_t elements, int64_t cols, int64_t grid_cols,
                   const Body& body) {
  if (elements < static_cast<int64_t>(simd::kParallelThreshold) || units < 2) {
    RowScratch scratch(cols, grid_cols);
    for (int64_t u = 0; u < units; ++u) body(u, scratch);
    return;
  }
#pragma omp parallel
  {
    RowScratch scratch(cols, grid_cols);
#pragma omp for schedule(dynamic, 8)
    for (int64_t u = 0; u < units; ++u) body(u, scratch);
  }
}

// Threads split the tensor at block-row boundaries; packed 4-bit codes must split at even
// element indices, so with an odd row count per block row and odd cols, work goes in pairs.
int64_t block_rows_per_unit(const QuantDesc& desc, int64_t block_rows, int64_t cols) {
  const bool nibbles = traits(desc.element).bits == 4;
  return nibbles && (block_rows * cols) % 2 != 0 ? 2 : 1;
}

void expand_per_column(const std::vector<float>& per_block, int64_t cols, int64_t block_cols,
                       std::vector<float>& per_column) {
  if (block_cols == 1) {
    std::copy_n(per_block.begin(), cols, per_column.begin());
    return;
  }
  for (int64_t c0 = 0, b = 0; c0 < cols; c0 += block_cols, ++b) {
    std::fill_n(per_column.begin() + c0, std::min(block_cols, cols - c0),
                per_block[static_cast<size_t>(b)]);
  }
}

void quantize_blocks(QuantizedTensor& q, const float* x, RandomStream rng) {
  const QuantDesc& desc = q.desc;
  const int64_t rows = q.rows, cols = q.cols;
  const BlockShape b = effective_block(desc);
  const int64_t grid_rows = q.block_grid_rows(), grid_cols = q.block_grid_cols();
  q.scales.assign(static_cast<size_t>(grid_rows * grid_cols), 0);
  float global_encode = 1.0f;
  if (desc.is_nvfp4()) {
    const uint32_t amax_bits = simd::abs_max_bits(x, static_cast<size_t>(q.numel()));
    global_encode = nvfp4_global_encode_scale(f32_from_bits(amax_bits));
    q.tensor_scale = 1.0f / global_encode;
  }
  // The reference's decode_scale = block_amax * (global_encode_scale * (1/6)).
  const float nvfp4_factor = global_encode * (1.0f / 6.0f);
  // The reference's encode multiplier of each ue4m3 block-scale code, computed once.
  std::array<float, 256> nvfp4_multipliers{};
  if (desc.is_nvfp4()) {
    const auto& ue4m3_values = scale_decode_table<Format::ue4m3>();
    for (size_t code = 0; code < 256; ++code) {
      nvfp4_multipliers[code] =
          std::fmin(1.0f / (ue4m3_values[code] * q.tensor_scale), kFloatMax);
    }
  }
  simd::EncodeRequest scale_request;
  scale_request.params = simd::encode_params(Format::ue4m3, Rounding::rne, Overflow::saturate);
  simd::EncodeRequest request;
  request.params = simd::encode_params(desc.element, desc.rounding, desc.overflow);
  request.rounding = desc.rounding;
  request.scale_mode = simd::ScaleMode::per_element;
  request.rng = rng;
  const simd::Kernels& kernels = simd::active_kernels();
  const auto& mx_multipliers = mx_encode_multipliers();
  // FLOOR reads only amax's exponent field: its scale code per field value (NaN and Inf have
  // field 0xFF), from the reference rule.
  std::vector<uint8_t> floor_codes;
  if (desc.is_mx() && desc.scale_rule == ScaleRule::floor) {
    floor_codes.resize(256);
    for (uint32_t field = 0; field < 256; ++field) {
      floor_codes[field] = mx_scale_code(f32_from_bits(field << 23 | (field == 0xFF ? 1u : 0u)),
                                         desc.element, desc.scale_rule);
    }
  }

  const int64_t per_unit = block_rows_per_unit(desc, b.rows, cols);
  const int64_t units = (grid_rows + per_unit - 1) / per_unit;
  // Rows of 1 x 2^k blocks (MXFP8/6/4 FLOOR, NVFP4 1x16) under RNE or RTZ run the fused
  // one-pass kernel over whole groups of `lanes` blocks; the rest of the row (and every other
  // layout) goes through amax, scales and a scaled encode below.
  const bool nibbles = traits(desc.element).bits == 4;
  const bool fusable = b.rows == 1 && desc.rounding != Rounding::stochastic &&
                       (desc.is_nvfp4() || !floor_codes.empty()) &&
                       std::has_single_bit(static_cast<uint64_t>(b.cols)) &&
                       b.cols % kernels.lanes == 0 && b.cols % (nibbles ? 8 : 4) == 0;
  const int64_t fused_group_cols = b.cols * kernels.lanes;
  simd::RowBlocksRequest fused;
  fused.element = request;
  fused.block_shift = std::countr_zero(static_cast<uint64_t>(b.cols));
  fused.nibbles = nibbles;
  fused.ue4m3_scale = desc.is_nvfp4();
  fused.exponent_table = floor_codes.data();
  fused.multiplier_table = desc.is_mx() ? mx_multipliers.data() : nvfp4_multipliers.data();
  fused.scale_params = scale_request.params;
  fused.scale_factor = nvfp4_factor;

  for_each_unit(units, q.numel(), cols, grid_cols, [&](int64_t unit, RowScratch& s) {
    for (int64_t gr = unit * per_unit; gr < std::min(grid_rows, (unit + 1) * per_unit); ++gr) {
      const int64_t r0 = gr * b.rows, r1 = std::min(rows, r0 + b.rows);
      uint8_t* scale_row = q.scales.data() + gr * grid_cols;
      // Columns [0, head) fused; [head, cols) below, from block column gc0.
      int64_t head = 0;
      if (fusable && (!nibbles || (r0 * cols) % 2 == 0)) {
        const int64_t groups = cols / fused_group_cols;
        head = groups * fused_group_cols;
        kernels.encode_row_blocks(fused, x + r0 * cols, static_cast<size_t>(groups), scale_row,
                                  q.codes.data() + (nibbles ? r0 * cols / 2 : r0 * cols));
      }
      if (head == cols) continue;
      const int64_t gc0 = head / b.cols, rest = cols - head;
      const auto* row_bits = reinterpret_cast<const uint32_t*>(x);  // fp32 bit patterns
      if (r1 - r0 == 1) {
        kernels.block_abs_max(row_bits + r0 * cols + head, static_cast<size_t>(rest),
                              static_cast<size_t>(b.cols), s.block_amax.data() + gc0);
      } else {
        std::fill(s.column_amax.begin(), s.column_amax.end(), 0u);
        for (int64_t r = r0; r < r1; ++r) {
          kernels.abs_max_accumulate(row_bits + r * cols, s.column_amax.data(),
                                     static_cast<size_t>(cols));
        }
        kernels.block_abs_max(s.column_amax.data(), static_cast<size_t>(cols),
                              static_cast<size_t>(b.cols), s.block_amax.data());
      }
      if (desc.is_mx()) {
        for (int64_t gc = gc0; gc < grid_cols; ++gc) {
          const uint32_t amax_bits = s.block_amax[static_cast<size_t>(gc)];
          const uint8_t code =
              floor_codes.empty()
                  ? mx_scale_code(f32_from_bits(amax_bits), desc.element, desc.scale_rule)
                  : floor_codes[amax_bits >> 23];  // sign is clear: the exponent field
          scale_row[gc] = code;
          s.block_multiplier[static_cast<size_t>(gc)] = mx_multipliers[code];
        }
      } else {
        for (int64_t gc = gc0; gc < grid_cols; ++gc) {
          s.block_values[static_cast<size_t>(gc)] =
              f32_from_bits(s.block_amax[static_cast<size_t>(gc)]) * nvfp4_factor;
        }
        kernels.encode(scale_request, s.block_values.data() + gc0, scale_row + gc0,
                       static_cast<size_t>(grid_cols - gc0));
        for (int64_t gc = gc0; gc < grid_cols; ++gc) {
          s.block_multiplier[static_cast<size_t>(gc)] = nvfp4_multipliers[scale_row[gc]];
        }
      }
      // Power-of-two block widths (MX: 32, NVFP4: 16) broadcast each block's multiplier in
      // the kernel; column blocks (width 1) already have one per column; others expand.
      simd::EncodeRequest row_request = request;
      if (b.cols == 1) {
        row_request.element_scale = s.block_multiplier.data();
      } else if (std::has_single_bit(static_cast<uint64_t>(b.cols))) {
        row_request.scale_mode = simd::ScaleMode::per_block;
        row_request.block_scale = s.block_multiplier.data() + gc0;
        row_request.block_shift = std::countr_zero(static_cast<uint64_t>(b.cols));
      } else {
        expand_per_column(s.block_multiplier, cols, b.cols, s.column_multiplier);
        row_request.element_scale = s.column_multiplier.data();
      }
      for (int64_t r = r0; r < r1; ++r) {
        simd::EncodeRequest local = row_request;
        local.first_index = static_cast<uint64_t>(r * cols + head);
        simd::encode_span(desc.element, local, x + r * cols + head, q.codes.data(),
                          static_cast<size_t>(r * cols + head), static_cast<size_t>(rest),
                          s.staging.data());
      }
    }
  });
}

void dequantize_blocks(const QuantizedTensor& q, float* out) {
  const QuantDesc& desc = q.desc;
  const BlockShape b = effective_block(desc);
  const int64_t cols = q.cols, grid_rows = q.block_grid_rows(), grid_cols = q.block_grid_cols();
  const auto& scale_values = desc.is_mx() ? scale_decode_table<Format::e8m0>()
                                          : scale_decode_table<Format::ue4m3>();
  simd::DecodeRequest request;
  request.params = simd::decode_params(desc.element);
  if (desc.is_nvfp4()) request.uniform_scale = &q.tensor_scale;
  for_each_unit(grid_rows, q.numel(), cols, grid_cols, [&](int64_t gr, RowScratch& s) {
    for (int64_t gc = 0; gc < grid_cols; ++gc) {
      s.block_multiplier[static_cast<size_t>(gc)] = scale_values[q.scales[gr * grid_cols + gc]];
    }
    expand_per_column(s.block_multiplier, cols, b.cols, s.column_multiplier);
    simd::DecodeRequest local = request;
    local.element_scale = s.column_multiplier.data();
    for (int64_t r = gr * b.rows; r < std::min(q.rows, (gr + 1) * b.rows); ++r) {
      simd::decode_span(desc.element, local, q.codes.data(), out + r * cols,
                        static_cast<size_t>(r * cols), static_cast<size_t>(cols),
                        s.staging.data());
    }
  });
}

}  // namespace

QuantizedTensor quantize(const QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
                         RandomStream rng) {
  QuantizedTensor q;
  quantize_into(q, desc, x, rows, cols, rng);
  return q;
}

void quantize_into(QuantizedTensor& q, const QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
                   RandomStream rng) {
  validate(desc, rows, cols);
  if (!has_fast_codec(desc.element)) {
    q = quantize_ref(desc, x, rows, cols, rng);
    return;
  }
  q.desc = desc;
  q.rows = rows;
  q.cols = cols;
  q.tensor_scale = 1.0f;
  q.scales.clear();
  const auto n = static_cast<size_t>(rows * cols);
  q.codes.assign(code_bytes(desc.element, rows * cols), 0);  // keeps the capacity: no fresh pages
  if (!desc.has_scale) {
    encode_array(desc.element, desc.rounding, desc.overflow, x, q.codes.data(), n, rng);
    return;
  }
  if (desc.is_per_tensor()) {
    const float amax = f32_from_bits(simd::abs_max_bits(x, n));
    const float max_elem = static_cast<float>(traits(desc.element).max_finite);
    const float s = (amax > 0.0f && std::isfinite(amax)) ? max_elem / amax : 1.0f;
    q.tensor_scale = 1.0f / s;
    simd::EncodeRequest request;
    request.params = simd::encode_params(desc.element, desc.rounding, desc.overflow);
    request.rounding = desc.rounding;
    request.scale_mode = simd::ScaleMode::uniform;
    request.uniform_scale = s;
    request.rng = rng;
    const int64_t chunk = static_cast<int64_t>(simd::kChunkElements);
    for_each_unit((rows * cols + chunk - 1) / chunk, rows * cols, chunk, 0,
                  [&](int64_t c, RowScratch& scratch) {
                    const auto begin = static_cast<size_t>(c * chunk);
                    simd::EncodeRequest local = request;
                    local.first_index = begin;
                    simd::encode_span(desc.element, local, x + begin, q.codes.data(), begin,
                                      std::min(static_cast<size_t>(chunk), n - begin),
                                      scratch.staging.data());
                  });
    return;
  }
  quantize_blocks(q, x, rng);
}

void dequantize(const QuantizedTensor& q, float* out) {
  const QuantDesc& desc = q.desc;
  if (!has_fast_codec(desc.element)) return dequantize_ref(q, out);
  const auto n = static_cast<size_t>(q.numel());
  if (!desc.has_scale) return decode_array(desc.element, q.codes.data(), out, n);
  if (desc.is_per_tensor()) {
    simd::DecodeRequest request;
    request.params = simd::decode_params(desc.element);
    request.uniform_scale = &q.tensor_scale;
    const int64_t chunk = static_cast<int64_t>(simd::kChunkElements);
    for_each_unit((q.numel() + chunk - 1) / chunk, q.numel(), chunk, 0,
                  [&](int64_t c, RowScratch& scratch) {
                    const auto begin = static_cast<size_t>(c * chunk);
                    simd::decode_span(desc.element, request, q.codes.data(), out + begin, begin,
                                      std::min(static_cast<size_t>(chunk), n - begin),
                                      scratch.staging.data());
                  });
    return;
  }
  dequantize_blocks(q, out);
}

void fake_quantize(const QuantDesc& desc, const float* x, float* out, int64_t rows,
                   int64_t cols, RandomStream rng) {
  dequantize(quantize(desc, x, rows, cols, rng), out);
}

}  // namespace concord::numerics
