// ModelConfig: the decoder's shape, read from a Hugging Face config.json (Qwen3ForCausalLM,
// Qwen2ForCausalLM, LlamaForCausalLM or Qwen3MoeForCausalLM). Qwen2 is Llama without QK-norm and
// with biases on the q/k/v projections; Llama's `attention_bias` adds biases to q/k/v and o;
// Qwen3-MoE is Qwen3 with router and expert MLPs in its MoE layers. Fields concord does not
// implement give a clear error rather than a silently different model; informational fields
// (torch_dtype, transformers_version, ...) are accepted.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace concord::io {
class JsonValue;
}

namespace concord::model {

struct ModelConfig {
  std::string architecture = "Qwen3ForCausalLM";  // or "Qwen2ForCausalLM", "LlamaForCausalLM",
                                                  // "Qwen3MoeForCausalLM"
  int64_t vocab_size = 259;
  int64_t hidden_size = 128;            // C
  int64_t intermediate_size = 384;      // F
  int64_t num_hidden_layers = 4;        // L
  int64_t num_attention_heads = 4;      // Hq
  int64_t num_key_value_heads = 2;      // Hkv (GQA: Hq % Hkv == 0)
  int64_t head_dim = 32;                // D
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = true;
  bool attention_bias = false;          // Llama only: biases on q, k, v and o (Qwen2: ignored)
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;  // the first of eos_token_ids
  std::vector<int64_t> eos_token_ids;   // every id config.json lists (an int or a list)
  // The schedule (model/block.h): application a runs decoder block schedule[a], so a block
  // may run more than once (tied weights). Empty: the identity, block i at application i — every
  // Hugging Face model. Written to config.json as "concord_schedule" only when not empty; HF
  // transformers and llama.cpp know no schedule, so exports to them refuse one.
  std::vector<int32_t> schedule;
  // Qwen3-MoE (Qwen3MoeForCausalLM; HF's Qwen3MoeConfig names and defaults). Layer i is an MoE
  // layer when num_experts > 0, (i + 1) % decoder_sparse_step == 0 and i is not in
  // mlp_only_layers; the others have the dense MLP of intermediate_size.
  int64_t num_experts = 0;            // E (0: no MoE layers)
  int64_t num_experts_per_tok = 0;    // k, the experts each token is routed to
  int64_t moe_intermediate_size = 0;  // Fm, each expert's SwiGLU width
  bool norm_topk_prob = false;        // renormalise the k routing weights to sum to 1
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  double router_aux_loss_coef = 0.001;  // HF's load-balancing loss weight (when output_router_logits)
  bool output_router_logits = false;

  bool qk_norm() const { return architecture == "Qwen3ForCausalLM" || moe(); }
  bool moe() const { return architecture == "Qwen3MoeForCausalLM"; }
  bool is_moe_layer(int64_t layer) const;
  // Biases on the q, k, v projections (Qwen2 always) and on o (attention_bias only).
  bool qkv_bias() const { return architecture == "Qwen2ForCausalLM" || attention_bias; }
  bool output_bias() const { return architecture != "Qwen2ForCausalLM" && attention_bias; }
  int64_t parameter_count() const;
  // Block applications of a forward pass, and the block application a runs.
  int64_t applications() const { return schedule.empty() ? num_hidden_layers : static_cast<int64_t>(schedule.size()); }
  int block_of(int64_t application) const {
    return schedule.empty() ? static_cast<int>(application) : schedule[static_cast<size_t>(application)];
  }
  bool identity_schedule() const;

  // Throws InputError naming `source` and the field on unknown or unsupported fields.
  static ModelConfig from_json(const nlohmann::json& j, std::string_view source);
  // The same for a config inside another JSON file: errors name its file and dotted key.
  static ModelConfig from_json(const io::JsonValue& value);
  static ModelConfig load(const std::filesystem::path& config_json);
  nlohmann::json to_json() const;  // HF-compatible config.json content
  void validate(std::string_view source) const;
};

}  // namespace concord::model
