// The fp64 reference decoder against HF transformers' own Qwen3/Llama (goldens made by
// tools/make_hf_golden.py in float64), and sanity checks of the reference by itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/io/safetensors.h"
#include "reference_fp64.h"

namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

const std::string kGoldenDir = CONCORD_GOLDEN_DIR;

// F64 read byte for byte (tensor_to_floats converts only to fp32), F32 through concord's reader.
std::vector<double> to_doubles(const concord::io::TensorInfo& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.dtype == concord::io::Dtype::F64) {
    std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  } else if (t.dtype == concord::io::Dtype::F32) {
    const std::vector<float> f = concord::io::tensor_to_floats(t);
    std::copy(f.begin(), f.end(), out.begin());
  } else {
    ADD_FAILURE() << "golden tensor '" << t.name << "' has dtype "
                  << concord::io::dtype_name(t.dtype) << "; expected F32 or F64";
  }
  return out;
}

std::vector<int32_t> to_int32(const concord::io::TensorInfo& t) {
  EXPECT_EQ(t.dtype, concord::io::Dtype::I32) << t.name;
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

// The reference's config from HF's config.json (read here, not through concord's ModelConfig,
// so the reference stays independent). transformers >= 5 keeps theta in "rope_parameters".
reference::Config config_from_hf_json(const nlohmann::json& j) {
  reference::Config c;
  const std::string arch = j.at("architectures").at(0).get<std::string>();
  EXPECT_TRUE(arch == "Qwen3ForCausalLM" || arch == "LlamaForCausalLM" ||
              arch == "Qwen2ForCausalLM")
      << arch;
  c.qwen3 = arch == "Qwen3ForCausalLM";
  c.qkv_bias = arch == "Qwen2ForCausalLM";
  c.vocab = j.at("vocab_size").get<int64_t>();
  c.hidden = j.at("hidden_size").get<int64_t>();
  c.intermediate = j.at("intermediate_size").get<int64_t>();
  c.layers = j.at("num_hidden_layers").get<int64_t>();
  c.heads = j.at("num_attention_heads").get<int64_t>();
  c.kv_heads = j.at("num_key_value_heads").get<int64_t>();
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? j["head_dim"].get<int64_t>()
                                                                   : c.hidden / c.heads;
  c.eps = j.at("rms_norm_eps").get<double>();
  c.theta = j.contains("rope_parameters") ? j["rope_parameters"].at("rope_theta").get<double>()
                                          : j.at("rope_theta").get<double>();
  c.tied = j.at("tie_word_embeddings").get<bool>();
  return c;
}

struct Golden {
  reference::Config config;
  reference::Weights weights;
  reference::Weights grads;        // by parameter name (stored as grad.<name>)
  std::vector<std::string> names;  // HF's named_parameters() order
  std::vector<int32_t> tokens;
  int64_t B = 0, T = 0;
  std::vector<double> logits;  // (B*T, V)
  double loss = 0.0;
};

Golden load_golden(const std::string& stem) {
  Golden g;
  std::ifstream config_file(kGoldenDir + "/" + stem + ".config.json");
  EXPECT_TRUE(config_file.good()) << "missing " << stem << ".config.json in " << kGoldenDir;
  g.config = config_from_hf_json(nlohmann::json::parse(config_file));
  const auto file = concord::io::SafetensorsFile::open(kGoldenDir + "/" + stem + ".safetensors");
  g.names = nlohmann::json::parse(file.metadata().at("parameters")).get<std::vector<std::string>>();
  for (const auto& name : g.names) {
    g.weights[name] = to_doubles(file.get(name));
    g.grads[name] = to_doubles(file.get("grad." + name));
  }
  const auto& ids = file.get("input_ids");
  g.B = ids.shape.at(0);
  g.T = ids.shape.at(1);
  g.tokens = to_int32(ids);
  g.logits = to_doubles(file.get("logits"));
  g.loss = to_doubles(file.get("loss")).at(0);
  return g;
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// max |a - b| / max |b|, and where the largest difference is.
struct RelativeError {
  double value = 0.0;
  size_t worst = 0;
};
RelativeError relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  RelativeError r;
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > worst) {
      worst = std::abs(a[i] - b[i]);
      r.worst = i;
    }
  r.value = worst / max_abs(b);
  return r;
}

class HfGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(HfGolden, ParameterNamesShapesAndOrderMatchHf) {
  const Golden g = load_golden(GetParam());
  const auto shapes = reference::parameter_shapes(g.config);
  ASSERT_EQ(shapes.size(), g.names.size());
  const auto file = concord::io::SafetensorsFile::open(kGoldenDir + "/" + GetParam() + ".safetensors");
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(shapes[i].first, g.names[i]) << "parameter " << i;
    EXPECT_EQ(shapes[i].second, file.get(g.names[i]).shape) << g.names[i];
  }
  EXPECT_EQ(g.weights.count("lm_head.weight"), g.config.tied ? 0u : 1u);
}

TEST_P(HfGolden, ReferenceLogitsAndLossMatchHfInFp64) {
  const Golden g = load_golden(GetParam());
  ASSERT_EQ(g.logits.size(), static_cast<size_t>(g.B * g.T * g.config.vocab));
  const std::vector<double> logits =
      reference::forward_logits(g.config, g.weights, g.tokens, g.B, g.T);
  const RelativeError err = relative_error(logits, g.logits);
  EXPECT_LE(err.value, 1e-9) << GetParam() << ": max|Δlogit|/max|HF logit| = " << err.value
                             << " at row " << err.worst / g.config.vocab << " column "
                             << err.worst % g.config.vocab << " (reference " << logits[err.worst]
                             << ", HF " << g.logits[err.worst] << ")";
  const double loss = reference::mean_cross_entropy(
      logits, reference::next_token_targets(g.tokens, g.B, g.T), g.config.vocab);
  EXPECT_LE(std::abs(loss - g.loss), 1e-9 * std::abs(g.loss))
      << GetParam() << ": reference loss " << loss << ", HF loss " << g.loss;
  std::printf("[ measured ] %s: logits rel err %.3g, loss rel err %.3g\n", GetParam().c_str(),
              err.value, std::abs(loss - g.loss) / g.loss);
}

// HF's gradients (fp64 autograd, stored as fp32) against central differences of the reference
// loss: checks the goldens' gradients before concord's backward is held to them.
TEST_P(HfGolden, HfGradientsMatchReferenceFiniteDifferences) {
  const Golden g = load_golden(GetParam());
  const auto targets = reference::next_token_targets(g.tokens, g.B, g.T);
  std::mt19937_64 rng(20240611);
  double worst_ratio = 0.0;
  std::string worst_where;
  for (const auto& name : g.names) {
    const std::vector<double>& grad = g.grads.at(name);
    const double scale = max_abs(grad);
    ASSERT_GT(scale, 0.0) << name << " has an all-zero HF gradient";
    // The largest entry, plus 5 uniform draws (the embedding's unused rows have gradient 0).
    std::vector<size_t> picks = {static_cast<size_t>(
        std::max_element(grad.begin(), grad.end(),
                         [](double a, double b) { return std::abs(a) < std::abs(b); }) -
        grad.begin())};
    std::uniform_int_distribution<size_t> uniform(0, grad.size() - 1);
    for (int i = 0; i < 5; ++i) picks.push_back(uniform(rng));
    for (size_t index : picks) {
      const double fd = reference::loss_gradient_central_difference(
          g.config, g.weights, name, static_cast<int64_t>(index), g.tokens, targets, g.B, g.T);
      // fp32 storage of the HF gradient: <= 2^-24 relative; the difference: ~1e-10 absolute.
      const double tolerance = 1e-6 * scale + 1e-9;
      const double diff = std::abs(fd - grad[index]);
      EXPECT_LE(diff, tolerance) << GetParam() << " " << name << "[" << index
                                 << "]: finite difference " << fd << ", HF " << grad[index]
                                 << " (tensor max |grad| " << scale << ")";
      if (diff / scale > worst_ratio) {
        worst_ratio = diff / scale;
        worst_where = name + "[" + std::to_string(index) + "]";
      }
    }
  }
  std::printf("[ measured ] %s: worst |fd - HF grad| / max|grad of tensor| = %.3g at %s\n",
              GetParam().c_str(), worst_ratio, worst_where.c_str());
}

INSTANTIATE_TEST_SUITE_P(Qwen3LlamaQwen2, HfGolden,
                         ::testing::Values("hf_qwen3_tiny", "hf_llama_tiny", "hf_qwen2_tiny"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return param_info.param.substr(3);  // "qwen3_tiny", "llama_tiny"
                         });

// Changing a token changes no logit of an earlier position, nor of the other sequence, and
// does change the logits at its own position.
TEST(Reference, AttentionIsCausalAndSequencesAreIndependent) {
  const Golden g = load_golden("hf_qwen3_tiny");
  const int64_t V = g.config.vocab, T = g.T;
  const auto base = reference::forward_logits(g.config, g.weights, g.tokens, g.B, g.T);
  for (int64_t changed : {int64_t{0}, int64_t{5}, T - 1}) {
    auto tokens = g.tokens;
    tokens[static_cast<size_t>(changed)] = (tokens[static_cast<size_t>(changed)] + 7) % static_cast<int32_t>(V);
    const auto logits = reference::forward_logits(g.config, g.weights, tokens, g.B, g.T);
    for (int64_t row = 0; row < g.B * T; ++row) {
      const bool may_change = row < T && row >= changed;  // sequence 0, at or after the change
      bool same = true;
      for (int64_t v = 0; v < V; ++v)
        same = same && logits[static_cast<size_t>(row * V + v)] == base[static_cast<size_t>(row * V + v)];
      if (!may_change) {
        EXPECT_TRUE(same) << "changing position " << changed << " changed row " << row;
      }
      if (row == changed) {
        EXPECT_FALSE(same) << "changing position " << changed << " left its logits";
      }
    }
  }
}

// A tied model equals the untied one whose lm_head is a copy of the embeddings; a different
// lm_head gives different logits (the head is used).
TEST(Reference, TiedEmbeddingsEqualUntiedWithCopiedHead) {
  const Golden g = load_golden("hf_llama_tiny");
  ASSERT_FALSE(g.config.tied);
  reference::Weights copied = g.weights;
  copied["lm_head.weight"] = copied.at("model.embed_tokens.weight");
  reference::Weights tied_weights = g.weights;
  tied_weights.erase("lm_head.weight");
  reference::Config tied = g.config;
  tied.tied = true;
  const auto a = reference::forward_logits(g.config, copied, g.tokens, g.B, g.T);
  const auto b = reference::forward_logits(tied, tied_weights, g.tokens, g.B, g.T);
  EXPECT_EQ(a, b);
  const auto own_head = reference::forward_logits(g.config, g.weights, g.tokens, g.B, g.T);
  EXPECT_GT(relative_error(own_head, b).value, 0.1);
}

// A sequence of one repeated token: every position attends to equal values, so all its rows of
// logits agree (the softmax weights sum to 1) whatever RoPE does to the scores.
TEST(Reference, RepeatedTokenGivesTheSameLogitsAtEveryPosition) {
  const Golden g = load_golden("hf_qwen3_tiny");
  const int64_t T = 9, V = g.config.vocab;
  const std::vector<int32_t> tokens(static_cast<size_t>(T), 42);
  const auto logits = reference::forward_logits(g.config, g.weights, tokens, 1, T);
  const std::vector<double> first(logits.begin(), logits.begin() + V);
  for (int64_t t = 1; t < T; ++t) {
    const std::vector<double> row(logits.begin() + t * V, logits.begin() + (t + 1) * V);
    EXPECT_LE(relative_error(row, first).value, 1e-13) << "position " << t;
  }
}

// Two sequences in one batch give the logits they give alone.
TEST(Reference, BatchRowsEqualSingleSequences) {
  const Golden g = load_golden("hf_llama_tiny");
  const auto both = reference::forward_logits(g.config, g.weights, g.tokens, g.B, g.T);
  const size_t half = g.tokens.size() / 2;
  const std::vector<int32_t> second(g.tokens.begin() + static_cast<std::ptrdiff_t>(half), g.tokens.end());
  const auto alone = reference::forward_logits(g.config, g.weights, second, 1, g.T);
  EXPECT_EQ(alone, std::vector<double>(both.begin() + static_cast<std::ptrdiff_t>(alone.size()), both.end()));
}

TEST(Reference, MeanCrossEntropyByHand) {
  // Uniform logits: log V. Targets < 0 are ignored.
  EXPECT_NEAR(reference::mean_cross_entropy(std::vector<double>(8, 0.25), {3, -1}, 4), std::log(4.0),
              1e-15);
  // Row (0, ln 3): p(1) = 3/4; row (1000, 0): p(0) = 1 (no overflow); mean of both.
  const double expected = (-std::log(0.75) + 0.0) / 2.0;
  EXPECT_NEAR(reference::mean_cross_entropy({0.0, std::log(3.0), 1000.0, 0.0}, {1, 0}, 2), expected,
              1e-15);
}

template <typename F>
void expect_throws_with(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected std::invalid_argument mentioning '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Reference, RejectsBadInputNamingTheProblem) {
  const Golden g = load_golden("hf_qwen3_tiny");
  auto missing = g.weights;
  missing.erase("model.layers.1.self_attn.k_norm.weight");
  expect_throws_with([&] { reference::forward_logits(g.config, missing, g.tokens, g.B, g.T); },
                     "model.layers.1.self_attn.k_norm.weight");
  auto extra = g.weights;
  extra["lm_head.weight"] = extra.at("model.embed_tokens.weight");
  expect_throws_with([&] { reference::forward_logits(g.config, extra, g.tokens, g.B, g.T); },
                     "lm_head.weight");
  auto short_weight = g.weights;
  short_weight["model.norm.weight"].pop_back();
  expect_throws_with([&] { reference::forward_logits(g.config, short_weight, g.tokens, g.B, g.T); },
                     "model.norm.weight");
  auto bad_tokens = g.tokens;
  bad_tokens[3] = static_cast<int32_t>(g.config.vocab);
  expect_throws_with([&] { reference::forward_logits(g.config, g.weights, bad_tokens, g.B, g.T); },
                     "outside");
  expect_throws_with([&] { reference::forward_logits(g.config, g.weights, g.tokens, g.B, g.T + 1); },
                     "B*T");
  expect_throws_with([&] { reference::mean_cross_entropy({0.0, 0.0}, {2}, 2); }, ">= V");
  expect_throws_with([&] { reference::mean_cross_entropy({0.0, 0.0}, {-1}, 2); }, "no target");
}

}  // namespace
