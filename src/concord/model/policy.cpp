// PrecisionPolicy presets and their JSON form.
#include "concord/model/policy.h"

#include <filesystem>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/json_file.h"
#include "concord/numerics/check.h"

namespace concord::model {
namespace {

using nlohmann::json;
using numerics::Format;
using numerics::QuantDesc;
using numerics::Rounding;
using numerics::ScaleRule;

constexpr std::string_view kRoleNames[kGemmRoles] = {"forward", "dgrad", "wgrad"};
constexpr std::string_view kClassNames[kLayerClasses] = {"attention", "mlp", "lm_head", "embedding"};

QuantDesc with_rounding(QuantDesc d, Rounding r) {
  d.rounding = r;
  return d;
}

// The same descriptor for every operand of every role.
LayerPrecision uniform(const std::optional<QuantDesc>& d) {
  LayerPrecision p;
  for (auto& role : p.role) role = {d, d, false};
  return p;
}

LayerPrecision bf16_layer() { return uniform(QuantDesc::elementwise(Format::bf16)); }

PrecisionPolicy make_preset(std::string_view name) {
  PrecisionPolicy p;
  p.name = std::string(name);
  if (name == "fp32") return p;  // every operand fp32, served weights fp32
  p.served_weights = Format::bf16;
  p.high_precision = bf16_layer();
  if (name == "bf16") {
    for (auto& c : p.layer_class) c = bf16_layer();
    p.layer_class[static_cast<int>(LayerClass::embedding)] = {};
    return p;
  }
  // The low-precision recipes keep lm_head in bf16 and the embedding lookup in the served copy.
  LayerPrecision body;
  if (name == "mxfp8") {
    // Transformer Engine's MXFP8 recipe: E4M3 for every operand, 1x32 blocks along K, the
    // scale rounded up so that no element saturates (RCEIL, as TE/cuBLAS compute it).
    body = uniform(QuantDesc::mx(Format::e4m3, ScaleRule::rceil));
  } else if (name == "fp8-tensor") {
    // The older per-tensor FP8 recipe (TE's DelayedScaling, HYBRID format, here with the
    // current amax): E4M3 forward, E5M2 for gradients.
    const QuantDesc e4m3 = QuantDesc::per_tensor(Format::e4m3);
    const QuantDesc e5m2 = QuantDesc::per_tensor(Format::e5m2);
    body[GemmRole::forward] = {e4m3, e4m3, false};
    body[GemmRole::dgrad] = {e5m2, e4m3, false};
    body[GemmRole::wgrad] = {e5m2, e4m3, false};
  } else if (name == "nvfp4") {
    // NVIDIA's NVFP4 recipe: 1x16 blocks for activations and gradients, 16x16 for weights (W
    // and Wᵀ quantize identically), stochastic rounding on gradients, RNE elsewhere, random
    // Hadamard transform on the wgrad inputs, the last layer(s) in bf16.
    const QuantDesc act = QuantDesc::nvfp4({1, 16});
    const QuantDesc weight = QuantDesc::nvfp4({16, 16});
    const QuantDesc grad = with_rounding(act, Rounding::stochastic);
    body[GemmRole::forward] = {act, weight, false};
    body[GemmRole::dgrad] = {grad, weight, false};
    body[GemmRole::wgrad] = {grad, act, true};
    p.high_precision_last_layers = 1;
  } else if (name == "mxfp4") {
    // OCP MXFP4 (E2M1, 1x32, FLOOR) for every operand; as in FP4 training recipes, gradients
    // use stochastic rounding and the wgrad inputs the random Hadamard transform.
    const QuantDesc fp4 = QuantDesc::mx(Format::e2m1, ScaleRule::floor);
    const QuantDesc grad = with_rounding(fp4, Rounding::stochastic);
    body[GemmRole::forward] = {fp4, fp4, false};
    body[GemmRole::dgrad] = {grad, fp4, false};
    body[GemmRole::wgrad] = {grad, fp4, true};
    p.high_precision_last_layers = 1;
  } else {
    throw InputError(fmt::format("[policy] unknown preset '{}' (presets: fp32, bf16, mxfp8, "
                                 "fp8-tensor, nvfp4, mxfp4, or a path to a JSON policy)", name));
  }
  p.layer_class[static_cast<int>(LayerClass::attention)] = body;
  p.layer_class[static_cast<int>(LayerClass::mlp)] = body;
  p.layer_class[static_cast<int>(LayerClass::lm_head)] = bf16_layer();
  return p;
}

[[noreturn]] void policy_error(std::string_view source, const std::string& what) {
  throw InputError(fmt::format("[policy] {}: {}", source, what));
}

std::optional<QuantDesc> operand_from_json(const json& j, std::string_view source,
                                           const std::string& where) {
  if (j.is_null()) return std::nullopt;
  auto from_text = [&](const std::string& text) -> std::optional<QuantDesc> {
    if (text == "fp32" || text == "f32" || text == "none") return std::nullopt;
    if (auto d = QuantDesc::from_name(text)) return d;
    if (auto d = QuantDesc::parse(text)) return d;
    policy_error(source, fmt::format("{}: '{}' is not a format (use fp32, bf16, mxfp8-e4m3, "
                                     "mxfp4, nvfp4, nvfp4-2d, fp8-tensor, ... or "
                                     "element=..;block=..)", where, text));
  };
  if (j.is_string()) return from_text(j.get<std::string>());
  if (!j.is_object() || !j.contains("format") || !j.at("format").is_string())
    policy_error(source, fmt::format("{}: expected a format name or an object with \"format\"", where));
  std::optional<QuantDesc> d = from_text(j.at("format").get<std::string>());
  if (!d) return d;
  for (const auto& [key, value] : j.items()) {
    if (key == "format") continue;
    if (!value.is_string()) policy_error(source, fmt::format("{}.{} must be a string", where, key));
    const std::string v = value.get<std::string>();
    if (key == "rounding") {
      auto r = numerics::rounding_from_name(v);
      if (!r) policy_error(source, fmt::format("{}.rounding '{}' (rne, rtz, sr)", where, v));
      d->rounding = *r;
    } else if (key == "scale_rule") {
      auto r = numerics::scale_rule_from_name(v);
      if (!r) policy_error(source, fmt::format("{}.scale_rule '{}' (floor, ceil, even, rceil)", where, v));
      d->scale_rule = *r;
    } else if (key == "block") {
      int rows = 0, cols = 0;
      char x = 0;
      std::istringstream in(v);
      if (!(in >> rows >> x >> cols) || x != 'x' || rows <= 0 || cols <= 0)
        policy_error(source, fmt::format("{}.block '{}' (ROWSxCOLS, e.g. 1x32)", where, v));
      d->block = {rows, cols};
    } else {
      policy_error(source, fmt::format("{}: unknown key '{}' (format, rounding, scale_rule, block)", where, key));
    }
  }
  return d;
}

json operand_to_json(const std::optional<QuantDesc>& d) {
  return d ? json(d->to_string()) : json("fp32");
}

LayerPrecision layer_from_json(const json& j, LayerPrecision base, std::string_view source,
                               const std::string& where) {
  if (j.is_string()) {
    auto d = operand_from_json(j, source, where);
    return uniform(d);
  }
  if (!j.is_object()) policy_error(source, fmt::format("{}: expected an object of roles", where));
  for (const auto& [key, value] : j.items()) {
    int r = 0;
    while (r < kGemmRoles && kRoleNames[r] != key) ++r;
    if (r == kGemmRoles)
      policy_error(source, fmt::format("{}: unknown role '{}' (forward, dgrad, wgrad)", where, key));
    OperandPrecision& op = base.role[r];
    const std::string at = where + "." + key;
    if (!value.is_object()) policy_error(source, fmt::format("{}: expected {{\"a\":..,\"b\":..}}", at));
    for (const auto& [k, v] : value.items()) {
      if (k == "a") op.a = operand_from_json(v, source, at + ".a");
      else if (k == "b") op.b = operand_from_json(v, source, at + ".b");
      else if (k == "hadamard") {
        if (!v.is_boolean()) policy_error(source, at + ".hadamard must be true or false");
        op.hadamard = v.get<bool>();
      } else {
        policy_error(source, fmt::format("{}: unknown key '{}' (a, b, hadamard)", at, k));
      }
    }
  }
  return base;
}

json layer_to_json(const LayerPrecision& l) {
  json j;
  for (int r = 0; r < kGemmRoles; ++r) {
    j[std::string(kRoleNames[r])] = {{"a", operand_to_json(l.role[r].a)},
                                     {"b", operand_to_json(l.role[r].b)},
                                     {"hadamard", l.role[r].hadamard}};
  }
  return j;
}

}  // namespace

std::string_view gemm_role_name(GemmRole r) { return kRoleNames[static_cast<int>(r)]; }
std::string_view layer_class_name(LayerClass c) { return kClassNames[static_cast<int>(c)]; }

const LayerPrecision& PrecisionPolicy::for_layer(LayerClass c, int layer, int num_layers) const {
  const bool decoder_class = c == LayerClass::attention || c == LayerClass::mlp;
  if (decoder_class && layer >= num_layers - high_precision_last_layers) return high_precision;
  return layer_class[static_cast<int>(c)];
}

PrecisionPolicy PrecisionPolicy::preset(std::string_view name) { return make_preset(name); }

std::vector<std::string> PrecisionPolicy::preset_names() {
  return {"fp32", "bf16", "mxfp8", "fp8-tensor", "nvfp4", "mxfp4"};
}

PrecisionPolicy PrecisionPolicy::from_json(const json& j, std::string_view source) {
  if (!j.is_object()) policy_error(source, "expected a JSON object");
  auto string_field = [&](const char* key, std::string fallback) {
    if (!j.contains(key)) return fallback;
    if (!j.at(key).is_string())
      policy_error(source, fmt::format("'{}' must be a string, got {}", key, io::json_type_phrase(j.at(key))));
    return j.at(key).get<std::string>();
  };
  PrecisionPolicy p;
  const std::string base = string_field("base", "fp32");
  try {
    p = make_preset(base);
  } catch (const InputError& e) {
    policy_error(source, fmt::format("'base': {}", e.what()));
  }
  p.name = string_field("name", std::string(source));
  for (const auto& [key, value] : j.items()) {
    if (key == "name" || key == "base") continue;
    if (key == "served_weights") {
      auto f = value.is_string() ? numerics::format_from_name(value.get<std::string>()) : std::nullopt;
      if (!f) policy_error(source, "served_weights must be a format name (f32, bf16, ...)");
      p.served_weights = *f;
    } else if (key == "high_precision_last_layers") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > 1'000'000)
        policy_error(source, "high_precision_last_layers must be a non-negative integer");
      p.high_precision_last_layers = value.get<int>();
    } else if (key == "high_precision") {
      p.high_precision = layer_from_json(value, p.high_precision, source, key);
    } else {
      int c = 0;
      while (c < kLayerClasses && kClassNames[c] != key) ++c;
      if (c == kLayerClasses)
        policy_error(source, fmt::format("unknown key '{}' (name, base, served_weights, "
                                         "high_precision_last_layers, high_precision, attention, "
                                         "mlp, lm_head, embedding)", key));
      p.layer_class[c] = layer_from_json(value, p.layer_class[c], source, key);
    }
  }
  return p;
}

PrecisionPolicy PrecisionPolicy::from_name_or_file(std::string_view name_or_path) {
  for (const auto& n : preset_names())
    if (n == name_or_path) return preset(name_or_path);
  const std::string path(name_or_path);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw InputError(fmt::format("[policy] '{}' is neither a preset (fp32, bf16, mxfp8, "
                                 "fp8-tensor, nvfp4, mxfp4) nor a JSON policy file", path));
  return from_json(io::read_json_file(path, "policy", "the precision policy"), path);
}

json PrecisionPolicy::to_json() const {
  json j;
  j["name"] = name;
  j["served_weights"] = std::string(numerics::traits(served_weights).name);
  j["high_precision_last_layers"] = high_precision_last_layers;
  j["high_precision"] = layer_to_json(high_precision);
  for (int c = 0; c < kLayerClasses; ++c) j[std::string(kClassNames[c])] = layer_to_json(layer_class[c]);
  return j;
}

}  // namespace concord::model
