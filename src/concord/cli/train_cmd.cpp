// `concord train`: train a model from a JSON training config (configs/<name>.json).
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/model/policy.h"
#include "concord/train/trainer.h"

namespace concord::cli {

void add_train_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::string out;
    std::string policy;
    std::string export_rule;
    std::string distill_from;
    std::optional<int64_t> steps;
    std::optional<uint64_t> seed;
    std::optional<int64_t> memory_budget;
    bool no_resume = false;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a model from a JSON config (configs/tiny.json, configs/small.json): AdamW over fp32 "
      "master weights, a precision policy for every GEMM, the King James Bible by default. "
      "Writes metrics.jsonl, checkpoints/ and final/ under the run directory and resumes from "
      "its last checkpoint when run again.");
  cmd->add_option("--config", args->config, "training config (JSON)")->required();
  cmd->add_option("--out", args->out, "run directory (default: the config's \"out\")");
  cmd->add_option("--policy", args->policy,
                  "precision preset (fp32, bf16, mxfp8, fp8-tensor, nvfp4, mxfp4) or policy JSON");
  cmd->add_option("--export", args->export_rule, "export rule master -> served: rne, sr, ef");
  add_integer_flag(cmd, "--steps", args->steps, between(1, kMaxSteps),
                   "number of optimizer steps (default: the config's train.steps)");
  add_seed_flag(cmd, "--seed", args->seed,
                "seed for init, batches and stochastic rounding (default: the config's train.seed)");
  cmd->add_option("--distill-from", args->distill_from,
                  "train a draft model for speculative decoding: the loss is the KL divergence to this teacher "
                  "model's next-token distributions (a model folder or GGUF; the corpus is tokenized by its "
                  "tokenizer, model.vocab_size must be its vocabulary's; default: the config's distill.from)");
  add_size_flag(cmd, "--memory-budget", args->memory_budget,
                "the run's peak RSS: the step's activations are planned to fit by recomputing attention probabilities "
                "or whole blocks in the backward (the same gradients, bit for bit); refused, with the figures, when "
                "even recomputing every block cannot fit");
  cmd->add_flag("--no-resume", args->no_resume, "start afresh even if the run has checkpoints");
  cmd->add_flag("--quiet", args->quiet, "no progress bar");
  cmd->callback([args]() {
    train::TrainConfig config = train::TrainConfig::load(args->config);
    if (!args->policy.empty()) config.policy = model::PrecisionPolicy::from_name_or_file(args->policy);
    if (!args->export_rule.empty()) config.export_rule = args->export_rule;
    if (args->steps) config.steps = *args->steps;
    if (args->seed) config.seed = *args->seed;
    if (!args->out.empty()) config.out = args->out;
    if (!args->distill_from.empty()) config.distill_from = args->distill_from;
    // Re-validate what the overrides touched.
    config = train::TrainConfig::from_json(config.to_json(), args->config);
    train::TrainOptions options;
    options.memory_budget = args->memory_budget;
    options.resume = !args->no_resume;
    options.progress = !args->quiet;
    const train::TrainResult r = train::train(config, options);
    if (r.losses.empty()) {
      std::printf("%s\n", fmt::format("{} is already trained to step {} ({}); {}", r.run_dir.string(), r.steps_done, config.name,
                                       r.final_rebuilt ? "rebuilt its final/ from the last checkpoint" : "nothing to do").c_str());
      return;
    }
    std::printf("%s\n", fmt::format("trained {} ({}, {} params) steps {}..{}: final loss {:.4f}, "
                                    "validation {} {:.4f} nats/{}, {:.0f} tokens/s, {:.1f} s, "
                                    "peak RSS {:.0f} MiB -> {}",
                                    config.name, config.policy.name, config.model.parameter_count(),
                                    r.start_step, r.steps_done,
                                    r.losses.back(), config.distill_from.empty() ? "loss" : "KL to the teacher",
                                    r.last_validation_loss, config.distill_from.empty() ? "byte" : "token",
                                    r.tokens_per_second, r.seconds,
                                    static_cast<double>(r.peak_rss_bytes) / (1 << 20),
                                    r.run_dir.string())
                            .c_str());
    if (options.memory_budget)
      std::printf("%s\n", fmt::format("memory budget {:.1f} MiB: peak RSS {:.1f} MiB ({}); activations {:.1f} MiB measured, "
                                      "{:.1f} MiB planned",
                                      static_cast<double>(*options.memory_budget) / (1 << 20),
                                      static_cast<double>(r.peak_rss_bytes) / (1 << 20),
                                      static_cast<int64_t>(r.peak_rss_bytes) <= *options.memory_budget ? "within" : "OVER",
                                      static_cast<double>(r.activation_measured) / (1 << 20),
                                      static_cast<double>(r.activation_predicted) / (1 << 20))
                              .c_str());
  });
}

}  // namespace concord::cli
