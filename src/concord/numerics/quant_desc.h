// The quantized-tensor descriptor: element format, block shape, scale format, scale rule,
// rounding, overflow and blocking axis — separate enums combined in one value (Transformer
// Engine / torchao's pattern), so nothing is written once per combination.
//
// Scaling schemes, chosen by the scale format:
//   f32 scale, block 0x0        per-tensor: S = max_elem / amax (fp32), codes = Q(x * S), the
//                               stored tensor_scale = 1/S (the older "fp8-tensor" recipe)
//   e8m0 scale (MX, OCP v1.0)   one power of two per block; shared exponent from the exponent
//                               bits of the block amax (see ScaleRule)
//   ue4m3 scale (NVFP4, TE)     fp32 per-tensor S_enc = 448*6/amax_tensor (1 if amax is 0),
//                               per block s = e4m3(block_amax * (S_enc * (1/6))), codes =
//                               Q(x * (1 / (s * (1/S_enc)))), tensor_scale = 1/S_enc
//   none (block 0x0)            plain element-wise cast
//
// Blocks: BlockShape{rows, cols} in the tensor's own (row, col) coordinates; a 2-D tensor
// (rows x cols, row-major) is tiled from the top-left, edge blocks may be partial. A 1-D block
// runs along `axis` (1 = along a row, the reduction dimension of x·Wᵀ; 0 = down a column);
// 2-D blocks (NVFP4 16x16 weights) make W and Wᵀ quantize identically.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "concord/numerics/format.h"
#include "concord/numerics/rounding.h"

namespace concord::numerics {

// How an MX block's power-of-two scale is chosen from the block amax (torchao's names).
// Let E(a) be the unbiased exponent field of fp32 a (fp32 subnormals read as -127) and
// emax_elem the exponent of the element format's largest binade (e4m3: 8, e5m2: 15, e2m3: 2,
// e3m2: 4, e2m1: 2):
//   floor  X = E(amax) - emax_elem                      (OCP v1.0; elements may saturate)
//   ceil   X = E(amax) + (mantissa(amax) != 0) - emax_elem
//   even   X = E(round_half_up(amax, mbits_elem)) - emax_elem
//   rceil  X = ceil_log2(fp32(amax * fp32(1/max_elem)))  (Transformer Engine / cuBLAS)
// X is clamped to [-127, 127]; a NaN or Inf amax gives the NaN scale 0xFF.
// Never floor(log2f(amax)): log2f rounds, and for amax just below a power of two it returns
// the next exponent (tests/numerics show a case).
enum class ScaleRule : uint8_t { floor = 0, ceil = 1, even = 2, rceil = 3 };

struct BlockShape {
  int rows = 1;
  int cols = 32;
  bool per_tensor() const { return rows == 0 && cols == 0; }
  friend bool operator==(BlockShape, BlockShape) = default;
};

struct QuantDesc {
  Format element = Format::e4m3;
  BlockShape block{1, 32};
  Format scale = Format::e8m0;  // e8m0 (MX), ue4m3 (NVFP4), f32 (per-tensor); f32 + 0x0 = none
  ScaleRule scale_rule = ScaleRule::floor;
  Rounding rounding = Rounding::rne;
  Overflow overflow = Overflow::saturate;
  int axis = 1;  // axis a 1-D block runs along
  bool has_scale = true;

  friend bool operator==(const QuantDesc&, const QuantDesc&) = default;

  bool is_mx() const { return has_scale && scale == Format::e8m0; }
  bool is_nvfp4() const { return has_scale && scale == Format::ue4m3; }
  bool is_per_tensor() const { return has_scale && scale == Format::f32; }

  // Presets (names used by the CLI and by safetensors metadata).
  static QuantDesc elementwise(Format f, Rounding r = Rounding::rne,
                               Overflow o = Overflow::saturate);
  static QuantDesc per_tensor(Format f);
  static QuantDesc mx(Format element, ScaleRule rule = ScaleRule::floor);
  static QuantDesc nvfp4(BlockShape block = {1, 16});

  // "mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp4", "nvfp4", "nvfp4-2d",
  // "fp8-tensor", or an element format name (plain cast).
  static std::optional<QuantDesc> from_name(std::string_view name);
  // A short stable description: "mxfp8-e4m3/floor/rne" etc; parse() reads it back.
  std::string to_string() const;
  static std::optional<QuantDesc> parse(std::string_view text);
};

std::string_view scale_rule_name(ScaleRule r);
std::optional<ScaleRule> scale_rule_from_name(std::string_view name);
// Names the CLI accepts for block formats, comma separated.
std::string_view block_format_names();

}  // namespace concord::numerics
