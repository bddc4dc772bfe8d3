// The RL loop end to end on a tiny model, in process: metrics.jsonl lines carry the named metrics,
// the report holds inline SVG, an injected fault is reported while the old version keeps
// serving, matched bf16/bf16 has no mismatch (and a mismatched pair has some), the warm-up cache
// is reused, the same seed gives the same run, and a stopped run resumes from its last
// checkpoint bit-identically.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "concord/numerics/check.h"
#include "concord/rl/channel.h"
#include "concord/rl/loop.h"
#include "concord/train/checkpoint.h"
#include "train_state_fixture.h"

namespace concord::rl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("concord_loop_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<json> read_jsonl(const fs::path& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) lines.push_back(json::parse(line));
  return lines;
}

RlConfig tiny_config(const fs::path& out, const std::string& sampler = "bf16",
                     const std::string& learner = "bf16") {
  RlConfig c;
  c.name = "tiny";
  c.model = default_rl_model();
  c.model.hidden_size = 32;
  c.model.intermediate_size = 64;
  c.model.num_hidden_layers = 1;
  c.model.num_attention_heads = 1;
  c.model.num_key_value_heads = 1;
  c.model.head_dim = 32;
  c.model.max_position_embeddings = 64;
  c.sampler = sampler;
  c.learner = learner;
  c.task = "add";
  c.difficulty = 1;
  // Enough warm-up that step 1 has rewards 0 and 1 in a group (a non-zero gradient).
  c.warmup_steps = 40;
  c.warmup_batch = 16;
  c.warmup_lr = 1e-2;
  c.steps = 3;
  c.prompts_per_step = 2;
  c.group_size = 4;
  c.max_new_tokens = 3;
  c.lr = 1e-3;
  c.probe.sequences = 2;
  c.probe.length = 16;
  c.seed = 5;
  c.out = out.string();
  return c;
}

RlResult run_in_process(const RlConfig& c) {
  auto channel = make_in_process_channel();
  return run_rl(c, *channel, /*progress=*/false);
}

// Drops what depends on the clock.
json without_timing(json line) {
  for (auto it = line.begin(); it != line.end();) {
    if (it.key().rfind("time/", 0) == 0 || it.key() == "sync/reports") it = line.erase(it);
    else ++it;
  }
  return line;
}

TEST(RlLoop, MetricsLinesCarryTheNamedMetricsAndTheReportHasSvg) {
  const fs::path out = temp_dir("metrics");
  const RlConfig c = tiny_config(out);
  const RlResult r = run_in_process(c);
  ASSERT_EQ(r.steps.size(), 3u);
  const std::vector<json> lines = read_jsonl(out / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < lines.size(); ++i) {
    const json& l = lines[i];
    EXPECT_EQ(l.at("step").get<int64_t>(), static_cast<int64_t>(i) + 1);
    for (const char* key :
         {"rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/log_ppl_abs_diff",
          "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_min", "rollout_corr/rollout_is_max",
          "rollout_corr/rollout_is_eff_sample_size", "token_mult_prob_error", "prob_diff_max",
          "prob_diff_mean", "reward", "entropy", "time/rollout_s", "time/learner_s", "time/sync_s",
          "actor/loss", "actor/pg_clipfrac"}) {
      EXPECT_TRUE(l.contains(key) && l.at(key).is_number()) << "step " << i + 1 << " lacks " << key;
    }
    const double reward = l.at("reward").get<double>();
    EXPECT_GE(reward, 0.0);
    EXPECT_LE(reward, 1.0);
    // rewards are 0/1 per completion: the step mean is a multiple of 1/8
    EXPECT_DOUBLE_EQ(reward * 8, std::round(reward * 8));
    EXPECT_GT(l.at("entropy").get<double>(), 0.0);
    const json& fc = l.at("fair_cast");
    for (const char* key : {"changed_fraction", "weights", "err_ulp", "lag"}) {
      EXPECT_TRUE(fc.contains(key)) << "fair_cast lacks " << key;
    }
    EXPECT_TRUE(l.at("sync/applied").get<bool>());
    ASSERT_EQ(l.at("sync/reports").size(), 1u);
    EXPECT_EQ(l.at("sync/reports")[0].at("serving").get<int64_t>(), static_cast<int64_t>(i) + 1);
  }
  // Step 1's update (non-zero gradient) reaches the served copy exported at step 2.
  ASSERT_GT(lines[0].at("grad_norm").get<double>(), 0.0);
  EXPECT_GT(lines[1].at("fair_cast").at("changed_fraction").get<double>(), 0.0);
  const std::string report = read_text(out / "report.html");
  EXPECT_NE(report.find("<svg"), std::string::npos);
  EXPECT_NE(report.find("rollout_corr/k3_kl"), std::string::npos);
  EXPECT_EQ(report.find("<script"), std::string::npos);
  const json summary = json::parse(read_text(out / "summary.json"));
  EXPECT_EQ(summary.at("sync_failures").get<int64_t>(), 0);
  EXPECT_EQ(json::parse(read_text(out / "config.json")), c.to_json());
  fs::remove_all(out);
}

// A Qwen3-MoE policy (issue 37) through the whole loop at bf16/bf16 and mxfp8/mxfp8: every sync
// passes its seven checks, matched precisions see no mismatch, and a stale router injected at
// step 2 is caught and keeps version 1 serving.
TEST(RlLoop, AQwen3MoePolicyRunsWithEverySyncCheck) {
  for (const std::string preset : {"bf16", "mxfp8"}) {
    const fs::path out = temp_dir("moe_" + preset);
    RlConfig c = tiny_config(out, preset, preset);
    c.model.architecture = "Qwen3MoeForCausalLM";
    c.model.num_experts = 4;
    c.model.num_experts_per_tok = 2;
    c.model.moe_intermediate_size = 16;
    c.model.norm_topk_prob = true;
    const RlResult r = run_in_process(c);
    ASSERT_EQ(r.steps.size(), 3u) << preset;
    for (const RlStepMetrics& s : r.steps) {
      EXPECT_TRUE(s.line.at("sync/applied").get<bool>()) << preset << " step " << s.step;
      const json& report = s.line.at("sync/reports")[0];
      EXPECT_TRUE(!report.contains("failure") || report.at("failure").is_null()) << report.dump();
      EXPECT_LT(std::abs(s.line.at("rollout_corr/k3_kl").get<double>()), 1e-12) << preset << " step " << s.step;
      EXPECT_TRUE(std::isfinite(s.line.at("actor/loss").get<double>()));
    }
    const json summary = json::parse(read_text(out / "summary.json"));
    EXPECT_EQ(summary.at("sync_failures").get<int64_t>(), 0) << preset;
    c.faults = {parse_fault("stale_router@2")};
    c.out = (out / "fault").string();
    const RlResult faulty = run_in_process(c);
    ASSERT_EQ(faulty.steps.size(), 3u);
    EXPECT_FALSE(faulty.steps[1].line.at("sync/applied").get<bool>()) << preset;
    EXPECT_NE(faulty.steps[1].line.at("sync/reports").dump().find("mlp.gate.weight"), std::string::npos)
        << faulty.steps[1].line.at("sync/reports").dump();
    fs::remove_all(out);
  }
}

TEST(RlLoop, MatchedBf16HasNoMismatchAndAMismatchedPairHasSome) {
  const fs::path out = temp_dir("matched");
  const RlResult matched = run_in_process(tiny_config(out / "a", "bf16", "bf16"));
  const RlResult mismatched = run_in_process(tiny_config(out / "b", "bf16", "mxfp8"));
  for (const RlStepMetrics& s : matched.steps) {
    EXPECT_LT(std::abs(s.line.at("rollout_corr/k3_kl").get<double>()), 1e-12) << "step " << s.step;
    EXPECT_LT(s.line.at("prob_diff_max").get<double>(), 1e-9) << "step " << s.step;
  }
  EXPECT_GT(mismatched.mean_mismatch_kl, 1e-8);
  EXPECT_GT(mismatched.mean_mismatch_kl, 1e3 * std::max(matched.mean_mismatch_kl, 1e-15));
  fs::remove_all(out);
}

// Speculative rollouts (--speculative): the rollouts' log-probs stay the sampler's own, so a
// matched pair still has no mismatch; a self drafter at the sampler's own precision accepts
// every draft; spec/* metrics are logged every step; the config key round-trips.
TEST(RlLoop, SpeculativeRolloutsKeepTheSamplersLogprobs) {
  const fs::path out = temp_dir("speculative");
  for (const std::string drafter : {"self:bf16", "self:mxfp4", "ngram"}) {
    RlConfig c = tiny_config(out / drafter.substr(0, 4), "bf16", "bf16");
    c.speculative = drafter;
    c.speculative_tokens = 2;
    c = RlConfig::from_json(c.to_json(), "test");
    ASSERT_EQ(c.speculative, drafter);
    const RlResult r = run_in_process(c);
    for (const RlStepMetrics& s : r.steps) {
      EXPECT_LT(std::abs(s.line.at("rollout_corr/k3_kl").get<double>()), 1e-12) << drafter << " step " << s.step;
      ASSERT_TRUE(s.line.contains("spec/accept_rate")) << drafter;
      if (drafter == "ngram") continue;  // short completions: prompt lookup may find nothing
      EXPECT_GT(s.line.at("spec/drafted").get<int64_t>(), 0) << drafter;
      EXPECT_GE(s.line.at("spec/accept_length").get<double>(), 1.0);
      if (drafter == "self:bf16") {
        EXPECT_EQ(s.line.at("spec/accept_rate").get<double>(), 1.0) << "step " << s.step;
      }
    }
  }
  fs::remove_all(out);
}

TEST(RlLoop, InjectedFaultIsReportedAndTheOldVersionKeepsServing) {
  const fs::path out = temp_dir("fault");
  RlConfig c = tiny_config(out);
  c.faults = {parse_fault("flipped_bit@2")};
  const RlResult r = run_in_process(c);
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_EQ(r.sync_failures, 1);
  const json& bad = r.steps[1].line;
  EXPECT_FALSE(bad.at("sync/applied").get<bool>());
  EXPECT_TRUE(bad.at("sync/failed_check").is_string());
  const json& report = bad.at("sync/reports")[0];
  EXPECT_EQ(report.at("serving").get<int64_t>(), 1) << "the sampler must keep serving version 1";
  EXPECT_FALSE(report.at("failure_message").get<std::string>().empty());
  // Clean steps raise no alarm; step 3 syncs again.
  EXPECT_TRUE(r.steps[0].line.at("sync/applied").get<bool>());
  EXPECT_TRUE(r.steps[2].line.at("sync/applied").get<bool>());
  EXPECT_EQ(r.steps[2].line.at("sync/reports")[0].at("serving").get<int64_t>(), 3);
  // Rollouts of step 2 came from version 1 while the learner is at version 2: a mismatch shows.
  EXPECT_GT(bad.at("rollout_corr/k3_kl").get<double>(), 0.0);
  const json summary = json::parse(read_text(out / "summary.json"));
  ASSERT_EQ(summary.at("faults").size(), 1u);
  EXPECT_TRUE(summary.at("faults")[0].at("caught").get<bool>());
  EXPECT_EQ(summary.at("sync_events")[0].at("step").get<int64_t>(), 2);
  EXPECT_NE(read_text(out / "report.html").find("Failed syncs"), std::string::npos);
  fs::remove_all(out);
}

TEST(RlLoop, SameSeedSameRunAndTheWarmupCacheIsReused) {
  const fs::path out = temp_dir("repro");
  RlConfig a = tiny_config(out / "a");
  a.export_rule = "sr";
  a.base = (out / "base").string();
  RlConfig b = a;
  b.out = (out / "b").string();
  const RlResult ra = run_in_process(a);
  const RlResult rb = run_in_process(b);
  EXPECT_FALSE(ra.warmup_cached);
  EXPECT_TRUE(rb.warmup_cached);
  EXPECT_TRUE(fs::exists(out / "base" / "model.safetensors"));
  ASSERT_EQ(ra.steps.size(), rb.steps.size());
  for (size_t i = 0; i < ra.steps.size(); ++i)
    EXPECT_EQ(without_timing(ra.steps[i].line), without_timing(rb.steps[i].line)) << "step " << i + 1;
  // Another seed gives another run (the comparison above can fail).
  RlConfig d = a;
  d.seed = 6;
  d.base.clear();
  d.out = (out / "d").string();
  const RlResult rd = run_in_process(d);
  EXPECT_NE(without_timing(ra.steps[0].line), without_timing(rd.steps[0].line));
  fs::remove_all(out);
}

// The warm-up cache never vouches for another warm-up's weights: a rewrite for other settings
// that fails after model.safetensors is replaced (here: tokenizer.json cannot be written) leaves
// no warmup.json, so a later run with the first settings trains again rather than reusing the
// other weights.
TEST(RlLoop, AFailedRewriteOfTheWarmupCacheIsNotReused) {
  const fs::path out = temp_dir("base_rewrite");
  RlConfig a = tiny_config(out / "a");
  a.steps = 1;
  a.base = (out / "base").string();
  const RlResult first = run_in_process(a);
  ASSERT_TRUE(fs::exists(out / "base" / "warmup.json"));
  fs::remove(out / "base" / "tokenizer.json");
  fs::create_directories(out / "base" / "tokenizer.json" / "blocker");
  RlConfig other = a;
  other.warmup_steps = a.warmup_steps + 1;
  other.out = (out / "other").string();
  EXPECT_THROW(run_in_process(other), InputError);
  EXPECT_FALSE(fs::exists(out / "base" / "warmup.json"));
  fs::remove_all(out / "base" / "tokenizer.json");
  RlConfig again = a;
  again.out = (out / "again").string();
  const RlResult second = run_in_process(again);
  EXPECT_FALSE(second.warmup_cached);
  EXPECT_EQ(without_timing(first.steps[0].line), without_timing(second.steps[0].line));
  fs::remove_all(out);
}

// Independent references over rollouts.jsonl: the reward recomputed from the completion text
// (integer addition), GRPO advantages and the mismatch metrics recomputed in fp64 here.
TEST(RlLoop, RewardsAdvantagesAndMismatchMatchAnIndependentReference) {
  const fs::path out = temp_dir("reference");
  RlConfig c = tiny_config(out, "bf16", "mxfp8");  // a mismatched pair: non-zero metrics
  c.log_rollouts = true;
  const RlResult r = run_in_process(c);
  std::vector<json> rollouts = read_jsonl(out / "rollouts.jsonl");
  ASSERT_EQ(rollouts.size(), static_cast<size_t>(c.steps * c.prompts_per_step * c.group_size));
  int rewarded = 0;
  for (int64_t step = 1; step <= c.steps; ++step) {
    double s_sum = 0, k3_sum = 0, mult_sum = 0, dp_max = 0;
    int64_t tokens = 0;
    std::vector<double> rewards, advantages;
    for (const json& x : rollouts) {
      if (x.at("step").get<int64_t>() != step) continue;
      // "Q: a+b=\nA: " -> a + b, the completion up to its first newline or special token.
      const std::string prompt = x.at("prompt_text").get<std::string>();
      const int a = std::stoi(prompt.substr(3, prompt.find('+') - 3));
      const int b = std::stoi(prompt.substr(prompt.find('+') + 1, prompt.find('=') - prompt.find('+') - 1));
      std::string answer;
      for (int t : x.at("tokens").get<std::vector<int>>()) {
        if (t > 255 || t == '\n') break;
        answer.push_back(static_cast<char>(t));
      }
      const double reward = answer == std::to_string(a + b) ? 1.0 : 0.0;
      EXPECT_EQ(x.at("reward").get<double>(), reward) << prompt << answer;
      rewarded += reward > 0;
      rewards.push_back(reward);
      advantages.push_back(x.at("advantage").get<double>());
      const auto s = x.at("sampler_logprobs").get<std::vector<double>>();
      const auto l = x.at("learner_logprobs").get<std::vector<double>>();
      ASSERT_EQ(s.size(), l.size());
      for (size_t t = 0; t < s.size(); ++t) {
        const double d = l[t] - s[t];
        s_sum += s[t] - l[t];
        k3_sum += std::exp(d) - d - 1;
        mult_sum += std::exp(std::abs(d));
        dp_max = std::max(dp_max, std::abs(std::exp(l[t]) - std::exp(s[t])));
        ++tokens;
      }
    }
    ASSERT_EQ(rewards.size(), static_cast<size_t>(c.prompts_per_step * c.group_size));
    for (size_t g = 0; g < rewards.size(); g += static_cast<size_t>(c.group_size)) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < c.group_size; ++j) mean += rewards[g + j] / c.group_size;
      for (int64_t j = 0; j < c.group_size; ++j) var += (rewards[g + j] - mean) * (rewards[g + j] - mean) / c.group_size;
      for (int64_t j = 0; j < c.group_size; ++j)
        EXPECT_NEAR(advantages[g + j], (rewards[g + j] - mean) / (std::sqrt(var) + 1e-6), 1e-12);
    }
    const json& line = r.steps[static_cast<size_t>(step - 1)].line;
    const double n = static_cast<double>(tokens);
    double mean_reward = 0;
    for (double x : rewards) mean_reward += x / static_cast<double>(rewards.size());
    EXPECT_NEAR(line.at("reward").get<double>(), mean_reward, 1e-12);
    EXPECT_NEAR(line.at("rollout_corr/kl").get<double>(), s_sum / n, 1e-12);
    EXPECT_NEAR(line.at("rollout_corr/k3_kl").get<double>(), k3_sum / n, 1e-12);
    EXPECT_NEAR(line.at("token_mult_prob_error").get<double>(), mult_sum / n, 1e-12);
    EXPECT_NEAR(line.at("prob_diff_max").get<double>(), dp_max, 1e-12);
    EXPECT_GT(line.at("rollout_corr/k3_kl").get<double>(), 0.0);
  }
  EXPECT_GT(rewarded, 0) << "no completion was right: the reward check is not exercised";
  fs::remove_all(out);
}

// The other knobs run end to end: a KL penalty to the warmed-up model (0 at step 1, when the
// learner still is that model), token-level TIS, two PPO epochs, the loss on the master, ef.
TEST(RlLoop, KlPenaltyImportanceSamplingEpochsAndLossOnMaster) {
  const fs::path out = temp_dir("options");
  RlConfig c = tiny_config(out, "bf16", "mxfp8");
  c.loss.kl_coef = 0.1;
  c.loss.is = IsMode::token_tis;
  c.ppo_epochs = 2;
  c.loss_on_served = false;
  c.export_rule = "ef";
  const RlResult r = run_in_process(c);
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_NEAR(r.steps[0].line.at("actor/kl_loss").get<double>(), 0.0, 1e-12);
  EXPECT_GT(r.steps[2].line.at("actor/kl_loss").get<double>(), 0.0);
  for (const RlStepMetrics& s : r.steps) {
    // token TIS weights min(exp(o - s), 2): a mismatched pair gives weights around 1, never above 2
    const double w = s.line.at("actor/is_weight_mean").get<double>();
    EXPECT_GT(w, 0.5);
    EXPECT_LE(w, 2.0);
    EXPECT_TRUE(s.line.at("sync/applied").get<bool>());
  }
  fs::remove_all(out);
}

TEST(RlLoop, ConfigJsonRoundTripsAndBadConfigsNameTheKey) {
  const RlConfig c = tiny_config("x");
  EXPECT_EQ(RlConfig::from_json(c.to_json(), "t").to_json(), c.to_json());
  auto message = [](const std::string& text) {
    try {
      RlConfig::from_json(json::parse(text), "cfg.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"grpo": {"stepz": 3}})").find("unknown key 'grpo.stepz'"), std::string::npos);
  EXPECT_NE(message(R"({"grpo": {"group_size": 1}})").find("group_size"), std::string::npos);
  EXPECT_NE(message(R"({"grpo": {"temperature": 0.7}})").find("temperature"), std::string::npos);
  EXPECT_NE(message(R"({"export": "stochastic"})").find("unknown export rule 'stochastic'"), std::string::npos);
  EXPECT_NE(message(R"({"sampler": "fp7"})").find("sampler"), std::string::npos);
  EXPECT_NE(message(R"({"faults": ["flipped_bit@99"]})").find("flipped_bit@99"), std::string::npos);
  EXPECT_NE(message(R"({"faults": ["melted@2"]})").find("melted"), std::string::npos);
  EXPECT_NE(message(R"({"task": {"name": "div"}})").find("div"), std::string::npos);
  EXPECT_NE(message(R"({"loss": {"is": "tis"}})").find("tis"), std::string::npos);
  EXPECT_THROW(parse_fault("flipped_bit"), InputError);
  EXPECT_THROW(parse_fault("flipped_bit@0"), InputError);
  EXPECT_EQ(parse_fault("zeroed_scales@4").step, 4);
}

// Killed after step 3 with checkpoints every 2 steps, the run resumes from step 2 (step 3 runs
// again) and ends where an uninterrupted run ends: the same metrics lines (clock fields aside),
// rollouts and final master weights, bit for bit. ef (carried error), kl_coef > 0 (the
// reference policy) and two PPO epochs make every piece of state count.
TEST(RlLoop, AStoppedRunResumesFromItsLastCheckpointBitIdentically) {
  const fs::path out = temp_dir("resume");
  RlConfig c = tiny_config(out / "whole");
  c.steps = 5;
  c.export_rule = "ef";
  c.loss.kl_coef = 0.05;
  c.ppo_epochs = 2;
  c.log_rollouts = true;
  c.checkpoint_every = 2;
  const RlResult whole = run_in_process(c);

  RlConfig s = c;
  s.out = (out / "split").string();
  auto channel = make_in_process_channel();
  RlOptions stop;
  stop.progress = false;
  stop.stop_after = 3;
  const RlResult first = run_rl(s, *channel, stop);
  EXPECT_TRUE(first.stopped);
  ASSERT_EQ(first.steps.size(), 3u);
  EXPECT_FALSE(fs::exists(out / "split" / "summary.json"));
  ASSERT_TRUE(train::latest_checkpoint(out / "split").has_value());
  EXPECT_EQ(train::latest_checkpoint(out / "split")->filename(), "step-00000002");

  auto channel2 = make_in_process_channel();
  RlOptions resume;
  resume.progress = false;
  const RlResult second = run_rl(s, *channel2, resume);
  EXPECT_EQ(second.start_step, 2);
  EXPECT_FALSE(second.stopped);
  ASSERT_EQ(second.steps.size(), whole.steps.size());

  const std::vector<json> a = read_jsonl(out / "whole" / "metrics.jsonl");
  const std::vector<json> b = read_jsonl(out / "split" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(without_timing(a[i]), without_timing(b[i])) << "step " << i + 1;
    EXPECT_EQ(a[i].at("sync/applied"), b[i].at("sync/applied")) << "step " << i + 1;
  }
  // The first sync after the resume applied on the fresh sampler.
  EXPECT_TRUE(b[2].at("sync/applied").get<bool>());
  EXPECT_EQ(read_text(out / "whole" / "rollouts.jsonl"), read_text(out / "split" / "rollouts.jsonl"));
  EXPECT_EQ(whole.final_reward, second.final_reward);
  EXPECT_EQ(whole.mean_mismatch_kl, second.mean_mismatch_kl);
  EXPECT_EQ(whole.lag_median, second.lag_median);

  const train::LoadedCheckpoint wa = train::load_checkpoint(*train::latest_checkpoint(out / "whole"));
  const train::LoadedCheckpoint wb = train::load_checkpoint(*train::latest_checkpoint(out / "split"));
  EXPECT_EQ(wa.step, 5);
  EXPECT_EQ(wb.step, 5);
  bool any_ef_state = false, any_reference = false, any_fair_cast = false;
  for (const auto& [ta, tb] : {std::pair{&wa.model, &wb.model}, std::pair{&wa.state_tensors, &wb.state_tensors}}) {
    ASSERT_EQ(ta->size(), tb->size());
    for (size_t i = 0; i < ta->size(); ++i) {
      const train::NamedTensor &a_i = (*ta)[i], &b_i = (*tb)[i];
      ASSERT_EQ(a_i.name, b_i.name);
      any_ef_state = any_ef_state || a_i.name.starts_with("export.");
      any_reference = any_reference || a_i.name.starts_with("reference.");
      any_fair_cast = any_fair_cast || a_i.name.starts_with("fair_cast.");
      ASSERT_EQ(a_i.values.size(), b_i.values.size());
      EXPECT_EQ(0, std::memcmp(a_i.values.data(), b_i.values.data(), a_i.values.size() * sizeof(float)))
          << a_i.name;
    }
  }
  EXPECT_TRUE(any_ef_state);
  EXPECT_TRUE(any_reference);
  EXPECT_TRUE(any_fair_cast);
  // model.safetensors holds the master and nothing else.
  for (const train::NamedTensor& t : wa.model) EXPECT_FALSE(t.name.starts_with("export.") || t.name.starts_with("state.")) << t.name;
  ASSERT_EQ(wa.optimizer.size(), wb.optimizer.size());
  for (size_t i = 0; i < wa.optimizer.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(wa.optimizer[i].values.data(), wb.optimizer[i].values.data(),
                             wa.optimizer[i].values.size() * sizeof(float)))
        << wa.optimizer[i].name;
  }
  // A finished run resumed again only rewrites its summary and report.
  auto channel3 = make_in_process_channel();
  const RlResult again = run_rl(s, *channel3, resume);
  EXPECT_EQ(again.start_step, 5);
  EXPECT_EQ(read_jsonl(out / "split" / "metrics.jsonl"), b);
  fs::remove_all(out);
}

// Issue 35: the same killed-and-resumed run (ef, a reference policy, two PPO epochs; an nvfp4
// sampler beside a bf16 learner) ends on the bits recorded before the training state was
// restructured (tests/golden/train_state_fingerprints.json, tests/train_state_fixture.h): the
// warm-up, the learner's optimizer and export rule, and the checkpoint round trip together.
TEST(RlLoop, KilledAndResumedRunEndsOnTheRecordedBits) {
  const fs::path out = temp_dir("fixture");
  RlConfig c = tiny_config(out, "nvfp4", "bf16");
  c.steps = 5;
  c.export_rule = "ef";
  c.loss.kl_coef = 0.05;
  c.ppo_epochs = 2;
  c.checkpoint_every = 2;
  auto channel = make_in_process_channel();
  RlOptions stop;
  stop.progress = false;
  stop.stop_after = 3;
  ASSERT_TRUE(run_rl(c, *channel, stop).stopped);
  auto channel2 = make_in_process_channel();
  RlOptions resume;
  resume.progress = false;
  const RlResult second = run_rl(c, *channel2, resume);
  ASSERT_EQ(second.start_step, 2);
  const train::LoadedCheckpoint last = train::load_checkpoint(*train::latest_checkpoint(out));
  ASSERT_EQ(last.step, 5);
  test::expect_fingerprint("rl_nvfp4_bf16_ef", test::fingerprint(last));
  fs::remove_all(out);
}

TEST(RlLoop, ResumingUnderAChangedConfigNamesTheKeyAndNoResumeStartsOver) {
  const fs::path out = temp_dir("resume_key");
  RlConfig c = tiny_config(out / "run");
  c.steps = 2;
  c.checkpoint_every = 1;
  RlOptions stop;
  stop.progress = false;
  stop.stop_after = 1;
  auto channel = make_in_process_channel();
  EXPECT_TRUE(run_rl(c, *channel, stop).stopped);

  RlConfig changed = c;
  changed.lr = 2e-3;
  RlOptions resume;
  resume.progress = false;
  auto channel2 = make_in_process_channel();
  try {
    run_rl(changed, *channel2, resume);
    ADD_FAILURE() << "resumed under a changed config";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'grpo'"), std::string::npos) << e.what();
  }
  // A checkpoint that lost its state tensors (or predates state.safetensors) is named, not
  // resumed from silently.
  const fs::path ckpt = *train::latest_checkpoint(out / "run");
  fs::rename(ckpt / "state.safetensors", out / "state.safetensors");
  auto channel4 = make_in_process_channel();
  try {
    run_rl(c, *channel4, resume);
    ADD_FAILURE() << "resumed without the state tensors";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(ckpt.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fair_cast.0.master' is missing"), std::string::npos) << e.what();
  }
  fs::rename(out / "state.safetensors", ckpt / "state.safetensors");
  // --no-resume: starts over (a full run of the changed config, its own checkpoints).
  resume.resume = false;
  auto channel3 = make_in_process_channel();
  const RlResult fresh = run_rl(changed, *channel3, resume);
  EXPECT_EQ(fresh.start_step, 0);
  EXPECT_EQ(fresh.steps.size(), 2u);
  EXPECT_EQ(train::list_checkpoints(out / "run").size(), 2u);
  fs::remove_all(out);
}

// Issue 26, item 1 for RL: a fresh start (--no-resume) stopped before its first checkpoint must
// not leave the previous run's checkpoints, summary or report beside its own config.json, and a
// plain rerun then starts this run afresh.
TEST(RlLoop, FreshStartDiscardsThePreviousRun) {
  const fs::path out = temp_dir("fresh");
  RlConfig a = tiny_config(out / "run");
  a.steps = 2;
  a.checkpoint_every = 1;
  run_in_process(a);
  ASSERT_TRUE(fs::exists(out / "run" / "summary.json"));

  RlConfig b = a;
  b.seed = 6;
  b.checkpoint_every = 0;  // only after the last step: stopped after step 1, it has none
  RlOptions o;
  o.progress = false;
  o.resume = false;
  o.stop_after = 1;
  auto channel = make_in_process_channel();
  EXPECT_TRUE(run_rl(b, *channel, o).stopped);
  EXPECT_TRUE(train::list_checkpoints(out / "run").empty());
  EXPECT_FALSE(fs::exists(out / "run" / "summary.json")) << "the previous run's summary survived";
  EXPECT_FALSE(fs::exists(out / "run" / "report.html")) << "the previous run's report survived";
  EXPECT_EQ(read_jsonl(out / "run" / "metrics.jsonl").size(), 1u);

  o.resume = true;
  o.stop_after.reset();
  auto channel2 = make_in_process_channel();
  const RlResult rerun = run_rl(b, *channel2, o);
  EXPECT_EQ(rerun.start_step, 0);
  EXPECT_EQ(rerun.steps.size(), 2u);
  const RlResult clean = run_in_process([&] {
    RlConfig c = b;
    c.out = (out / "clean").string();
    return c;
  }());
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(without_timing(rerun.steps[i].line), without_timing(clean.steps[i].line)) << i;
  fs::remove_all(out);
}

// A checkpoint records the config it was written under; a resume checks it too, so a
// config.json that no longer describes the checkpoints cannot make another run's state resume.
TEST(RlLoop, ResumingACheckpointOfAnotherRunIsAnError) {
  const fs::path out = temp_dir("identity");
  RlConfig c = tiny_config(out / "run");
  c.steps = 2;
  c.checkpoint_every = 1;
  RlOptions o;
  o.progress = false;
  o.stop_after = 1;
  auto channel = make_in_process_channel();
  EXPECT_TRUE(run_rl(c, *channel, o).stopped);
  RlConfig changed = c;
  changed.lr = 2e-3;
  std::ofstream(out / "run" / "config.json") << changed.to_json().dump(2);
  o.stop_after.reset();
  auto channel2 = make_in_process_channel();
  try {
    run_rl(changed, *channel2, o);
    ADD_FAILURE() << "resumed a checkpoint of another run";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("step-00000001"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'grpo.lr' (0.001 there, 0.002 in this config)"), std::string::npos)
        << e.what();
  }
  fs::remove_all(out);
}

// Issue 26, item 13: after a resume the time summary's parts and its total both count every
// process (the total was this process's alone, below the sum of its parts).
TEST(RlLoop, AResumedRunsTotalTimeCoversItsParts) {
  const fs::path out = temp_dir("times");
  RlConfig c = tiny_config(out / "run");
  c.steps = 2;
  c.checkpoint_every = 1;
  RlOptions o;
  o.progress = false;
  o.stop_after = 1;
  auto channel = make_in_process_channel();
  const RlResult first = run_rl(c, *channel, o);
  o.stop_after.reset();
  auto channel2 = make_in_process_channel();
  const RlResult second = run_rl(c, *channel2, o);
  ASSERT_EQ(second.start_step, 1);
  const json seconds = json::parse(read_text(out / "run" / "summary.json")).at("seconds");
  const double parts = seconds.at("warmup").get<double>() + seconds.at("rollout").get<double>() +
                       seconds.at("learner").get<double>() + seconds.at("sync").get<double>();
  EXPECT_GE(seconds.at("total").get<double>(), parts) << seconds.dump();
  EXPECT_GE(seconds.at("total").get<double>(), first.seconds_total) << seconds.dump();
  EXPECT_LE(seconds.at("this_process").get<double>(), seconds.at("total").get<double>());
  EXPECT_EQ(seconds.at("this_process").get<double>(), second.seconds_this_process);
  // The warm-up ran in the first process only: this one's time does not include it.
  EXPECT_GT(seconds.at("warmup").get<double>(), 0);
  fs::remove_all(out);
}

TEST(RlLoop, ConfigTypeErrorsNameTheFileAndKey) {
  const fs::path dir = temp_dir("config_types");
  fs::create_directories(dir);
  auto message = [&](const std::string& text) {
    std::ofstream(dir / "cfg.json") << text;
    try {
      RlConfig::load(dir / "cfg.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("not an InputError: ") + e.what();
    }
    return std::string("no error");
  };
  const std::string file = (dir / "cfg.json").string();
  EXPECT_EQ(message(R"({"name": 5})"), "[rl] " + file + ": 'name' must be a string, got an integer");
  EXPECT_EQ(message(R"({"grpo": {"lr": "1e-3"}})"), "[rl] " + file + ": 'grpo.lr' must be a number, got a string");
  EXPECT_EQ(message(R"({"grpo": {"grad_clip": -1}})"), "[rl] " + file + ": 'grpo.grad_clip' must be >= 0, got -1");
  EXPECT_EQ(message(R"({"model": {"model_type": 3}})"), "[rl] " + file + ": 'model.model_type' must be a string, got an integer");
  EXPECT_EQ(message(R"({"base": "x", "out": "x"})").find("'base' and 'out' are the same folder"), file.size() + 7);
  try {
    RlConfig::load(dir);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open the RL config: it is a directory"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// AdamW's betas are config keys of `concord rl`; today's values (0.9, 0.999) are the defaults and
// are not written, so the config JSON (and with it a run's identity) of older runs is unchanged.
TEST(RlLoop, AdamWBetasAreConfigKeysWrittenOnlyWhenNotTheDefault) {
  const RlConfig defaults = RlConfig::from_json(json::object(), "t");
  EXPECT_EQ(defaults.beta1, 0.9);
  EXPECT_EQ(defaults.beta2, 0.999);
  EXPECT_FALSE(defaults.to_json().at("grpo").contains("beta1"));
  EXPECT_FALSE(defaults.to_json().at("grpo").contains("beta2"));
  const RlConfig set = RlConfig::from_json(json::parse(R"({"grpo": {"beta1": 0.8, "beta2": 0.99}})"), "t");
  EXPECT_EQ(set.beta1, 0.8);
  EXPECT_EQ(set.beta2, 0.99);
  EXPECT_EQ(set.to_json().at("grpo").at("beta1"), 0.8);
  EXPECT_EQ(RlConfig::from_json(set.to_json(), "t").to_json(), set.to_json());
  for (const char* bad : {R"({"grpo": {"beta1": 1}})", R"({"grpo": {"beta2": -0.1}})"}) {
    try {
      RlConfig::from_json(json::parse(bad), "t");
      ADD_FAILURE() << bad;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("must lie in [0, 1)"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace concord::rl
