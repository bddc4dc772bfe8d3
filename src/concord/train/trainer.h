// The training loop behind `concord train --config configs/<name>.json`: AdamW over fp32 master
// weights, the served copy made by an export rule each step, the model's forward/backward under
// a precision policy, periodic validation, metrics as JSON lines, atomic checkpoints, and a
// resume that continues bit-identically to a run that was never interrupted.
//
// A run directory holds:  config.json (the resolved training config), metrics.jsonl (one line
// per step and per evaluation), checkpoints/step-XXXXXXXX/ (model.safetensors = fp32 master
// weights under HF names, optimizer.safetensors, state.safetensors with ef's carried error,
// state.json) and checkpoints/latest, and
// final/ (config.json + model.safetensors of the served weights + tokenizer.json: an HF-layout
// model folder, written as a whole).
//
// Resume rules: with resume (the default) and a checkpoint, the run continues from it when
// config.json and the checkpoint's recorded config both match this config (else an InputError
// naming the key); a run already at train.steps rebuilds final/ from the last checkpoint when
// final/ is missing, incomplete or of another run. Otherwise (resume = false, or no checkpoint)
// the run starts afresh: the previous run's config.json, checkpoints/, final/ and metrics.jsonl
// are discarded before the new config.json is written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/model/config.h"
#include "concord/model/policy.h"
#include "concord/train/depth.h"
#include "concord/train/optimizer.h"

namespace concord::train {

struct TrainConfig {
  std::string name = "tiny";
  model::ModelConfig model;
  model::PrecisionPolicy policy = model::PrecisionPolicy::preset("fp32");
  std::string export_rule = "rne";  // rne | sr | ef (export.h)
  // data
  std::string corpus = "kjv";  // "kjv" or a path to a UTF-8 text file
  double validation_fraction = 0.05;
  int64_t split_chunk = 4096;
  // optimisation
  int64_t batch_size = 16;
  int64_t seq_len = 128;
  int64_t steps = 600;
  uint64_t seed = 1;
  double lr = 3e-3;
  double min_lr = 3e-4;
  int64_t warmup_steps = 30;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double init_std = 0.02;
  // The optimizer ("optimizer": {"name": ..., binary settings}): "adamw" (the default), or a
  // binary-weight optimizer (binary.h: "latent-adamw", "bop", "ed") that trains the selected GEMM
  // weights as signs with a per-row scale and everything else with AdamW at the settings above.
  std::string optimizer = "adamw";
  BinaryConfig binary;
  OptimizerConfig optimizer_config() const;
  // depth of each step of a depth-recurrent model (depth.h; the "depth" section, only for one)
  DepthSampler depth;
  // Distillation ("distill": {"from": PATH}, `concord train --distill-from PATH`): train to the
  // teacher model's next-token distributions (loss: KL(p_teacher || p_model), Model::
  // forward_backward_distill) over the corpus tokenized by the teacher's tokenizer, which
  // final/ then carries — a draft model for speculative decoding (docs/speculative.md). The
  // teacher (a model folder or GGUF, served in its own precision) must have model.vocab_size
  // tokens; validation reports the mean KL in nats per token.
  std::string distill_from;
  // Fine-tuning ("init": {"from": PATH}, `concord train --init PATH`): the weights start as this
  // model's (a folder, a training run or a GGUF, read as fp32 values) instead of a random init;
  // its architecture must be model's (the keys of config.json; InputError naming the first that
  // differs). The run evaluates the initial weights on the validation split first (step 0 in
  // metrics.jsonl), so that what the fine-tuning gained on the new corpus is measured.
  std::string init_from;
  // evaluation and checkpoints (0 disables the periodic ones; the last step always does both)
  int64_t eval_every = 100;
  int64_t eval_batches = 8;
  int64_t checkpoint_every = 100;
  int checkpoint_keep = 2;
  std::string out = "runs/tiny";

  static TrainConfig from_json(const nlohmann::json& j, const std::string& source);
  static TrainConfig load(const std::filesystem::path& path);
  nlohmann::json to_json() const;
};

struct TrainOptions {
  std::optional<std::filesystem::path> out;  // overrides config.out
  bool resume = true;                        // continue from the run directory's last checkpoint
  std::optional<int64_t> stop_after;         // stop (as if killed) after this many steps
  bool progress = true;                      // progress bar on stderr
  // `concord train --memory-budget`: the run's peak RSS must stay within this many bytes. The
  // activations are planned to fit (sched/recompute.h: which applications recompute their
  // attention probabilities or their whole block in the backward; the gradients are bit for bit
  // the same under every plan). Before the first step the run refuses (InputError, with the
  // figures) when what it holds already, plus the gradients, plus the smallest plan (every block
  // recomputed) cannot fit. The first step runs under that smallest plan; its measured peak RSS
  // less its measured activations, plus what comes later (the validation pass's logits, B·T·V
  // floats, and the served copy the final export writes, a float per parameter), is what the
  // process holds besides them; from the second step on the plan of least recomputation that fits
  // the rest of the budget runs.
  std::optional<int64_t> memory_budget;
};

struct TrainResult {
  int64_t start_step = 0;     // 0, or the step a resumed run started from
  int64_t steps_done = 0;     // the step count reached
  std::vector<float> losses;  // training loss of each step run here
  double last_validation_loss = 0;
  std::optional<double> initial_validation_loss;  // --init: the initial weights' (step 0)
  double tokens_per_second = 0;
  double seconds = 0;
  size_t peak_rss_bytes = 0;
  // The optimizer's state from its allocations (OptimizerMemory), and the weights the run keeps
  // as fp32 masters (all of them under adamw; under a binary optimizer the master holds the
  // served alpha * sign values the model's GEMMs read).
  OptimizerMemory optimizer_memory;
  int64_t master_bytes = 0;
  int64_t binary_flips = 0;  // sign flips over the steps run here (binary optimizers)
  // With a memory budget: the plan of the steps after the first ("keep" / "attention" / "block"
  // per application), its predicted activation peak and the largest measured one.
  std::vector<std::string> recompute;
  int64_t activation_predicted = 0, activation_measured = 0;
  std::filesystem::path run_dir;
  bool final_rebuilt = false;  // the run was already done; final/ was missing or stale and is rebuilt
};

TrainResult train(const TrainConfig& config, const TrainOptions& options = {});


}  // namespace concord::train
