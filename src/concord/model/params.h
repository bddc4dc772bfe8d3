// The parameter registry: every weight of the decoder with its kind (q, k, v, o, gate, up, down,
// the norms, embedding, head), its layer class and its decoder layer, fixed when the parameter
// list of a config is made (parameter_specs). Code that needs "the up projection of layer 0", a
// weight's precision class, or the GGUF name of a weight asks the registry; no code outside
// model/ and io/ spells a Hugging Face weight name.
//
// The table in params.cpp is the one place the Hugging Face and GGUF (llama.cpp) names are
// written; hf_param_name/gguf_param_name and their parsers are derived from it.
//
// Parameter order (model.h) never changes: random init, the SR streams of the export rules and
// the export rules' state are keyed by the index in that order.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "concord/model/policy.h"

namespace concord::model {

enum class ParamKind : uint8_t {
  embed,        // model.embed_tokens.weight           (V, C)
  input_norm,   // model.layers.{i}.input_layernorm.weight
  q, q_bias,    // model.layers.{i}.self_attn.q_proj.{weight,bias}
  k, k_bias,
  v, v_bias,
  o, o_bias,
  q_norm,       // model.layers.{i}.self_attn.q_norm.weight (Qwen3)
  k_norm,
  post_norm,    // model.layers.{i}.post_attention_layernorm.weight
  gate, up, down,  // model.layers.{i}.mlp.{gate,up,down}_proj.weight
  final_norm,   // model.norm.weight
  lm_head,      // lm_head.weight (absent when the embeddings are tied)
  // Qwen3-MoE layers (block_moe.cpp) in place of gate/up/down:
  router,       // model.layers.{i}.mlp.gate.weight (E, C), fp32, never quantized
  expert_gate,  // model.layers.{i}.mlp.experts.{e}.gate_proj.weight (Fm, C)
  expert_up,    // model.layers.{i}.mlp.experts.{e}.up_proj.weight (Fm, C)
  expert_down,  // model.layers.{i}.mlp.experts.{e}.down_proj.weight (C, Fm)
  // A depth-recurrent model (ConcordRecurrentForCausalLM):
  adapter,      // model.adapter.weight (C, 2C): [s, e] -> the core's input; class mlp; no GGUF name
};
inline constexpr int kParamKinds = static_cast<int>(ParamKind::adapter) + 1;

// The class of a parameter: which part of the network it belongs to. Biases belong to their
// projection's class; the q/k norms are norms; experts are mlp; an MoE router is its own class
// (its GEMM runs in fp32 under every precision policy).
enum class ParamClass : uint8_t { embedding, attention, mlp, norm, lm_head, router };

struct ParamKindInfo {
  ParamKind kind;
  ParamClass cls;
  bool per_layer;          // named per decoder layer ("model.layers.{i}." / "blk.{i}.")
  bool per_expert;         // named per expert too ("model.layers.{i}.mlp.experts.{e}.")
  bool gemm_weight;        // the b operand of a GEMM (q k v o gate up down lm_head)
  std::string_view label;  // short name: "q", "up", "input_norm", ...
  std::string_view hf;     // HF name, after "model.layers.{i}." when per_layer (and
                           // "mlp.experts.{e}." when per_expert)
  std::string_view gguf;   // GGUF name, after "blk.{i}." when per_layer; for an expert kind
                           // llama.cpp's 3-D tensor of all the layer's experts
};
const ParamKindInfo& param_kind_info(ParamKind kind);
std::span<const ParamKindInfo> param_kinds();
std::string_view param_class_name(ParamClass c);

struct ParamSpec {
  std::string name;            // HF name
  std::vector<int64_t> shape;  // 1-D (norm weights, biases) or 2-D (out, in)
  ParamKind kind = ParamKind::embed;
  int layer = -1;   // the decoder layer of a per-layer kind; -1 otherwise
  int expert = -1;  // the expert of a per-expert kind; -1 otherwise

  int64_t numel() const;
  bool is_matrix() const { return shape.size() == 2; }
  ParamClass cls() const { return param_kind_info(kind).cls; }
  bool is_gemm_weight() const { return param_kind_info(kind).gemm_weight; }
  // Whether the served copy holds the fp32 values themselves (no export rule, no quantized
  // payload): 1-D parameters (norms, biases) and MoE routers (fp32 under every policy).
  bool served_in_f32() const { return !is_matrix() || kind == ParamKind::router; }
  // The precision policy's class of a GEMM weight (attention, mlp, lm_head); nullopt for the
  // rest, the router included (its GEMM is fp32 under every policy). The tied embedding serves
  // as the head too: the model asks for lm_head there itself.
  std::optional<LayerClass> gemm_class() const;
};

// The projection a bias kind belongs to (q_bias -> q, ...); nullopt for a kind that is no bias.
std::optional<ParamKind> bias_weight_kind(ParamKind kind);

// The registered spec of `kind` (at `layer` for per-layer kinds, `expert` for per-expert kinds)
// in `specs`: its index, or -1.
int find_param(std::span<const ParamSpec> specs, ParamKind kind, int layer = -1, int expert = -1);
// The same, as an InputError naming the weight when absent.
int require_param(std::span<const ParamSpec> specs, ParamKind kind, int layer = -1, int expert = -1);

std::string hf_param_name(ParamKind kind, int layer = -1, int expert = -1);
// For an expert kind, the name of llama.cpp's 3-D tensor holding every expert of the layer.
std::string gguf_param_name(ParamKind kind, int layer = -1);
struct ParamName {
  ParamKind kind;
  int layer;       // -1 for a kind that is not per layer
  int expert = -1;  // -1 for a kind that is not per expert (and for GGUF's merged expert tensors)
  friend bool operator==(const ParamName&, const ParamName&) = default;
};
// The kind and layer a name stands for; nullopt for a name of no registered kind.
std::optional<ParamName> parse_hf_param_name(std::string_view name);
std::optional<ParamName> parse_gguf_param_name(std::string_view name);

// Whether `spec` is one of a binary-weight model's +-alpha weights (ModelConfig::binary_weights:
// "attention,mlp" | "attention" | "mlp" | ""): a GEMM weight matrix of a named class (experts are
// mlp; never the embedding, the head, a norm, a bias, an MoE router or a recurrent adapter).
bool is_binary_weight(const ParamSpec& spec, std::string_view binary_weights);

}  // namespace concord::model
