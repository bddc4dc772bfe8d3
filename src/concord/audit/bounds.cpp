// One position's divergence between two logit rows (three vectorized passes, fixed summation
// order) and the guarantees a bound on their oscillation implies (proofs: docs/contracts.md).
//
// Passes over the vocabulary, Δ = z_A − z_B in double (rounding error tracked exactly):
//   1. max/min Δ, top-2 of z_A with its lowest-index argmax, argmax z_B, finiteness.
//   2. S_A = Σ e^(z_A − max z_A) and the log-partition gap c = log Z_A − log Z_B, taken as
//      c = s − log1p(E_A[e^−(Δ−s)] − 1) with s = Δ at the reference's top token: the expm1 form
//      keeps c accurate to the spread of Δ around s, where log S_A − log S_B would lose it.
//   3. (reusing pass 2's e^(z_A − max z_A), kept in a per-thread scratch row)
//      with r = Δ − c = log p_A − log p_B: TV = ½ Σ p_A |e^−r − 1|, KL = Σ p_A ψ(−r),
//      KL_rev = Σ p_B ψ(r), ψ(x) = e^x − 1 − x ≥ 0. These forms sum non-negative terms (no
//      cancellation) and an error δ common to every r moves KL only by ψ(−δ) ≈ δ²/2.
//      Where |r| > 0.34 the terms are written with p_B directly (p_B − p_A + p_A r, ...).
// When osc ≤ 0.34 every |Δ − s| and |r| is ≤ osc, so only the Taylor path runs (the common
// case for kernels in contract). Each sum has 8 lanes (lane j takes indices ≡ j mod 8) summed
// per block of 1024 entries, blocks in order, lanes in a fixed tree: the result is the same on
// every ISA and never depends on threads. No FMA (contraction is off project-wide), so the
// generic, AVX2 and AVX-512 builds of the kernel are bit-identical.
#include "concord/audit/bounds.h"

#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "concord/audit/bounds_simd.h"
#include "concord/numerics/check.h"
#include "concord/numerics/convert.h"

namespace concord::audit {
namespace {

// One build of each kernel per ISA (GCC target attributes; the helpers of bounds_simd.h are
// always inlined into them). Nothing is fused or reordered differently between ISAs.
#define CONCORD_AUDIT_KERNELS(suffix, width, target_attribute)                                   \
  template <class T>                                                                             \
  target_attribute Scan scan_##suffix(const T* ref, const T* cand, size_t n) {                   \
    return scan_row<width>(ref, cand, n);                                                        \
  }                                                                                              \
  template <class T>                                                                             \
  target_attribute Sums sums_##suffix(const T* ref, const T* cand, size_t n, const Scan& s,      \
                                      double osc, double shift, double cand_gap, double* exps) { \
    return sums<width>(ref, cand, n, s, osc, shift, cand_gap, exps);                             \
  }                                                                                              \
  target_attribute void exp_##suffix(const double* x, double* out, size_t n) {                   \
    exp_arrays<width>(x, out, n);                                                                \
  }                                                                                              \
  target_attribute void psi_##suffix(const double* t, double* pos, double* neg, size_t n) {      \
    psi_arrays<width>(t, pos, neg, n);                                                           \
  }

CONCORD_AUDIT_KERNELS(generic, 2, )
CONCORD_AUDIT_KERNELS(avx2, 4, __attribute__((target("avx2"))))
CONCORD_AUDIT_KERNELS(avx512, 8, __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))))

enum class Kernel { generic, avx2, avx512 };

Kernel active_kernel() {
  switch (numerics::active_isa()) {
    case numerics::Isa::avx512: return Kernel::avx512;
    case numerics::Isa::avx2:
    case numerics::Isa::wide16: return Kernel::avx2;
    case numerics::Isa::generic: break;
  }
  return Kernel::generic;
}

template <class T>
Scan dispatch_scan(const T* ref, const T* cand, size_t n) {
  switch (active_kernel()) {
    case Kernel::avx512: return scan_avx512(ref, cand, n);
    case Kernel::avx2: return scan_avx2(ref, cand, n);
    case Kernel::generic: break;
  }
  return scan_generic(ref, cand, n);
}

// exps: scratch for pass 2's exponentials, reused across calls on the same thread.
template <class T>
Sums dispatch_sums(const T* ref, const T* cand, size_t n, const Scan& s, double osc, double shift,
                   double cand_gap) {
  thread_local std::vector<double> scratch;
  scratch.resize(std::max(scratch.size(), (n + kLanes - 1) / kLanes * kLanes));
  double* exps = scratch.data();
  switch (active_kernel()) {
    case Kernel::avx512: return sums_avx512(ref, cand, n, s, osc, shift, cand_gap, exps);
    case Kernel::avx2: return sums_avx2(ref, cand, n, s, osc, shift, cand_gap, exps);
    case Kernel::generic: break;
  }
  return sums_generic(ref, cand, n, s, osc, shift, cand_gap, exps);
}

void check_eps(const char* what, double eps) {
  if (!(eps >= 0)) {
    throw InputError(fmt::format("[audit] {}: the bound eps must be >= 0 (got {})", what, eps));
  }
}

template <class T>
RowDivergence row_divergence_impl(std::span<const T> ref, std::span<const T> cand, int32_t token) {
  if (ref.size() != cand.size()) {
    throw InputError(fmt::format(
        "[audit] row_divergence: the reference row has {} logits but the candidate row {} "
        "(both must cover the same vocabulary)",
        ref.size(), cand.size()));
  }
  const size_t n = ref.size();
  if (n == 0) throw InputError("[audit] row_divergence: empty logit rows (need >= 1 logit)");
  if (n > static_cast<size_t>(INT32_MAX)) {
    throw InputError(
        fmt::format("[audit] row_divergence: {} logits per row exceed the "
                    "supported vocabulary of 2^31 - 1",
                    n));
  }
  if (token < -1 || (token >= 0 && static_cast<size_t>(token) >= n)) {
    throw InputError(fmt::format(
        "[audit] row_divergence: token {} is outside the vocabulary [0, {}) (-1: no token)", token,
        n));
  }
  const Scan scan = dispatch_scan(ref.data(), cand.data(), n);
  if (!scan.finite) {
    for (size_t i = 0; i < n; ++i) {
      for (const auto& [row, name] : {std::pair{ref, "reference"}, std::pair{cand, "candidate"}}) {
        if (!std::isfinite(static_cast<double>(row[i]))) {
          throw InputError(fmt::format(
              "[audit] row_divergence: the {} row holds {} at logit {} (logits must be finite)",
              name, static_cast<double>(row[i]), i));
        }
      }
    }
  }
  // d + e = z_A − z_B exactly per entry, |e| ≤ diff_error: the exact oscillation is at most
  // (diff_max − diff_min) + 2 diff_error (0 for fp32 rows of comparable magnitude).
  const double osc = (scan.diff_max - scan.diff_min) + 2 * scan.diff_error;
  // A finite osc keeps every difference passes 2 and 3 form finite: max z_A − max z_B lies in
  // [min Δ, max Δ], and max z_B − z_B[top_ref] in [0, osc].
  if (!std::isfinite(osc)) {
    throw InputError(
        "[audit] row_divergence: the logit differences overflow double (|logits| near "
        "1.8e308); rescale the rows");
  }
  RowDivergence out;
  out.osc = osc;
  out.linf = std::fmax(std::fabs(scan.diff_max), std::fabs(scan.diff_min));
  out.top_ref = static_cast<int32_t>(scan.top_ref);
  out.top_cand = static_cast<int32_t>(scan.top_cand);
  out.margin_ref = n == 1 ? kInf : scan.top1 - scan.top2;
  out.flip = out.top_ref != out.top_cand;
  out.flip_possible = !greedy_stable(out.margin_ref, osc);

  const auto at = [](std::span<const T> row, size_t i) { return static_cast<double>(row[i]); };
  const size_t top = static_cast<size_t>(scan.top_ref);
  const double shift = at(ref, top) - at(cand, top);
  const double cand_gap = scan.cand_max - at(cand, top);
  const Sums s = dispatch_sums(ref.data(), cand.data(), n, scan, osc, shift, cand_gap);
  out.tv = 0.5 * s.pass3.tv2;
  out.kl = s.pass3.kl;
  out.kl_reverse = s.pass3.kl_reverse;
  // |log p_A − log p_B| = |Δ − c| is largest at an extreme of Δ.
  out.max_abs_dlogp = std::fmax((scan.diff_max - shift) - s.gap, s.gap - (scan.diff_min - shift));

  if (token >= 0) {
    const size_t y = static_cast<size_t>(token);
    const double x_a = at(ref, y) - scan.top1;
    const double r = ((at(ref, y) - at(cand, y)) - shift) - s.gap;
    const double log_sum = std::log(s.ref_sum);
    const double p_a = std::exp(x_a) / s.ref_sum;
    out.token = token;
    out.dlogp_token = r;
    out.logp_ref_token = x_a - log_sum;
    // p_A − p_B = −p_A (e^−r − 1); for large |r| directly (e^−r may overflow).
    out.dp_token = std::fabs(r) <= 1 ? -p_a * std::expm1(-r) : p_a - std::exp(x_a - r) / s.ref_sum;
  }
  return out;
}

}  // namespace

RowDivergence row_divergence(std::span<const float> ref, std::span<const float> cand,
                             int32_t token) {
  return row_divergence_impl(ref, cand, token);
}

RowDivergence row_divergence(std::span<const double> ref, std::span<const double> cand,
                             int32_t token) {
  return row_divergence_impl(ref, cand, token);
}

double tv_bound(double eps) {
  check_eps("tv_bound", eps);
  return std::tanh(eps / 4);
}

double kl_bound(double eps) {
  check_eps("kl_bound", eps);
  return std::fmin(eps * eps / 8, eps * std::tanh(eps / 4));
}

double logp_bound(double eps) {
  check_eps("logp_bound", eps);
  return eps;
}

std::pair<double, double> ratio_bounds(double eps) {
  check_eps("ratio_bounds", eps);
  return {std::exp(-eps), std::exp(eps)};
}

// margin > eps·(1 + 2^-40) + DBL_MIN: the relative slack covers the few roundings in the
// computed margin and osc (each ≤ 2^-53 relative, the inexact differences being counted into
// osc), DBL_MIN the absolute rounding of a subnormal product. A NaN margin is never stable.
bool greedy_stable(double margin_ref, double eps) {
  check_eps("greedy_stable", eps);
  return margin_ref > eps * (1 + 0x1p-40) + DBL_MIN;
}

double sequence_tv_bound(std::span<const double> eps) {
  // 1 − Π(1 − tanh(ε_t/4)) = −expm1(Σ log1p(−tanh(ε_t/4))): no cancellation for small ε.
  double log_stay = 0;
  for (const double e : eps) {
    check_eps("sequence_tv_bound", e);
    log_stay += std::log1p(-std::tanh(e / 4));
  }
  const double tv = -std::expm1(log_stay);
  return std::fmin(1.0, std::fmax(0.0, tv));
}

double reward_drift_bound(double r_min, double r_max, double sequence_tv) {
  if (!(std::isfinite(r_min) && std::isfinite(r_max) && r_min <= r_max)) {
    throw InputError(fmt::format(
        "[audit] reward_drift_bound: the reward range [{}, {}] must be finite with r_min <= r_max",
        r_min, r_max));
  }
  if (!(sequence_tv >= 0 && sequence_tv <= 1)) {
    throw InputError(fmt::format(
        "[audit] reward_drift_bound: a total variation lies in [0, 1] (got {})", sequence_tv));
  }
  return (r_max - r_min) * sequence_tv;
}

double policy_gradient_bias_bound(double g_max, double sequence_tv) {
  if (!(g_max >= 0)) {
    throw InputError(fmt::format(
        "[audit] policy_gradient_bias_bound: g_max = sup |R grad log p| must be >= 0 (got {})",
        g_max));
  }
  if (!(sequence_tv >= 0 && sequence_tv <= 1)) {
    throw InputError(
        fmt::format("[audit] policy_gradient_bias_bound: a total variation lies in [0, 1] (got {})",
                    sequence_tv));
  }
  return 2 * g_max * sequence_tv;
}

double tis_safe_truncation(double eps) {
  check_eps("tis_safe_truncation", eps);
  return std::exp(eps);
}

void vector_exp(std::span<const double> x, std::span<double> out) {
  if (x.size() != out.size()) {
    throw InputError(
        fmt::format("[audit] vector_exp: {} arguments but {} outputs", x.size(), out.size()));
  }
  switch (active_kernel()) {
    case Kernel::avx512: return exp_avx512(x.data(), out.data(), x.size());
    case Kernel::avx2: return exp_avx2(x.data(), out.data(), x.size());
    case Kernel::generic: break;
  }
  exp_generic(x.data(), out.data(), x.size());
}

void vector_exp_psi(std::span<const double> t, std::span<double> psi_pos,
                    std::span<double> psi_neg) {
  if (t.size() != psi_pos.size() || t.size() != psi_neg.size()) {
    throw InputError(fmt::format("[audit] vector_exp_psi: {} arguments but {} and {} outputs",
                                 t.size(), psi_pos.size(), psi_neg.size()));
  }
  switch (active_kernel()) {
    case Kernel::avx512: return psi_avx512(t.data(), psi_pos.data(), psi_neg.data(), t.size());
    case Kernel::avx2: return psi_avx2(t.data(), psi_pos.data(), psi_neg.data(), t.size());
    case Kernel::generic: break;
  }
  psi_generic(t.data(), psi_pos.data(), psi_neg.data(), t.size());
}

}  // namespace concord::audit
