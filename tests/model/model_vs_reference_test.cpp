// concord's Model (fp32 policy) against the independent references: HF transformers' goldens
// (logits, loss, every gradient), the fp64 reference decoder on random weights (llm.c's
// pattern), and central finite differences of the fp64 reference's loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/io/safetensors.h"
#include "concord/model/config.h"
#include "concord/model/model.h"
#include "concord/model/policy.h"
#include "model_to_reference.h"
#include "reference_fp64.h"

namespace {

using concord_test::reference_config;
using concord_test::reference_weights;

using concord::model::Model;
using concord::model::ModelConfig;
using concord::model::PrecisionPolicy;

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

const std::string kGoldenDir = CONCORD_GOLDEN_DIR;

std::vector<double> to_doubles(const concord::io::TensorInfo& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.dtype == concord::io::Dtype::F64) {
    std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  } else {
    const std::vector<float> f = concord::io::tensor_to_floats(t);  // F32/F16/BF16, else throws
    std::copy(f.begin(), f.end(), out.begin());
  }
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// max |a - b| / max |b|.
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst / max_abs(b);
}

std::vector<double> widen(std::span<const float> x) { return {x.begin(), x.end()}; }

std::vector<double> model_logits(Model& model, const std::vector<int32_t>& tokens, int64_t B,
                                 int64_t T) {
  std::vector<float> logits(static_cast<size_t>(B * T * model.config().vocab_size));
  model.forward(tokens, B, T, logits);
  return widen(logits);
}

// ---------------------------------------------------------------------------------------------
// HF goldens: the weights HF ran on (stored as exact fp32) loaded into Model.

class ModelVsHfGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelVsHfGolden, LogitsLossAndEveryGradientMatchHf) {
  const std::string stem = GetParam();
  const ModelConfig config = ModelConfig::load(kGoldenDir + "/" + stem + ".config.json");
  std::ifstream json_file(kGoldenDir + "/" + stem + ".config.json");
  const nlohmann::json hf = nlohmann::json::parse(json_file);
  EXPECT_EQ(config.architecture, hf.at("architectures").at(0).get<std::string>());
  EXPECT_EQ(config.tie_word_embeddings, hf.at("tie_word_embeddings").get<bool>());
  EXPECT_EQ(config.head_dim, 16);
  EXPECT_EQ(config.rope_theta, 10000.0);

  const auto file = concord::io::SafetensorsFile::open(kGoldenDir + "/" + stem + ".safetensors");
  const auto hf_names =
      nlohmann::json::parse(file.metadata().at("parameters")).get<std::vector<std::string>>();
  Model model(config, PrecisionPolicy::preset("fp32"));
  ASSERT_EQ(model.params().size(), hf_names.size()) << stem << ": parameter count differs from HF's";
  for (const auto& spec : model.params()) {
    const auto* t = file.find(spec.name);
    ASSERT_NE(t, nullptr) << stem << ": concord parameter '" << spec.name << "' is not in HF's model";
    ASSERT_EQ(t->shape, spec.shape) << spec.name;
    ASSERT_EQ(t->dtype, concord::io::Dtype::F32) << spec.name;
    const std::vector<float> values = concord::io::tensor_to_floats(*t);
    std::copy(values.begin(), values.end(), model.param(spec.name).begin());
  }
  model.weights_changed();

  const auto& ids = file.get("input_ids");
  const int64_t B = ids.shape.at(0), T = ids.shape.at(1);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  std::memcpy(tokens.data(), ids.bytes.data(), ids.bytes.size());
  const std::vector<double> hf_logits = to_doubles(file.get("logits"));
  const double hf_loss = to_doubles(file.get("loss")).at(0);

  const double logits_error = relative_error(model_logits(model, tokens, B, T), hf_logits);
  EXPECT_LE(logits_error, 1e-5) << stem << ": max|Δlogit|/max|HF logit| = " << logits_error;

  const auto targets = reference::next_token_targets(tokens, B, T);
  const double loss = model.forward_backward(tokens, targets, B, T);
  EXPECT_LE(std::abs(loss - hf_loss), 1e-5 * std::abs(hf_loss))
      << stem << ": Model loss " << loss << ", HF loss " << hf_loss;

  double worst = 0.0;
  std::string worst_name, failures;
  for (const auto& spec : model.params()) {
    const double err =
        relative_error(widen(model.grad(spec.name)), to_doubles(file.get("grad." + spec.name)));
    if (err > worst) {
      worst = err;
      worst_name = spec.name;
    }
    if (!(err <= 1e-4)) failures += "\n  " + spec.name + ": " + std::to_string(err);
  }
  EXPECT_TRUE(failures.empty()) << stem << ": gradients off by max|Δ|/max|HF grad| > 1e-4:"
                                << failures;
  if (config.moe()) {
    // Qwen3-MoE (tools/make_hf_golden.py qwen3_moe): the load-balancing loss, and every token's
    // selected experts in each MoE layer, identical to HF's.
    const double hf_aux = to_doubles(file.get("aux_loss")).at(0);
    EXPECT_LE(std::abs(model.moe_aux_loss() - hf_aux), 1e-6 * hf_aux) << model.moe_aux_loss() << " vs " << hf_aux;
    for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
      if (!config.is_moe_layer(layer)) {
        EXPECT_TRUE(model.moe_selected(layer).empty()) << layer;
        continue;
      }
      const auto& hf_selected = file.get("selected." + std::to_string(layer));
      std::vector<int32_t> want(static_cast<size_t>(hf_selected.numel()));
      std::memcpy(want.data(), hf_selected.bytes.data(), hf_selected.bytes.size());
      EXPECT_EQ(model.moe_selected(layer), want) << "layer " << layer;
    }
    std::printf("[ measured ] %s: aux loss %.17g (HF %.17g)\n", stem.c_str(), model.moe_aux_loss(), hf_aux);
  }
  std::printf("[ measured ] %s: logits %.3g, loss %.3g, worst gradient %.3g (%s)\n", stem.c_str(),
              logits_error, std::abs(loss - hf_loss) / hf_loss, worst, worst_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Qwen3Moe, ModelVsHfGolden, ::testing::Values("hf_qwen3_moe_tiny"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return param_info.param.substr(3);
                         });

INSTANTIATE_TEST_SUITE_P(Qwen3TiedLlamaUntiedQwen2Bias, ModelVsHfGolden,
                         ::testing::Values("hf_qwen3_tiny", "hf_llama_tiny", "hf_qwen2_tiny"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return param_info.param.substr(3);
                         });

// ---------------------------------------------------------------------------------------------
// Random weights: Model against the fp64 reference on the same (fp32) weights.

// The architectures under test: Qwen3 (QK-norm, tied), Qwen2 (q/k/v biases, tied), Llama
// (untied) and Llama with attention_bias (q/k/v and o biases): both head paths and every bias.
struct Architecture {
  const char* name;          // test-name suffix
  const char* architecture;  // HF's
  bool tied;
  bool attention_bias;
};
const Architecture kQwen3{"qwen3", "Qwen3ForCausalLM", true, false};
const Architecture kQwen2{"qwen2", "Qwen2ForCausalLM", true, false};
const Architecture kLlama{"llama", "LlamaForCausalLM", false, false};
const Architecture kLlamaBias{"llama_bias", "LlamaForCausalLM", false, true};

ModelConfig small_config(const Architecture& arch, int64_t vocab, int64_t hidden,
                         int64_t intermediate, int64_t layers, int64_t heads, int64_t kv_heads,
                         int64_t head_dim) {
  ModelConfig c;
  c.architecture = arch.architecture;
  c.tie_word_embeddings = arch.tied;
  c.attention_bias = arch.attention_bias;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.validate("model_vs_reference_test");
  return c;
}

// Model::init_random, then norm weights 1 + 0.1 N(0, 1) so that the norms are not the identity,
// and biases 0.1 N(0, 1) so that they are not zero.
Model random_model(const ModelConfig& config, uint64_t seed, float std) {
  Model model(config, PrecisionPolicy::preset("fp32"));
  model.init_random(seed, std);
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& spec : model.params()) {
    if (spec.is_matrix()) continue;
    const bool bias = spec.name.size() > 5 && spec.name.substr(spec.name.size() - 5) == ".bias";
    for (float& g : model.param(spec.name)) g = (bias ? 0.0f : 1.0f) + 0.1f * normal(rng);
  }
  model.weights_changed();
  return model;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> uniform(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = uniform(rng);
  return tokens;
}

struct RandomCase {
  Architecture arch;
  uint64_t seed;
};

class ModelVsReferenceRandom : public ::testing::TestWithParam<RandomCase> {};

TEST_P(ModelVsReferenceRandom, ForwardAndLossMatchFp64Reference) {
  const auto [arch, seed] = GetParam();
  const ModelConfig config = small_config(arch, 300, 96, 256, 3, 6, 2, 16);
  Model model = random_model(config, seed, 0.02f);
  const int64_t B = 2, T = 16;
  const auto tokens = random_tokens(B * T, config.vocab_size, seed + 1);
  const auto ref = reference::forward_logits(reference_config(config), reference_weights(model),
                                             tokens, B, T);
  const double err = relative_error(model_logits(model, tokens, B, T), ref);
  EXPECT_LE(err, 1e-5) << config.architecture << " seed " << seed
                       << ": max|Δlogit|/max|reference logit| = " << err;
  const auto targets = reference::next_token_targets(tokens, B, T);
  const double ref_loss = reference::mean_cross_entropy(ref, targets, config.vocab_size);
  const double loss = model.forward_backward(tokens, targets, B, T);
  EXPECT_LE(std::abs(loss - ref_loss), 1e-5 * ref_loss)
      << config.architecture << " seed " << seed << ": loss " << loss << ", reference " << ref_loss;
  std::printf("[ measured ] %s seed %llu: logits %.3g, loss %.3g\n", config.architecture.c_str(),
              static_cast<unsigned long long>(seed), err, std::abs(loss - ref_loss) / ref_loss);
}

INSTANTIATE_TEST_SUITE_P(TwoSeeds, ModelVsReferenceRandom,
                         ::testing::Values(RandomCase{kQwen3, 1}, RandomCase{kQwen3, 2},
                                           RandomCase{kLlama, 1}, RandomCase{kLlama, 2},
                                           RandomCase{kQwen2, 1}, RandomCase{kQwen2, 2},
                                           RandomCase{kLlamaBias, 1}),
                         [](const ::testing::TestParamInfo<RandomCase>& param_info) {
                           return std::string(param_info.param.arch.name) + "_seed" +
                                  std::to_string(param_info.param.seed);
                         });

// ---------------------------------------------------------------------------------------------
// Whole-model gradient check: Model::forward_backward (fp32) against central differences of
// the fp64 reference's loss (step 1e-5, error ~1e-10), 30 entries per tensor kind (the name
// without "model.layers.{i}."), drawn over all layers with a fixed seed. An entry passes when
//   |g_model - g_fd| <= 1e-3 |g_fd| + 1e-4 s,   s = max |g_fd| over the kind's sampled entries:
// fp32 forward/backward rounding is ~1e-6 s, a wrong formula is off by O(s).

std::string tensor_kind(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return name;
  return name.substr(name.find('.', prefix.size()) + 1);
}

class ModelGradientVsFiniteDifferences : public ::testing::TestWithParam<Architecture> {};

TEST_P(ModelGradientVsFiniteDifferences, SampledEntriesOfEveryTensorKind) {
  const ModelConfig config = small_config(GetParam(), 64, 32, 48, 2, 4, 2, 8);
  Model model = random_model(config, 7, 0.1f);
  const int64_t B = 2, T = 6;
  const auto tokens = random_tokens(B * T, config.vocab_size, 11);
  const auto targets = reference::next_token_targets(tokens, B, T);
  model.forward_backward(tokens, targets, B, T);
  const reference::Config ref_config = reference_config(config);
  const reference::Weights weights = reference_weights(model);

  std::map<std::string, std::vector<const concord::model::ParamSpec*>> kinds;
  for (const auto& spec : model.params()) kinds[tensor_kind(spec.name)].push_back(&spec);
  const std::set<int32_t> used(tokens.begin(), tokens.end());
  std::mt19937_64 rng(123);
  for (const auto& [kind, specs] : kinds) {
    struct Entry {
      std::string name;
      int64_t index;
      double model_grad, fd;
    };
    std::vector<Entry> entries;
    for (int i = 0; i < 30; ++i) {
      const auto& spec = *specs[std::uniform_int_distribution<size_t>(0, specs.size() - 1)(rng)];
      int64_t index = std::uniform_int_distribution<int64_t>(0, spec.numel() - 1)(rng);
      if (spec.name == "model.embed_tokens.weight" && i % 2 == 0) {
        // Half of the embedding draws from rows of tokens that occur (the others are 0 untied).
        auto it = used.begin();
        std::advance(it, std::uniform_int_distribution<size_t>(0, used.size() - 1)(rng));
        index = *it * config.hidden_size + index % config.hidden_size;
      }
      const double fd = reference::loss_gradient_central_difference(
          ref_config, weights, spec.name, index, tokens, targets, B, T);
      entries.push_back({spec.name, index, model.grad(spec.name)[static_cast<size_t>(index)], fd});
    }
    double scale = 0.0;
    for (const auto& e : entries) scale = std::max(scale, std::abs(e.fd));
    ASSERT_GT(scale, 0.0) << kind << ": every sampled finite difference is 0";
    double worst = 0.0;
    for (const auto& e : entries) {
      const double diff = std::abs(e.model_grad - e.fd);
      EXPECT_LE(diff, 1e-3 * std::abs(e.fd) + 1e-4 * scale)
          << config.architecture << " " << e.name << "[" << e.index << "]: Model " << e.model_grad
          << ", finite difference " << e.fd << " (kind scale " << scale << ")";
      worst = std::max(worst, diff / scale);
    }
    std::printf("[ measured ] %s %-36s scale %.3g, worst |Δ|/scale %.3g\n",
                config.architecture.c_str(), kind.c_str(), scale, worst);
  }
  if (!config.tie_word_embeddings) {  // untied: rows of tokens absent from the input get no gradient
    const auto grad = model.grad("model.embed_tokens.weight");
    for (int64_t row = 0; row < config.vocab_size; ++row) {
      if (used.count(static_cast<int32_t>(row))) continue;
      for (int64_t i = 0; i < config.hidden_size; ++i)
        ASSERT_EQ(grad[static_cast<size_t>(row * config.hidden_size + i)], 0.0f)
            << "embedding row " << row << " (token not in the input) has a gradient";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Qwen3Qwen2AndLlama, ModelGradientVsFiniteDifferences,
                         ::testing::Values(kQwen3, kQwen2, kLlama, kLlamaBias),
                         [](const ::testing::TestParamInfo<Architecture>& param_info) {
                           return std::string(param_info.param.name);
                         });

}  // namespace
