// PrecisionPolicy: the format of every GEMM operand, per GEMM role and per layer class.
//
// Roles (row-major, T tokens, K inputs, N outputs; W is (N, K) as in HF checkpoints):
//   forward  Y  = X · Wᵀ      a = X  (T, K)   b = W (N, K)   reduction over K
//   dgrad    dX = dY · W      a = dY (T, N)   b = W (N, K)   reduction over N
//   wgrad    dW = dYᵀ · X     a = dY (T, N)   b = X (T, K)   reduction over T
// Each operand's descriptor is written for blocks along the reduction dimension; the GEMM sets
// the blocking axis from the operand's layout (MX convention), so a 1x32 descriptor means "32
// consecutive elements of the reduction". 2-D blocks (NVFP4 16x16 weights) quantize W and Wᵀ
// identically. No descriptor (std::nullopt) means the operand stays fp32.
// Norms, softmax, RoPE, the attention score/value products and the loss stay fp32.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "concord/numerics/quant_desc.h"

namespace concord::model {

enum class GemmRole : uint8_t { forward = 0, dgrad = 1, wgrad = 2 };
enum class LayerClass : uint8_t { attention = 0, mlp = 1, lm_head = 2, embedding = 3 };
inline constexpr int kGemmRoles = 3;
inline constexpr int kLayerClasses = 4;

struct OperandPrecision {
  std::optional<numerics::QuantDesc> a;  // activation or output gradient
  std::optional<numerics::QuantDesc> b;  // weight (forward, dgrad) or activation (wgrad)
  bool hadamard = false;                 // random Hadamard transform of both operands (wgrad)
  friend bool operator==(const OperandPrecision&, const OperandPrecision&) = default;
};

struct LayerPrecision {
  OperandPrecision role[kGemmRoles];
  const OperandPrecision& operator[](GemmRole r) const { return role[static_cast<int>(r)]; }
  OperandPrecision& operator[](GemmRole r) { return role[static_cast<int>(r)]; }
  friend bool operator==(const LayerPrecision&, const LayerPrecision&) = default;
};

struct PrecisionPolicy {
  std::string name = "fp32";
  LayerPrecision layer_class[kLayerClasses];
  // The last `high_precision_last_layers` decoder layers use `high_precision` for their
  // attention and MLP GEMMs (NVIDIA's NVFP4 recipe keeps the last layers in bf16).
  int high_precision_last_layers = 0;
  LayerPrecision high_precision;
  // Format of the served weight copy the export rule makes from the fp32 master weights.
  numerics::Format served_weights = numerics::Format::f32;

  const LayerPrecision& for_layer(LayerClass c, int layer, int num_layers) const;

  // Presets: fp32, bf16, mxfp8, fp8-tensor, nvfp4, mxfp4.
  static PrecisionPolicy preset(std::string_view name);
  static std::vector<std::string> preset_names();
  // A preset name or a path to a JSON policy (see docs/precision.md).
  static PrecisionPolicy from_name_or_file(std::string_view name_or_path);
  static PrecisionPolicy from_json(const nlohmann::json& j, std::string_view source);
  nlohmann::json to_json() const;
  friend bool operator==(const PrecisionPolicy&, const PrecisionPolicy&) = default;
};

std::string_view gemm_role_name(GemmRole r);
std::string_view layer_class_name(LayerClass c);

}  // namespace concord::model
