// The gradient flow of a concord transformer against its real training runs (issue 20,
// docs/flow.md): the population loss of a model as a function of one flat parameter vector, the
// flow of it integrated by the adaptive solver (flow.h), and the runs to compare — gradient
// descent, SGD and AdamW (train/optimizer.h, the trainer's own) with fp32 or bf16 served weights
// under the Fair Cast export rules (train/export.h) — from the same start.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "concord/model/model.h"
#include "concord/numerics/format.h"
#include "concord/train/data.h"
#include "concord/train/flow.h"

namespace concord::train::flow {

// L(θ) = the mean cross-entropy over every target of `population` (one batch of S sequences),
// θ the model's parameters in params() order, flattened. The model must hold fp32 values (no
// stored weights); its precision policy is the one the losses and gradients are computed under
// (fp32 for the flow).
class ModelLoss {
 public:
  ModelLoss(model::Model& m, Batch population);

  int64_t size() const { return size_; }
  int64_t sequences() const { return population_.B; }
  const std::vector<model::ParamSpec>& params() const { return model_.params(); }
  // params()[p] occupies [offsets()[p], offsets()[p] + numel).
  const std::vector<int64_t>& offsets() const { return offsets_; }
  // The model's current parameters.
  Vec values() const;
  // Writes θ into the model (rounded to fp32).
  void set(std::span<const double> theta);
  double loss(std::span<const double> theta);
  // L and ∇L at θ (g has size()).
  double gradient(std::span<const double> theta, std::span<double> g);
  // The mean cross-entropy and its gradient over the population sequences `rows` (repeats
  // allowed: SGD's minibatch), at θ.
  double batch_gradient(std::span<const int64_t> rows, std::span<const double> theta, std::span<double> g);
  // The logits (B·T·V) of `probe` at θ: the function-space distance compares them.
  std::vector<float> logits(std::span<const double> theta, const Batch& probe);
  // Forward-backward passes so far (each over the batch it was given).
  int64_t evaluations() const { return evaluations_; }

 private:
  double run(const Batch& batch, std::span<double> g);
  model::Model& model_;
  Batch population_;
  std::vector<int64_t> offsets_;
  int64_t size_ = 0;
  int64_t evaluations_ = 0;
};

// One real run from θ0.
struct ModelRunOptions {
  std::string optimizer = "gd";  // gd | sgd | adamw
  double lr = 0.1;
  int64_t batch = 1;             // sgd: sequences per step, drawn with replacement (sgd_batch)
  numerics::Format served = numerics::Format::f32;  // the served copy's format
  std::string rule = "rne";      // rne | sr | ef (export.h); for f32 every rule is a copy
  uint64_t seed = 1;             // keys sr and the SGD batches
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw (no weight decay, no clipping)
};
struct ModelRun {
  std::vector<int64_t> steps;       // the recorded steps
  std::vector<Vec> served;          // the served copy (what the gradient was taken at) at each
  std::vector<double> loss;         // L(served) at each
  std::vector<int64_t> first_move;  // per parameter element: the first step its served value changed (−1: never)
  std::vector<int64_t> changes;     // per parameter element: the steps at which its served value changed
};
// `steps` steps of the run: fp32 master m (from θ0), served copy s = export(m) each step, the
// gradient of L (gd, adamw) or of the minibatch (sgd) taken at s, the update applied to m.
// Records at `record` (ascending, ≤ steps; 0 is the start). InputError for an unknown optimizer
// or rule, a bad lr or batch.
ModelRun run_model(ModelLoss& loss, std::span<const double> theta0, const ModelRunOptions& options, int64_t steps,
                   std::span<const int64_t> record);

// The nonlinear flow of `loss` from θ0 at each of `times`, by Dormand–Prince (flow.h).
std::vector<Vec> model_flow(ModelLoss& loss, std::span<const double> theta0, std::span<const double> times,
                            const OdeOptions& options = {}, OdeStats* stats = nullptr);

// The largest Hessian eigenvalue of `loss` at θ, the sharpness compared with 2/η
// (largest_eigenvalue on central-difference Hessian-vector products of the gradient, step eps).
PowerResult model_sharpness(ModelLoss& loss, std::span<const double> theta, uint64_t seed, int max_iterations = 50,
                            double tol = 1e-4, double eps = 1e-3);

}  // namespace concord::train::flow
