// Scalar reference for block quantization (MX, NVFP4, per-tensor, plain cast): see block.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/scalar.h"

namespace concord::numerics {
namespace {

int exponent_field_unbiased(uint32_t bits) { return static_cast<int>((bits >> 23) & 0xFFu) - 127; }

}  // namespace

size_t code_bytes(Format f, int64_t n) {
  const int bits = traits(f).bits;
  const auto count = static_cast<size_t>(n);
  if (bits <= 4) return (count + 1) / 2;
  if (bits <= 8) return count;
  return count * static_cast<size_t>(traits(f).storage_bytes());
}

uint32_t get_code(Format f, std::span<const uint8_t> codes, int64_t i) {
  const FormatTraits& t = traits(f);
  const auto k = static_cast<size_t>(i);
  if (t.bits <= 4) return (codes[k / 2] >> ((k & 1) * 4)) & 0xFu;
  if (t.bits <= 8) return codes[k];
  if (t.bits <= 16) return codes[2 * k] | (uint32_t{codes[2 * k + 1]} << 8);
  return codes[4 * k] | (uint32_t{codes[4 * k + 1]} << 8) | (uint32_t{codes[4 * k + 2]} << 16) |
         (uint32_t{codes[4 * k + 3]} << 24);
}

void set_code(Format f, std::span<uint8_t> codes, int64_t i, uint32_t code) {
  const FormatTraits& t = traits(f);
  const auto k = static_cast<size_t>(i);
  if (t.bits <= 4) {
    const int shift = static_cast<int>(k & 1) * 4;
    codes[k / 2] = static_cast<uint8_t>((codes[k / 2] & ~(0xFu << shift)) | ((code & 0xFu) << shift));
  } else {
    for (int b = 0; b < t.storage_bytes(); ++b) {
      codes[static_cast<size_t>(t.storage_bytes()) * k + static_cast<size_t>(b)] =
          static_cast<uint8_t>(code >> (8 * b));
    }
  }
}

int64_t QuantizedTensor::block_grid_rows() const {
  if (!desc.has_scale || desc.block.per_tensor()) return 0;
  const BlockShape b = effective_block(desc);
  return (rows + b.rows - 1) / b.rows;
}

int64_t QuantizedTensor::block_grid_cols() const {
  if (!desc.has_scale || desc.block.per_tensor()) return 0;
  const BlockShape b = effective_block(desc);
  return (cols + b.cols - 1) / b.cols;
}

float amax_ref(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return std::numeric_limits<float>::quiet_NaN();
    amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

int mx_scale_exponent(float amax, Format element, ScaleRule rule) {
  if (!std::isfinite(amax)) return 128;
  const FormatTraits& t = traits(element);
  const uint32_t bits = f32_bits(std::fabs(amax));
  int x = 0;
  switch (rule) {
    case ScaleRule::floor:
      x = exponent_field_unbiased(bits) - t.emax;
      break;
    case ScaleRule::ceil:
      x = exponent_field_unbiased(bits) + ((bits & 0x7FFFFFu) != 0 ? 1 : 0) - t.emax;
      break;
    case ScaleRule::even: {
      // Round amax to the element's mantissa width (half up), keep only its exponent.
      const uint64_t rounded = uint64_t{bits} + (uint64_t{1} << (22 - t.mantissa_bits));
      x = static_cast<int>((rounded >> 23) & 0x1FFu) - 127 - t.emax;
      break;
    }
    case ScaleRule::rceil: {
      const float descale = std::fabs(amax) * (1.0f / static_cast<float>(t.max_finite));
      const uint32_t d = f32_bits(descale);
      const uint32_t field = (d >> 23) & 0xFFu, mantissa = d & 0x7FFFFFu;
      // fp32 subnormals: e8m0 code 0 is 2^-127 = 0x00400000, round up only above it.
      const bool round_up = field == 0 ? mantissa > 0x400000u : mantissa != 0;
      x = static_cast<int>(field + (round_up ? 1u : 0u)) - 127;
      break;
    }
  }
  return std::clamp(x, -127, 127);
}

uint8_t mx_scale_code(float amax, Format element, ScaleRule rule) {
  const int x = mx_scale_exponent(amax, element, rule);
  return x == 128 ? uint8_t{0xFF} : static_cast<uint8_t>(x + 127);
}

float nvfp4_global_encode_scale(float tensor_amax) {
  constexpr float kFp8Max = 448.0f, kFp4Max = 6.0f;
  float s = kFp8Max * kFp4Max / tensor_amax;
  s = std::fmin(s, std::numeric_limits<float>::max());
  if (tensor_amax == 0.0f || s == 0.0f) return 1.0f;
  return s;  // a NaN amax gives FLT_MAX here: fmin drops the NaN (TE behaves the same)
}

uint8_t nvfp4_block_scale_code(float block_amax, float global_encode_scale) {
  constexpr float kFp4MaxInv = 1.0f / 6.0f;
  const float decode_scale = block_amax * (global_encode_scale * kFp4MaxInv);
  return static_cast<uint8_t>(
      encode_ref(Format::ue4m3, decode_scale, Rounding::rne, Overflow::saturate));
}

BlockShape effective_block(const QuantDesc& desc) {
  if (desc.axis == 0 && desc.block.rows == 1) return {desc.block.cols, 1};
  return desc.block;
}

void validate(const QuantDesc& desc, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) throw InputError("[quantize] negative shape");
  const FormatTraits& e = traits(desc.element);
  if (!desc.has_scale) return;
  const std::string name = desc.to_string();  // only descriptors with a scale can be rejected
  if (e.is_integer() || desc.element == Format::e8m0 || desc.element == Format::ue4m3 ||
      desc.element == Format::f32) {
    throw InputError("[quantize] " + name + ": element format " + std::string(e.name) +
                     " cannot be block-scaled (use e4m3, e5m2, e2m3, e3m2, e2m1, fp16 or bf16)");
  }
  if (desc.is_per_tensor()) {
    if (!desc.block.per_tensor()) {
      throw InputError("[quantize] " + name + ": an f32 scale is per tensor (block 0x0)");
    }
    return;
  }
  if (desc.block.rows <= 0 || desc.block.cols <= 0) {
    throw InputError("[quantize] " + name + ": block shape must be positive");
  }
  if (desc.is_nvfp4() && desc.element != Format::e2m1) {
    throw InputError("[quantize] " + name + ": NVFP4 (ue4m3 scales) needs e2m1 elements");
  }
  if (!desc.is_mx() && !desc.is_nvfp4()) {
    throw InputError("[quantize] " + name + ": scale format must be e8m0, ue4m3 or f32");
  }
}

QuantizedTensor quantize_ref(const QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
                             RandomStream rng) {
  validate(desc, rows, cols);
  QuantizedTensor q;
  q.desc = desc;
  q.rows = rows;
  q.cols = cols;
  const int64_t n = rows * cols;
  q.codes.assign(code_bytes(desc.element, n), 0);
  const bool sr = desc.rounding == Rounding::stochastic;
  auto encode = [&](int64_t i, float v) {
    const uint32_t random = sr ? rng.word(static_cast<uint64_t>(i)) : 0u;
    set_code(desc.element, q.codes, i, encode_ref(desc.element, v, desc.rounding, desc.overflow, random));
  };

  if (!desc.has_scale) {
    for (int64_t i = 0; i < n; ++i) encode(i, x[i]);
    return q;
  }
  if (desc.is_per_tensor()) {
    const float amax = amax_ref(x, n);
    const float max_elem = static_cast<float>(traits(desc.element).max_finite);
    const float s = (amax > 0.0f && std::isfinite(amax)) ? max_elem / amax : 1.0f;
    q.tensor_scale = 1.0f / s;
    for (int64_t i = 0; i < n; ++i) encode(i, x[i] * s);
    return q;
  }

  const BlockShape b = effective_block(desc);
  const int64_t grid_rows = q.block_grid_rows(), grid_cols = q.block_grid_cols();
  q.scales.assign(static_cast<size_t>(grid_rows * grid_cols), 0);
  float global_encode = 1.0f;
  if (desc.is_nvfp4()) {
    global_encode = nvfp4_global_encode_scale(amax_ref(x, n));
    q.tensor_scale = 1.0f / global_encode;
  }
  for (int64_t gr = 0; gr < grid_rows; ++gr) {
    for (int64_t gc = 0; gc < grid_cols; ++gc) {
      const int64_t r0 = gr * b.rows, r1 = std::min(rows, r0 + b.rows);
      const int64_t c0 = gc * b.cols, c1 = std::min(cols, c0 + b.cols);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        const float a = amax_ref(x + r * cols + c0, c1 - c0);
        amax = std::isnan(a) || std::isnan(amax) ? a + amax : std::max(amax, a);
      }
      uint8_t scale_code;
      float multiplier;  // what each element is multiplied by before its cast
      if (desc.is_mx()) {
        scale_code = mx_scale_code(amax, desc.element, desc.scale_rule);
        multiplier = scale_code == 0xFF ? std::numeric_limits<float>::quiet_NaN()
                                        : std::ldexp(1.0f, 127 - static_cast<int>(scale_code));
      } else {
        scale_code = nvfp4_block_scale_code(amax, global_encode);
        const float block_decode = decode_ref(Format::ue4m3, scale_code);
        multiplier = std::fmin(1.0f / (block_decode * q.tensor_scale),
                               std::numeric_limits<float>::max());
      }
      q.scales[static_cast<size_t>(gr * grid_cols + gc)] = scale_code;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) encode(r * cols + c, x[r * cols + c] * multiplier);
      }
    }
  }
  return q;
}

void dequantize_ref(const QuantizedTensor& q, float* out) {
  const QuantDesc& desc = q.desc;
  const int64_t n = q.numel();
  if (!desc.has_scale || desc.is_per_tensor()) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = decode_ref(desc.element, get_code(desc.element, q.codes, i));
      out[i] = desc.has_scale ? v * q.tensor_scale : v;
    }
    return;
  }
  const BlockShape b = effective_block(desc);
  const int64_t grid_cols = q.block_grid_cols();
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      const uint8_t scale_code = q.scales[static_cast<size_t>((r / b.rows) * grid_cols + c / b.cols)];
      const float v = decode_ref(desc.element, get_code(desc.element, q.codes, r * q.cols + c));
      if (desc.is_mx()) {
        out[r * q.cols + c] = v * decode_ref(Format::e8m0, scale_code);
      } else {
        out[r * q.cols + c] = (v * decode_ref(Format::ue4m3, scale_code)) * q.tensor_scale;
      }
    }
  }
}

}  // namespace concord::numerics
