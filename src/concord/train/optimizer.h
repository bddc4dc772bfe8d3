// AdamW over fp32 master weights, the learning-rate schedule, and the global gradient norm.
//
// The optimizer works on named fp32 spans (ParamView), not on the Model class, so the same code
// updates any set of parameters. Its update is bit-reproducible: the same inputs give the same
// bits whatever the OpenMP thread count, because every element's update is computed on its own
// and the one reduction (the gradient norm) sums fixed-size blocks in a fixed order.
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
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

class AdamW {
 public:
  explicit AdamW(AdamWConfig config);

  const AdamWConfig& config() const { return config_; }

  // One step at learning rate `lr` (the schedule's value; config().lr is only a default for
  // callers without a schedule). Moments are created as zeros on a parameter's first step.
  // Returns the pre-clip global gradient norm. Throws InputError when a value and its gradient
  // differ in size, or a parameter's size differs from its stored moments.
  double step(std::span<const ParamView> params, double lr);
  // Steps taken (t in the bias corrections); skipped non-finite steps are not counted.
  int64_t steps_taken() const { return steps_; }

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
