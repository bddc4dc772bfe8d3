// ModelConfig from / to a Hugging Face config.json (Qwen3ForCausalLM, Qwen2ForCausalLM,
// LlamaForCausalLM).
#include "concord/model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/json_file.h"
#include "concord/numerics/check.h"

namespace concord::model {
namespace {

using nlohmann::json;

// Fields that describe how HF trains or stores the model, not what it computes.
const std::set<std::string>& informational_fields() {
  static const std::set<std::string> fields = {
      "_name_or_path", "architectures", "model_type", "torch_dtype", "dtype",
      "transformers_version", "use_cache", "initializer_range", "attention_dropout",
      "pad_token_id", "bos_token_id", "eos_token_id", "max_window_layers", "sliding_window",
      "use_sliding_window", "rope_scaling", "attention_bias", "mlp_bias", "hidden_act",
      "pretraining_tp", "layer_types", "tie_word_embeddings", "head_dim", "output_attentions",
      "output_hidden_states", "return_dict", "is_encoder_decoder", "chunk_size_feed_forward",
      "id2label", "label2id", "problem_type", "tokenizer_class", "task_specific_params",
      "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
      "rope_theta", "rope_parameters", "concord_schedule", "concord_binary_weights", "num_experts", "num_experts_per_tok",
      "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
      "router_aux_loss_coef", "output_router_logits", "num_local_experts", "n_layers_in_prelude",
      "n_layers_in_recurrent_block", "n_layers_in_coda", "mean_recurrence", "max_recurrence",
      "injection_type", "state_init", "state_init_std"};
  return fields;
}

[[noreturn]] void config_error(std::string_view source, const std::string& what) {
  throw InputError(fmt::format("[config] {}: {}", source, what));
}

int64_t get_int(const io::JsonValue& j, const char* key) {
  if (!j.contains(key)) {
    throw InputError(fmt::format("[{}] {}: missing field '{}'", j.layer(), j.source(),
                                 j.key().empty() ? std::string(key) : j.key() + "." + key));
  }
  return j[key].any_integer();
}

double get_number(const io::JsonValue& j, const char* key, double fallback) {
  if (!j.contains(key) || j.json().at(key).is_null()) return fallback;
  return j[key].number();
}

bool is_false_or_absent(const json& j, const char* key) {
  return !j.contains(key) || j.at(key).is_null() || (j.at(key).is_boolean() && !j.at(key).get<bool>());
}

}  // namespace

int64_t ModelConfig::parameter_count() const {
  const int64_t C = hidden_size, D = head_dim;
  const int64_t attn = C * num_attention_heads * D * 2 + C * num_key_value_heads * D * 2 +
                       (qkv_bias() ? (num_attention_heads + 2 * num_key_value_heads) * D : 0) +
                       (output_bias() ? C : 0);
  const int64_t norms = 2 * C + (qk_norm() ? 2 * D : 0);
  const int64_t head = tie_word_embeddings ? 0 : vocab_size * C;
  int64_t layers = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i)
    layers += attn + norms +
              (is_moe_layer(i) ? num_experts * C + num_experts * 3 * C * moe_intermediate_size : 3 * C * intermediate_size);
  const int64_t adapter = recurrent() ? 2 * C * C : 0;
  return vocab_size * C + layers + adapter + C + head;
}

int64_t ModelConfig::applications_at(int64_t depth) const {
  if (recurrent()) return n_layers_in_prelude + depth * n_layers_in_recurrent_block + n_layers_in_coda;
  return schedule.empty() ? num_hidden_layers : static_cast<int64_t>(schedule.size());
}

int ModelConfig::block_of_at(int64_t application, int64_t depth) const {
  if (recurrent()) {
    const int64_t P = n_layers_in_prelude, R = n_layers_in_recurrent_block;
    if (application < P) return static_cast<int>(application);
    if (application < P + depth * R) return static_cast<int>(P + (application - P) % R);
    return static_cast<int>(application - (depth - 1) * R);
  }
  return schedule.empty() ? static_cast<int>(application) : schedule[static_cast<size_t>(application)];
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  return moe() && num_experts > 0 && decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end();
}

void ModelConfig::validate(std::string_view source) const {
  if (architecture != "Qwen3ForCausalLM" && architecture != "Qwen2ForCausalLM" &&
      architecture != "LlamaForCausalLM" && architecture != "Qwen3MoeForCausalLM" && !recurrent())
    config_error(source, fmt::format("architecture '{}' is not supported (Qwen3ForCausalLM, "
                                     "Qwen2ForCausalLM, LlamaForCausalLM, Qwen3MoeForCausalLM, "
                                     "ConcordRecurrentForCausalLM)", architecture));
  if (recurrent()) {
    const int64_t P = n_layers_in_prelude, R = n_layers_in_recurrent_block, Q = n_layers_in_coda;
    if (P < 0 || R < 1 || Q < 0)
      config_error(source, fmt::format("a recurrent model needs n_layers_in_prelude >= 0, "
                                       "n_layers_in_recurrent_block >= 1 and n_layers_in_coda >= 0 "
                                       "(got {}, {}, {})", P, R, Q));
    if (P + R + Q != num_hidden_layers)
      config_error(source, fmt::format("num_hidden_layers ({}) must equal n_layers_in_prelude + "
                                       "n_layers_in_recurrent_block + n_layers_in_coda ({} + {} + {})",
                                       num_hidden_layers, P, R, Q));
    if (mean_recurrence < 1 || mean_recurrence > 1024)
      config_error(source, fmt::format("'mean_recurrence' must lie in 1..1024 (got {})", mean_recurrence));
    if (max_recurrence < 1 || max_recurrence > 4096)
      config_error(source, fmt::format("'max_recurrence' must lie in 1..4096 (got {})", max_recurrence));
    if (injection_type != "linear")
      config_error(source, fmt::format("injection_type '{}' is not supported (linear)", injection_type));
    if (state_init != "random" && state_init != "zero")
      config_error(source, fmt::format("state_init '{}' is not supported (random, zero)", state_init));
    if (!(state_init_std > 0) || !std::isfinite(state_init_std))
      config_error(source, "'state_init_std' must be positive and finite");
    if (!schedule.empty()) config_error(source, "a recurrent model has no 'concord_schedule' (its core repeats)");
  } else if (n_layers_in_prelude != 0 || n_layers_in_recurrent_block != 0 || n_layers_in_coda != 0 ||
             mean_recurrence != 0 || max_recurrence != 0) {
    config_error(source, fmt::format("{} is not recurrent: the recurrence fields belong to "
                                     "ConcordRecurrentForCausalLM", architecture));
  }
  if (moe()) {
    if (num_experts < 0) config_error(source, fmt::format("'num_experts' must be >= 0 (got {})", num_experts));
    if (num_experts > 0 && (num_experts_per_tok < 1 || num_experts_per_tok > num_experts))
      config_error(source, fmt::format("'num_experts_per_tok' must lie in 1..num_experts = {} (got {})", num_experts,
                                       num_experts_per_tok));
    if (num_experts > 0 && moe_intermediate_size <= 0)
      config_error(source, fmt::format("'moe_intermediate_size' must be positive (got {})", moe_intermediate_size));
    if (decoder_sparse_step < 1)
      config_error(source, fmt::format("'decoder_sparse_step' must be >= 1 (got {})", decoder_sparse_step));
    if (!(router_aux_loss_coef >= 0)) config_error(source, "'router_aux_loss_coef' must be >= 0");
    for (int64_t layer : mlp_only_layers)
      if (layer < 0 || layer >= num_hidden_layers)
        config_error(source, fmt::format("'mlp_only_layers' lists layer {}, outside 0..{}", layer, num_hidden_layers - 1));
  } else if (num_experts != 0 || num_experts_per_tok != 0 || moe_intermediate_size != 0 || norm_topk_prob ||
             !mlp_only_layers.empty()) {
    config_error(source, fmt::format("{} has no experts: the MoE fields belong to Qwen3MoeForCausalLM", architecture));
  }
  if (attention_bias && architecture != "LlamaForCausalLM")
    config_error(source, "attention_bias = true is supported for LlamaForCausalLM only");
  auto positive = [&](int64_t v, const char* name) {
    if (v <= 0) config_error(source, fmt::format("'{}' must be positive (got {})", name, v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(max_position_embeddings, "max_position_embeddings");
  if (num_attention_heads % num_key_value_heads != 0)
    config_error(source, fmt::format("num_attention_heads ({}) must be a multiple of "
                                     "num_key_value_heads ({})", num_attention_heads,
                                     num_key_value_heads));
  if (head_dim % 2 != 0) config_error(source, fmt::format("head_dim ({}) must be even for RoPE", head_dim));
  if (!(rms_norm_eps > 0)) config_error(source, "rms_norm_eps must be positive");
  if (!(rope_theta > 0)) config_error(source, "rope_theta must be positive");
  if (vocab_size > (int64_t{1} << 31) - 1) config_error(source, "vocab_size does not fit int32 token ids");
  constexpr size_t kMaxApplications = 4096;
  if (!binary_weights.empty() && binary_weights != "attention,mlp" && binary_weights != "attention" &&
      binary_weights != "mlp")
    config_error(source, fmt::format("'concord_binary_weights' is '{}': use attention,mlp | attention | mlp",
                                     binary_weights));
  if (schedule.size() > kMaxApplications)
    config_error(source, fmt::format("'concord_schedule' holds {} applications, more than {}", schedule.size(),
                                     kMaxApplications));
  for (size_t a = 0; a < schedule.size(); ++a)
    if (schedule[a] < 0 || schedule[a] >= num_hidden_layers)
      config_error(source, fmt::format("'concord_schedule'[{}] = {} is not a block of this model (0..{})", a,
                                       schedule[a], num_hidden_layers - 1));
}

bool ModelConfig::identity_schedule() const {
  if (schedule.empty()) return true;
  if (static_cast<int64_t>(schedule.size()) != num_hidden_layers) return false;
  for (size_t a = 0; a < schedule.size(); ++a)
    if (schedule[a] != static_cast<int32_t>(a)) return false;
  return true;
}

ModelConfig ModelConfig::from_json(const json& j, std::string_view source) {
  return from_json(io::JsonValue(j, "config", std::string(source)));
}

ModelConfig ModelConfig::from_json(const io::JsonValue& doc) {
  const json& j = doc.object().json();
  // Messages of the checks below name the file and, inside another config, the key of the model.
  const std::string source = doc.key().empty() ? doc.source() : fmt::format("{}: {}", doc.source(), doc.key());
  for (const auto& [key, value] : j.items()) {
    if (!informational_fields().count(key))
      config_error(source, fmt::format("unknown field '{}'; concord implements the Qwen3/Llama "
                                       "decoder fields only (remove it or convert the model)", key));
  }
  ModelConfig c;
  const std::string model_type = doc.contains("model_type") ? doc["model_type"].string() : std::string();
  if (doc.contains("architectures")) {
    const io::JsonValue a = doc["architectures"];
    if (!a.json().is_array() || a.size() != 1) a.fail("must list exactly one architecture");
    c.architecture = a.element(0).string();
  } else if (model_type == "qwen3") {
    c.architecture = "Qwen3ForCausalLM";
  } else if (model_type == "qwen2") {
    c.architecture = "Qwen2ForCausalLM";
  } else if (model_type == "llama") {
    c.architecture = "LlamaForCausalLM";
  } else if (model_type == "qwen3_moe") {
    c.architecture = "Qwen3MoeForCausalLM";
  } else if (model_type == "concord_recurrent") {
    c.architecture = "ConcordRecurrentForCausalLM";
  } else {
    config_error(source, "no 'architectures' and no known 'model_type' (qwen3, qwen2, llama, qwen3_moe, "
                         "concord_recurrent)");
  }
  if (!model_type.empty() && model_type != "qwen3" && model_type != "qwen2" && model_type != "llama" &&
      model_type != "qwen3_moe" && model_type != "concord_recurrent")
    config_error(source, fmt::format("model_type '{}' is not supported (qwen3, qwen2, llama, qwen3_moe, "
                                     "concord_recurrent)", model_type));

  // Qwen2's q/k/v biases are built in (HF's Qwen2Attention ignores attention_bias); Llama puts
  // biases on q, k, v and o when attention_bias is true.
  if (j.contains("attention_bias") && !j.at("attention_bias").is_null()) {
    c.attention_bias = c.architecture != "Qwen2ForCausalLM" && doc["attention_bias"].boolean();
    if (c.attention_bias && c.architecture != "LlamaForCausalLM")
      config_error(source, "attention_bias = true is supported for LlamaForCausalLM only");
  }
  // Fields whose non-default values would change the computation and are not implemented.
  if (!is_false_or_absent(j, "mlp_bias")) config_error(source, "mlp_bias = true is not supported");
  if (!is_false_or_absent(j, "use_sliding_window"))
    config_error(source, "use_sliding_window = true is not supported");
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null())
    config_error(source, "rope_scaling is not supported (set it to null)");
  if (j.contains("rope_parameters") && !j.at("rope_parameters").is_null()) {
    const io::JsonValue rp = doc["rope_parameters"];
    rp.object();
    if (rp.contains("rope_type") && rp["rope_type"].string() != "default")
      config_error(source, "rope_parameters: only rope_type 'default' is supported");
  }
  if (j.contains("hidden_act") && j.at("hidden_act") != "silu")
    config_error(source, "hidden_act must be 'silu' (SwiGLU)");
  if (j.contains("pretraining_tp") && j.at("pretraining_tp") != 1)
    config_error(source, "pretraining_tp must be 1");

  c.vocab_size = get_int(doc, "vocab_size");
  c.hidden_size = get_int(doc, "hidden_size");
  c.intermediate_size = get_int(doc, "intermediate_size");
  c.num_hidden_layers = get_int(doc, "num_hidden_layers");
  c.num_attention_heads = get_int(doc, "num_attention_heads");
  c.num_key_value_heads = doc.contains("num_key_value_heads") ? get_int(doc, "num_key_value_heads") : c.num_attention_heads;
  c.head_dim = j.contains("head_dim") && !j.at("head_dim").is_null()
                   ? get_int(doc, "head_dim")
                   : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
  c.max_position_embeddings = doc.contains("max_position_embeddings") ? get_int(doc, "max_position_embeddings") : 2048;
  c.rms_norm_eps = get_number(doc, "rms_norm_eps", 1e-6);
  double theta = get_number(doc, "rope_theta", 10000.0);
  if (j.contains("rope_parameters") && j.at("rope_parameters").is_object())
    theta = get_number(doc["rope_parameters"], "rope_theta", theta);
  c.rope_theta = theta;
  c.tie_word_embeddings = c.architecture == "Qwen3ForCausalLM" || c.recurrent();
  if (j.contains("tie_word_embeddings") && !j.at("tie_word_embeddings").is_null())
    c.tie_word_embeddings = doc["tie_word_embeddings"].boolean();
  auto token_id = [&](const char* key) -> std::optional<int64_t> {
    if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
    return doc[key].any_integer();
  };
  c.bos_token_id = token_id("bos_token_id");
  if (j.contains("eos_token_id") && j.at("eos_token_id").is_array()) {  // Llama 3: several ids
    const io::JsonValue ids = doc["eos_token_id"];
    for (size_t i = 0; i < ids.size(); ++i) c.eos_token_ids.push_back(ids.element(i).any_integer());
    if (!c.eos_token_ids.empty()) c.eos_token_id = c.eos_token_ids.front();
  } else {
    c.eos_token_id = token_id("eos_token_id");
    if (c.eos_token_id) c.eos_token_ids = {*c.eos_token_id};
  }
  if (c.moe()) {  // HF's Qwen3MoeConfig defaults for absent keys
    auto int_or = [&](const char* key, int64_t fallback) {
      return j.contains(key) && !j.at(key).is_null() ? doc[key].any_integer() : fallback;
    };
    // transformers 5 writes num_experts as "num_local_experts" (its attribute map); the Hub's
    // Qwen3-MoE configs say "num_experts". Either, or both when they agree.
    c.num_experts = int_or("num_experts", int_or("num_local_experts", 128));
    if (j.contains("num_experts") && j.contains("num_local_experts") && !j.at("num_local_experts").is_null() &&
        int_or("num_local_experts", 0) != c.num_experts)
      config_error(source, fmt::format("'num_experts' ({}) and 'num_local_experts' ({}) differ", c.num_experts,
                                       int_or("num_local_experts", 0)));
    c.num_experts_per_tok = int_or("num_experts_per_tok", 8);
    c.moe_intermediate_size = int_or("moe_intermediate_size", 768);
    c.decoder_sparse_step = int_or("decoder_sparse_step", 1);
    if (j.contains("norm_topk_prob") && !j.at("norm_topk_prob").is_null())
      c.norm_topk_prob = doc["norm_topk_prob"].boolean();
    if (j.contains("output_router_logits") && !j.at("output_router_logits").is_null())
      c.output_router_logits = doc["output_router_logits"].boolean();
    c.router_aux_loss_coef = get_number(doc, "router_aux_loss_coef", 0.001);
    if (j.contains("mlp_only_layers") && !j.at("mlp_only_layers").is_null()) {
      const io::JsonValue layers = doc["mlp_only_layers"];
      if (!layers.json().is_array()) layers.fail("must be a list of layer indices");
      for (size_t i = 0; i < layers.size(); ++i) c.mlp_only_layers.push_back(layers.element(i).any_integer());
    }
  } else {
    for (const char* key : {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                            "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits",
                            "num_local_experts"})
      if (j.contains(key) && !j.at(key).is_null())
        config_error(source, fmt::format("unknown field '{}' for {} (a Qwen3MoeForCausalLM field: this "
                                         "architecture has no experts)", key, c.architecture));
  }
  static constexpr const char* kRecurrenceKeys[] = {"n_layers_in_prelude", "n_layers_in_recurrent_block",
                                                     "n_layers_in_coda", "mean_recurrence", "max_recurrence",
                                                     "injection_type", "state_init", "state_init_std"};
  if (c.recurrent()) {
    auto int_or = [&](const char* key, int64_t fallback) {
      return j.contains(key) && !j.at(key).is_null() ? doc[key].any_integer() : fallback;
    };
    c.n_layers_in_prelude = int_or("n_layers_in_prelude", 0);
    c.n_layers_in_recurrent_block = get_int(doc, "n_layers_in_recurrent_block");
    c.n_layers_in_coda = int_or("n_layers_in_coda", 0);
    c.mean_recurrence = get_int(doc, "mean_recurrence");
    c.max_recurrence = int_or("max_recurrence", 4 * c.mean_recurrence);
    if (j.contains("injection_type") && !j.at("injection_type").is_null()) c.injection_type = doc["injection_type"].string();
    if (j.contains("state_init") && !j.at("state_init").is_null()) c.state_init = doc["state_init"].string();
    c.state_init_std = get_number(doc, "state_init_std", std::sqrt(2.0 / (5.0 * static_cast<double>(c.hidden_size))));
  } else {
    for (const char* key : kRecurrenceKeys)
      if (j.contains(key) && !j.at(key).is_null())
        config_error(source, fmt::format("unknown field '{}' for {} (a ConcordRecurrentForCausalLM field)", key,
                                         c.architecture));
  }
  if (j.contains("concord_binary_weights")) c.binary_weights = doc["concord_binary_weights"].string();
  if (j.contains("concord_schedule")) {
    const io::JsonValue sched = doc["concord_schedule"];
    if (!sched.json().is_array() || sched.size() == 0)
      sched.fail("must be a non-empty list of block indices");
    for (size_t i = 0; i < sched.size(); ++i) {
      const int64_t block = sched.element(i).any_integer();
      if (block < 0 || block >= c.num_hidden_layers)
        config_error(source, fmt::format("'concord_schedule'[{}] = {} is not a block of this model (0..{})", i,
                                         block, c.num_hidden_layers - 1));
      c.schedule.push_back(static_cast<int32_t>(block));
    }
  }
  c.validate(source);
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& config_json) {
  return from_json(io::read_json_file(config_json, "config", "the model config"), config_json.string());
}

json ModelConfig::to_json() const {
  json j;
  const bool qwen2 = architecture == "Qwen2ForCausalLM";
  j["architectures"] = json::array({architecture});
  j["model_type"] = architecture == "Qwen3ForCausalLM" ? "qwen3"
                    : qwen2                             ? "qwen2"
                    : moe()                             ? "qwen3_moe"
                    : recurrent()                       ? "concord_recurrent"
                                                        : "llama";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  if (!qwen2) j["attention_bias"] = attention_bias;
  j["torch_dtype"] = "float32";
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() > 1) {
    j["eos_token_id"] = eos_token_ids;
  } else if (eos_token_id) {
    j["eos_token_id"] = *eos_token_id;
  }
  if (moe()) {
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["norm_topk_prob"] = norm_topk_prob;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["mlp_only_layers"] = mlp_only_layers;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
    j["output_router_logits"] = output_router_logits;
  }
  if (recurrent()) {
    j["n_layers_in_prelude"] = n_layers_in_prelude;
    j["n_layers_in_recurrent_block"] = n_layers_in_recurrent_block;
    j["n_layers_in_coda"] = n_layers_in_coda;
    j["mean_recurrence"] = mean_recurrence;
    j["max_recurrence"] = max_recurrence;
    j["injection_type"] = injection_type;
    j["state_init"] = state_init;
    j["state_init_std"] = state_init_std;
  }
  if (!schedule.empty()) j["concord_schedule"] = schedule;
  if (!binary_weights.empty()) j["concord_binary_weights"] = binary_weights;
  return j;
}

}  // namespace concord::model
