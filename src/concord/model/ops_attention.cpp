// Causal grouped-query attention, forward and backward, and the single-query routine the engine's
// KV-cache decode step shares with the batched forward (see ops.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "concord/model/ops.h"
#include "concord/model/ops_attention_isa.h"
#include "concord/numerics/convert.h"

#define CONCORD_ATTENTION_NS attention_generic
#define CONCORD_ATTENTION_VREGS 8  // 8-float vectors in the 16 SSE registers: the reference loops
#include "concord/model/ops_attention_kernel.h"

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

using attention_generic::attention_scale;
using attention_generic::dot_fixed_order;

// One query against n_ctx cached rows (ops_attention_kernel.h): float runs the copy built for the
// active instruction set (CONCORD_ISA=generic: the baseline one), double the baseline one. The
// copies perform the same IEEE operations in the same order per output, so the bits never depend
// on the pick (tests/model/ops_test.cpp AttentionIsa* compares them).
void attend_one_query(float* out, float* probs, int64_t probs_head_stride, const float* q,
                      const float* k, const float* v, int64_t n_ctx, int64_t kv_stride,
                      int64_t Hq, int64_t Hkv, int64_t D, float* scores) {
  if (numerics::active_isa() != numerics::Isa::generic) {
    attention_avx2::attend_one_query_f32(out, probs, probs_head_stride, q, k, v, n_ctx, kv_stride,
                                         Hq, Hkv, D, scores);
    return;
  }
  attention_generic::attend_one_query<float>(out, probs, probs_head_stride, q, k, v, n_ctx,
                                             kv_stride, Hq, Hkv, D, scores);
}

void attend_one_query(double* out, double* probs, int64_t probs_head_stride, const double* q,
                      const double* k, const double* v, int64_t n_ctx, int64_t kv_stride,
                      int64_t Hq, int64_t Hkv, int64_t D, double* scores) {
  attention_generic::attend_one_query<double>(out, probs, probs_head_stride, q, k, v, n_ctx,
                                              kv_stride, Hq, Hkv, D, scores);
}

template <class F>
void query_row_checked(F* out, F* probs, const F* q, const F* k, const F* v, int64_t n_ctx,
                       int64_t kv_stride, int64_t Hq, int64_t Hkv, int64_t D, F* given_scores = nullptr) {
  check_heads("attention_query_row", Hq, Hkv, D);
  if (n_ctx <= 0) {
    throw InputError("[attention_query_row] needs at least one cached position, got n_ctx=" +
                     std::to_string(n_ctx));
  }
  if (kv_stride < Hkv * D) {
    throw InputError("[attention_query_row] kv_stride " + std::to_string(kv_stride) +
                     " is shorter than a cache row (Hkv*D = " + std::to_string(Hkv * D) + ")");
  }
  if (given_scores != nullptr) {
    attend_one_query(out, probs, n_ctx, q, k, v, n_ctx, kv_stride, Hq, Hkv, D, given_scores);
    return;
  }
  thread_local std::vector<F> scores;  // reused: one call per query row and layer in decode
  scores.resize(static_cast<size_t>(Hq * n_ctx));
  attend_one_query(out, probs, n_ctx, q, k, v, n_ctx, kv_stride, Hq, Hkv, D, scores.data());
}

}  // namespace

void attention_query_row(float* out, float* probs, const float* q, const float* k, const float* v,
                         int64_t n_ctx, int64_t kv_stride, int64_t Hq, int64_t Hkv, int64_t D, float* scores) {
  query_row_checked(out, probs, q, k, v, n_ctx, kv_stride, Hq, Hkv, D, scores);
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
