// The parameter registry (params.h): every parameter of every architecture carries the kind,
// class and layer its Hugging Face name says (the names written out here by hand, from the HF
// model classes, not from src/), the names round-trip through the parsers, and lookups by kind
// find what the string matching they replace found.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "concord/model/model.h"
#include "concord/numerics/check.h"

namespace concord::model {
namespace {

ModelConfig config_of(const std::string& arch, bool bias, bool tied) {
  ModelConfig c;
  c.architecture = arch;
  c.attention_bias = bias;
  c.tie_word_embeddings = tied;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.max_position_embeddings = 32;
  return c;
}

struct Expected {
  std::string name;
  std::string cls;
  int layer;
};

// Qwen2 (q/k/v biases), untied: every kind but o_bias and the q/k norms, by hand.
TEST(ParamRegistry, Qwen2UntiedHasTheHfNamesWithTheirClassesAndLayers) {
  std::vector<Expected> want = {{"model.embed_tokens.weight", "embedding", -1}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const Expected& e : std::vector<Expected>{
             {p + "input_layernorm.weight", "norm", i},
             {p + "self_attn.q_proj.weight", "attention", i},
             {p + "self_attn.q_proj.bias", "attention", i},
             {p + "self_attn.k_proj.weight", "attention", i},
             {p + "self_attn.k_proj.bias", "attention", i},
             {p + "self_attn.v_proj.weight", "attention", i},
             {p + "self_attn.v_proj.bias", "attention", i},
             {p + "self_attn.o_proj.weight", "attention", i},
             {p + "post_attention_layernorm.weight", "norm", i},
             {p + "mlp.gate_proj.weight", "mlp", i},
             {p + "mlp.up_proj.weight", "mlp", i},
             {p + "mlp.down_proj.weight", "mlp", i}})
      want.push_back(e);
  }
  want.push_back({"model.norm.weight", "norm", -1});
  want.push_back({"lm_head.weight", "lm_head", -1});
  const std::vector<ParamSpec> specs = parameter_specs(config_of("Qwen2ForCausalLM", false, false));
  ASSERT_EQ(specs.size(), want.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(specs[i].name, want[i].name);
    EXPECT_EQ(param_class_name(specs[i].cls()), want[i].cls) << specs[i].name;
    EXPECT_EQ(specs[i].layer, want[i].layer) << specs[i].name;
  }
}

TEST(ParamRegistry, KindsOfEveryArchitectureRoundTripThroughHfAndGgufNames) {
  for (const char* arch : {"Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"})
    for (bool bias : {false, true})
      for (bool tied : {false, true}) {
        const std::vector<ParamSpec> specs = parameter_specs(config_of(arch, bias, tied));
        for (size_t i = 0; i < specs.size(); ++i) {
          const ParamSpec& s = specs[i];
          EXPECT_EQ(hf_param_name(s.kind, s.layer), s.name);
          EXPECT_EQ(parse_hf_param_name(s.name), (ParamName{s.kind, s.layer})) << s.name;
          EXPECT_EQ(parse_gguf_param_name(gguf_param_name(s.kind, s.layer)), (ParamName{s.kind, s.layer}));
          EXPECT_EQ(find_param(specs, s.kind, s.layer), static_cast<int>(i)) << s.name;
          // GEMM weights are the matrices but the embedding (a row lookup, not a GEMM).
          EXPECT_EQ(s.is_gemm_weight(), s.is_matrix() && s.kind != ParamKind::embed) << s.name;
          EXPECT_EQ(s.gemm_class().has_value(), s.is_gemm_weight()) << s.name;
          EXPECT_EQ(s.cls() == ParamClass::norm, s.name.find("norm") != std::string::npos) << s.name;
        }
        EXPECT_EQ(find_param(specs, ParamKind::lm_head) < 0, tied) << arch;
        EXPECT_EQ(find_param(specs, ParamKind::q_norm, 0) >= 0, std::string(arch) == "Qwen3ForCausalLM");
      }
}

TEST(ParamRegistry, GgufNamesAreLlamaCpps) {
  EXPECT_EQ(gguf_param_name(ParamKind::embed), "token_embd.weight");
  EXPECT_EQ(gguf_param_name(ParamKind::lm_head), "output.weight");
  EXPECT_EQ(gguf_param_name(ParamKind::final_norm), "output_norm.weight");
  EXPECT_EQ(gguf_param_name(ParamKind::input_norm, 7), "blk.7.attn_norm.weight");
  EXPECT_EQ(gguf_param_name(ParamKind::post_norm, 0), "blk.0.ffn_norm.weight");
  EXPECT_EQ(gguf_param_name(ParamKind::o, 12), "blk.12.attn_output.weight");
  EXPECT_EQ(gguf_param_name(ParamKind::q_bias, 1), "blk.1.attn_q.bias");
  EXPECT_EQ(gguf_param_name(ParamKind::k_norm, 2), "blk.2.attn_k_norm.weight");
  EXPECT_EQ(gguf_param_name(ParamKind::gate, 3), "blk.3.ffn_gate.weight");
}

TEST(ParamRegistry, NamesOfNoRegisteredKindParseToNothing) {
  for (const char* name : {"model.layers.x.mlp.up_proj.weight", "model.layers.01.mlp.up_proj.weight",
                           "model.layers..mlp.up_proj.weight", "model.layers.0.mlp.extra",
                           "model.layers.99999999999.mlp.up_proj.weight", "mlp.up_proj.weight",
                           "blk.0.ffn_up.weight", "model.layers.0.self_attn.rotary_emb.inv_freq",
                           "lm_head.weight.", "model.embed_tokens"})
    EXPECT_EQ(parse_hf_param_name(name), std::nullopt) << name;
  EXPECT_EQ(parse_gguf_param_name("model.layers.0.mlp.up_proj.weight"), std::nullopt);
  EXPECT_EQ(parse_gguf_param_name("rope_freqs.weight"), std::nullopt);
  EXPECT_EQ(parse_hf_param_name("model.layers.10.mlp.up_proj.weight"), (ParamName{ParamKind::up, 10}));
}

TEST(ParamRegistry, AMissingKindIsNamed) {
  const std::vector<ParamSpec> specs = parameter_specs(config_of("Qwen3ForCausalLM", false, true));
  EXPECT_EQ(find_param(specs, ParamKind::q_bias, 0), -1);
  EXPECT_EQ(find_param(specs, ParamKind::up, 2), -1);  // two layers: 0 and 1
  try {
    require_param(specs, ParamKind::lm_head);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "[model] this model has no parameter lm_head.weight (lm_head)");
  }
}

}  // namespace
}  // namespace concord::model
