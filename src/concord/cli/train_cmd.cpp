// `concord train`: train a model from a JSON training config (configs/<name>.json).
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/model/policy.h"
#include "concord/train/binary.h"
#include "concord/train/trainer.h"

namespace concord::cli {

void add_train_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::string out;
    std::string policy;
    std::string export_rule;
    std::string distill_from;
    std::string init;
    std::string corpus;
    std::optional<int64_t> steps;
    std::optional<uint64_t> seed;
    std::optional<int64_t> memory_budget;
    std::string optimizer, binary, ed_rounding, ed_update;
    std::optional<int64_t> ed_bits;
    std::optional<double> ed_range;
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
  cmd->add_option("--init", args->init,
                  "fine-tune: start from this model's weights (a model folder, a training run or a GGUF; the config's "
                  "model must be its architecture) instead of a random init; step 0 of metrics.jsonl is its validation "
                  "loss on the corpus (default: the config's init.from)");
  cmd->add_option("--corpus", args->corpus,
                  "training text: kjv (the King James Bible), python-docs (the Python 3.11 documentation), "
                  "addition:N, or a UTF-8 text file (default: the config's data.corpus)");
  add_size_flag(cmd, "--memory-budget", args->memory_budget,
                "the run's peak RSS: the step's activations are planned to fit by recomputing attention probabilities "
                "or whole blocks in the backward (the same gradients, bit for bit); refused, with the figures, when "
                "even recomputing every block cannot fit");
  cmd->add_option("--optimizer", args->optimizer,
                  "adamw (fp32 master weights), or a binary-weight optimizer: latent-adamw (an fp32 latent per weight, "
                  "the baseline), bop, ed (error diffusion with a packed b-bit residual); default: the config's");
  cmd->add_option("--binary", args->binary,
                  "which GEMM weights a binary optimizer trains as signs: attention,mlp (default) | attention | mlp");
  add_integer_flag(cmd, "--ed-bits", args->ed_bits, between(0, 8),
                   "ed: the residual's bits per weight, 2..8 (0: an unbounded fp32 residual; default 4)");
  add_real_flag(cmd, "--latent-range", args->ed_range, real_in(0, 1, true, false),
                  "latent-adamw and ed: the latent's range [-R, R], 0 < R <= 1 (default 1, BinaryConnect's clip at +-1): "
                  "where latent-adamw clips and the span of ed's b-bit grid (a smaller R spends ed's bits nearer the flip "
                  "threshold)");
  cmd->add_option("--ed-rounding", args->ed_rounding, "ed: how an update is rounded onto the grid: stochastic | diffused");
  cmd->add_option("--ed-update", args->ed_update, "ed: rms (the gradient over its tensor's RMS, default) | factored (over its row's and column's RMS, as Adafactor) | sign (its sign) | sgd (the gradient)");
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
    if (!args->init.empty()) config.init_from = args->init;
    if (!args->corpus.empty()) config.corpus = args->corpus;
    if (!args->optimizer.empty()) config.optimizer = args->optimizer;
    if (!args->binary.empty()) train::parse_binary_classes(args->binary, config.binary);
    if (args->ed_bits) config.binary.bits = static_cast<int>(*args->ed_bits);
    if (!args->ed_rounding.empty()) config.binary.rounding = args->ed_rounding;
    if (args->ed_range) config.binary.range = *args->ed_range;
    if (!args->ed_update.empty()) config.binary.update = args->ed_update;
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
    if (r.initial_validation_loss)
      std::printf("%s\n", fmt::format("from {}: validation loss {:.4f} -> {:.4f} nats/byte on {}", config.init_from,
                                      *r.initial_validation_loss, r.last_validation_loss, config.corpus)
                              .c_str());
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
    const train::OptimizerMemory& om = r.optimizer_memory;
    if (om.binary_weights > 0)
      std::printf("%s\n", fmt::format("optimizer {} ({} weights binary, {} of them): {:.3f} bits of state per binary "
                                      "weight (its sign and {}), {:.3f} more for the per-row scales and their moments; "
                                      "{:.1f} MiB of optimizer state in all; {} sign flips; the fp32 copy the GEMMs "
                                      "read {:.1f} MiB",
                                      config.optimizer, train::binary_classes_text(config.binary), om.binary_weights,
                                      om.binary_bits_per_weight(),
                                      config.optimizer == "ed"
                                          ? (config.binary.bits == 0 ? std::string("an fp32 residual")
                                                                     : fmt::format("a {}-bit residual", config.binary.bits)) +
                                                (config.binary.update == "rms"        ? ", its tensor's mean square"
                                                 : config.binary.update == "factored" ? ", its row's and column's mean squares"
                                                                                      : "")
                                          : config.optimizer == "bop" ? std::string("an fp32 gradient EMA")
                                                                      : std::string("an fp32 latent and its two moments"),
                                      om.scale_bits_per_weight(), static_cast<double>(om.total_bytes()) / (1 << 20),
                                      r.binary_flips, static_cast<double>(r.master_bytes) / (1 << 20))
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
