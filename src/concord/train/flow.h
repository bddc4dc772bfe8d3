// Population gradient flow θ̇ = −∇L(θ) and the real trajectories that depart from it (issue 20,
// docs/flow.md): finite step size, finite batches, low-precision served weights.
//
// This part holds what every comparison needs, in fp64 and sharing no code with the trainer:
//   - an adaptive ODE solver (Dormand–Prince 5(4) with error control) for the flow of any loss;
//   - a symmetric eigensolver (cyclic Jacobi) for closed forms and sharpness checks;
//   - least squares, where everything is exact: the flow in closed form, gradient descent, SGD
//     with its exact first two moments and their small-η diffusion limit, and gradient descent
//     on a served copy under an export rule (rne / sr / ef, train/export.h) whose stalls are
//     predicted from the ulp-to-update ratio;
//   - Hessian-vector products by central differences of a gradient, and the top Hessian
//     eigenvalue (sharpness) by power iteration on them.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "concord/numerics/format.h"

namespace concord::train::flow {

using Vec = std::vector<double>;

// ---- ODE integration ----------------------------------------------------------------------

// dy/dt = f(t, y): writes f into dy (dy.size() == y.size()).
using OdeRhs = std::function<void(double t, std::span<const double> y, std::span<double> dy)>;

struct OdeOptions {
  double rtol = 1e-9;           // per component: a step's error must be ≤ atol + rtol·|y|
  double atol = 1e-12;
  double initial_step = 0;      // 0: chosen from the derivative's scale (Hairer, Nørsett, Wanner II.4)
  int64_t max_steps = 10'000'000;
};
struct OdeStats {
  int64_t accepted = 0, rejected = 0, evaluations = 0;
};

// Dormand–Prince 5(4) (the pair of MATLAB's ode45 and SciPy's RK45): the 5th-order solution is
// propagated, the embedded 4th-order one estimates the error, and a step is accepted when the
// RMS over components of error / (atol + rtol·max(|y_old|, |y_new|)) is ≤ 1; the next step is
// h·clamp(0.9·err^(−1/5), 0.2, 5). Steps end exactly on each of `times` (ascending, ≥ t0).
// Returns y at each time. InputError for unsorted times or a step budget exhausted; a non-finite
// derivative is an error (the flow diverged), not a silent NaN.
std::vector<Vec> integrate(const OdeRhs& f, double t0, Vec y0, std::span<const double> times,
                           const OdeOptions& options = {}, OdeStats* stats = nullptr);

// ---- linear algebra -------------------------------------------------------------------------

// A symmetric matrix's eigendecomposition: values ascending, vectors[i * d + j] = component i of
// eigenvector j (so A = V diag(values) Vᵀ).
struct SymmetricEigen {
  int64_t d = 0;
  Vec values;
  Vec vectors;
};
// Cyclic Jacobi rotations until the off-diagonal mass is below 1e-15 of the matrix's norm;
// `a` is d×d row-major and must be symmetric (InputError otherwise).
SymmetricEigen symmetric_eigen(std::span<const double> a, int64_t d);

// A standard normal from Philox (seed, stream, index) by Box–Muller: reproducible anywhere.
double philox_normal(uint64_t seed, uint32_t stream, uint64_t index);

// ---- least squares --------------------------------------------------------------------------

// L(θ) = (1/2n) Σ_i (x_iᵀθ − y_i)² over a fixed finite "population" of n rows. Its gradient is
// Hθ − b (H = XᵀX/n, b = Xᵀy/n); per row g_i(θ) = x_i(x_iᵀθ − y_i).
struct LeastSquares {
  int64_t n = 0, d = 0;
  Vec x;  // n × d, row-major
  Vec y;  // n

  // Rows x_ij = s_j·N(0,1) with s_j spaced geometrically from 1 down to 1/sqrt(condition) (so
  // the Hessian's condition number is about `condition`), y = x·θ_true + noise·N(0,1), θ_true
  // ~ N(0,1); all from Philox keyed by `seed`.
  static LeastSquares random(int64_t n, int64_t d, double condition, double noise, uint64_t seed);

  double loss(std::span<const double> theta) const;
  void gradient(std::span<const double> theta, std::span<double> g) const;
  // The mean of g_i over `rows` (a minibatch, repeats allowed).
  void batch_gradient(std::span<const int64_t> rows, std::span<const double> theta, std::span<double> g) const;
  Vec hessian() const;  // d × d
  Vec b() const;
  // The per-row gradients' covariance at θ: (1/n) Σ g_i g_iᵀ − ḡḡᵀ (d × d).
  Vec noise_covariance(std::span<const double> theta) const;
};

// The flow of a least-squares loss in closed form: θ(t) = θ* + V e^(−tΛ) Vᵀ (θ₀ − θ*).
class LeastSquaresFlow {
 public:
  explicit LeastSquaresFlow(const LeastSquares& problem);
  Vec at(double t, std::span<const double> theta0) const;
  const Vec& minimizer() const { return theta_star_; }
  const SymmetricEigen& eigen() const { return eigen_; }

 private:
  SymmetricEigen eigen_;
  Vec theta_star_;
};

// Gradient descent θ ← θ − η∇L(θ) from theta0; θ after each step in `record` (ascending; 0 is
// the start).
std::vector<Vec> gradient_descent(const LeastSquares& problem, std::span<const double> theta0, double eta,
                                  std::span<const int64_t> record);

// The minibatch of SGD step k: `batch` rows drawn uniformly with replacement from Philox
// (seed, stream k), the same on every machine and thread count.
std::vector<int64_t> sgd_batch(int64_t n, int64_t batch, uint64_t seed, int64_t step);
// SGD θ ← θ − η·(mean of g_i over sgd_batch(step)); θ after each step in `record`.
std::vector<Vec> sgd(const LeastSquares& problem, std::span<const double> theta0, double eta, int64_t batch,
                     uint64_t seed, std::span<const int64_t> record);

// SGD's exact first two moments over the batch draws. The gradient is affine in θ, so they close:
// mean_{k+1} = (I − ηH) mean_k + ηb (gradient descent), and with M = I − ηH
//   Cov_{k+1} = M Cov_k M + (η²/B) [Σ(mean_k) + (1/n) Σ_i A_i Cov_k A_i − H Cov_k H],  A_i = x_i x_iᵀ.
// So E‖θ_k − θ_flow(ηk)‖² = ‖mean_k − θ_flow‖² + tr Cov_k exactly.
struct SgdMoments {
  std::vector<Vec> mean, covariance;  // at each recorded step; covariance d × d
};
SgdMoments sgd_moments(const LeastSquares& problem, std::span<const double> theta0, double eta, int64_t batch,
                       std::span<const int64_t> record);

// The small-η limit of SGD's covariance per unit η/B: Cov(t) ≈ (η/B)·C(t), where
// dC/dt = −HC − CH + Σ(θ_flow(t)), C(0) = 0 (the linear-noise / diffusion approximation),
// integrated with `integrate`. C at each of `times`.
std::vector<Vec> sgd_diffusion_covariance(const LeastSquares& problem, std::span<const double> theta0,
                                          std::span<const double> times);

// Gradient descent on a served copy: fp32 master weights m, the served copy s = export(m) under
// `rule` (rne | sr | ef into `served`, train/export.h; seed keys sr), the gradient taken at s and
// the update applied to m: m ← m − η∇L(s). Returns the served copies after each recorded step.
// `first_move[j]` (if given) receives the first step at which served coordinate j changed (−1:
// never within the run).
std::vector<Vec> served_gradient_descent(const LeastSquares& problem, std::span<const double> theta0, double eta,
                                         const std::string& rule, numerics::Format served, uint64_t seed,
                                         int64_t steps, std::span<const int64_t> record,
                                         std::vector<int64_t>* first_move = nullptr);

// A served format's ulp at x (the spacing of the representable values at |x|'s binade).
double served_ulp(numerics::Format served, double x);

// ---- curvature ------------------------------------------------------------------------------

using GradientFn = std::function<void(std::span<const double> theta, std::span<double> g)>;
using HvpFn = std::function<void(std::span<const double> v, std::span<double> out)>;

// H v ≈ (∇L(θ + εv̂) − ∇L(θ − εv̂)) / (2ε) · ‖v‖ with v̂ = v/‖v‖: error O(ε²·‖∇³L‖) from
// truncation plus O(δ/ε) from a gradient computed to precision δ.
void hvp_central(const GradientFn& gradient, std::span<const double> theta, std::span<const double> v, double eps,
                 std::span<double> out);

struct PowerResult {
  double value = 0;  // the eigenvalue of largest magnitude
  Vec vector;        // unit
  int iterations = 0;
  double residual = 0;  // ‖Hv − λv‖ at the end
};
// Power iteration on `hvp` from a Philox-seeded start until the Rayleigh quotient changes by
// less than tol·|λ| (or max_iterations).
PowerResult top_eigenvalue(const HvpFn& hvp, int64_t d, uint64_t seed, int max_iterations = 1000, double tol = 1e-10);

// The largest (most positive) eigenvalue — the sharpness of the edge-of-stability literature —
// of a possibly indefinite Hessian: power iteration finds the eigenvalue of largest magnitude
// λ₁; when λ₁ < 0 a second power iteration on H − λ₁I (whose eigenvalues are ≥ 0, largest
// λ_max − λ₁) gives λ_max. `iterations` counts both.
PowerResult largest_eigenvalue(const HvpFn& hvp, int64_t d, uint64_t seed, int max_iterations = 1000,
                               double tol = 1e-10);

// The least-squares slope of log(y) on log(x) (the order of a convergence): InputError for fewer
// than two points or a non-positive value.
double log_log_slope(std::span<const double> x, std::span<const double> y);

}  // namespace concord::train::flow
