// The depth of each training step of a depth-recurrent model (docs/recurrence.md): Huginn's
// randomized depth, or a fixed depth as the baseline at equal compute.
//
// randomized:  r = 1 + Poisson(λ),  λ ~ LogNormal(ln r̄ − σ²/2, σ)
//   so E[λ] = r̄, E[r] = 1 + r̄, Var[r] = r̄ + r̄² (e^{σ²} − 1)
//   (law of total variance: E[Var(r | λ)] = E[λ], Var(E[r | λ]) = Var(λ)).
// fixed:       r = `fixed` every step (1 + r̄ by default: the randomized sampler's mean depth).
//
// The depth of step s is a function of (seed, s) alone (one Philox block per step), so a resumed
// run draws the depths the uninterrupted run drew. λ is capped at 700 (e^{−λ} stays a normal
// double; with σ = 0.5 a λ that large needs r̄ > 100 or a 10σ draw).
#pragma once

#include <cstdint>
#include <string>

namespace concord::train {

struct DepthSampler {
  std::string kind = "randomized";  // or "fixed"
  double mean = 4;                  // r̄
  double sigma = 0.5;               // σ of the log-normal
  int64_t fixed = 0;                // the fixed depth (0: round(1 + r̄))
  int64_t backprop = 0;             // gradient through the last k iterations (0: all of them)

  // Throws InputError naming `source` on a bad kind or value.
  void validate(const std::string& source) const;
  int64_t at(uint64_t seed, int64_t step) const;
  double expected_depth() const;  // E[r]
  double depth_variance() const;  // Var[r]
};

// One draw of Poisson(λ) by inversion of its CDF at u in (0, 1), in double (λ in [0, 700]).
int64_t poisson_inverse(double lambda, double u);

}  // namespace concord::train
