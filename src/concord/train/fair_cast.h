// Fair Cast metrics (docs/design.md system #5): how much of the learner's update survives the export
// of the fp32 master weights to the served copy, step by step.
//
// Per step, over every weight recorded:
//   changed_fraction     share of weights whose served value changed (bitwise) this step
//   update_realization   ‖Δserved‖ / ‖Δmaster‖ (NaN when the master did not move)
//   err_ulp              |served − master| in units of the served ulp at the served value:
//                        histogram over [0, ¼), [¼, ½), [½, 1), [1, 2), [2, ∞), mean and max
//   lag events           for each weight, the master's cumulative drift since its served value
//                        last moved (|master − anchor|, anchor = the master when it did) first
//                        exceeding half a served ulp opens an event at that step; the served value
//                        moving closes it, with lag = steps between the two (0: same step). A
//                        move before the drift got there closes nothing and restarts the drift.
// Under round-to-nearest a weight whose update per step is u ≪ ulp moves once every ulp/u steps
// and the served value lags the master by about ulp/(2u) steps after each move; stochastic
// rounding and error feedback move it in proportion, so events close sooner (docs/training.md).
//
// The served ulp of value s in a float format with m fraction bits and smallest normal
// exponent emin: 2^(max(⌊log2 |s|⌋, emin) − m) (s = 0: the subnormal spacing 2^(emin − m)).
// Weights stay in fp32 everywhere; the meter copies what it needs (4 floats + 1 int per weight).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "concord/numerics/format.h"
#include "concord/train/checkpoint.h"

namespace concord::train {

// Lags of closed events, binned [0], [1], [2, 4), [4, 8), ..., [512, 1024), [1024, ∞).
struct LagSummary {
  static constexpr int kBins = 12;
  std::array<int64_t, kBins> histogram{};
  int64_t events = 0;   // closed events
  int64_t pending = 0;  // open events (drift past half an ulp, served not moved yet)
  double median = 0;    // of closed events' lags (0 when none)
  double p90 = 0;
  static int64_t bin_lo(int bin);  // 0, 1, 2, 4, ...
  nlohmann::json to_json() const;
};

struct FairCastStep {
  uint64_t step = 0;
  int64_t weights = 0;  // weights measured this step
  int64_t changed = 0;
  double changed_fraction = 0;
  double master_update_norm = 0, served_update_norm = 0;
  double update_realization = 0;
  std::array<int64_t, 5> err_ulp_histogram{};
  double err_ulp_mean = 0, err_ulp_max = 0;
  int64_t lag_events_closed = 0;  // this step
  LagSummary lag;                 // cumulative over all steps so far
  nlohmann::json to_json() const;
};

// The served ulp at s (see above); f must be a float format (InputError otherwise).
double served_ulp(numerics::Format f, float s);

class FairCastMeter {
 public:
  // served: the served copy's element format (bf16, or the sampler's weight format).
  explicit FairCastMeter(numerics::Format served);

  // One step: begin_step(step), record() each tensor's master and served values after the
  // step's export, end_step() for the step's metrics. The first record of a tensor only sets
  // its starting point; its size must stay the same afterwards. Steps must increase.
  void begin_step(uint64_t step);
  void record(int tensor, std::span<const float> master, std::span<const float> served);
  FairCastStep end_step();
  LagSummary lag() const;

  // Checkpoints. state_tensors: per recorded tensor i, "<prefix>.<i>.master", ".served",
  // ".anchor" and ".opened" (the step an open event started, as a float; -1: none); state_json:
  // the step, the closed-event count and the lag counts. restore() replaces the meter's state
  // with them (between steps), so that the next step measures as if the meter had never stopped;
  // InputError naming the tensor when they do not fit together.
  std::vector<NamedTensor> state_tensors(std::string_view prefix) const;
  nlohmann::json state_json() const;
  void restore(std::span<const NamedTensor> tensors, std::string_view prefix, const nlohmann::json& state);

 private:
  struct Tensor {
    std::vector<float> master, served, anchor;
    std::vector<int32_t> opened;  // step the open event started, or -1 (steps < 2^24: checkpoints store floats)
  };
  numerics::Format format_;
  std::vector<Tensor> tensors_;
  // Closed events by lag: lag_counts_[l] events closed after l steps (lags are bounded by the
  // steps run, so this stays small while events number in the millions).
  std::vector<int64_t> lag_counts_;
  int64_t lag_events_ = 0;
  // accumulators of the current step
  uint64_t current_step_ = 0;
  bool step_open_ = false;
  int64_t weights_ = 0, changed_ = 0, closed_ = 0;
  double dm2_ = 0, ds2_ = 0, err_sum_ = 0, err_max_ = 0;
  std::array<int64_t, 5> err_hist_{};
};

}  // namespace concord::train
