// PrecisionPolicy presets and JSON; ModelConfig from HF config.json.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "concord/model/config.h"
#include "concord/model/policy.h"
#include "concord/numerics/check.h"

namespace concord::model {
namespace {

using nlohmann::json;
using numerics::Format;
using numerics::Rounding;

TEST(Policy, EveryPresetRoundTripsThroughJson) {
  for (const std::string& name : PrecisionPolicy::preset_names()) {
    const PrecisionPolicy p = PrecisionPolicy::preset(name);
    EXPECT_EQ(p.name, name);
    const PrecisionPolicy back = PrecisionPolicy::from_json(p.to_json(), "roundtrip");
    EXPECT_EQ(back, p) << name << "\n" << p.to_json().dump(2);
  }
}

TEST(Policy, Fp32QuantizesNothingAndServesFp32) {
  const PrecisionPolicy p = PrecisionPolicy::preset("fp32");
  EXPECT_EQ(p.served_weights, Format::f32);
  for (const auto& c : p.layer_class)
    for (const auto& r : c.role) {
      EXPECT_FALSE(r.a.has_value());
      EXPECT_FALSE(r.b.has_value());
    }
}

TEST(Policy, Mxfp8IsE4m3OneByThirtyTwoEverywhereButTheHead) {
  const PrecisionPolicy p = PrecisionPolicy::preset("mxfp8");
  for (LayerClass c : {LayerClass::attention, LayerClass::mlp})
    for (GemmRole r : {GemmRole::forward, GemmRole::dgrad, GemmRole::wgrad}) {
      const OperandPrecision& op = p.layer_class[static_cast<int>(c)][r];
      for (const auto& d : {op.a, op.b}) {
        ASSERT_TRUE(d.has_value());
        EXPECT_EQ(d->element, Format::e4m3);
        EXPECT_EQ(d->block.rows, 1);
        EXPECT_EQ(d->block.cols, 32);
        EXPECT_TRUE(d->is_mx());
      }
    }
  EXPECT_EQ(p.layer_class[static_cast<int>(LayerClass::lm_head)][GemmRole::forward].a->element,
            Format::bf16);
}

TEST(Policy, Nvfp4FollowsNvidiasRecipe) {
  const PrecisionPolicy p = PrecisionPolicy::preset("nvfp4");
  const LayerPrecision& mlp = p.layer_class[static_cast<int>(LayerClass::mlp)];
  EXPECT_EQ(mlp[GemmRole::forward].a->block.cols, 16);
  EXPECT_EQ(mlp[GemmRole::forward].b->block.rows, 16);  // 16x16 weights
  EXPECT_EQ(mlp[GemmRole::forward].b->block.cols, 16);
  EXPECT_EQ(mlp[GemmRole::forward].a->rounding, Rounding::rne);
  EXPECT_EQ(mlp[GemmRole::dgrad].a->rounding, Rounding::stochastic);  // gradients: SR
  EXPECT_EQ(mlp[GemmRole::wgrad].a->rounding, Rounding::stochastic);
  EXPECT_TRUE(mlp[GemmRole::wgrad].hadamard);
  EXPECT_FALSE(mlp[GemmRole::forward].hadamard);
  // The last layer in bf16.
  EXPECT_EQ(p.high_precision_last_layers, 1);
  EXPECT_EQ(p.for_layer(LayerClass::mlp, 7, 8)[GemmRole::forward].a->element, Format::bf16);
  EXPECT_EQ(p.for_layer(LayerClass::mlp, 6, 8)[GemmRole::forward].a->element, Format::e2m1);
}

TEST(Policy, JsonOverridesABase) {
  const json j = json::parse(R"({
    "name": "custom", "base": "mxfp8", "high_precision_last_layers": 2,
    "mlp": {"wgrad": {"a": {"format": "mxfp4", "rounding": "sr"}, "b": "mxfp4", "hadamard": true}},
    "attention": {"forward": {"a": "fp32"}}
  })");
  const PrecisionPolicy p = PrecisionPolicy::from_json(j, "test");
  EXPECT_EQ(p.name, "custom");
  const LayerPrecision& mlp = p.layer_class[static_cast<int>(LayerClass::mlp)];
  EXPECT_EQ(mlp[GemmRole::wgrad].a->element, Format::e2m1);
  EXPECT_EQ(mlp[GemmRole::wgrad].a->rounding, Rounding::stochastic);
  EXPECT_TRUE(mlp[GemmRole::wgrad].hadamard);
  EXPECT_EQ(mlp[GemmRole::forward].a->element, Format::e4m3);  // kept from the base
  EXPECT_FALSE(p.layer_class[0][GemmRole::forward].a.has_value());
  EXPECT_EQ(p.high_precision_last_layers, 2);
}

TEST(Policy, BadJsonNamesTheProblem) {
  auto message = [](const char* text) {
    try {
      PrecisionPolicy::from_json(json::parse(text), "p.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"mpl": {}})").find("unknown key 'mpl'"), std::string::npos);
  EXPECT_NE(message(R"({"mlp": {"fwd": {}}})").find("unknown role 'fwd'"), std::string::npos);
  EXPECT_NE(message(R"({"mlp": {"forward": {"a": "fp7"}}})").find("'fp7' is not a format"),
            std::string::npos);
  EXPECT_NE(message(R"({"base": "fp3"})").find("unknown preset 'fp3'"), std::string::npos);
  EXPECT_THROW(PrecisionPolicy::from_name_or_file("/nonexistent/policy.json"), InputError);
}

// A Qwen3 config.json as transformers writes it.
const char* kQwen3Config = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
})";

TEST(Config, ReadsQwen3ConfigJson) {
  const ModelConfig c = ModelConfig::from_json(json::parse(kQwen3Config), "qwen3");
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(c.qk_norm());
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_id.value(), 151645);
  // Qwen3-0.6B has 596M parameters with tied embeddings (0.44B without them).
  EXPECT_EQ(c.parameter_count(), 596049920);
  EXPECT_EQ(ModelConfig::from_json(c.to_json(), "roundtrip").to_json(), c.to_json());
}

TEST(Config, LlamaDefaultsHeadDimAndUntiedHead) {
  json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 300},
            {"hidden_size", 64}, {"intermediate_size", 160}, {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"tie_word_embeddings", false}};
  const ModelConfig c = ModelConfig::from_json(j, "llama");
  EXPECT_FALSE(c.qk_norm());
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FALSE(c.tie_word_embeddings);
}

// Issue 26, item 4: a value of the wrong type names the file and the key (it was nlohmann's
// "[json.exception.type_error.302] type must be string, but is number", exit 3); a directory or
// invalid JSON given as the file says which.
TEST(Config, WrongTypesNameTheFileAndTheKey) {
  auto message = [](const json& j) {
    try {
      ModelConfig::from_json(j, "config.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("not an InputError: ") + e.what();
    }
    return std::string("no error");
  };
  const json base = json::parse(kQwen3Config);
  json j = base;
  j["model_type"] = 3;
  EXPECT_EQ(message(j), "[config] config.json: 'model_type' must be a string, got an integer");
  j = base;
  j["tie_word_embeddings"] = "yes";
  EXPECT_EQ(message(j), "[config] config.json: 'tie_word_embeddings' must be true or false, got a string");
  j = base;
  j["hidden_size"] = 10.5;
  EXPECT_EQ(message(j), "[config] config.json: 'hidden_size' must be an integer, got 10.5");
  j = base;
  j["eos_token_id"] = {1, "2"};
  EXPECT_EQ(message(j), "[config] config.json: 'eos_token_id[1]' must be an integer, got a string");
  j = base;
  j["rope_parameters"] = {{"rope_type", 1}};
  EXPECT_EQ(message(j), "[config] config.json: 'rope_parameters.rope_type' must be a string, got an integer");

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("concord_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  try {
    ModelConfig::load(dir);
    ADD_FAILURE() << "loaded a directory";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open the model config: it is a directory"), std::string::npos)
        << e.what();
  }
  std::ofstream(dir / "config.json") << "{\"vocab_size\": 259,\n\"hidden_size\": }";
  try {
    ModelConfig::load(dir / "config.json");
    ADD_FAILURE() << "loaded invalid JSON";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: not valid JSON (parse error at line 2"), std::string::npos)
        << e.what();
  }
  std::ofstream(dir / "policy.json") << R"({"base": 8})";
  try {
    PrecisionPolicy::from_name_or_file((dir / "policy.json").string());
    ADD_FAILURE() << "read a number as the base preset";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "[policy] " + (dir / "policy.json").string() +
                                         ": 'base' must be a string, got an integer");
  }
  try {
    PrecisionPolicy::from_name_or_file(dir.string());
    ADD_FAILURE() << "read a directory as a policy";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("it is a directory"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Config, UnsupportedFieldsAreErrors) {
  auto message = [](json j) {
    try {
      ModelConfig::from_json(j, "config.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const json base = json::parse(kQwen3Config);
  json j = base;
  j["moe_intermediate_size"] = 768;
  EXPECT_NE(message(j).find("unknown field 'moe_intermediate_size'"), std::string::npos);
  j = base;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(message(j).find("rope_scaling"), std::string::npos);
  j = base;
  j["attention_bias"] = true;
  EXPECT_NE(message(j).find("attention_bias"), std::string::npos);
  j = base;
  j["num_key_value_heads"] = 5;
  EXPECT_NE(message(j).find("multiple of num_key_value_heads"), std::string::npos);
  j = base;
  j["architectures"] = {"MistralForCausalLM"};
  EXPECT_NE(message(j).find("not supported"), std::string::npos);
  j = base;
  j.erase("hidden_size");
  EXPECT_NE(message(j).find("missing field 'hidden_size'"), std::string::npos);
}

}  // namespace
}  // namespace concord::model
