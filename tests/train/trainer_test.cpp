// The training loop: determinism across runs and thread counts, resume == uninterrupted, loss
// decreasing on a fixed batch under every precision preset, config errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/train/checkpoint.h"
#include "concord/train/optimizer.h"
#include "concord/train/trainer.h"
#include "temp_dir.h"

namespace concord::train {
namespace {

namespace fs = std::filesystem;

// A small corpus with structure a model can learn: numbered sentences from a few templates.
fs::path write_corpus(const fs::path& dir) {
  std::ostringstream text;
  const char* subjects[] = {"the king", "a shepherd", "the people", "my brother", "the prophet"};
  const char* verbs[] = {"went up to", "spake unto", "looked upon", "came down from", "blessed"};
  const char* objects[] = {"the city", "the mountain", "the temple", "the river", "the land"};
  std::mt19937 rng(5);
  for (int i = 0; i < 3000; ++i)
    text << i % 50 + 1 << ":" << i % 7 + 1 << " And " << subjects[rng() % 5] << " " << verbs[rng() % 5]
         << " " << objects[rng() % 5] << ".\n";
  const fs::path path = dir / "corpus.txt";
  std::ofstream(path) << text.str();
  return path;
}

TrainConfig tiny_config(const fs::path& dir) {
  TrainConfig c;
  c.name = "test";
  c.model.hidden_size = 48;
  c.model.intermediate_size = 96;
  c.model.num_hidden_layers = 2;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.head_dim = 12;
  c.model.max_position_embeddings = 64;
  c.corpus = write_corpus(dir).string();
  c.validation_fraction = 0.1;
  c.split_chunk = 512;
  c.batch_size = 4;
  c.seq_len = 32;
  c.steps = 12;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.warmup_steps = 3;
  c.eval_every = 4;
  c.eval_batches = 2;
  c.checkpoint_every = 4;
  c.checkpoint_keep = 2;
  c.out = (dir / "run").string();
  return c;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Trainer, SameSeedSameLossesForOneAndTwoThreads) {
  const TempDir tmp;
  const fs::path& dir = tmp.path;
  TrainConfig c = tiny_config(dir);
  c.steps = 6;
  TrainOptions o;
  o.progress = false;
  omp_set_num_threads(1);
  o.out = dir / "one";
  const TrainResult one = train(c, o);
  omp_set_num_threads(2);
  o.out = dir / "two";
  const TrainResult two = train(c, o);
  ASSERT_EQ(one.losses.size(), 6u);
  EXPECT_TRUE(same_bits(one.losses, two.losses));
  EXPECT_EQ(read_file(dir / "one/final/model.safetensors"), read_file(dir / "two/final/model.safetensors"));
}

TEST(Trainer, ResumedRunEqualsUninterruptedRun) {
  const TempDir tmp;
  // sr: stateless but random, the resumed run must draw the same bits; ef: its carried error
  // must come back from the checkpoint.
  for (const auto& [policy, rule] : {std::pair{"fp32", "sr"}, std::pair{"nvfp4", "sr"},
                                     std::pair{"bf16", "ef"}, std::pair{"nvfp4", "ef"}}) {
    const std::string name = std::string(policy) + "-" + rule;
    const fs::path dir = tmp.path / name;
    fs::create_directories(dir);
    TrainConfig c = tiny_config(dir);
    c.policy = model::PrecisionPolicy::preset(policy);
    c.export_rule = rule;
    TrainOptions o;
    o.progress = false;
    o.out = dir / "whole";
    const TrainResult whole = train(c, o);
    ASSERT_EQ(whole.losses.size(), 12u);

    o.out = dir / "killed";
    o.stop_after = 6;  // checkpoints at 4; steps 5 and 6 are lost with the "kill"
    const TrainResult first = train(c, o);
    EXPECT_EQ(first.steps_done, 6);
    o.stop_after.reset();
    const TrainResult resumed = train(c, o);
    EXPECT_EQ(resumed.start_step, 4);
    std::vector<float> tail(whole.losses.begin() + 4, whole.losses.end());
    EXPECT_TRUE(same_bits(resumed.losses, tail)) << name;
    EXPECT_EQ(read_file(dir / "whole/final/model.safetensors"),
              read_file(dir / "killed/final/model.safetensors")) << name;
    // ef's carried error is in the checkpoint (and only there: model.safetensors is the master).
    const LoadedCheckpoint ckpt = load_checkpoint(*latest_checkpoint(dir / "killed"));
    EXPECT_EQ(ckpt.state_tensors.empty(), std::string(rule) != "ef") << name;
    for (const NamedTensor& t : ckpt.model) EXPECT_FALSE(t.name.starts_with("export.")) << t.name;
    // The metrics file holds each step once, as if never interrupted.
    std::ifstream metrics(dir / "killed/metrics.jsonl");
    std::string line;
    std::multiset<int64_t> loss_steps;
    while (std::getline(metrics, line)) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) loss_steps.insert(j["step"].get<int64_t>());
    }
    EXPECT_EQ(loss_steps.size(), 12u);
    for (int64_t s = 1; s <= 12; ++s) EXPECT_EQ(loss_steps.count(s), 1u) << s;
    }
}

TEST(Trainer, ResumingUnderAnotherConfigIsAnError) {
  const TempDir tmp;
  const fs::path& dir = tmp.path;
  TrainConfig c = tiny_config(dir);
  c.steps = 4;
  TrainOptions o;
  o.progress = false;
  train(c, o);
  c.lr = 1e-2;
  EXPECT_THROW(train(c, o), InputError);
  o.resume = false;
  EXPECT_NO_THROW(train(c, o));
}

TEST(Trainer, ConfigErrorsNameTheKey) {
  auto message = [](const char* text) {
    try {
      TrainConfig::from_json(nlohmann::json::parse(text), "cfg.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"train": {"stpes": 3}})").find("train.stpes"), std::string::npos);
  EXPECT_NE(message(R"({"export": "nearest"})").find("nearest"), std::string::npos);
  EXPECT_NE(message(R"({"policy": "fp5"})").find("fp5"), std::string::npos);
  EXPECT_NE(message(R"({"optimiser": {}})").find("optimiser"), std::string::npos);
}

// Loss decreases on a fixed batch for every preset (the model can fit what it sees).
class FixedBatchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixedBatchTest, LossDecreases) {
  model::ModelConfig mc;
  mc.hidden_size = 64;
  mc.intermediate_size = 128;
  mc.num_hidden_layers = 2;
  mc.num_attention_heads = 4;
  mc.num_key_value_heads = 2;
  mc.head_dim = 16;
  mc.max_position_embeddings = 64;
  model::PrecisionPolicy policy = model::PrecisionPolicy::preset(GetParam());
  policy.high_precision_last_layers = 0;  // every layer at the preset's precision
  model::Model m(mc, policy);
  m.init_random(21);
  const int64_t B = 2, T = 32;
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 259);
  for (int64_t i = 0; i < B * T; ++i) targets[i] = (i + 1) % T == 0 ? -1 : tokens[i + 1];
  std::vector<std::vector<float>> master;
  for (const auto& p : m.params()) master.emplace_back(m.param(p.name).begin(), m.param(p.name).end());
  AdamW opt({1e-2, 0.9, 0.95, 1e-8, 0.0, 1.0});
  float first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    for (size_t p = 0; p < master.size(); ++p) std::copy(master[p].begin(), master[p].end(), m.param(m.params()[p].name).begin());
    m.weights_changed();
    const float loss = m.forward_backward(tokens, targets, B, T, static_cast<uint64_t>(step));
    if (step == 0) first = loss;
    last = loss;
    std::vector<ParamView> views;
    for (size_t p = 0; p < master.size(); ++p)
      views.push_back({m.params()[p].name, master[p], m.grad(m.params()[p].name), m.params()[p].is_matrix()});
    opt.step(views, 1e-2);
  }
  EXPECT_NEAR(first, std::log(259.0), 0.3);
  EXPECT_LT(last, 0.5f * first) << GetParam() << ": " << first << " -> " << last;
}

INSTANTIATE_TEST_SUITE_P(Presets, FixedBatchTest,
                         ::testing::Values("fp32", "bf16", "mxfp8", "fp8-tensor", "nvfp4", "mxfp4"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace concord::train
