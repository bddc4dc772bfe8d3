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

#include <cmath>
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
  // > 0: a binary GEMM weight with this many output channels (binary.h: the optimizer keeps its
  // signs and a per-row scale and writes alpha * sign into `value`); 0: a plain parameter.
  int64_t binary_rows = 0;
};

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // max global L2 norm; <= 0 disables clipping
};

// One element of AdamW's update (the formula of the file comment), in double, each stored
// quantity rounded to fp32 once: AdamW::step and the binary optimizers' latent and alpha share it.
struct AdamWElement {
  double beta1, beta2, eps;
  double step_size;     // lr / (1 - beta1^t)
  double bias2_sqrt;    // sqrt(1 - beta2^t)
  double decay_factor;  // 1 - lr * weight_decay, or 1
  AdamWElement(const AdamWConfig& c, double lr, int64_t t, bool decay);
  void operator()(float& value, float& m, float& v, double g) const {
    const double m_new = beta1 * m + (1.0 - beta1) * g;
    const double v_new = beta2 * v + (1.0 - beta2) * (g * g);
    const double denom = std::sqrt(v_new) / bias2_sqrt + eps;
    const double updated = static_cast<double>(value) * decay_factor - step_size * (m_new / denom);
    m = static_cast<float>(m_new);
    v = static_cast<float>(v_new);
    value = static_cast<float>(updated);
  }
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
// make_optimizer() is the one place that constructs an optimizer: AdamW, and the binary-weight
// optimizers of binary.h (latent-adamw, bop, ed).
//
// What an optimizer's state occupies, from its allocations (the capacity of every buffer it
// owns), not from a formula. "Binary" weights are those the optimizer trains as signs
// (ParamView::binary_rows > 0): binary_bytes are their signs plus the state the method keeps for
// them (latents and moments, Bop's EMA, ED's residuals and its per-tensor statistic);
// scale_bytes the per-row scales alpha and their AdamW moments (the same under every binary
// method: 96 bits per output channel). other_bytes is the state of the other parameters (AdamW's
// moments), not their fp32 values.
struct OptimizerMemory {
  int64_t binary_weights = 0;
  int64_t binary_bytes = 0;
  int64_t scale_bytes = 0;
  int64_t other_weights = 0;
  int64_t other_bytes = 0;
  double binary_bits_per_weight() const { return per_binary_weight(binary_bytes); }
  double scale_bits_per_weight() const { return per_binary_weight(scale_bytes); }
  int64_t total_bytes() const { return binary_bytes + scale_bytes + other_bytes; }

 private:
  double per_binary_weight(int64_t bytes) const {
    return binary_weights == 0 ? 0.0 : 8.0 * static_cast<double>(bytes) / static_cast<double>(binary_weights);
  }
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string_view name() const = 0;
  // Called once before the first step with the parameters (gradients may be empty): an optimizer
  // whose served values differ from the initial ones (binary: alpha * sign) makes its state and
  // writes them. AdamW does nothing.
  virtual void initialize(std::span<const ParamView> /*params*/) {}
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
  virtual OptimizerMemory memory() const = 0;
};

// The binary-weight optimizers' settings (binary.h says what each does).
struct BinaryConfig {
  bool attention = true;  // q, k, v, o are binary
  bool mlp = true;        // gate, up, down (and the experts') are binary
  int bits = 4;           // ed: the residual's bits, 2..8; 0 = an unbounded fp32 residual
  std::string rounding = "stochastic";  // ed: stochastic | diffused
  std::string update = "rms";           // ed: rms | factored | sign | sgd
  double range = 1.0;                   // latent-adamw's clip / ed's grid: latents in [-range, range] (<= 1)
  double beta2 = 0.999;                 // ed rms / factored: the EMA of the mean squared gradient
  double eps = 1e-8;                    // ed rms / factored
  double bop_gamma = 1e-3;              // bop: the EMA's rate
  double bop_threshold = 1e-6;          // bop: flip when s * m exceeds it
  uint64_t seed = 1;                    // ed stochastic rounding
  friend bool operator==(const BinaryConfig&, const BinaryConfig&) = default;
};

// The optimizer of a run and its settings: "adamw", or a binary-weight optimizer ("latent-adamw",
// "bop", "ed"), which trains alpha and the non-binary parameters with `adamw`.
struct OptimizerConfig {
  std::string name = "adamw";
  AdamWConfig adamw;
  BinaryConfig binary;
  bool is_binary() const { return name != "adamw"; }
};
// InputError naming the name for an unknown optimizer, and AdamW's for bad settings.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config);
std::vector<std::string> optimizer_names();
// Every "<key>" an optimizer may write as "<param>.<key>" (load_checkpoint's check).
std::vector<std::string> optimizer_state_keys();
// The shape a state tensor "<param>.<key>" has for a parameter of `param_shape`: the parameter's,
// or one value per output channel (row) for the per-row keys of the binary optimizers.
std::vector<int64_t> optimizer_state_shape(std::string_view key, std::span<const int64_t> param_shape);

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
  // The update of step t with a given gradient scale, without the norm, the checks or counting
  // the step (step() is: checks, norm, clip scale, apply, count). The binary optimizers use it
  // for their non-binary parameters under their own global norm.
  void apply(std::span<const ParamView> params, double lr, double clip_scale, int64_t t);
  OptimizerMemory memory() const override;
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
