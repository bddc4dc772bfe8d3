// THE arithmetic of one attention query (all heads against n_ctx cached keys/values), written once
// and compiled once per instruction set: ops_attention.cpp includes it for the baseline (SSE2) and
// ops_attention_avx2.cpp for AVX2 (no FMA: the build's -ffp-contract=off keeps every product and
// sum a separate IEEE operation). The includer defines CONCORD_ATTENTION_NS, so each copy has its
// own names and the linker never merges code built for different instruction sets.
//
// Every output value is the same sequence of IEEE operations in every copy and in every loop shape
// below (the reference order, kept by the scalar path for double and for head_dim % 8 != 0):
//   s_j = (q·k_j) · scale     8 lanes, lane l = 0 + Σ_{i ≡ l mod 8} q_i k_i (i ascending),
//                             then ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))
//   p_j = exp(s_j − max) / Σ exp   std::exp in F, the sum (j ascending) and the division in double
//   out = 0 + Σ_j p_j v_j     j ascending, accumulated in F
// The float path for head_dim = 8·NV holds the 8 lanes of a dot product in one 8-wide vector
// (one AVX register, two SSE ones), runs four keys' dot products side by side (independent chains
// instead of one latency-bound chain) and keeps a head's whole output row in registers across the
// keys; only the order in which independent values are computed changes, never an operand.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#ifndef CONCORD_ATTENTION_NS
#error "define CONCORD_ATTENTION_NS before including ops_attention_kernel.h"
#endif

namespace concord::model::CONCORD_ATTENTION_NS {

template <class F>
F attention_scale(int64_t D) {
  return static_cast<F>(1.0 / std::sqrt(static_cast<double>(D)));
}

// Dot product in the fixed order above (any n; the tail elements go to lanes 0..n%8-1).
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

// max_j p_j (NaNs skipped, −inf if there is nothing else), over 8 interleaved lanes so that it
// vectorizes. A maximum involves no rounding: the result is the set's largest value whatever the
// order, except that +0 and −0 tie and either may come out; p_j − (±0) is then the same number
// for p_j ≠ 0 and a zero for p_j = ±0, whose exp is exactly 1, so no output bit can differ.
template <class F>
F max_fixed_lanes(const F* p, int64_t n) {
  constexpr int64_t kLanes = 8;
  F lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<F>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lane[l] = std::max(lane[l], p[j + l]);
  }
  for (int64_t l = 0; j + l < n; ++l) lane[l] = std::max(lane[l], p[j + l]);
  F m = lane[0];
  for (int64_t l = 1; l < kLanes; ++l) m = std::max(m, lane[l]);
  return m;
}

// exp, normalisation and the optional copy to probs, per head (scores → probabilities in place).
template <class F>
void softmax_rows(F* scores, F* probs, int64_t probs_head_stride, int64_t n_ctx, int64_t Hq) {
  for (int64_t h = 0; h < Hq; ++h) {
    F* p = scores + h * n_ctx;
    const F max_score = max_fixed_lanes(p, n_ctx);
    double sum = 0.0;
    for (int64_t j = 0; j < n_ctx; ++j) {
      p[j] = std::exp(p[j] - max_score);
      sum += static_cast<double>(p[j]);
    }
    const double inv_sum = 1.0 / sum;
    for (int64_t j = 0; j < n_ctx; ++j) p[j] = static_cast<F>(static_cast<double>(p[j]) * inv_sum);
    if (probs != nullptr) std::copy(p, p + n_ctx, probs + h * probs_head_stride);
  }
}

// The reference loop shape (any F, any D).
template <class F>
void attend_one_query_scalar(F* out, F* probs, int64_t probs_head_stride, const F* q, const F* k,
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
  softmax_rows(scores, probs, probs_head_stride, n_ctx, Hq);
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

// 8 float lanes; GCC lowers the vector operations to one AVX or two SSE instructions each, one
// IEEE operation per lane, nothing fused or reassociated.
typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));

// Unaligned loads (by reference: a 32-byte vector passed by value changes the ABI without AVX).
inline void load8(V8& r, const float* p) { std::memcpy(&r, p, sizeof(r)); }

// Scores of head_dim = 8·NV: for each head, its query's 8-lane chunks against four keys at a
// time; each key's lanes start at 0 and take q_c·k_c for c ascending, as in dot_fixed_order.
template <int NV>
void scores_v8(float* scores, const float* q, const float* k, int64_t n_ctx, int64_t kv_stride,
               int64_t Hq, int64_t group, float scale) {
  constexpr int64_t D = 8 * NV;
  for (int64_t h = 0; h < Hq; ++h) {
    const float* qh = q + h * D;
    const float* kh = k + (h / group) * D;
    float* sh = scores + h * n_ctx;
    int64_t j = 0;
    for (; j + 4 <= n_ctx; j += 4) {
      const float* k0 = kh + j * kv_stride;
      const float* k1 = k0 + kv_stride;
      const float* k2 = k1 + kv_stride;
      const float* k3 = k2 + kv_stride;
      V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
#pragma GCC unroll 16
      for (int c = 0; c < NV; ++c) {
        V8 qc, x0, x1, x2, x3;
        load8(qc, qh + 8 * c);
        load8(x0, k0 + 8 * c);
        load8(x1, k1 + 8 * c);
        load8(x2, k2 + 8 * c);
        load8(x3, k3 + 8 * c);
        a0 = a0 + qc * x0;
        a1 = a1 + qc * x1;
        a2 = a2 + qc * x2;
        a3 = a3 + qc * x3;
      }
      // m = (l0+l4, l1+l5, l2+l6, l3+l7) per key, then (m0+m1) and (m2+m3), then their sum.
      const V4 m0 = __builtin_shufflevector(a0, a0, 0, 1, 2, 3) + __builtin_shufflevector(a0, a0, 4, 5, 6, 7);
      const V4 m1 = __builtin_shufflevector(a1, a1, 0, 1, 2, 3) + __builtin_shufflevector(a1, a1, 4, 5, 6, 7);
      const V4 m2 = __builtin_shufflevector(a2, a2, 0, 1, 2, 3) + __builtin_shufflevector(a2, a2, 4, 5, 6, 7);
      const V4 m3 = __builtin_shufflevector(a3, a3, 0, 1, 2, 3) + __builtin_shufflevector(a3, a3, 4, 5, 6, 7);
      // s01 = (m0[0]+m0[1], m0[2]+m0[3], m1[0]+m1[1], m1[2]+m1[3]), likewise s23.
      const V4 s01 = __builtin_shufflevector(m0, m1, 0, 2, 4, 6) + __builtin_shufflevector(m0, m1, 1, 3, 5, 7);
      const V4 s23 = __builtin_shufflevector(m2, m3, 0, 2, 4, 6) + __builtin_shufflevector(m2, m3, 1, 3, 5, 7);
      const V4 dots = __builtin_shufflevector(s01, s23, 0, 2, 4, 6) + __builtin_shufflevector(s01, s23, 1, 3, 5, 7);
      const V4 s = dots * scale;
      std::memcpy(sh + j, &s, sizeof(s));
    }
    for (; j < n_ctx; ++j) {
      const float* kj = kh + j * kv_stride;
      V8 a = {};
#pragma GCC unroll 16
      for (int c = 0; c < NV; ++c) {
        V8 qc, x;
        load8(qc, qh + 8 * c);
        load8(x, kj + 8 * c);
        a = a + qc * x;
      }
      sh[j] = (((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))) * scale;
    }
  }
}

// out_h = 0 + Σ_j p_j v_j with j ascending, the head's row held in NV vectors across all keys.
template <int NV>
void weighted_values_v8(float* out, const float* scores, const float* v, int64_t n_ctx,
                        int64_t kv_stride, int64_t Hq, int64_t group) {
  constexpr int64_t D = 8 * NV;
  for (int64_t h = 0; h < Hq; ++h) {
    const float* vh = v + (h / group) * D;
    const float* ph = scores + h * n_ctx;
    V8 acc[NV] = {};
    for (int64_t j = 0; j < n_ctx; ++j) {
      const float pj = ph[j];
      const float* vj = vh + j * kv_stride;
#pragma GCC unroll 16
      for (int c = 0; c < NV; ++c) {
        V8 x;
        load8(x, vj + 8 * c);
        acc[c] = acc[c] + pj * x;
      }
    }
    std::memcpy(out + h * D, acc, sizeof(acc));
  }
}

template <int NV>
void attend_one_query_v8(float* out, float* probs, int64_t probs_head_stride, const float* q,
                         const float* k, const float* v, int64_t n_ctx, int64_t kv_stride,
                         int64_t Hq, int64_t Hkv, float* scores) {
  const int64_t group = Hq / Hkv;
  scores_v8<NV>(scores, q, k, n_ctx, kv_stride, Hq, group, attention_scale<float>(8 * NV));
  softmax_rows(scores, probs, probs_head_stride, n_ctx, Hq);
  weighted_values_v8<NV>(out, scores, v, n_ctx, kv_stride, Hq, group);
}

// The entry: scores must hold Hq * n_ctx values; probs, if not null, receives head h's
// probabilities at probs + h * probs_head_stride.
template <class F>
void attend_one_query(F* out, F* probs, int64_t probs_head_stride, const F* q, const F* k,
                      const F* v, int64_t n_ctx, int64_t kv_stride, int64_t Hq, int64_t Hkv,
                      int64_t D, F* scores) {
  if constexpr (std::is_same_v<F, float>) {
    switch (D) {
      case 32: return attend_one_query_v8<4>(out, probs, probs_head_stride, q, k, v, n_ctx, kv_stride, Hq, Hkv, scores);
      case 64: return attend_one_query_v8<8>(out, probs, probs_head_stride, q, k, v, n_ctx, kv_stride, Hq, Hkv, scores);
      case 128: return attend_one_query_v8<16>(out, probs, probs_head_stride, q, k, v, n_ctx, kv_stride, Hq, Hkv, scores);
      default: break;
    }
  }
  attend_one_query_scalar(out, probs, probs_head_stride, q, k, v, n_ctx, kv_stride, Hq, Hkv, D,
                          scores);
}

}  // namespace concord::model::CONCORD_ATTENTION_NS
