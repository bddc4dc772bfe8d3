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
  // The population's logits (S·T·V) at θ.
  std::vector<float> population_logits(std::span<const double> theta);
  // At θ: the mean over the population rows of KL(softmax(teacher) ‖ p_θ) and its gradient
  // Jᵀ(p_θ − q)/rows (Model::forward_backward_distill) — a vector-Jacobian product.
  double distill_gradient(std::span<const double> theta, std::span<const float> teacher_logits, std::span<double> g);
  // Forward or backward passes so far.
  int64_t evaluations() const { return evaluations_; }
  // The mean cross-entropy of logits (S·T·V) against the population's targets.
  double cross_entropy(std::span<const float> logits) const;

 private:
  double run(const Batch& batch, std::span<double> g);
  model::Model& model_;
  Batch population_;
  std::vector<int64_t> offsets_;
  int64_t size_ = 0;
  int64_t evaluations_ = 0;
};

// The linearized model around θ0 (first-order Taylor): on the population, logits
// z_lin(θ) = z(θ0) + J(θ0)(θ − θ0), and L_lin(θ) = the mean cross-entropy of z_lin. J·v comes from
// central differences of the forward pass along v̂ = v/‖v‖ (step eps), times ‖v‖; Jᵀ from the backward pass: ∇L_lin(θ) = Jᵀ(softmax(z_lin) − onehot)/rows
// = ∇L(θ0) − ∇_θ KL(softmax(z_lin) ‖ p_θ)|θ0 (both backward passes at θ0; the first is cached).
class LinearizedLoss {
 public:
  // eps: the central difference's step (truncation O(eps²), fp32 rounding of the logits O(1e-7/eps)).
  LinearizedLoss(ModelLoss& loss, std::span<const double> theta0, double eps = 1e-2);
  // J(θ0)·v on the population (S·T·V), by central differences.
  std::vector<double> jvp(std::span<const double> v);
  // Jᵀ(q_a − q_b)·rows⁻¹ for two teacher logit sets (S·T·V): the backward pass's product.
  Vec vjp(std::span<const float> teacher_a, std::span<const float> teacher_b);
  double loss(std::span<const double> theta);
  double gradient(std::span<const double> theta, std::span<double> g);

 private:
  std::vector<float> logits_at(std::span<const double> theta);
  ModelLoss& loss_;
  Vec theta0_, grad0_;
  std::vector<float> z0_;
  double eps_;
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

// The linearized model's flow from θ0 at each of `times`.
std::vector<Vec> linearized_flow(LinearizedLoss& loss, std::span<const double> theta0, std::span<const double> times,
                                 const OdeOptions& options = {}, OdeStats* stats = nullptr);

// The largest Hessian eigenvalue of `loss` at θ, the sharpness compared with 2/η
// (largest_eigenvalue on central-difference Hessian-vector products of the gradient, step eps).
PowerResult model_sharpness(ModelLoss& loss, std::span<const double> theta, uint64_t seed, int max_iterations = 50,
                            double tol = 1e-4, double eps = 1e-3);

}  // namespace concord::train::flow
