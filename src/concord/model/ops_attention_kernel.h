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
//   p_j = exp(s_j − max) / Σ exp   std::exp in F (for float: numerics::exp_shifted, the same bits
//                             eight at a time), the sum (j ascending) and the division in double
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

#include "concord/numerics/exp.h"

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
[[gnu::always_inline]] inline F dot_fixed_order(const F* a, const F* b, int64_t n) {
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
    // The exps first, then their sum (j ascending): the sum's dependency chain does not have to
    // wait on each libm call.
    if constexpr (std::is_same_v<F, float>) {
      numerics::exp_shifted(p, n_ctx, max_score);  // std::exp's bits, eight at a time (exp.h)
    } else {
      for (int64_t j = 0; j < n_ctx; ++j) p[j] = std::exp(p[j] - max_score);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n_ctx; ++j) sum += static_cast<double>(p[j]);
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

// Horizontal step of the dot products of four keys: a_t holds key t's 8 lanes. Returns
// (((l0+l4) + (l1+l5)) + ((l2+l6) + (l3+l7))) for t = 0..3, every sum with its operands in that order.
inline void combine4(const V8& a0, const V8& a1, const V8& a2, const V8& a3, V4& dots) {
  // m_t = (l0+l4, l1+l5, l2+l6, l3+l7) of key t.
  const V4 m0 = __builtin_shufflevector(a0, a0, 0, 1, 2, 3) + __builtin_shufflevector(a0, a0, 4, 5, 6, 7);
  const V4 m1 = __builtin_shufflevector(a1, a1, 0, 1, 2, 3) + __builtin_shufflevector(a1, a1, 4, 5, 6, 7);
  const V4 m2 = __builtin_shufflevector(a2, a2, 0, 1, 2, 3) + __builtin_shufflevector(a2, a2, 4, 5, 6, 7);
  const V4 m3 = __builtin_shufflevector(a3, a3, 0, 1, 2, 3) + __builtin_shufflevector(a3, a3, 4, 5, 6, 7);
  // s01 = (m0[0]+m0[1], m0[2]+m0[3], m1[0]+m1[1], m1[2]+m1[3]), likewise s23; then their pairs.
  const V4 s01 = __builtin_shufflevector(m0, m1, 0, 2, 4, 6) + __builtin_shufflevector(m0, m1, 1, 3, 5, 7);
  const V4 s23 = __builtin_shufflevector(m2, m3, 0, 2, 4, 6) + __builtin_shufflevector(m2, m3, 1, 3, 5, 7);
  dots = __builtin_shufflevector(s01, s23, 0, 2, 4, 6) + __builtin_shufflevector(s01, s23, 1, 3, 5, 7);
}

// Scores of GB query heads that share one kv head, head_dim = 8·NV: four keys at a time, each
// key's chunk loaded once for the GB heads (the cache rows are read once per group, not per head);
// each (head, key) lane starts at 0 and takes q_c·k_c for c ascending, as in dot_fixed_order.
template <int NV, int GB>
void scores_v8(float* scores, const float* q, const float* kh, int64_t n_ctx, int64_t kv_stride,
               float scale) {
  constexpr int64_t D = 8 * NV;
  int64_t j = 0;
  for (; j + 4 <= n_ctx; j += 4) {
    const float* k0 = kh + j * kv_stride;
    V8 a[GB][4] = {};
#pragma GCC unroll 16
    for (int c = 0; c < NV; ++c) {
      V8 x[4];
      load8(x[0], k0 + 8 * c);
      load8(x[1], k0 + kv_stride + 8 * c);
      load8(x[2], k0 + 2 * kv_stride + 8 * c);
      load8(x[3], k0 + 3 * kv_stride + 8 * c);
#pragma GCC unroll 4
      for (int i = 0; i < GB; ++i) {
        V8 qc;
        load8(qc, q + i * D + 8 * c);
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) a[i][t] = a[i][t] + qc * x[t];
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < GB; ++i) {
      V4 dots;
      combine4(a[i][0], a[i][1], a[i][2], a[i][3], dots);
      const V4 sc = dots * scale;
      std::memcpy(scores + i * n_ctx + j, &sc, sizeof(sc));
    }
  }
  for (; j < n_ctx; ++j) {
    const float* kj = kh + j * kv_stride;
    for (int i = 0; i < GB; ++i) {
      V8 a = {};
#pragma GCC unroll 16
      for (int c = 0; c < NV; ++c) {
        V8 qc, x;
        load8(qc, q + i * D + 8 * c);
        load8(x, kj + 8 * c);
        a = a + qc * x;
      }
      scores[i * n_ctx + j] = (((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))) * scale;
    }
  }
}

// out_i = 0 + Σ_j p_ij v_j with j ascending for GB heads sharing the value rows vh, P of the NV
// 8-float chunks per pass (GB·P accumulators in registers), each chunk of v_j loaded once for the
// GB heads.
template <int NV, int GB, int P>
void weighted_values_v8(float* out, const float* p, const float* vh, int64_t n_ctx,
                        int64_t kv_stride) {
  constexpr int64_t D = 8 * NV;
  static_assert(NV % P == 0, "the passes must tile the head");
  for (int c0 = 0; c0 < NV; c0 += P) {
    V8 acc[GB][P] = {};
    for (int64_t j = 0; j < n_ctx; ++j) {
      const float* vj = vh + j * kv_stride + 8 * c0;
#pragma GCC unroll 4
      for (int i = 0; i < GB; ++i) {
        const float pij = p[i * n_ctx + j];
#pragma GCC unroll 16
        for (int c = 0; c < P; ++c) {
          V8 x;
          load8(x, vj + 8 * c);
          acc[i][c] = acc[i][c] + pij * x;
        }
      }
    }
    for (int i = 0; i < GB; ++i) std::memcpy(out + i * D + 8 * c0, acc[i], sizeof(acc[i]));
  }
}

#ifndef CONCORD_ATTENTION_VREGS
#define CONCORD_ATTENTION_VREGS 16
#endif

// The value pass width: the block's accumulators fit the vector registers the instruction set
// has (CONCORD_ATTENTION_VREGS), leaving a few for loads and broadcasts.
template <int NV, int GB>
void values_head_block(float* out, const float* p, const float* vh, int64_t n_ctx,
                       int64_t kv_stride) {
  constexpr int kRegs = CONCORD_ATTENTION_VREGS;
  constexpr int kMaxP = (kRegs - 4) / GB;  // accumulators; the rest for loads and broadcasts
  constexpr int P = NV <= kMaxP ? NV : (kMaxP >= 8 ? 8 : kMaxP >= 4 ? 4 : kMaxP >= 2 ? 2 : 1);
  weighted_values_v8<NV, GB, P>(out, p, vh, n_ctx, kv_stride);
}

template <int NV>
void attend_one_query_v8(float* out, float* probs, int64_t probs_head_stride, const float* q,
                         const float* k, const float* v, int64_t n_ctx, int64_t kv_stride,
                         int64_t Hq, int64_t Hkv, float* scores) {
  constexpr int64_t D = 8 * NV;
  const int64_t group = Hq / Hkv;
  const float scale = attention_scale<float>(D);
  // Heads h0 .. h0+b-1 of kv head g, in blocks of at most 3.
  const auto for_blocks = [&](auto&& body) {
    for (int64_t g = 0; g < Hkv; ++g) {
      for (int64_t i = 0; i < group;) {
        const int64_t b = std::min<int64_t>(3, group - i);
        body(g * group + i, b, g);
        i += b;
      }
    }
  };
  for_blocks([&](int64_t h0, int64_t b, int64_t g) {
    float* s = scores + h0 * n_ctx;
    const float* qh = q + h0 * D;
    const float* kh = k + g * D;
    if (b == 3) scores_v8<NV, 3>(s, qh, kh, n_ctx, kv_stride, scale);
    else if (b == 2) scores_v8<NV, 2>(s, qh, kh, n_ctx, kv_stride, scale);
    else scores_v8<NV, 1>(s, qh, kh, n_ctx, kv_stride, scale);
  });
  softmax_rows(scores, probs, probs_head_stride, n_ctx, Hq);
  for_blocks([&](int64_t h0, int64_t b, int64_t g) {
    float* o = out + h0 * D;
    const float* p = scores + h0 * n_ctx;
    const float* vh = v + g * D;
    if (b == 3) values_head_block<NV, 3>(o, p, vh, n_ctx, kv_stride);
    else if (b == 2) values_head_block<NV, 2>(o, p, vh, n_ctx, kv_stride);
    else values_head_block<NV, 1>(o, p, vh, n_ctx, kv_stride);
  });
}

// The entry: scores must hold Hq * n_ctx values; probs, if not null, receives head h's
// probabilities at probs + h * probs_head_stride.
template <class F>
void attend_one_query(F* out, F* probs, int64_t probs_head_stride, const F* q, const F* k,
                      const F* v, int64_t n_ctx, int64_t kv_stride, int64_t Hq, int64_t Hkv,
                      int64_t D, F* scores) {
  // The 8-wide loop shapes pay off with AVX registers; at the SSE2 baseline (two registers per
  // 8-float vector, no room to keep a row) the reference loops are faster, so that copy keeps them.
  if constexpr (std::is_same_v<F, float> && CONCORD_ATTENTION_VREGS >= 16) {
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
