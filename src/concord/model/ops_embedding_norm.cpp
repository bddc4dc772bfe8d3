// Token embedding and RMSNorm, forward and backward (see ops.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "concord/model/ops.h"

namespace concord::model {
namespace {

void check_tokens(const char* op, const int32_t* tokens, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= V) {
      throw InputError(std::string("[") + op + "] token " + std::to_string(tokens[t]) +
                       " at row " + std::to_string(t) + " is outside the vocabulary [0, " +
                       std::to_string(V) + "); check the tokenizer matches the model's vocab_size");
    }
  }
}

void check_shape(const char* op, int64_t T, int64_t C) {
  if (T < 0 || C <= 0) {
    throw InputError(std::string("[") + op + "] needs T >= 0 rows and C > 0 columns, got T=" +
                     std::to_string(T) + ", C=" + std::to_string(C));
  }
}

// Σ_c a_c·b_c·w_c (w optional) in double, in a fixed order: 4 interleaved partial sums (lane l
// takes c ≡ l mod 4) combined pairwise. The order depends only on n; the independent lanes keep
// the loop from waiting on one chain of double additions.
template <class F>
double sum_of_products(const F* a, const F* b, const F* w, int64_t n) {
  double lane[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t c = 0;
  for (; c + 4 <= n; c += 4) {
    for (int64_t l = 0; l < 4; ++l) {
      const double weight = w != nullptr ? static_cast<double>(w[c + l]) : 1.0;
      lane[l] += weight * a[c + l] * b[c + l];
    }
  }
  for (int64_t l = 0; c + l < n; ++l) {
    const double weight = w != nullptr ? static_cast<double>(w[c + l]) : 1.0;
    lane[l] += weight * a[c + l] * b[c + l];
  }
  return (lane[0] + lane[2]) + (lane[1] + lane[3]);
}

// Columns per task of rmsnorm's dw: each task owns a column block and adds the rows in order.
constexpr int64_t kColumnBlock = 64;

}  // namespace

template <class F>
void embedding_forward(F* out, const int32_t* tokens, const F* table, int64_t T, int64_t V,
                       int64_t C) {
  check_shape("embedding_forward", T, C);
  check_tokens("embedding_forward", tokens, T, V);
#pragma omp parallel for schedule(static) if (T * C >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(out + t * C, table + static_cast<int64_t>(tokens[t]) * C,
                static_cast<size_t>(C) * sizeof(F));
  }
}

template <class F>
void embedding_backward(F* dtable, const F* dout, const int32_t* tokens, int64_t T, int64_t V,
                        int64_t C) {
  check_shape("embedding_backward", T, C);
  check_tokens("embedding_backward", tokens, T, V);
  // Parallel over the distinct tokens: rows are grouped by token with a stable sort, so each
  // dtable row receives its dout rows in ascending t whatever the thread count.
  std::vector<int64_t> order(static_cast<size_t>(T));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [tokens](int64_t a, int64_t b) { return tokens[a] < tokens[b]; });
  std::vector<int64_t> group_start;  // index into order where each token's run begins
  for (int64_t i = 0; i < T; ++i) {
    if (i == 0 || tokens[order[i]] != tokens[order[i - 1]]) group_start.push_back(i);
  }
  group_start.push_back(T);
  const auto groups = static_cast<int64_t>(group_start.size()) - 1;
#pragma omp parallel for schedule(dynamic, 16) if (T * C >= kOpParallelMinElements)
  for (int64_t g = 0; g < groups; ++g) {
    F* dst = dtable + static_cast<int64_t>(tokens[order[group_start[g]]]) * C;
    for (int64_t i = group_start[g]; i < group_start[g + 1]; ++i) {
      const F* src = dout + order[i] * C;
      for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
    }
  }
}

template <class F>
void rmsnorm_forward(F* y, F* rstd, const F* x, const F* w, int64_t T, int64_t C, double eps) {
  check_shape("rmsnorm_forward", T, C);
  if (!(eps >= 0.0)) {
    throw InputError("[rmsnorm_forward] eps must be >= 0, got " + std::to_string(eps));
  }
#pragma omp parallel for schedule(static) if (T * C >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t) {
    const F* xt = x + t * C;
    F* yt = y + t * C;
    // Sum of squares in double (cheap), so r is rounded once, from a nearly exact mean.
    const double sum_sq = sum_of_products<F>(xt, xt, nullptr, C);
    const auto r = static_cast<F>(1.0 / std::sqrt(sum_sq / static_cast<double>(C) + eps));
    rstd[t] = r;
    // HF's order: the normalized row first, then the weight.
    for (int64_t c = 0; c < C; ++c) yt[c] = w[c] * (xt[c] * r);
  }
}

template <class F>
void rmsnorm_backward(F* dx, F* dw, const F* dy, const F* x, const F* w, const F* rstd, int64_t T,
                      int64_t C) {
  check_shape("rmsnorm_backward", T, C);
  // dx = r·(w⊙dy) − x · r³/C · Σ_c (w⊙dy⊙x)_c ; the row sum in double, each element in double.
#pragma omp parallel for schedule(static) if (T * C >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t) {
    const F* xt = x + t * C;
    const F* dyt = dy + t * C;
    F* dxt = dx + t * C;
    const double r = rstd[t];
    const double dot = sum_of_products<F>(dyt, xt, w, C);
    const double coef = r * r * r * dot / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      dxt[c] = static_cast<F>(r * (static_cast<double>(w[c]) * dyt[c]) - coef * xt[c]);
    }
  }
  // dw_c += Σ_t dy[t,c] · (x[t,c] · r_t): parallel over column blocks, rows in ascending t, so
  // the sum's order never depends on the thread count. (x·r) is rounded as in the forward; the
  // sum over up to 16k rows is carried in double (64 doubles per task: cheap).
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (T * C >= kOpParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kColumnBlock;
    const int64_t width = std::min(C, c0 + kColumnBlock) - c0;
    double acc[kColumnBlock];
    for (int64_t c = 0; c < width; ++c) acc[c] = dw[c0 + c];
    for (int64_t t = 0; t < T; ++t) {
      const F* xt = x + t * C + c0;
      const F* dyt = dy + t * C + c0;
      const F r = rstd[t];
      for (int64_t c = 0; c < width; ++c) acc[c] += static_cast<double>(dyt[c]) * (xt[c] * r);
    }
    for (int64_t c = 0; c < width; ++c) dw[c0 + c] = static_cast<F>(acc[c]);
  }
}

#define CONCORD_INSTANTIATE(F)                                                                  \
  template void embedding_forward<F>(F*, const int32_t*, const F*, int64_t, int64_t, int64_t); \
  template void embedding_backward<F>(F*, const F*, const int32_t*, int64_t, int64_t,          \
                                      int64_t);                                                \
  template void rmsnorm_forward<F>(F*, F*, const F*, const F*, int64_t, int64_t, double);      \
  template void rmsnorm_backward<F>(F*, F*, const F*, const F*, const F*, const F*, int64_t,   \
                                    int64_t);
CONCORD_INSTANTIATE(float)
CONCORD_INSTANTIATE(double)
#undef CONCORD_INSTANTIATE

}  // namespace concord::model
