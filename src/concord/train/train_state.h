// The training state of a run: fp32 master weights, the export rule that makes the served copy
// from them (and the state it carries: ef's residuals; sr's seed), the optimizer and its state,
// and the step count — what `concord train`, the RL learner and the RL warm-up each used to build
// by hand. One class, so that a checkpoint, a resume and an export mean the same thing in all
// three, and so that an optimizer or export rule added here is available to all of them.
//
//   TrainState state(model_config, served_policy, "ef", seed, optimizer_config, initial_values);
//   for (step ...) {
//     state.export_to(served_model, step);       // master -> served copy (once per step)
//     model.forward_backward(...);               // gradients in some model (served or not)
//     state.step(model, lr);                     // the optimizer over the master, grads from model
//     if (due) state.save(run_dir, step + 1, json{...}, keep);
//   }
//   state.restore(load_checkpoint(dir), "train");  // on resume
//
// Parameters are model::Model::params() of the config, in that order: the export rule's
// parameter index, the SR streams and random init are keyed by it, and checkpoints name each
// tensor by its Hugging Face name (model.safetensors holds the master and nothing else).
//
// Checkpoints (train/checkpoint.h): model.safetensors the master, optimizer.safetensors the
// optimizer's state_views(), state.safetensors the export rule's state ("export.<name>") and the
// caller's own tensors, state.json the caller's JSON with "optimizer_steps" added. restore()
// puts back the master, the optimizer (its step count from "optimizer_steps", or the
// checkpoint's step when an older checkpoint lacks it) and the export rule's state; the caller
// restores its own extras.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/model/config.h"
#include "concord/model/model.h"
#include "concord/model/policy.h"
#include "concord/train/checkpoint.h"
#include "concord/train/export.h"
#include "concord/train/optimizer.h"
#include "concord/train/tensors.h"

namespace concord::train {

class TrainState {
 public:
  // The master starts as `initial` (one vector per parameter of `config`, in params() order,
  // each of the parameter's size; InputError otherwise). `served_policy.served_weights` is the
  // format the export rule writes; `export_rule` is rne | sr | ef (export.h); `seed` keys sr.
  TrainState(const model::ModelConfig& config, const model::PrecisionPolicy& served_policy,
             std::string_view export_rule, uint64_t seed, const OptimizerConfig& optimizer,
             std::vector<std::vector<float>> initial);
  // The master starts as `m`'s fp32 values (its config; `m` must hold no stored weights).
  TrainState(model::Model& m, const model::PrecisionPolicy& served_policy, std::string_view export_rule,
             uint64_t seed, const OptimizerConfig& optimizer);
  ~TrainState();
  TrainState(TrainState&&) noexcept;
  TrainState& operator=(TrainState&&) noexcept;

  const std::vector<model::ParamSpec>& params() const { return specs_; }
  // The fp32 master of parameter p (params() order).
  std::span<float> master(size_t p) { return master_[p]; }
  std::span<const float> master(size_t p) const { return master_[p]; }
  const std::vector<std::vector<float>>& masters() const { return master_; }
  // The master as checkpoint views (HF names, shapes); valid until the next step or restore.
  std::vector<TensorView> master_views() const;

  // Writes the served copy of `step` into `served` (every parameter through the export rule, then
  // served.weights_changed()). A stateful rule (ef) advances its state: call once per step.
  void export_to(model::Model& served, int64_t step);
  // Writes the master into `m` unchanged (fp32 values; weights_changed()).
  void copy_master_to(model::Model& m) const;

  // One optimizer step over the master with the gradients `grads_from` holds (a model of the same
  // config whose backward ran). Returns the pre-clip gradient norm (non-finite: the step was
  // skipped and nothing changed).
  double step(model::Model& grads_from, double lr);
  // Binary-weight optimizers (binary.h): the output channels of parameter p when it is trained as
  // signs (its master then holds alpha * sign), 0 otherwise; the weights so trained.
  int64_t binary_rows(size_t p) const { return binary_rows_[p]; }
  int64_t binary_weights() const;
  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  ExportRule& export_rule() { return *exporter_; }
  const ExportRule& export_rule() const { return *exporter_; }

  // The export rule's state as "export.<name>" tensors (a copy, for a checkpoint taken later).
  std::vector<NamedTensor> export_state() const;
  // Writes the checkpoint of `step` (see the file comment). `state` is the caller's JSON object
  // ("optimizer_steps" is added); `extra` its own state tensors; `export_state`, when given,
  // the export rule's state to save instead of the current one (the trainer's: from before the
  // export of `step`, when that export already ran).
  std::filesystem::path save(const std::filesystem::path& run_dir, int64_t step, nlohmann::json state,
                             int keep, std::span<const NamedTensor> extra = {},
                             const std::vector<NamedTensor>* export_state = nullptr) const;
  // Restores master, optimizer and export-rule state from `ckpt`. InputError "[<layer>] <file>:
  // ..." for a parameter missing or of the wrong size, a bad "optimizer_steps", optimizer or
  // export state that does not fit.
  void restore(const LoadedCheckpoint& ckpt, std::string_view layer);

 private:
  std::vector<model::ParamSpec> specs_;
  std::vector<std::vector<float>> master_;
  std::unique_ptr<ExportRule> exporter_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<int64_t> binary_rows_;

  // The parameters as the optimizer sees them, with `grads` (params() order; empty: none).
  std::vector<ParamView> views(std::span<const std::span<const float>> grads);
};

}  // namespace concord::train
