// The training loop: determinism across runs and thread counts, resume == uninterrupted, loss
// decreasing on a fixed batch under every precision preset, config errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
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

// The binary-weight optimizers (binary.h) in the training loop: a killed run resumes bit for bit
// (signs, residuals, scales and EMAs come back from the checkpoint), the served weights are +-alpha
// per row, and metrics.jsonl carries the state per binary weight.
TEST(BinaryTraining, KilledAndResumedRunsEqualUninterruptedOnesAndTheServedWeightsAreBinary) {
  const TempDir tmp;
  for (const char* name : {"latent-adamw", "bop", "ed"}) {
    const fs::path dir = tmp.path / name;
    fs::create_directories(dir);
    TrainConfig c = tiny_config(dir);
    c.steps = 10;
    c.lr = 1e-2;
    c.optimizer = name;
    c.binary.bop_threshold = 1e-7;
    c = TrainConfig::from_json(c.to_json(), "test");  // the optimizer section round-trips
    EXPECT_EQ(c.optimizer, name);
    TrainOptions o;
    o.progress = false;
    o.out = dir / "whole";
    const TrainResult whole = train(c, o);
    ASSERT_EQ(whole.losses.size(), 10u);
    EXPECT_GT(whole.optimizer_memory.binary_weights, 0);
    EXPECT_GT(whole.binary_flips, 0) << name;
    o.out = dir / "killed";
    o.stop_after = 6;
    train(c, o);
    o.stop_after.reset();
    const TrainResult resumed = train(c, o);
    EXPECT_EQ(resumed.start_step, 4);
    EXPECT_TRUE(same_bits(resumed.losses, std::vector<float>(whole.losses.begin() + 4, whole.losses.end()))) << name;
    EXPECT_EQ(read_file(dir / "whole/final/model.safetensors"), read_file(dir / "killed/final/model.safetensors"));
    // The checkpoint's master of a binary weight holds +-alpha per row: two values per row.
    const LoadedCheckpoint ckpt = load_checkpoint(*latest_checkpoint(dir / "killed"));
    const NamedTensor* up = find_tensor(ckpt.model, "model.layers.0.mlp.up_proj.weight");
    ASSERT_NE(up, nullptr);
    const int64_t cols = up->shape[1];
    for (int64_t r = 0; r < up->shape[0]; ++r) {
      const float a = std::fabs(up->values[static_cast<size_t>(r * cols)]);
      for (int64_t k = 0; k < cols; ++k) ASSERT_EQ(std::fabs(up->values[static_cast<size_t>(r * cols + k)]), a);
    }
    // metrics.jsonl names the state per binary weight.
    std::ifstream metrics(dir / "whole/metrics.jsonl");
    std::string line;
    std::getline(metrics, line);
    const auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("sign_flips") && j.contains("peak_rss_bytes"));
    EXPECT_NEAR(j["state_bits_per_binary_weight"].get<double>(), whole.optimizer_memory.binary_bits_per_weight(), 1e-9);
  }
}


// Fine-tuning a binary model on a new corpus (--init): the run starts from the model's +-alpha
// weights (step 0's validation loss is theirs, on the new corpus) and lowers that loss; a model of
// another architecture is refused naming the key.
TEST(BinaryTraining, InitFineTunesAPretrainedBinaryModelOnANewCorpus) {
  const TempDir tmp;
  TrainConfig c = tiny_config(tmp.path);
  c.optimizer = "ed";
  c.steps = 8;
  c.lr = 1e-2;
  TrainOptions o;
  o.progress = false;
  o.out = tmp.path / "pretrained";
  train(TrainConfig::from_json(c.to_json(), "test"), o);
  // The new domain: code-like lines.
  std::ostringstream code;
  for (int i = 0; i < 3000; ++i) code << "def f" << i % 17 << "(x):\n    return x * " << i % 9 << " + " << i % 5 << "\n";
  std::ofstream(tmp.path / "code.txt") << code.str();
  TrainConfig fine = c;
  fine.corpus = (tmp.path / "code.txt").string();
  fine.init_from = (tmp.path / "pretrained").string();
  fine.steps = 12;
  fine = TrainConfig::from_json(fine.to_json(), "test");
  o.out = tmp.path / "fine";
  const TrainResult r = train(fine, o);
  ASSERT_TRUE(r.initial_validation_loss.has_value());
  EXPECT_LT(r.last_validation_loss, *r.initial_validation_loss);
  std::ifstream metrics(tmp.path / "fine/metrics.jsonl");
  std::string first;
  std::getline(metrics, first);
  EXPECT_EQ(nlohmann::json::parse(first)["step"], 0);
  fine.model.head_dim = 16;
  o.out = tmp.path / "other";
  try {
    train(fine, o);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'head_dim' is 12"), std::string::npos) << e.what();
  }
}

// A depth-recurrent model: each step's depth and s0 are drawn from (seed, step), so a killed and
// resumed run (truncated backprop, randomized depth) equals the uninterrupted one bit for bit; the
// metrics name each step's depth.
TEST(Trainer, RecurrentResumedRunEqualsUninterruptedRun) {
  const TempDir tmp;
  TrainConfig c = tiny_config(tmp.path);
  c.model.architecture = "ConcordRecurrentForCausalLM";
  c.model.num_hidden_layers = 3;
  c.model.n_layers_in_prelude = 1;
  c.model.n_layers_in_recurrent_block = 1;
  c.model.n_layers_in_coda = 1;
  c.model.mean_recurrence = 3;
  c.model.max_recurrence = 12;
  c.model.state_init_std = 0.1;
  c.depth.mean = 3;
  c.depth.backprop = 2;
  TrainOptions o;
  o.progress = false;
  o.out = tmp.path / "whole";
  const TrainResult whole = train(c, o);
  o.out = tmp.path / "killed";
  o.stop_after = 6;
  train(c, o);
  o.stop_after.reset();
  const TrainResult resumed = train(c, o);
  EXPECT_EQ(resumed.start_step, 4);
  std::vector<float> tail(whole.losses.begin() + 4, whole.losses.end());
  EXPECT_TRUE(same_bits(resumed.losses, tail));
  EXPECT_EQ(read_file(tmp.path / "whole/final/model.safetensors"), read_file(tmp.path / "killed/final/model.safetensors"));
  std::ifstream metrics(tmp.path / "whole/metrics.jsonl");
  std::string line;
  std::set<int64_t> depths;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) depths.insert(j.at("depth").get<int64_t>());
  }
  EXPECT_GT(depths.size(), 1u) << "randomized depth";
  // The config records the sampler; a depth section for a model that is not recurrent is an error.
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j.at("depth").at("backprop"), 2);
  EXPECT_EQ(TrainConfig::from_json(j, "t").to_json(), j);
  nlohmann::json dense = tiny_config(tmp.path).to_json();
  EXPECT_FALSE(dense.contains("depth"));
  dense["depth"] = {{"mean", 4}};
  EXPECT_THROW(TrainConfig::from_json(dense, "t"), InputError);
  nlohmann::json bad = j;
  bad["depth"]["sampler"] = "poisson";
  EXPECT_THROW(TrainConfig::from_json(bad, "t"), InputError);
}

// Distillation (a draft model for speculative decoding): a smaller student trained to a trained
// teacher's distributions ends closer to it (validation KL falls), carries the teacher's
// tokenizer, and resumes bit-identically; a student of another vocabulary is refused.
TEST(Trainer, DistilledStudentApproachesTheTeacher) {
  const TempDir tmp;
  TrainConfig t = tiny_config(tmp.path);
  t.steps = 40;
  t.eval_every = 0;
  TrainOptions o;
  o.progress = false;
  o.out = tmp.path / "teacher";
  train(t, o);
  TrainConfig c = tiny_config(tmp.path);
  c.model.hidden_size = 32;
  c.model.head_dim = 8;
  c.model.num_hidden_layers = 1;
  c.distill_from = (tmp.path / "teacher" / "final").string();
  c.steps = 24;
  c.eval_every = 4;
  c = TrainConfig::from_json(c.to_json(), "test");  // the "distill" section round-trips
  EXPECT_EQ(c.distill_from, (tmp.path / "teacher" / "final").string());
  o.out = tmp.path / "student";
  const TrainResult whole = train(c, o);
  std::vector<double> kl;
  std::ifstream metrics(tmp.path / "student/metrics.jsonl");
  std::string line;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) kl.push_back(j["val_loss"].get<double>());
  }
  ASSERT_EQ(kl.size(), 6u);
  EXPECT_LT(kl.back(), 0.8 * kl.front());
  EXPECT_GT(kl.back(), 0.0);
  EXPECT_EQ(read_file(tmp.path / "student/final/tokenizer.json"), read_file(tmp.path / "teacher/final/tokenizer.json"));
  o.out = tmp.path / "killed";
  o.stop_after = 10;
  train(c, o);
  o.stop_after.reset();
  const TrainResult resumed = train(c, o);
  std::vector<float> tail(whole.losses.begin() + 8, whole.losses.end());
  EXPECT_TRUE(same_bits(resumed.losses, tail));
  c.model.vocab_size = 300;
  o.out = tmp.path / "wrong";
  try {
    train(c, o);
    ADD_FAILURE() << "a student of another vocabulary trained";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("set model.vocab_size to 259"), std::string::npos) << e.what();
  }
}

// Every config the repository ships (configs/*.json) is a valid training config.
TEST(Trainer, EveryShippedConfigLoads) {
  const char* golden = std::getenv("CONCORD_GOLDEN_DIR");
  ASSERT_NE(golden, nullptr) << "CONCORD_GOLDEN_DIR is not set (ctest sets it to tests/golden)";
  const fs::path dir = fs::path(golden).parent_path().parent_path() / "configs";
  int n = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    EXPECT_NO_THROW(TrainConfig::load(entry.path())) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 7);
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

// Every file of a model folder, by name.
std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = read_file(e.path());
  return out;
}

// Issue 26, item 1: a fresh start (--no-resume) killed before its first checkpoint left the old
// run's checkpoints and final/ beside its own config.json, and a plain rerun "resumed" the old run.
TEST(Trainer, FreshStartDiscardsThePreviousRun) {
  const TempDir tmp;
  TrainConfig c = tiny_config(tmp.path);
  c.steps = 8;
  TrainOptions o;
  o.progress = false;
  o.out = tmp.path / "run";
  train(c, o);  // seed 1, finished: checkpoints at 4 and 8, final/
  ASSERT_TRUE(fs::exists(tmp.path / "run/final/model.safetensors"));

  TrainConfig seed2 = c;
  seed2.seed = 2;
  o.resume = false;
  o.stop_after = 2;  // "killed" before its first checkpoint
  train(seed2, o);
  EXPECT_FALSE(fs::exists(tmp.path / "run/final")) << "the seed-1 final/ survived a fresh start";
  EXPECT_TRUE(list_checkpoints(tmp.path / "run").empty()) << "the seed-1 checkpoints survived a fresh start";

  o.resume = true;  // the plain rerun
  o.stop_after.reset();
  const TrainResult rerun = train(seed2, o);
  EXPECT_EQ(rerun.start_step, 0);
  EXPECT_EQ(rerun.losses.size(), 8u);
  o.out = tmp.path / "clean";
  train(seed2, o);
  EXPECT_TRUE(folder_bytes(tmp.path / "run/final") == folder_bytes(tmp.path / "clean/final"));
}

// Defense in depth: a checkpoint records the config it was written under, and a resume checks
// the checkpoint, not only config.json (here: a config.json that no longer describes it).
TEST(Trainer, ResumingACheckpointOfAnotherRunIsAnError) {
  const TempDir tmp;
  TrainConfig c = tiny_config(tmp.path);
  c.steps = 8;
  TrainOptions o;
  o.progress = false;
  o.stop_after = 4;
  train(c, o);
  TrainConfig seed2 = c;
  seed2.seed = 2;
  std::ofstream(fs::path(c.out) / "config.json") << seed2.to_json().dump(2);
  o.stop_after.reset();
  try {
    train(seed2, o);
    FAIL() << "resumed a checkpoint of another run";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("step-00000004"), std::string::npos) << m;
    EXPECT_NE(m.find("'train.seed' (1 there, 2 in this config)"), std::string::npos) << m;
  }
  const fs::path state = fs::path(c.out) / "checkpoints/step-00000004/state.json";
  nlohmann::json j = nlohmann::json::parse(read_file(state));
  // A damaged state.json names itself (it was nlohmann's type_error, exit 3).
  const std::string good = j.dump();
  j["optimizer_steps"] = "4";
  std::ofstream(state) << j.dump();
  std::ofstream(fs::path(c.out) / "config.json") << c.to_json().dump(2);
  try {
    train(c, o);
    FAIL() << "resumed with a damaged state.json";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("state.json: 'optimizer_steps' must be an integer"), std::string::npos)
        << e.what();
  }
  j = nlohmann::json::parse(good);
  // A checkpoint that records no config (an older concord's) is not trusted either.
  j.erase("config");
  std::ofstream(state) << j.dump();
  std::ofstream(fs::path(c.out) / "config.json") << c.to_json().dump(2);
  try {
    train(c, o);
    FAIL() << "resumed a checkpoint without a recorded config";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("records no config"), std::string::npos) << e.what();
  }
}

// Issue 26, item 2: a finished run whose final/ is missing, incomplete or of another step gets it
// back from the last checkpoint, bit for bit (ef: the carried error; sr: the step's random bits).
TEST(Trainer, FinalIsRebuiltFromTheLastCheckpoint) {
  const TempDir tmp;
  for (const auto& [policy, rule] : {std::pair{"bf16", "ef"}, std::pair{"nvfp4", "sr"}, std::pair{"mxfp8", "rne"}}) {
    const std::string name = std::string(policy) + "-" + rule;
    const fs::path dir = tmp.path / name;
    fs::create_directories(dir);
    TrainConfig c = tiny_config(dir);
    c.steps = 6;
    c.eval_every = 0;
    c.policy = model::PrecisionPolicy::preset(policy);
    c.export_rule = rule;
    TrainOptions o;
    o.progress = false;
    const fs::path final_dir = fs::path(c.out) / "final";
    EXPECT_FALSE(train(c, o).final_rebuilt);
    const auto original = folder_bytes(final_dir);
    ASSERT_EQ(original.size(), 5u) << name;

    const TrainResult again = train(c, o);  // final/ is current: nothing to do
    EXPECT_TRUE(again.losses.empty());
    EXPECT_FALSE(again.final_rebuilt) << name;

    fs::remove_all(final_dir);  // removed (or never written: killed after the last checkpoint)
    const TrainResult rebuilt = train(c, o);
    EXPECT_TRUE(rebuilt.final_rebuilt) << name;
    EXPECT_TRUE(rebuilt.losses.empty()) << name;
    EXPECT_TRUE(folder_bytes(final_dir) == original) << name;

    fs::remove(final_dir / "tokenizer.json");  // incomplete
    EXPECT_TRUE(train(c, o).final_rebuilt) << name;
    EXPECT_TRUE(folder_bytes(final_dir) == original) << name;

    std::ofstream(final_dir / "model.safetensors", std::ios::trunc) << "torn";  // damaged
    EXPECT_TRUE(train(c, o).final_rebuilt) << name;
    EXPECT_TRUE(folder_bytes(final_dir) == original) << name;
  }
}

// A final/ of another run of the same directory (here: the same config but another step count,
// copied in by hand) is not taken for this run's.
TEST(Trainer, FinalOfAnotherRunIsRebuilt) {
  const TempDir tmp;
  TrainConfig c = tiny_config(tmp.path);
  c.steps = 4;
  TrainOptions o;
  o.progress = false;
  o.out = tmp.path / "four";
  train(c, o);
  TrainConfig five = c;
  five.steps = 5;
  o.out = tmp.path / "five";
  train(five, o);
  const auto original = folder_bytes(tmp.path / "five/final");
  fs::remove_all(tmp.path / "five/final");
  fs::copy(tmp.path / "four/final", tmp.path / "five/final");
  EXPECT_TRUE(train(five, o).final_rebuilt);
  EXPECT_TRUE(folder_bytes(tmp.path / "five/final") == original);
}

TEST(Trainer, ConfigTypeAndDomainErrorsNameTheFileAndKey) {
  const TempDir tmp;
  auto message = [&](const std::string& text) {
    const fs::path path = tmp.path / "cfg.json";
    std::ofstream(path) << text;
    try {
      TrainConfig::load(path);
    } catch (const InputError& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("not an InputError: ") + e.what();
    }
    return std::string("no error");
  };
  const std::string file = (tmp.path / "cfg.json").string();
  EXPECT_EQ(message(R"({"name": 5})"), "[train] " + file + ": 'name' must be a string, got an integer");
  EXPECT_EQ(message(R"({"data": {"corpus": 7}})"), "[train] " + file + ": 'data.corpus' must be a string, got an integer");
  EXPECT_EQ(message(R"({"export": ["ef"]})"), "[train] " + file + ": 'export' must be a string, got a list");
  EXPECT_EQ(message(R"({"train": {"lr": -1}})"), "[train] " + file + ": 'train.lr' must be > 0, got -1");
  EXPECT_EQ(message(R"({"train": {"steps": 0}})"), "[train] " + file + ": 'train.steps' must be an integer >= 1, got 0");
  EXPECT_EQ(message(R"({"train": {"batch_size": 2.5}})"),
            "[train] " + file + ": 'train.batch_size' must be an integer >= 1, got 2.5");
  EXPECT_EQ(message(R"({"train": {"beta2": 1}})").find("'train.beta2' must be below 1"), file.size() + 10);
  EXPECT_EQ(message(R"({"model": {"model_type": "qwen3", "vocab_size": "259"}})"),
            "[train] " + file + ": 'model.vocab_size' must be an integer, got a string");
  EXPECT_EQ(message(R"({"model": {"tie_word_embeddings": 1, "vocab_size": 259, "hidden_size": 8,
                "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "model_type": "qwen3"}})"),
            "[train] " + file + ": 'model.tie_word_embeddings' must be true or false, got an integer");
  EXPECT_EQ(message(R"({"policy": {"base": 3}})"), "[policy] " + file + ": policy: 'base' must be a string, got an integer");
  EXPECT_EQ(message(R"({"train": {"lr": 1, "lr": 2}})"), "[train] " + file + ": key 'lr' appears twice in one object (keep one)");
  const std::string bad = message("{\n  \"name\": x\n}");
  EXPECT_TRUE(bad.starts_with("[train] " + file + ": not valid JSON (")) << bad;
  EXPECT_NE(bad.find("line 2"), std::string::npos) << bad;
  try {
    TrainConfig::load(tmp.path);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "[train] " + tmp.path.string() +
                                         ": cannot open the training config: it is a directory (give the JSON file itself)");
  }
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
