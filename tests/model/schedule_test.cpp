// Blocks and the schedule (model/block.h): the identity schedule written out computes the bits of
// the plain layer loop; a schedule that applies a block twice (tied weights) has the gradient of
// the unrolled model summed over the block's applications (central differences of the independent
// fp64 reference, which knows nothing of schedules: it runs the unrolled model), and its KV-cache
// forward equals its training forward bit for bit; a block's node description lists exactly the
// GEMMs a training step runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <unistd.h>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "concord/model/files.h"
#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "model_to_reference.h"
#include "test_inputs.h"
#include "reference_fp64.h"

namespace concord::model {
namespace {

using concord_test::same_bits;
using concord_test::tokens_of;

using concord_test::reference_config;

ModelConfig tiny(int layers) {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 48;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  return c;
}

void randomize(Model& m, uint64_t seed) { concord_test::randomize_weights(m, seed); }

// The identity written out as a schedule is the model without one, to the bit, including the
// stochastic rounding of nvfp4's backward (whose streams are keyed by parameter).
TEST(Schedule, TheIdentityWrittenOutKeepsEveryBit) {
  for (const char* preset : {"fp32", "nvfp4"}) {
    ModelConfig plain = tiny(3), written = tiny(3);
    written.schedule = {0, 1, 2};
    EXPECT_TRUE(written.identity_schedule());
    Model a(plain, PrecisionPolicy::preset(preset)), b(written, PrecisionPolicy::preset(preset));
    randomize(a, 3);
    randomize(b, 3);
    const int64_t B = 2, T = 7;
    const auto tokens = tokens_of(B * T, 5, plain.vocab_size);
    const auto targets = reference::next_token_targets(tokens, B, T);
    const float la = a.forward_backward(tokens, targets, B, T, 4);
    const float lb = b.forward_backward(tokens, targets, B, T, 4);
    EXPECT_EQ(std::bit_cast<uint32_t>(la), std::bit_cast<uint32_t>(lb)) << preset;
    for (const ParamSpec& s : a.params()) EXPECT_TRUE(same_bits(a.grad(s.name), b.grad(s.name))) << preset << " " << s.name;
  }
}

// Blocks 0, 1, 0: the reference runs the unrolled three-layer model whose layers 0 and 2 hold
// block 0's weights; perturbing a block-0 weight perturbs both copies.
TEST(Schedule, ABlockAppliedTwiceGetsTheSumOfItsApplicationsGradients) {
  ModelConfig c = tiny(2);
  c.schedule = {0, 1, 0};
  Model m(c);
  randomize(m, 21);
  const int64_t B = 2, T = 6;
  const auto tokens = tokens_of(B * T, 8, c.vocab_size);
  const auto targets = reference::next_token_targets(tokens, B, T);
  const float loss = m.forward_backward(tokens, targets, B, T);

  ModelConfig unrolled = tiny(3);
  const reference::Config ref = reference_config(unrolled);
  reference::Weights w;
  std::map<std::string, std::vector<std::string>> copies;  // block weight -> unrolled names
  for (const ParamSpec& s : m.params()) {
    const auto v = m.param(s.name);
    std::vector<std::string> names;
    if (s.layer < 0) {
      names.push_back(s.name);
    } else {
      for (int app = 0; app < 3; ++app)
        if (c.schedule[static_cast<size_t>(app)] == s.layer) names.push_back(hf_param_name(s.kind, app));
    }
    for (const std::string& n : names) w[n] = std::vector<double>(v.begin(), v.end());
    copies[s.name] = names;
  }
  const double ref_loss = reference::loss(ref, w, tokens, targets, B, T);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss));

  std::mt19937_64 rng(77);
  for (const ParamSpec& s : m.params()) {
    if (s.layer != 0) continue;  // block 0: applied twice
    double scale = 0.0, worst = 0.0;
    std::vector<std::pair<double, double>> pairs;
    for (int i = 0; i < 12; ++i) {
      const auto index = static_cast<size_t>(std::uniform_int_distribution<int64_t>(0, s.numel() - 1)(rng));
      const double h = 1e-5;
      auto loss_at = [&](double delta) {
        reference::Weights p = w;
        for (const std::string& n : copies[s.name]) p[n][index] += delta;
        return reference::loss(ref, p, tokens, targets, B, T);
      };
      const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
      pairs.emplace_back(m.grad(s.name)[index], fd);
      scale = std::max(scale, std::abs(fd));
    }
    ASSERT_GT(scale, 0.0) << s.name;
    for (const auto& [g, fd] : pairs) {
      EXPECT_LE(std::abs(g - fd), 1e-3 * std::abs(fd) + 1e-4 * scale) << s.name << ": " << g << " vs " << fd;
      worst = std::max(worst, std::abs(g - fd) / scale);
    }
    std::printf("[ measured ] tied block 0 %-34s scale %.3g, worst |Δ|/scale %.3g\n", s.name.c_str(), scale, worst);
  }
}

// The KV-cache forward of a schedule with a repeated block: one cache row set per application,
// prefill and token-by-token decode both equal to the training forward's logits, bit for bit.
TEST(Schedule, TheCachedForwardOfATiedScheduleEqualsTheTrainingForward) {
  for (const char* preset : {"fp32", "bf16", "mxfp8"}) {
    ModelConfig c = tiny(2);
    c.schedule = {1, 0, 1, 1};
    Model m(c, PrecisionPolicy::preset(preset));
    randomize(m, 9);
    const int64_t T = 9, V = c.vocab_size;
    const auto tokens = tokens_of(T, 13, V);
    std::vector<float> full(static_cast<size_t>(T * V));
    m.forward(tokens, 1, T, full);

    KvCache cache(c, 2);
    EXPECT_EQ(cache.num_layers(), 4);
    const int whole = cache.allocate(), stepwise = cache.allocate();
    std::vector<float> prefill(static_cast<size_t>(T * V));
    const CachedInput all{whole, tokens, LogitRows::all};
    m.forward_cached(cache, std::span(&all, 1), prefill);
    EXPECT_TRUE(same_bits(prefill, full)) << preset << ": prefill";
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> row(static_cast<size_t>(V));
      const CachedInput one{stepwise, std::span(tokens).subspan(static_cast<size_t>(t), 1), LogitRows::last};
      m.forward_cached(cache, std::span(&one, 1), row);
      EXPECT_TRUE(same_bits(row, std::span<const float>(full).subspan(static_cast<size_t>(t * V), static_cast<size_t>(V))))
          << preset << ": decode position " << t;
    }
    KvCache identity_shaped(tiny(2), 1);
    std::vector<float> out(static_cast<size_t>(V));
    const int slot = identity_shaped.allocate();
    const CachedInput one{slot, std::span(tokens).subspan(0, 1), LogitRows::last};
    EXPECT_THROW(m.forward_cached(identity_shaped, std::span(&one, 1), out), InputError);
  }
}

// Every GEMM a training step runs, as the observer sees it, is a linear node of the block its
// weight belongs to, with that role — once per application of the block.
TEST(Schedule, BlockNodesListEveryGemmOfATrainingStep) {
  ModelConfig c = tiny(2);
  c.architecture = "LlamaForCausalLM";
  c.schedule = {0, 1, 1};
  Model m(c);
  randomize(m, 2);
  std::map<std::pair<std::string, GemmRole>, int> seen;
  m.set_gemm_observer([&](const GemmRecord& r) { ++seen[{std::string(r.weight), r.role}]; });
  const int64_t B = 1, T = 5;
  const auto tokens = tokens_of(B * T, 3, c.vocab_size);
  m.forward_backward(tokens, reference::next_token_targets(tokens, B, T), B, T);
  m.set_gemm_observer(nullptr);

  std::map<std::pair<std::string, GemmRole>, int> described;
  std::set<std::string> names;
  for (int block = 0; block < 2; ++block) {
    const int applications = static_cast<int>(std::count(c.schedule.begin(), c.schedule.end(), block));
    for (const BlockNode& n : m.describe_block(block)) {
      EXPECT_TRUE(names.insert(std::to_string(block) + n.name).second) << n.name << " twice";
      if (n.param >= 0) {
        EXPECT_EQ(m.params()[static_cast<size_t>(n.param)].layer, block) << n.name;
      }
      EXPECT_EQ(n.op == NodeOp::linear, !n.roles.empty()) << n.name;
      for (GemmRole role : n.roles) described[{m.params()[static_cast<size_t>(n.param)].name, role}] += applications;
    }
  }
  // The head (tied: the embedding) is no block's.
  for (GemmRole role : {GemmRole::forward, GemmRole::dgrad, GemmRole::wgrad})
    EXPECT_EQ(seen.erase({"model.embed_tokens.weight", role}), 1u);
  EXPECT_EQ(seen, described);
  EXPECT_THROW(m.describe_block(2), InputError);
}

TEST(Schedule, ConfigJsonCarriesItAndRefusesBlocksThatDoNotExist) {
  ModelConfig c = tiny(2);
  EXPECT_FALSE(c.to_json().contains("concord_schedule"));
  c.schedule = {0, 1, 1, 0};
  EXPECT_EQ(c.applications(), 4);
  const ModelConfig back = ModelConfig::from_json(c.to_json(), "t");
  EXPECT_EQ(back.schedule, c.schedule);
  EXPECT_FALSE(back.identity_schedule());
  auto message = [&](nlohmann::json j) {
    try {
      ModelConfig::from_json(j, "cfg.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json j = c.to_json();
  j["concord_schedule"] = {0, 2};
  EXPECT_EQ(message(j), "[config] cfg.json: 'concord_schedule'[1] = 2 is not a block of this model (0..1)");
  j["concord_schedule"] = nlohmann::json::array();
  EXPECT_NE(message(j).find("must be a non-empty list of block indices"), std::string::npos) << message(j);
}

// llama.cpp runs no schedule: a GGUF export says so instead of writing a different model; a
// concord folder keeps the schedule and loads back with it.
TEST(Schedule, GgufExportRefusesItAndAConcordFolderKeepsIt) {
  ModelConfig c = tiny(2);
  c.schedule = {0, 1, 0};
  Model m(c);
  randomize(m, 4);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("concord_schedule_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ExportOptions gguf;
  gguf.format = ExportFormat::gguf;
  try {
    export_model(m, dir / "m.gguf", gguf);
    ADD_FAILURE() << "exported a scheduled model to GGUF";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("llama.cpp cannot run"), std::string::npos) << e.what();
  }
  export_model(m, dir / "hf", ExportOptions{});
  LoadedModel back = load_model(dir / "hf");
  EXPECT_EQ(back.model.config().schedule, c.schedule);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace concord::model
