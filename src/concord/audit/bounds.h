// Divergence between two serving programs' logits for one position, and the guarantees that a
// bound on their difference implies (docs/contracts.md states and proves each).
//
// For logits z_A (the reference) and z_B (the candidate) over one vocabulary, Δ = z_A − z_B and
// osc = max Δ − min Δ (≤ 2‖Δ‖∞). Softmax is invariant to adding a constant, so osc — not ‖Δ‖∞ —
// is what moves the distribution. With p = softmax(z), a bound osc ≤ ε implies, for every token:
//   |log p_A(y) − log p_B(y)| ≤ ε                      (log-prob / importance-ratio bound)
//   p_A(y) / p_B(y) ∈ [e^−ε, e^ε]
//   TV(p_A, p_B) ≤ tanh(ε/4)                           (tight: a two-point distribution attains it)
//   KL(p_A‖p_B) ≤ min(ε²/8, ε·tanh(ε/4))               (both directions)
//   the reference's greedy token stays the candidate's when its top-1 margin exceeds ε
// and, over a sequence of T positions with bounds ε_t:
//   TV of the sequence distributions ≤ 1 − Π_t (1 − tanh(ε_t/4)) ≤ Σ_t tanh(ε_t/4)
//   |E_A[R] − E_B[R]| ≤ (R_max − R_min) · that sequence TV
//   the bias of a policy gradient estimated on the candidate's samples for the reference
//   (no importance correction) ≤ 2 · G · that sequence TV, G = sup |R · ∇log p|.
//
// Arithmetic: the logits' differences are taken in double (exact for fp32 inputs of comparable
// magnitude), exp/log in double with a vectorized exp accurate to a few ulp; each computed
// statistic carries a relative error far below the slack the tests allow (stated there).
#pragma once

#include <cstdint>
#include <span>
#include <utility>

namespace concord::audit {

// What one position's two rows of logits say (reference A, candidate B).
struct RowDivergence {
  double osc = 0;            // max Δ − min Δ, Δ = z_A − z_B
  double linf = 0;           // max |Δ|
  double max_abs_dlogp = 0;  // max over the vocabulary of |log p_A − log p_B|
  double tv = 0;             // ½ Σ |p_A − p_B|
  double kl = 0;             // KL(p_A ‖ p_B)
  double kl_reverse = 0;     // KL(p_B ‖ p_A)
  int32_t top_ref = 0;       // argmax z_A (lowest index on ties)
  int32_t top_cand = 0;      // argmax z_B
  double margin_ref = 0;     // z_A[top] − max_{j≠top} z_A[j] (0 on a tie; +inf for V = 1)
  bool flip = false;         // top_ref != top_cand
  bool flip_possible = false;  // the predictor: !greedy_stable(margin_ref, osc)
  // For the row's token y (the one sampled or teacher-forced; -1: none given): log p_A(y) −
  // log p_B(y), and p_A(y) − p_B(y).
  int32_t token = -1;
  double dlogp_token = 0;
  double dp_token = 0;
  double logp_ref_token = 0;  // log p_A(y)
};

// InputError (concord/numerics/check.h) when the rows differ in length, are empty, hold NaN or
// ±Inf, or the token is outside the vocabulary.
RowDivergence row_divergence(std::span<const float> ref, std::span<const float> cand,
                             int32_t token = -1);
RowDivergence row_divergence(std::span<const double> ref, std::span<const double> cand,
                             int32_t token = -1);

// The guarantees above, as functions of a bound eps on osc (eps ≥ 0).
double tv_bound(double eps);    // tanh(eps / 4)
double kl_bound(double eps);    // min(eps² / 8, eps · tanh(eps / 4))
double logp_bound(double eps);  // eps
std::pair<double, double> ratio_bounds(double eps);  // [e^−eps, e^eps]
// True when the reference's greedy token provably stays the candidate's: margin > eps, with a
// relative slack of 2^-40 against the rounding of the computed margin and osc (a margin within
// the slack of eps counts as "may flip"; the predictor never misses a flip).
bool greedy_stable(double margin_ref, double eps);
// Sequence level, from per-position bounds eps_t: 1 − Π(1 − tanh(eps_t/4)), clamped to [0, 1].
double sequence_tv_bound(std::span<const double> eps);
// |E_A[R] − E_B[R]| ≤ (r_max − r_min) · sequence_tv.
double reward_drift_bound(double r_min, double r_max, double sequence_tv);
// Bias of the uncorrected policy-gradient estimate: ≤ 2 · g_max · sequence_tv, g_max = sup of
// |R · ∇log p| (per coordinate, or any norm).
double policy_gradient_bias_bound(double g_max, double sequence_tv);
// Token-level TIS with truncation C never truncates when C ≥ e^eps (the ratio bound), so its
// estimate is then unbiased; returns that smallest safe C.
double tis_safe_truncation(double eps);

// The vectorized elementary functions row_divergence uses, on arrays (exposed for their accuracy
// tests; same ISA dispatch as row_divergence, bit-identical on every ISA). InputError when the
// spans differ in length.
//   vector_exp: out[i] = e^x[i], within 2 ulp of the correctly rounded value for x ≤ 709
//     (0 below −745.13, where e^x rounds to zero; arguments clamp to [−750, 709]).
//   vector_exp_psi: for |t| ≤ ln2/2, psi_pos[i] = e^t − 1 − t and psi_neg[i] = e^−t − 1 + t
//     at t = t[i], each to a few ulp relative (no cancellation: a Taylor polynomial in t).
void vector_exp(std::span<const double> x, std::span<double> out);
void vector_exp_psi(std::span<const double> t, std::span<double> psi_pos,
                    std::span<double> psi_neg);

}  // namespace concord::audit
