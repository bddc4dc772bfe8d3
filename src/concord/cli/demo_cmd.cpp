// concord demo: the main job. Warm up a small model on a verifiable task once (cached in
// OUT/base/), then run GRPO arms that differ only in the sampler's and the learner's precision and
// in the export rule of the fp32 master to the served copy: bf16/bf16, mxfp8/mxfp8, mismatched
// pairs (bf16 sampler + mxfp8 learner, per-tensor FP8 sampler + MXFP8 learner), nvfp4/nvfp4, each
// with rne and with sr (bf16/bf16 also ef). Every sync passes through the seven checks. Prints a
// comparison table (reward, mismatch KL, Fair Cast lag, time split) and writes per-arm
// metrics.jsonl / report.html / summary.json and one combined OUT/report.html.
// `concord demo --numerics` runs the earlier numerics showcase instead (demo_numerics.cpp).
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/cli/commands.h"
#include "concord/cli/demo_numerics.h"
#include "concord/cli/flags.h"
#include "concord/io/atomic_file.h"
#include "concord/numerics/check.h"
#include "concord/rl/channel.h"
#include "concord/rl/loop.h"
#include "concord/rl/report.h"
#include "concord/train/checkpoint.h"

namespace concord::cli {
namespace {

namespace fs = std::filesystem;

struct DemoOptions {
  std::string out = "demo-out";
  uint64_t seed = 20261202;
  bool quick = false, numerics = false, quiet = false;
  std::optional<int64_t> steps;
  std::vector<std::string> arms;  // "SAMPLER/LEARNER:EXPORT"; empty: the defaults
};

struct Arm {
  std::string sampler, learner, export_rule;
  double lr = 0;  // 0: the demo's GRPO learning rate
  std::string label() const {
    return fmt::format("{}/{} {}{}", sampler, learner, export_rule, lr > 0 ? fmt::format(" lr={:g}", lr) : "");
  }
  std::string dir() const {
    return fmt::format("{}_{}_{}{}", sampler, learner, export_rule, lr > 0 ? fmt::format("_lr{:g}", lr) : "");
  }
};

std::vector<Arm> default_arms(bool quick) {
  if (quick) return {{"bf16", "bf16", "rne"}, {"mxfp8", "mxfp8", "sr"}, {"nvfp4", "nvfp4", "ef"}};
  // The last three: Fair Cast at a learning rate whose updates are far below a bf16 ulp.
  return {{"bf16", "bf16", "rne"},        {"bf16", "bf16", "sr"},        {"bf16", "bf16", "ef"},
          {"mxfp8", "mxfp8", "rne"},      {"mxfp8", "mxfp8", "sr"},      {"bf16", "mxfp8", "rne"},
          {"bf16", "mxfp8", "sr"},        {"fp8-tensor", "mxfp8", "rne"}, {"fp8-tensor", "mxfp8", "sr"},
          {"nvfp4", "nvfp4", "rne"},      {"nvfp4", "nvfp4", "sr"},
          {"bf16", "bf16", "rne", 1e-5},  {"bf16", "bf16", "sr", 1e-5},   {"bf16", "bf16", "ef", 1e-5}};
}

Arm parse_arm(const std::string& text) {
  const size_t slash = text.find('/'), colon = text.find(':'), at = text.find('@');
  if (slash == std::string::npos || colon == std::string::npos || colon < slash || (at != std::string::npos && at < colon))
    throw InputError(fmt::format("[demo] arm '{}' must be SAMPLER/LEARNER:EXPORT[@LR], e.g. bf16/mxfp8:sr "
                                 "or bf16/bf16:rne@1e-5", text));
  Arm arm{text.substr(0, slash), text.substr(slash + 1, colon - slash - 1),
          text.substr(colon + 1, at == std::string::npos ? std::string::npos : at - colon - 1)};
  if (at != std::string::npos) {
    const std::string lr = text.substr(at + 1);
    char* end = nullptr;
    arm.lr = std::strtod(lr.c_str(), &end);
    if (lr.empty() || std::isspace(static_cast<unsigned char>(lr[0])) || *end != '\0' ||
        !positive().contains(arm.lr))
      throw InputError(fmt::format("[demo] arm '{}': the learning rate after '@' must be a finite number > 0", text));
  }
  return arm;
}

// The embedded defaults: a 2-layer byte-level model, one-digit addition, a short supervised
// warm-up so the reward starts near 0.5, then 200 GRPO steps of 16 prompts x 8 completions.
rl::RlConfig demo_config(const DemoOptions& o) {
  rl::RlConfig c;
  c.model = rl::default_rl_model();
  c.task = "add";
  c.difficulty = 1;
  c.seed = o.seed;
  c.base = (fs::path(o.out) / "base").string();
  c.warmup_steps = o.quick ? 60 : 200;
  c.warmup_lr = 3e-3;
  c.warmup_batch = 32;
  c.steps = o.quick ? 3 : 200;
  c.prompts_per_step = o.quick ? 4 : 16;
  c.group_size = o.quick ? 4 : 8;
  c.max_new_tokens = 4;
  c.lr = 5e-4;
  c.grad_clip = 1.0;
  if (o.steps) c.steps = *o.steps;
  return c;
}

std::string seconds_text(double s) { return fmt::format("{:.1f}", s); }

void print_table(const std::vector<Arm>& arms, const std::vector<rl::RlResult>& results) {
  std::printf("\n%-28s %8s %8s %10s %8s %8s %9s %9s %8s %6s\n", "arm (sampler/learner export)",
              "reward<", "reward>", "k3 KL", "lag p50", "lag p90", "rollout s", "learner s",
              "sync s", "fails");
  for (size_t i = 0; i < arms.size(); ++i) {
    const rl::RlResult& r = results[i];
    std::printf("%-28s %8.3f %8.3f %10.3g %8.0f %8.0f %9s %9s %8s %6lld\n", arms[i].label().c_str(),
                r.initial_reward, r.final_reward, r.mean_mismatch_kl, r.lag_median, r.lag_p90,
                seconds_text(r.seconds_rollout).c_str(), seconds_text(r.seconds_learner).c_str(),
                seconds_text(r.seconds_sync).c_str(), static_cast<long long>(r.sync_failures));
  }
  std::printf(
      "\nreward< and reward>: mean reward of the sampled completions over the first and the last "
      "10%% of steps.\nk3 KL: rollout_corr/k3_kl, sampler vs learner log-probs of the sampled tokens, "
      "mean over steps.\nlag: Fair Cast, steps from a master weight drifting half a served ulp to "
      "its served copy moving.\nfails: syncs that failed one of the seven checks (0 on a clean "
      "run).\n");
}

void run_demo(const DemoOptions& o) {
  if (o.numerics) {
    run_numerics_showcase({o.out, o.seed, o.quick});
    return;
  }
  std::vector<Arm> arms;
  for (const std::string& a : o.arms) arms.push_back(parse_arm(a));
  if (arms.empty()) arms = default_arms(o.quick);
  const rl::RlConfig base = demo_config(o);
  std::vector<rl::RlConfig> configs;
  for (const Arm& arm : arms) {
    rl::RlConfig c = base;
    c.name = arm.label();
    c.sampler = arm.sampler;
    c.learner = arm.learner;
    c.export_rule = arm.export_rule;
    if (arm.lr > 0) c.lr = arm.lr;
    c.out = (fs::path(o.out) / arm.dir()).string();
    c.validate(fmt::format("demo arm '{}'", arm.label()));
    configs.push_back(std::move(c));
  }
  std::printf("concord demo: GRPO on '%s' (difficulty %d) with a %lld-parameter model, %zu arms x "
              "%lld steps of %lld prompts x %lld completions -> %s/\n",
              base.task.c_str(), base.difficulty,
              static_cast<long long>(base.model.parameter_count()), arms.size(),
              static_cast<long long>(base.steps), static_cast<long long>(base.prompts_per_step),
              static_cast<long long>(base.group_size), o.out.c_str());
  std::fflush(stdout);
  // The previous demo's summary and report go first: a demo stopped part-way must not leave them
  // beside this one's arms (each arm discards its own folder's previous run: rl::run_rl).
  train::discard_run_files(o.out, std::vector<std::string>{"summary.json", "report.html"});
  std::vector<rl::RlResult> results;
  for (size_t i = 0; i < configs.size(); ++i) {
    if (!o.quiet) std::fprintf(stderr, "[%zu/%zu] %s\n", i + 1, configs.size(), configs[i].name.c_str());
    auto channel = rl::make_in_process_channel();
    results.push_back(rl::run_rl(configs[i], *channel, !o.quiet));
  }
  print_table(arms, results);

  std::vector<rl::ReportArm> report;
  nlohmann::json summary = {{"format", "concord-demo/1"}, {"arms", nlohmann::json::array()}};
  for (size_t i = 0; i < arms.size(); ++i) {
    report.push_back({arms[i].label(), &configs[i], &results[i]});
    nlohmann::json s = results[i].summary;
    s["dir"] = arms[i].dir();
    summary["arms"].push_back(std::move(s));
  }
  rl::write_rl_report(fs::path(o.out) / "report.html", "concord demo: RL in low precision", report);
  io::write_file_atomic(fs::path(o.out) / "summary.json", summary.dump(2) + "\n");
  std::printf("\nwrote %s/report.html (all arms), %s/summary.json, and per arm "
              "metrics.jsonl, summary.json, report.html under %s/<arm>/\n",
              o.out.c_str(), o.out.c_str(), o.out.c_str());
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto opts = std::make_shared<DemoOptions>();
  auto* demo = app.add_subcommand(
      "demo",
      "Run the main job on its embedded defaults: warm up a small model on one-digit addition, "
      "then GRPO arms at bf16/bf16, mxfp8/mxfp8, bf16/mxfp8, fp8-tensor/mxfp8 and nvfp4/nvfp4 with "
      "rne/sr/ef export; prints a comparison table and writes OUT/report.html");
  demo->add_option("--out", opts->out, "Output folder (default: demo-out)");
  add_seed_flag(demo, "--seed", opts->seed, "Seed for the model, prompts and sampling (default 20261202)");
  add_integer_flag(demo, "--steps", opts->steps, between(1, kMaxSteps),
                   "GRPO steps per arm (default 200; --quick 3)");
  demo->add_option("--arm", opts->arms, "Run this arm instead of the defaults: SAMPLER/LEARNER:EXPORT[@LR] (repeatable)");
  demo->add_flag("--quick", opts->quick, "Three small arms of three steps, for CI");
  demo->add_flag("--quiet", opts->quiet, "No progress on stderr");
  demo->add_flag("--numerics", opts->numerics,
                 "The numerics showcase instead: every block format and scale rule on a generated checkpoint");
  demo->callback([opts] { run_demo(*opts); });
}

}  // namespace concord::cli
