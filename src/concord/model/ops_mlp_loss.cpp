// SwiGLU, log-softmax and cross-entropy, forward and backward (see ops.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "concord/model/ops.h"
#include "concord/numerics/exp.h"

namespace concord::model {
namespace {

void check_rows(const char* op, int64_t T, int64_t V) {
  if (T < 0 || V <= 0) {
    throw InputError(std::string("[") + op + "] needs T >= 0 rows of V > 0 columns, got T=" +
                     std::to_string(T) + ", V=" + std::to_string(V));
  }
}

void check_targets(const char* op, const int32_t* targets, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; ++t) {
    if (targets[t] >= V) {
      throw InputError(std::string("[") + op + "] target " + std::to_string(targets[t]) +
                       " at row " + std::to_string(t) + " is outside the vocabulary [0, " +
                       std::to_string(V) + "); use a negative target to ignore a row");
    }
  }
}

template <class F>
F row_max(const F* x, int64_t V) {
  F m = x[0];
  for (int64_t v = 1; v < V; ++v) m = std::max(m, x[v]);
  return m;
}

// Σ_v exp(x_v − m): exp in F (m is the row max, so no term overflows), the sum in double in
// column order. If e is not null it receives the terms exp(x_v − m).
template <class F>
double row_sum_exp(const F* x, int64_t V, F m, F* e) {
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    const F ev = std::exp(x[v] - m);
    if (e != nullptr) e[v] = ev;
    sum += static_cast<double>(ev);
  }
  return sum;
}

// log Σ_v exp(x_v), in double.
template <class F>
double row_log_sum_exp(const F* x, int64_t V) {
  const F m = row_max(x, V);
  return static_cast<double>(m) + std::log(row_sum_exp<F>(x, V, m, nullptr));
}

}  // namespace

template <class F>
void swiglu_forward(F* out, const F* gate, const F* up, int64_t T, int64_t Fdim) {
  check_rows("swiglu_forward", T, Fdim);
#pragma omp parallel for schedule(static) if (T * Fdim >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t) {
    if constexpr (std::is_same_v<F, float>) {
      // exp(-g) eight at a time with std::exp's bits (numerics/exp.h; -g - 0 is -g), in a row of
      // its own (out may be gate or up).
      thread_local std::vector<float> e;
      e.resize(static_cast<size_t>(Fdim));
      const float* g = gate + t * Fdim;
      for (int64_t i = 0; i < Fdim; ++i) e[i] = -g[i];
      numerics::exp_shifted(e.data(), Fdim, 0.0f);
      for (int64_t i = 0; i < Fdim; ++i) out[t * Fdim + i] = g[i] / (F(1) + e[i]) * up[t * Fdim + i];
    } else {
      for (int64_t i = t * Fdim; i < (t + 1) * Fdim; ++i) {
        const F g = gate[i];
        out[i] = g / (F(1) + std::exp(-g)) * up[i];
      }
    }
  }
}

template <class F>
void swiglu_backward(F* dgate, F* dup, const F* dout, const F* gate, const F* up, int64_t T,
                     int64_t Fdim) {
  check_rows("swiglu_backward", T, Fdim);
  // silu'(g) = σ(g) · (1 + g · (1 − σ(g))), σ(g) = 1 / (1 + exp(−g)).
#pragma omp parallel for schedule(static) if (T * Fdim >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = t * Fdim; i < (t + 1) * Fdim; ++i) {
      const F g = gate[i];
      const F denom = F(1) + std::exp(-g);
      const F sigmoid = F(1) / denom;
      const F silu = g / denom;
      dup[i] = dout[i] * silu;
      dgate[i] = dout[i] * up[i] * (sigmoid * (F(1) + g * (F(1) - sigmoid)));
    }
  }
}

template <class F>
void log_softmax_forward(F* out, const F* logits, int64_t T, int64_t V) {
  check_rows("log_softmax_forward", T, V);
#pragma omp parallel for schedule(static) if (T * V >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t) {
    const F* x = logits + t * V;
    F* o = out + t * V;
    const double lse = row_log_sum_exp<F>(x, V);
    for (int64_t v = 0; v < V; ++v) o[v] = static_cast<F>(static_cast<double>(x[v]) - lse);
  }
}

template <class F>
void log_softmax_backward(F* dlogits, const F* dout, const F* out, int64_t T, int64_t V) {
  check_rows("log_softmax_backward", T, V);
  // d/dx_v Σ_u dout_u (x_u − lse) = dout_v − softmax_v · Σ_u dout_u; softmax = exp(log-probs).
#pragma omp parallel for schedule(static) if (T * V >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t) {
    const F* dy = dout + t * V;
    const F* y = out + t * V;
    F* dx = dlogits + t * V;
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += static_cast<double>(dy[v]);
    for (int64_t v = 0; v < V; ++v) {
      dx[v] = static_cast<F>(static_cast<double>(dy[v]) -
                             static_cast<double>(std::exp(y[v])) * sum);
    }
  }
}

template <class F>
double cross_entropy_forward(F* losses, const F* logits, const int32_t* targets, int64_t T,
                             int64_t V) {
  check_rows("cross_entropy_forward", T, V);
  check_targets("cross_entropy_forward", targets, T, V);
  std::vector<double> row_loss(static_cast<size_t>(T), 0.0);
#pragma omp parallel for schedule(static) if (T * V >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t) {
    if (targets[t] < 0) continue;
    const F* x = logits + t * V;
    row_loss[static_cast<size_t>(t)] = row_log_sum_exp<F>(x, V) - x[targets[t]];
  }
  // The total in ascending t, in double: independent of the thread count.
  double total = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    total += row_loss[static_cast<size_t>(t)];
    if (losses != nullptr) losses[t] = static_cast<F>(row_loss[static_cast<size_t>(t)]);
  }
  return total;
}

// One row of the cross-entropy gradient, scale·(softmax(x) − onehot(target)); a row whose
// target is ignored (< 0) gets zeros. d holds exp(x − max) first; softmax = that / Σ, formed in
// double and rounded once.
template <class F>
static void cross_entropy_backward_row(F* d, const F* x, int32_t target, int64_t V, double scale) {
  if (target < 0) {
    std::fill(d, d + V, F(0));
    return;
  }
  const double inv_sum = 1.0 / row_sum_exp<F>(x, V, row_max(x, V), d);
  const double p_target = static_cast<double>(d[target]) * inv_sum;
  for (int64_t v = 0; v < V; ++v) {
    d[v] = static_cast<F>(scale * (static_cast<double>(d[v]) * inv_sum));
  }
  d[target] = static_cast<F>(scale * (p_target - 1.0));
}

template <class F>
void cross_entropy_backward(F* dlogits, const F* logits, const int32_t* targets, int64_t T,
                            int64_t V, double scale) {
  check_rows("cross_entropy_backward", T, V);
  check_targets("cross_entropy_backward", targets, T, V);
#pragma omp parallel for schedule(static) if (T * V >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t)
    cross_entropy_backward_row(dlogits + t * V, logits + t * V, targets[t], V, scale);
}

template <class F>
void cross_entropy_backward_rows(F* dlogits, const F* logits, const int32_t* targets, int64_t T,
                                 int64_t V, const double* row_scale) {
  check_rows("cross_entropy_backward_rows", T, V);
  check_targets("cross_entropy_backward_rows", targets, T, V);
#pragma omp parallel for schedule(static) if (T * V >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t)
    cross_entropy_backward_row(dlogits + t * V, logits + t * V, targets[t], V, row_scale[t]);
}

#define CONCORD_INSTANTIATE(F)                                                                 \
  template void swiglu_forward<F>(F*, const F*, const F*, int64_t, int64_t);                  \
  template void swiglu_backward<F>(F*, F*, const F*, const F*, const F*, int64_t, int64_t);   \
  template void log_softmax_forward<F>(F*, const F*, int64_t, int64_t);                       \
  template void log_softmax_backward<F>(F*, const F*, const F*, int64_t, int64_t);            \
  template double cross_entropy_forward<F>(F*, const F*, const int32_t*, int64_t, int64_t);   \
  template void cross_entropy_backward<F>(F*, const F*, const int32_t*, int64_t, int64_t,     \
                                          double);                                            \
  template void cross_entropy_backward_rows<F>(F*, const F*, const int32_t*, int64_t, int64_t, \
                                               const double*);
CONCORD_INSTANTIATE(float)
CONCORD_INSTANTIATE(double)
#undef CONCORD_INSTANTIATE

}  // namespace concord::model
