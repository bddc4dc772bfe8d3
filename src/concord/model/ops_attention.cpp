// Causal grouped-query attention, forward and backward, and the single-query routine the engine's
// KV-cache decode step shares with the batched forward (see ops.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "concord/model/ops.h"

namespace concord::model {
namespace {

void check_heads(const char* op, int64_t Hq, int64_t Hkv, int64_t D) {
  if (Hq <= 0 || Hkv <= 0 || D <= 0) {
    throw InputError(std::string("[") + op + "] needs Hq, Hkv and head_dim > 0, got Hq=" +
                     std::to_string(Hq) + ", Hkv=" + std::to_string(Hkv) +
                     ", D=" + std::to_string(D));
  }
  if (Hq % Hkv != 0) {
    throw InputError(std::string("[") + op + "] num_attention_heads " + std::to_string(Hq) +
                     " is not a multiple of num_key_value_heads " + std::to_string(Hkv) +
                     "; check config.json");
  }
}

void check_batch(const char* op, int64_t B, int64_t S) {
  if (B < 0 || S < 0) {
    throw InputError(std::string("[") + op + "] needs B >= 0 and S >= 0, got B=" +
                     std::to_string(B) + ", S=" + std::to_string(S));
  }
}

// Dot product in a fixed order: 8 interleaved partial sums (lane l takes elements i ≡ l mod 8),
// combined pairwise. The order depends only on n, so every caller gets the same bits; the 8
// independent lanes let GCC vectorize it at the SSE2 baseline without reassociating anything.
template <class F>
F dot_fixed_order(const F* a, const F* b, int64_t n) {
  constexpr int64_t kLanes = 8;
  F lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += a[i + l] * b[i + l];
  }
  for (int64_t l = 0; i + l < n; ++l) lane[l] += a[i + l] * b[i + l];
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

template <class F>
F attention_scale(int64_t D) {
  return static_cast<F>(1.0 / std::sqrt(static_cast<double>(D)));
}

// THE arithmetic of one query position (all Hq heads) against n_ctx keys/values; both
// attention_forward and attention_query_row run through here. scores: Hq * n_ctx scratch values.
// probs, if not null, receives head h's probabilities at probs + h * probs_head_stride.
//   s_j = (q·k_j) · scale          dot_fixed_order over D
//   p_j = exp(s_j − max) / Σ exp   exp in F, the sum and the division in double
//   out = Σ_j p_j v_j              j ascending, accumulated in F, vectorized over D
// The loops run key-major (all heads for one cached row, then the next row) so each cache row is
// read once per query instead of once per head; every head's arithmetic is unchanged by that.
template <class F>
void attend_one_query(F* out, F* probs, int64_t probs_head_stride, const F* q, const F* k,
                      const F* v, int64_t n_ctx, int64_t kv_stride, int64_t Hq, int64_t Hkv,
                      int64_t D, F* scores) {
  const int64_t group = Hq / Hkv;
  const F scale = attention_scale<F>(D);
  for (int64_t j = 0; j < n_ctx; ++j) {
    const F* kj = k + j * kv_stride;
    for (int64_t h = 0; h < Hq; ++h) {
      scores[h * n_ctx + j] = dot_fixed_order(q + h * D, kj + (h / group) * D, D) * scale;
    }
  }
  for (int64_t h = 0; h < Hq; ++h) {
    F* p = scores + h * n_ctx;
    F max_score = -std::numeric_limits<F>::infinity();
    for (int64_t j = 0; j < n_ctx; ++j) max_score = std::max(max_score, p[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < n_ctx; ++j) {
      p[j] = std::exp(p[j] - max_score);
      sum += static_cast<double>(p[j]);
    }
    const double inv_sum = 1.0 / sum;
    for (int64_t j = 0; j < n_ctx; ++j) p[j] = static_cast<F>(static_cast<double>(p[j]) * inv_sum);
    if (probs != nullptr) std::copy(p, p + n_ctx, probs + h * probs_head_stride);
  }
  // Four keys per pass keep out[d] in a register across them; the additions stay one per key, in
  // ascending j, so the bits are those of the one-key-at-a-time loop (the tail) for any n_ctx.
  std::fill(out, out + Hq * D, F(0));
  int64_t j = 0;
  for (; j + 4 <= n_ctx; j += 4) {
    for (int64_t h = 0; h < Hq; ++h) {
      const F* v0 = v + j * kv_stride + (h / group) * D;
      const F* v1 = v0 + kv_stride;
      const F* v2 = v1 + kv_stride;
      const F* v3 = v2 + kv_stride;
      const F* p = scores + h * n_ctx + j;
      const F p0 = p[0], p1 = p[1], p2 = p[2], p3 = p[3];
      F* oh = out + h * D;
      for (int64_t d = 0; d < D; ++d) {
        F o = oh[d];
        o += p0 * v0[d];
        o += p1 * v1[d];
        o += p2 * v2[d];
        o += p3 * v3[d];
        oh[d] = o;
      }
    }
  }
  for (; j < n_ctx; ++j) {
    for (int64_t h = 0; h < Hq; ++h) {
      const F pj = scores[h * n_ctx + j];
      const F* vjh = v + j * kv_stride + (h / group) * D;
      F* oh = out + h * D;
      for (int64_t d = 0; d < D; ++d) oh[d] += pj * vjh[d];
    }
  }
}

template <class F>
void query_row_checked(F* out, F* probs, const F* q, const F* k, const F* v, int64_t n_ctx,
                       int64_t kv_stride, int64_t Hq, int64_t Hkv, int64_t D) {
  check_heads("attention_query_row", Hq, Hkv, D);
  if (n_ctx <= 0) {
    throw InputError("[attention_query_row] needs at least one cached position, got n_ctx=" +
                     std::to_string(n_ctx));
  }
  if (kv_stride < Hkv * D) {
    throw InputError("[attention_query_row] kv_stride " + std::to_string(kv_stride) +
                     " is shorter than a cache row (Hkv*D = " + std::to_string(Hkv * D) + ")");
  }
  std::vector<F> scores(static_cast<size_t>(Hq * n_ctx));
  attend_one_query(out, probs, n_ctx, q, k, v, n_ctx, kv_stride, Hq, Hkv, D, scores.data());
}

}  // namespace

void attention_query_row(float* out, float* probs, const float* q, const float* k, const float* v,
                         int64_t n_ctx, int64_t kv_stride, int64_t Hq, int64_t Hkv, int64_t D) {
  query_row_checked(out, probs, q, k, v, n_ctx, kv_stride, Hq, Hkv, D);
}

void attention_query_row(double* out, double* probs, const double* q, const double* k,
                         const double* v, int64_t n_ctx, int64_t kv_stride, int64_t Hq,
                         int64_t Hkv, int64_t D) {
  query_row_checked(out, probs, q, k, v, n_ctx, kv_stride, Hq, Hkv, D);
}

template <class F>
void attention_forward(F* out, F* probs, const F* q, const F* k, const F* v, int64_t B, int64_t S,
                       int64_t Hq, int64_t Hkv, int64_t D) {
  check_heads("attention_forward", Hq, Hkv, D);
  check_batch("attention_forward", B, S);
  const int64_t kv_stride = Hkv * D;
  // One task per query row (b, s), with n_ctx = s + 1: exactly the decode step's call.
#pragma omp parallel
  {
    std::vector<F> scores(static_cast<size_t>(Hq * S));
#pragma omp for schedule(dynamic, 4)
    for (int64_t row = 0; row < B * S; ++row) {
      const int64_t b = row / S, s = row % S;
      F* probs_row = probs + (b * Hq * S + s) * S;  // head h at + h * S * S
      attend_one_query(out + row * Hq * D, probs_row, S * S, q + row * Hq * D,
                       k + b * S * kv_stride, v + b * S * kv_stride, s + 1, kv_stride, Hq, Hkv, D,
                       scores.data());
      for (int64_t h = 0; h < Hq; ++h) {
        std::fill(probs_row + h * S * S + s + 1, probs_row + h * S * S + S, F(0));
      }
    }
  }
}

template <class F>
void attention_backward(F* dq, F* dk, F* dv, const F* dout, const F* probs, const F* q,
                        const F* k, const F* v, int64_t B, int64_t S, int64_t Hq, int64_t Hkv,
                        int64_t D) {
  check_heads("attention_backward", Hq, Hkv, D);
  check_batch("attention_backward", B, S);
  const int64_t group = Hq / Hkv;
  const int64_t kv_stride = Hkv * D, q_stride = Hq * D;
  const F scale = attention_scale<F>(D);
  // One task per (b, kv head g): it owns dk/dv of that head and dq of the group's query heads.
  // dk_j and dv_j receive their terms in a fixed order (query row s ascending, then query head h
  // ascending), whatever the thread count. The head's keys, values and their gradients are
  // copied into contiguous (S, D) buffers first: the rows of one head are kv_stride apart in
  // memory, and walking them for every query row thrashes the cache and the TLB.
#pragma omp parallel
  {
    const auto SD = static_cast<size_t>(S * D);
    std::vector<F> k_head(SD), v_head(SD), dk_head(SD), dv_head(SD);
    std::vector<F> dscore(static_cast<size_t>(group * S));  // dS·scale of the group's heads
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * Hkv; ++task) {
      const int64_t b = task / Hkv, g = task % Hkv;
      for (int64_t j = 0; j < S; ++j) {
        const int64_t src = (b * S + j) * kv_stride + g * D;
        std::copy(k + src, k + src + D, k_head.data() + j * D);
        std::copy(v + src, v + src + D, v_head.data() + j * D);
      }
      std::fill(dk_head.begin(), dk_head.end(), F(0));
      std::fill(dv_head.begin(), dv_head.end(), F(0));
      for (int64_t s = 0; s < S; ++s) {
        for (int64_t i = 0; i < group; ++i) {
          const int64_t h = g * group + i;
          const F* p = probs + ((b * Hq + h) * S + s) * S;
          const int64_t row = (b * S + s) * q_stride + h * D;
          const F* dout_s = dout + row;
          F* ds = dscore.data() + i * S;
          // dP_j = dout_s · v_j, and the row sum Σ_j dP_j P_j in double.
          double rowsum = 0.0;
          for (int64_t j = 0; j <= s; ++j) {
            ds[j] = dot_fixed_order(dout_s, v_head.data() + j * D, D);
            rowsum += static_cast<double>(ds[j]) * p[j];
          }
          // dS_j · scale = P_j (dP_j − rowsum) · scale, in double, rounded once.
          for (int64_t j = 0; j <= s; ++j) {
            ds[j] = static_cast<F>(static_cast<double>(p[j]) *
                                   (static_cast<double>(ds[j]) - rowsum) * scale);
          }
          // dq_s = Σ_j dS_j·scale · k_j, j ascending.
          F* dq_s = dq + row;
          std::fill(dq_s, dq_s + D, F(0));
          for (int64_t j = 0; j <= s; ++j) {
            const F dsj = ds[j];
            const F* kj = k_head.data() + j * D;
            for (int64_t d = 0; d < D; ++d) dq_s[d] += dsj * kj[d];
          }
        }
        // dk_j += dS_j·scale · q_s and dv_j += P_j · dout_s over the group's heads, in order.
        for (int64_t j = 0; j <= s; ++j) {
          F* dkj = dk_head.data() + j * D;
          F* dvj = dv_head.data() + j * D;
          for (int64_t i = 0; i < group; ++i) {
            const int64_t h = g * group + i;
            const int64_t row = (b * S + s) * q_stride + h * D;
            const F dsj = dscore[i * S + j];
            const F pj = probs[((b * Hq + h) * S + s) * S + j];
            const F* q_s = q + row;
            const F* dout_s = dout + row;
            for (int64_t d = 0; d < D; ++d) dkj[d] += dsj * q_s[d];
            for (int64_t d = 0; d < D; ++d) dvj[d] += pj * dout_s[d];
          }
        }
      }
      for (int64_t j = 0; j < S; ++j) {
        const int64_t dst = (b * S + j) * kv_stride + g * D;
        std::copy(dk_head.data() + j * D, dk_head.data() + (j + 1) * D, dk + dst);
        std::copy(dv_head.data() + j * D, dv_head.data() + (j + 1) * D, dv + dst);
      }
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       int64_t, int64_t, int64_t, int64_t, int64_t);
template void attention_forward<double>(double*, double*, const double*, const double*,
                                        const double*, int64_t, int64_t, int64_t, int64_t,
                                        int64_t);
template void attention_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, int64_t, int64_t,
                                        int64_t, int64_t, int64_t);
template void attention_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*, int64_t,
                                         int64_t, int64_t, int64_t, int64_t);

}  // namespace concord::model
