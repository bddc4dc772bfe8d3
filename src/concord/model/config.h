// ModelConfig: the decoder's shape, read from a Hugging Face config.json (Qwen3ForCausalLM,
// Qwen2ForCausalLM, LlamaForCausalLM or Qwen3MoeForCausalLM). Qwen2 is Llama without QK-norm and
// with biases on the q/k/v projections; Llama's `attention_bias` adds biases to q/k/v and o;
// Qwen3-MoE is Qwen3 with router and expert MLPs in its MoE layers; ConcordRecurrentForCausalLM
// is the Huginn-style depth-recurrent decoder of Qwen3 layers (docs/recurrence.md). Fields concord does not
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
                                                  // "Qwen3MoeForCausalLM", "ConcordRecurrentForCausalLM"
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
  // A binary-weight model (train/binary.h): its attention and/or MLP GEMM weights are +-alpha per
  // output channel — "attention,mlp", "attention", "mlp", or empty for an ordinary model. Written
  // to config.json as "concord_binary_weights" only when set; loaded with the "native" policy,
  // those weights are served as packed signs (tensor::BlockQuant::b1, no fp32 copy).
  std::string binary_weights;
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

  // Depth recurrence (ConcordRecurrentForCausalLM, Huginn's config names; docs/recurrence.md):
  // layers 0..P-1 are the prelude, P..P+R-1 the recurrent core, the last Q the coda
  // (num_hidden_layers = P + R + Q). With e the prelude's output and s0 the initial state, each
  // of the r core iterations computes s <- core(adapter([s, e])), adapter a linear map 2C -> C
  // (model.adapter.weight, (C, 2C)); the coda reads the last s. r is chosen per pass
  // (Model::set_depth), mean_recurrence by default.
  int64_t n_layers_in_prelude = 0;          // P
  int64_t n_layers_in_recurrent_block = 0;  // R (0: not recurrent)
  int64_t n_layers_in_coda = 0;             // Q
  int64_t mean_recurrence = 0;              // r̄: the depth passes use unless told otherwise
  int64_t max_recurrence = 0;               // the deepest a KV cache holds (default 4 r̄)
  std::string injection_type = "linear";    // [s, e] -> C: a linear adapter (the one implemented)
  std::string state_init = "random";        // "random": truncated normal; "zero"
  double state_init_std = 0.0;              // random s0's std (default sqrt(2 / (5 C)), Huginn's)

  bool qk_norm() const { return architecture == "Qwen3ForCausalLM" || moe() || recurrent(); }
  bool moe() const { return architecture == "Qwen3MoeForCausalLM"; }
  bool recurrent() const { return architecture == "ConcordRecurrentForCausalLM"; }
  bool is_moe_layer(int64_t layer) const;
  // Biases on the q, k, v projections (Qwen2 always) and on o (attention_bias only).
  bool qkv_bias() const { return architecture == "Qwen2ForCausalLM" || attention_bias; }
  bool output_bias() const { return architecture != "Qwen2ForCausalLM" && attention_bias; }
  int64_t parameter_count() const;
  // Block applications of a forward pass, and the block application a runs (a recurrent model:
  // at depth mean_recurrence; Model::Impl's plan follows its current depth).
  int64_t applications() const { return applications_at(mean_recurrence); }
  int block_of(int64_t application) const { return block_of_at(application, mean_recurrence); }
  // The same at core depth `depth` (ignored by a model that is not recurrent).
  int64_t applications_at(int64_t depth) const;
  int block_of_at(int64_t application, int64_t depth) const;
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
