// The parameter registry's table and lookups (params.h).
#include "concord/model/params.h"

#include <array>
#include <charconv>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::model {
namespace {

using K = ParamKind;
using C = ParamClass;

// One row per kind, in ParamKind order.
constexpr std::array<ParamKindInfo, kParamKinds> kKinds = {{
    {K::embed, C::embedding, false, false, false, "embed", "model.embed_tokens.weight", "token_embd.weight"},
    {K::input_norm, C::norm, true, false, false, "input_norm", "input_layernorm.weight", "attn_norm.weight"},
    {K::q, C::attention, true, false, true, "q", "self_attn.q_proj.weight", "attn_q.weight"},
    {K::q_bias, C::attention, true, false, false, "q_bias", "self_attn.q_proj.bias", "attn_q.bias"},
    {K::k, C::attention, true, false, true, "k", "self_attn.k_proj.weight", "attn_k.weight"},
    {K::k_bias, C::attention, true, false, false, "k_bias", "self_attn.k_proj.bias", "attn_k.bias"},
    {K::v, C::attention, true, false, true, "v", "self_attn.v_proj.weight", "attn_v.weight"},
    {K::v_bias, C::attention, true, false, false, "v_bias", "self_attn.v_proj.bias", "attn_v.bias"},
    {K::o, C::attention, true, false, true, "o", "self_attn.o_proj.weight", "attn_output.weight"},
    {K::o_bias, C::attention, true, false, false, "o_bias", "self_attn.o_proj.bias", "attn_output.bias"},
    {K::q_norm, C::norm, true, false, false, "q_norm", "self_attn.q_norm.weight", "attn_q_norm.weight"},
    {K::k_norm, C::norm, true, false, false, "k_norm", "self_attn.k_norm.weight", "attn_k_norm.weight"},
    {K::post_norm, C::norm, true, false, false, "post_norm", "post_attention_layernorm.weight", "ffn_norm.weight"},
    {K::gate, C::mlp, true, false, true, "gate", "mlp.gate_proj.weight", "ffn_gate.weight"},
    {K::up, C::mlp, true, false, true, "up", "mlp.up_proj.weight", "ffn_up.weight"},
    {K::down, C::mlp, true, false, true, "down", "mlp.down_proj.weight", "ffn_down.weight"},
    {K::final_norm, C::norm, false, false, false, "final_norm", "model.norm.weight", "output_norm.weight"},
    {K::lm_head, C::lm_head, false, false, true, "lm_head", "lm_head.weight", "output.weight"},
    {K::router, C::router, true, false, false, "router", "mlp.gate.weight", "ffn_gate_inp.weight"},
    {K::expert_gate, C::mlp, true, true, true, "expert_gate", "gate_proj.weight", "ffn_gate_exps.weight"},
    {K::expert_up, C::mlp, true, true, true, "expert_up", "up_proj.weight", "ffn_up_exps.weight"},
    {K::expert_down, C::mlp, true, true, true, "expert_down", "down_proj.weight", "ffn_down_exps.weight"},
    {K::adapter, C::mlp, false, false, true, "adapter", "model.adapter.weight", ""},
}};

constexpr bool table_in_kind_order() {
  for (size_t i = 0; i < kKinds.size(); ++i)
    if (static_cast<size_t>(kKinds[i].kind) != i) return false;
  return true;
}
static_assert(table_in_kind_order(), "kKinds rows must follow ParamKind order");

constexpr std::string_view kHfLayerPrefix = "model.layers.";
constexpr std::string_view kGgufLayerPrefix = "blk.";

// "<prefix><digits>.<rest>" -> (layer, rest); nullopt otherwise (no digits, a leading zero of a
// multi-digit number, an overflow: names that no registered parameter has).
std::optional<std::pair<int, std::string_view>> split_layer(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  const std::string_view rest = name.substr(prefix.size());
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string_view::npos || (dot > 1 && rest[0] == '0')) return std::nullopt;
  int layer = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + dot, layer);
  if (ec != std::errc() || end != rest.data() + dot || layer < 0) return std::nullopt;
  return std::make_pair(layer, rest.substr(dot + 1));
}

constexpr std::string_view kHfExpertPrefix = "mlp.experts.";

std::optional<ParamName> parse(std::string_view name, std::string_view prefix, bool gguf) {
  const auto layered = split_layer(name, prefix);
  // "mlp.experts.<e>.<rest>" after the layer prefix (HF only: GGUF merges a layer's experts).
  const auto expert = layered && !gguf ? split_layer(layered->second, kHfExpertPrefix) : std::nullopt;
  for (const ParamKindInfo& k : kKinds) {
    const std::string_view own = gguf ? k.gguf : k.hf;
    if (k.per_expert && !gguf) {
      if (expert && expert->second == own) return ParamName{k.kind, layered->first, expert->first};
      continue;
    }
    if (k.per_layer && layered && layered->second == own) return ParamName{k.kind, layered->first};
    if (!k.per_layer && name == own) return ParamName{k.kind, -1};
  }
  return std::nullopt;
}

std::string name_of(ParamKind kind, int layer, int expert, bool gguf) {
  const ParamKindInfo& k = param_kind_info(kind);
  const std::string_view own = gguf ? k.gguf : k.hf;
  CONCORD_CHECK(k.per_layer == (layer >= 0), fmt::format("parameter kind '{}' {} a layer", k.label,
                                                         k.per_layer ? "needs" : "takes no"));
  CONCORD_CHECK((k.per_expert && !gguf) == (expert >= 0),
                fmt::format("parameter kind '{}' {} an expert here", k.label, expert >= 0 ? "takes no" : "needs"));
  if (!k.per_layer) return std::string(own);
  if (expert >= 0) return fmt::format("{}{}.{}{}.{}", kHfLayerPrefix, layer, kHfExpertPrefix, expert, own);
  return fmt::format("{}{}.{}", gguf ? kGgufLayerPrefix : kHfLayerPrefix, layer, own);
}

}  // namespace

const ParamKindInfo& param_kind_info(ParamKind kind) { return kKinds[static_cast<size_t>(kind)]; }
std::span<const ParamKindInfo> param_kinds() { return kKinds; }

std::string_view param_class_name(ParamClass c) {
  switch (c) {
    case ParamClass::embedding: return "embedding";
    case ParamClass::attention: return "attention";
    case ParamClass::mlp: return "mlp";
    case ParamClass::norm: return "norm";
    case ParamClass::lm_head: return "lm_head";
    case ParamClass::router: return "router";
  }
  return "?";
}

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::optional<LayerClass> ParamSpec::gemm_class() const {
  if (!is_gemm_weight()) return std::nullopt;
  switch (cls()) {
    case ParamClass::attention: return LayerClass::attention;
    case ParamClass::mlp: return LayerClass::mlp;
    case ParamClass::lm_head: return LayerClass::lm_head;
    default: return std::nullopt;
  }
}

std::optional<ParamKind> bias_weight_kind(ParamKind kind) {
  switch (kind) {
    case ParamKind::q_bias: return ParamKind::q;
    case ParamKind::k_bias: return ParamKind::k;
    case ParamKind::v_bias: return ParamKind::v;
    case ParamKind::o_bias: return ParamKind::o;
    default: return std::nullopt;
  }
}

int find_param(std::span<const ParamSpec> specs, ParamKind kind, int layer, int expert) {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].kind == kind && specs[i].layer == layer && specs[i].expert == expert) return static_cast<int>(i);
  return -1;
}

int require_param(std::span<const ParamSpec> specs, ParamKind kind, int layer, int expert) {
  const int i = find_param(specs, kind, layer, expert);
  if (i < 0)
    throw InputError(fmt::format("[model] this model has no parameter {} ({})", hf_param_name(kind, layer, expert),
                                 param_kind_info(kind).label));
  return i;
}

std::string hf_param_name(ParamKind kind, int layer, int expert) { return name_of(kind, layer, expert, false); }
std::string gguf_param_name(ParamKind kind, int layer) { return name_of(kind, layer, -1, true); }

std::optional<ParamName> parse_hf_param_name(std::string_view name) { return parse(name, kHfLayerPrefix, false); }
std::optional<ParamName> parse_gguf_param_name(std::string_view name) {
  return parse(name, kGgufLayerPrefix, true);
}

bool is_binary_weight(const ParamSpec& spec, std::string_view binary_weights) {
  if (binary_weights.empty() || !spec.is_matrix() || !spec.is_gemm_weight()) return false;
  const bool attention = binary_weights == "attention,mlp" || binary_weights == "attention";
  const bool mlp = binary_weights == "attention,mlp" || binary_weights == "mlp";
  switch (spec.cls()) {
    case ParamClass::attention: return attention;
    case ParamClass::mlp: return mlp && spec.kind != ParamKind::adapter;
    default: return false;
  }
}

}  // namespace concord::model
