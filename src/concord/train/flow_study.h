// The least-squares study of `concord flow lsq` (docs/flow.md): on one seeded problem, where the
// gradient flow predicts each real trajectory and by how much each departure moves it —
// step size (gradient descent against the flow, up to and past the edge of stability 2/λ_max),
// batch noise (SGD's exact spread and its η/B diffusion limit against Monte Carlo runs), and
// low-precision served weights (bf16 rne / sr / ef against fp32, the rne stall predicted from the
// ulp-to-update ratio). Everything here is exact or sampled with a stated error; the JSON it
// returns is what the command prints, writes and plots.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace concord::train {
struct Batch;
}
namespace concord::train::flow {

struct LeastSquaresStudyOptions {
  int64_t n = 256, d = 16;   // population rows, dimensions
  double condition = 30;     // about λ_max / λ_min of the Hessian
  double noise = 0.5;        // label noise
  uint64_t seed = 1;
  double time = 0;           // the comparison time t; 0: 1/λ_min (the slowest mode's time constant)
  // Step sizes as multiples of 1/λ_max (η·λ_max); those ≥ 2 diverge (edge of stability).
  std::vector<double> gd_steps = {2.1, 1.9, 1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125};
  std::vector<double> sgd_steps = {0.25, 0.0625};
  std::vector<int64_t> batches = {1, 4, 16, 64};
  int64_t sgd_runs = 64;          // Monte Carlo runs per (η, B)
  double precision_step = 0.01;   // η·λ_max of the served-precision runs (small updates)
  int64_t probe = 256;            // probe rows for the function-space distance
  int64_t trajectory_points = 60;
};

// Runs the study; progress(line) after each part (for a long run's stderr). InputError for
// options out of range (n < d, empty grids, a non-positive step or batch, ...).
nlohmann::ordered_json least_squares_study(const LeastSquaresStudyOptions& options,
                                           const std::function<void(const std::string&)>& progress = {});

class ModelLoss;

// The study of `concord flow model` on a concord transformer, from its current weights: the
// population `loss` (flow_model.h) and a held-out `probe` batch for the function-space distance.
// Step sizes are multiples of 1/λ_max, λ_max the sharpness (the Hessian's largest eigenvalue)
// at the start, so that 2 is the edge of stability.
struct ModelStudyOptions {
  double time = 0;  // the comparison time t; 0: 20/λ_max
  std::vector<double> gd_steps = {1.0, 0.5, 0.25, 0.125};  // η·λ_max of the GD runs
  double sgd_step = 0.25;                                  // η·λ_max of the SGD runs
  std::vector<int64_t> batches = {1, 2, 4};                // SGD sequences per step
  int64_t sgd_runs = 4;                                    // seeds per SGD batch size
  std::vector<double> adam_lrs = {1e-3, 2.5e-4};           // AdamW (no decay, no clipping)
  double precision_step = 0.25;                            // η·λ_max of the served-precision runs
  int64_t points = 20;                                     // samples along each trajectory
  double rtol = 1e-6;                                      // the flow's integration tolerance
  uint64_t seed = 1;
};
nlohmann::ordered_json model_study(ModelLoss& loss, const Batch& probe, const ModelStudyOptions& options,
                                   const std::function<void(const std::string&)>& progress = {});

}  // namespace concord::train::flow
