// ModelConfig: the decoder's shape, read from a Hugging Face config.json (Qwen3ForCausalLM or
// LlamaForCausalLM). Fields concord does not implement give a clear error rather than a silently
// different model; informational fields (torch_dtype, transformers_version, ...) are accepted.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace concord::model {

struct ModelConfig {
  std::string architecture = "Qwen3ForCausalLM";  // or "LlamaForCausalLM"
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
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;

  bool qk_norm() const { return architecture == "Qwen3ForCausalLM"; }
  int64_t parameter_count() const;

  // Throws InputError naming `source` and the field on unknown or unsupported fields.
  static ModelConfig from_json(const nlohmann::json& j, std::string_view source);
  static ModelConfig load(const std::filesystem::path& config_json);
  nlohmann::json to_json() const;  // HF-compatible config.json content
  void validate(std::string_view source) const;
};

}  // namespace concord::model
