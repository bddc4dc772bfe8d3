// The optimizer interface, AdamW over fp32 master weights (its first implementation), the
// learning-rate schedule, and the global gradient norm.
//
// An optimizer works on named fp32 spans (ParamView), not on the Model class, so the same code
// updates any set of parameters. train::TrainState (train_state.h) owns the one optimizer of a
// run (`concord train`, the RL learner, the RL warm-up) and hands it the parameters each step.
// Its update is bit-reproducible: the same inputs give the same bits whatever the OpenMP thread
// count, because every element's update is computed on its own and the one reduction (the
// gradient norm) sums fixed-size blocks in a fixed order.
//
// Precision: values, gradients and the moment buffers are stored in fp32; each element's update
// is computed in double and rounded to fp32 once per stored quantity (m, v, the parameter). The
// formula is PyTorch's torch.optim.AdamW (decoupled weight decay, bias-corrected moments):
//   g  = grad * clip_scale                 clip_scale = min(1, grad_clip / ||grad||) if grad_clip > 0
//   p  = p * (1 - lr * weight_decay)       only for parameters with decay = true
//   m  = b1 m + (1 - b1) g
//   v  = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// A step whose gradient norm is not finite (NaN/Inf in some gradient) changes nothing — no
// parameter, no moment, not the step count — and returns that norm, so the caller can log it,
// skip the batch or stop, instead of the NaN poisoning the master weights for good.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "concord/train/tensors.h"

namespace concord::train {

// One parameter: its fp32 master values (updated in place) and its gradient.
struct ParamView {
  std::string_view name;
  std::span<float> value;
  std::span<const float> grad;
  bool decay = true;  // false for norm weights (1-D): no weight decay
};

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // max global L2 norm; <= 0 disables clipping
};

// Linear warmup then cosine decay. `step` counts from 0 (the first optimizer step):
//   step <  warmup:            peak * (step + 1) / warmup      (peak/warmup at step 0)
//   warmup <= step <= total:   min + (peak - min) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2
//   step >  total:             min
// so the value is peak at step == warmup, (peak + min)/2 halfway through the decay and min at
// step == total. Throws InputError for negative lrs or steps, or total < warmup.
struct LrSchedule {
  double peak_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  void validate() const;
  double at(int64_t step) const;
};

// Global L2 norm of all gradients, accumulated in double. Each parameter is cut into blocks of
// kNormBlock elements; each block's sum of squares is computed on its own (in parallel) and the
// block sums are added in parameter order, so the result does not depend on the thread count.
inline constexpr int64_t kNormBlock = 1 << 14;
double global_grad_norm(std::span<const ParamView> params);

// What every optimizer does for a training loop. The loop calls step() with the registered
// parameters in a fixed order (model::Model::params(): random init, SR streams and export rules
// are keyed by that index) and saves/restores the state through state_views()/restore_state().
//
// Optimizers whose state is not an fp32 master (the binary-weight optimizers of DESIGN.md's
// error-diffusion system: sign bits with a per-channel scale, a packed b-bit residual per weight,
// Bop's gradient EMA) fit this interface as it is:
//   - ParamView::value is "the weights this optimizer writes", not necessarily a master: such an
//     optimizer writes the served values (±α) into it and keeps everything else — the residual,
//     the EMA, the flip counters — as its own state, under its own names;
//   - its state goes to checkpoints as state_views(): F32 tensors "<param>.<key>", shaped like
//     the parameter (b-bit integers and signs are exact in fp32; the file spends 32 bits on each,
//     which a later U8 dtype in optimizer.safetensors can cut without touching the interface),
//     with each key listed in optimizer_state_keys() so that load_checkpoint validates them;
//   - the export from TrainState then only copies: "rne" of a value already on the served grid
//     is that value, so no export rule of an fp32 master is involved.
// Only AdamW exists today; make_optimizer() is the one place that constructs an optimizer.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string_view name() const = 0;
  // One step at learning rate `lr` (the schedule's value). Returns the pre-clip global gradient
  // norm; a non-finite norm means the step changed nothing (see the file comment).
  virtual double step(std::span<const ParamView> params, double lr) = 0;
  // Steps taken (skipped non-finite steps are not counted).
  virtual int64_t steps_taken() const = 0;
  // The state tensors for a checkpoint ("<param>.<key>", shaped like the parameter in `params`,
  // parameters in `params` order), as views valid until the next step or restore.
  virtual std::vector<TensorView> state_views(std::span<const TensorView> params) const = 0;
  // Replaces the whole state with `tensors` (as load_checkpoint returns them) and sets the step
  // count. InputError naming the problem for a tensor this optimizer does not keep, a parameter
  // with part of its state, or a size that differs from its parameter's in `params`.
  virtual void restore_state(std::span<const NamedTensor> tensors, std::span<const TensorView> params,
                             int64_t steps_taken) = 0;
};

// The optimizer of a run and its settings; today only "adamw".
struct OptimizerConfig {
  std::string name = "adamw";
  AdamWConfig adamw;
};
// InputError naming the name for an unknown optimizer, and AdamW's for bad settings.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config);
std::vector<std::string> optimizer_names();
// Every "<key>" an optimizer may write as "<param>.<key>" (load_checkpoint's check).
std::vector<std::string> optimizer_state_keys();

class AdamW final : public Optimizer {
 public:
  explicit AdamW(AdamWConfig config);

  std::string_view name() const override { return "adamw"; }

  const AdamWConfig& config() const { return config_; }

  // One step at learning rate `lr` (the schedule's value; config().lr is only a default for
  // callers without a schedule). Moments are created as zeros on a parameter's first step.
  // Returns the pre-clip global gradient norm. Throws InputError when a value and its gradient
  // differ in size, or a parameter's size differs from its stored moments.
  double step(std::span<const ParamView> params, double lr) override;
  // Steps taken (t in the bias corrections); skipped non-finite steps are not counted.
  int64_t steps_taken() const override { return steps_; }
  // "<param>.exp_avg" and "<param>.exp_avg_sq" for each parameter of `params` with moments.
  std::vector<TensorView> state_views(std::span<const TensorView> params) const override;
  void restore_state(std::span<const NamedTensor> tensors, std::span<const TensorView> params,
                     int64_t steps_taken) override;

  // --- state, for checkpoints --------------------------------------------------------------
  // Names with moments, sorted.
  std::vector<std::string> state_names() const;
  bool has_state(std::string_view name) const;
  // Moment buffers of a parameter; throw InputError for a name without state.
  std::span<const float> exp_avg(std::string_view name) const;
  std::span<const float> exp_avg_sq(std::string_view name) const;
  // Restores (or creates) a parameter's moments; both spans must have the same size.
  void set_state(std::string_view name, std::span<const float> exp_avg,
                 std::span<const float> exp_avg_sq);
  void set_steps_taken(int64_t steps);
  void clear_state();

 private:
  struct Moments {
    std::vector<float> exp_avg;
    std::vector<float> exp_avg_sq;
  };
  const Moments& moments(std::string_view name) const;

  AdamWConfig config_;
  int64_t steps_ = 0;
  std::map<std::string, Moments, std::less<>> state_;
};

}  // namespace concord::train
