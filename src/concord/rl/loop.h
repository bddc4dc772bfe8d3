// The RL run behind `concord rl` and the arms of `concord demo`: a short supervised warm-up on
// task examples (so a small model starts with a non-zero reward), then GRPO steps:
//
//   1 sync     the learner exports its fp32 master to the served copy (Fair Cast rule), publishes
//              it (rl/sync.h) through the channel (rl/channel.h); each sampler verifies it with
//              the seven checks and swaps it in (a failed sync keeps the old version serving)
//   2 rollout  each sampler generates group_size completions for its share of the step's
//              prompts with the engine (serve/engine.h) at the sampler preset, with log-probs
//   3 learn    the learner scores the rollouts (exact task rewards), computes its own log-probs
//              at the learner preset (θ_old), the reference log-probs (when kl_coef > 0), and
//              takes ppo_epochs AdamW steps on the GRPO loss (rl/grpo.h) — on the served copy
//              when loss_on_served (straight-through to the master) or on the master
//   4 metrics  reward, entropy, mismatch (rl/mismatch.h), Fair Cast (train/fair_cast.h), the sync
//              report, the time split — one JSON line per step in OUT/metrics.jsonl
// and at the end OUT/report.html (inline SVG: reward, mismatch KL, lag) and OUT/summary.json.
//
// Checkpoints (OUT/checkpoints, train/checkpoint.h) every checkpoint_every steps and at the end
// hold what the next step needs to continue bit-identically: the fp32 master, the AdamW moments
// and step count, the export rule's state (ef's carried error), the Fair Cast meter, the
// reference weights (kl_coef > 0), the metrics lines and running totals (times included, so that
// a resumed run's summary counts every process), and the config they were written under. Running
// the same config on the same OUT resumes from OUT/checkpoints/latest (the warm-up is skipped); a
// config that differs in anything but `out` and `checkpoint_every`, from config.json or from the
// checkpoint's record, is an InputError naming the key. A fresh start (resume = false, or no
// checkpoint) first discards the previous run's config.json, checkpoints/, metrics.jsonl,
// summary.json, report.html and rollouts.jsonl, so that no later resume picks up another run.
// Samplers keep nothing across steps but their serving version, which a fresh sampler lacks:
// the first sync after a resume applies as any first sync does. Faults that depend on the
// previous sync (stale_version, stale_weights, stale_derived) at the first step after a resume
// see no previous sync (the stale_* ones are then an InputError: nothing to re-send).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/model/config.h"
#include "concord/rl/channel.h"
#include "concord/rl/grpo.h"
#include "concord/rl/sync.h"

namespace concord::rl {

struct FaultAt {
  int64_t step = 0;
  Fault fault = Fault::none;
};

// The small model the demo and `concord rl` start from: 2 layers, d_model 64, byte vocabulary.
model::ModelConfig default_rl_model();

struct RlConfig {
  std::string name = "rl";
  model::ModelConfig model = default_rl_model();  // used when init_from is empty
  std::string init_from;                // a model folder (HF layout) to start from; else random
  // A folder caching the warmed-up model (HF layout, fp32 master + warmup.json): reused when its
  // warmup.json matches this run's model, init and warm-up settings, else (re)written. Empty:
  // the warm-up runs in memory every time.
  std::string base;
  std::string sampler = "bf16";         // precision preset (or policy JSON) of the samplers
  std::string learner = "bf16";         // precision preset of the learner
  std::string export_rule = "rne";      // rne | sr | ef: master → served copy
  bool loss_on_served = true;           // learner's loss on the served copy (straight-through)
  // task
  std::string task = "add";
  int difficulty = 1;
  // warm-up (supervised on task examples: prompt + answer + eos)
  int64_t warmup_steps = 200;
  double warmup_lr = 3e-3;
  int64_t warmup_batch = 32;            // examples per warm-up step
  // GRPO
  int64_t steps = 50;
  int64_t prompts_per_step = 16;
  int64_t group_size = 8;
  int64_t max_new_tokens = 8;
  double temperature = 1.0;
  int64_t ppo_epochs = 1;
  double lr = 5e-4;
  double weight_decay = 0;
  double grad_clip = 1.0;
  // AdamW's betas; to_json writes them only when they differ from these defaults, so that a
  // run from before they were keys keeps its config identity (its checkpoints resume).
  static constexpr double kDefaultBeta1 = 0.9, kDefaultBeta2 = 0.999;
  double beta1 = kDefaultBeta1;
  double beta2 = kDefaultBeta2;
  PolicyLossConfig loss;
  // sync
  ProbeOptions probe;
  std::vector<FaultAt> faults;
  uint64_t seed = 1;
  std::string out = "runs/rl";
  // Also write OUT/rollouts.jsonl at the end: one line per completion (step, prompt, sample,
  // task, prompt and completion text, tokens, reward, advantage, sampler and learner log-probs).
  bool log_rollouts = false;
  // Write a checkpoint every this many steps (and after the last); 0: only after the last.
  int64_t checkpoint_every = 25;
  // Speculative rollouts (docs/speculative.md): "" (off), "ngram", "self:PRESET",
  // "self:layers=K" (rebuilt from the sampler's weights after every sync: never out of sync), or
  // a draft model folder (fixed: the policy drifts away from it). The rollouts' tokens follow
  // the sampler's distribution and their log-probs are the sampler's, as without speculation;
  // metrics.jsonl gains spec/accept_rate and spec/accept_length per step.
  std::string speculative;
  int speculative_tokens = 4;
  // Held-out evaluation (docs/rl.md, "Held-out evaluation"): every eval_every steps (0: off),
  // right after the sync of steps 1, 1 + every, 1 + 2 every, ... and once after the last step,
  // greedy replies to eval_prompts held-out prompts (their own seed stream, never a training
  // prompt's index) from the served copy at the sampler preset and from the fp32 master: their
  // rewards, and how many replies are the same tokens (checkpoint consistency: does the served
  // copy reproduce the master's greedy outputs?). max_new_tokens 0: grpo.max_new_tokens.
  int64_t eval_every = 0;
  int64_t eval_prompts = 32;
  int64_t eval_max_new_tokens = 0;

  // JSON layout (docs/rl.md): {"name", "model", "init_from", "base", "sampler", "learner",
  // "export", "loss_on_served", "task": {"name", "difficulty"}, "warmup": {"steps", "lr",
  // "batch_size"}, "grpo": {"steps", "prompts_per_step", "group_size", "max_new_tokens",
  // "temperature", "ppo_epochs", "lr", "weight_decay", "grad_clip", "beta1", "beta2"}, "loss": {"clip_low",
  // "clip_high", "kl_coef", "is", "is_cap", "mask_lo", "mask_hi"}, "probe": {"sequences",
  // "length", "seed", "max_k3_kl", "osc_max"}, "faults": ["NAME@STEP", ...], "seed", "out",
  // "log_rollouts", "checkpoint_every", "speculative": {"drafter", "draft_tokens"},
  // "eval": {"every", "prompts", "max_new_tokens"}};
  // every key optional, unknown keys are errors. from_json validates everything (InputError
  // naming `source` and the key).
  static RlConfig from_json(const nlohmann::json& j, const std::string& source);
  static RlConfig load(const std::filesystem::path& path);
  nlohmann::json to_json() const;
  void validate(const std::string& source) const;
  // The model config the run uses: config.json of init_from, else `model`.
  model::ModelConfig resolved_model() const;
};

// "NAME@STEP" (e.g. "flipped_bit@3"): InputError naming the fault list or the step.
FaultAt parse_fault(std::string_view text);

struct RlStepMetrics {
  int64_t step = 0;
  double reward = 0, entropy = 0;
  nlohmann::json line;  // the full metrics.jsonl line
};

struct RlResult {
  std::vector<RlStepMetrics> steps;
  double warmup_reward = 0;       // mean reward after the warm-up, before the first GRPO step
  double initial_reward = 0;      // mean reward of the first 10% of steps
  double final_reward = 0;        // mean reward of the last 10% of steps
  double mean_mismatch_kl = 0;    // mean rollout_corr/k3_kl over steps
  double lag_median = 0, lag_p90 = 0;
  double seconds_rollout = 0, seconds_learner = 0, seconds_sync = 0;
  int64_t sync_failures = 0;      // syncs that did not apply (by check: in summary.json)
  // Wall time of the whole run, over every process that ran part of it (a resumed run adds its
  // own to its checkpoint's total, as it does for the parts), and of this process alone.
  double seconds_warmup = 0, seconds_total = 0, seconds_this_process = 0;
  bool warmup_cached = false;     // the warmed-up model came from `base`
  int64_t start_step = 0;         // 0, or the checkpoint step a resumed run continued from
  bool stopped = false;           // RlOptions::stop_after ended the run early (no summary/report)
  nlohmann::json summary;         // OUT/summary.json
};

struct RlOptions {
  bool progress = true;              // a line per step on stderr
  bool resume = true;                // continue from OUT/checkpoints/latest when there is one
  // Stop (as if killed, after that step's checkpoint when one is due) after this many steps run
  // here; tests of resume. In process only (sampler ranks would wait for the next step).
  std::optional<int64_t> stop_after;
  // --transport http: the sampler is the `concord serve` at this URL ("http://HOST:PORT", serving
  // the run's model config at the sampler preset, taking weight updates); the channel must be
  // the in-process one. Its rollouts equal the in-process sampler's (same engine, same seeds).
  std::string sampler_url;
  std::string sampler_api_key;  // its --api-key, if any
};

// Runs the run on this rank of `channel` (rank 0: learner; others: samplers). Rank 0 writes
// OUT/; sampler ranks only return their own timing. progress: a line per step on stderr.
RlResult run_rl(const RlConfig& config, Channel& channel, const RlOptions& options);
// A fresh run (resume = false), as `concord demo` runs its arms.
RlResult run_rl(const RlConfig& config, Channel& channel, bool progress = true);

// A finished run read back from its directory (config.json, metrics.jsonl, summary.json), for a
// report over several runs (`concord rl-report`). InputError naming the file and the problem
// when one is missing, unreadable or does not fit the others (a run that has not finished has
// no summary.json).
struct LoadedRun {
  RlConfig config;
  RlResult result;
};
LoadedRun load_rl_run(const std::filesystem::path& dir);

}  // namespace concord::rl
