// The decoder's non-GEMM ops (Qwen3/Llama family), each a forward/backward pair, shared by the
// learner (training) and the serving engine (KV-cache decoding).
//
// Conventions: row-major; T = number of token rows; templates over F in {float, double} (float
// is what runs, double is what the finite-difference tests differentiate). Every op is a plain
// loop a reader can check against its formula, OpenMP-parallel over independent rows.
//
// Determinism (the engine's batch invariance rests on it): a row's result depends only on that
// row's data, never on T, B or the number of threads. Reductions inside a row run in a fixed
// order; reductions across rows (rmsnorm dw, embedding dtable, attention dk/dv) run over rows in
// ascending order, parallelized over the *other* index (columns, vocabulary, kv heads).
// Reductions that are cheap to widen (sums of squares, softmax sums, cross-entropy) accumulate in
// double for both instantiations.
//
// Bad arguments (token or position out of range, odd head_dim, Hq % Hkv != 0, ...) throw
// concord::InputError naming the op, before any output is written.
#pragma once

#include <cstdint>
#include <vector>

#include "concord/numerics/check.h"

namespace concord::model {

// Threading rule (src/concord/tensor/README.md): a row loop forks only when it touches at least
// this many elements; below, the fork and join (~8 us with concord's passive OpenMP wait, where
// the work is a few us) cost more than a second thread saves. Whether a loop runs in parallel
// never changes a bit of its result (rows are independent).
inline constexpr int64_t kOpParallelMinElements = int64_t{1} << 14;

// ---- embedding: out (T, C) = table[tokens[t]], table (V, C) --------------------------------
template <class F>
void embedding_forward(F* out, const int32_t* tokens, const F* table, int64_t T, int64_t V,
                       int64_t C);
// dtable (V, C) is ACCUMULATED: dtable[tokens[t]] += dout[t], rows added in ascending t.
template <class F>
void embedding_backward(F* dtable, const F* dout, const int32_t* tokens, int64_t T, int64_t V,
                        int64_t C);

// ---- RMSNorm as HF's Qwen3RMSNorm / LlamaRMSNorm --------------------------------------------
// y = w ⊙ (x · r), r = 1/sqrt(mean(x²) + eps); rstd (T) receives r (the mean is taken in double).
// QK-norm is the same op over T·H rows of C = head_dim.
template <class F>
void rmsnorm_forward(F* y, F* rstd, const F* x, const F* w, int64_t T, int64_t C, double eps);
// dx (T, C) overwritten; dw (C) ACCUMULATED (rows added in ascending t).
template <class F>
void rmsnorm_backward(F* dx, F* dw, const F* dy, const F* x, const F* w, const F* rstd, int64_t T,
                      int64_t C);

// ---- RoPE, HF's rotate_half convention ------------------------------------------------------
// For i < D/2 the pair (i, i + D/2) is rotated by the angle pos · θ^(-2i/D). The table holds cos
// and sin in double (HF computes its angles in fp32, which at position p is off by ~p·2^-24 rad;
// this table is the exact one).
struct RopeTable {
  int64_t max_positions = 0, head_dim = 0;
  double theta = 0;
  std::vector<double> cos, sin;  // (max_positions, head_dim/2), computed in double
  static RopeTable build(int64_t max_positions, int64_t head_dim, double theta);
};
// x (T, H, D) rotated in place; positions (T) in [0, table.max_positions).
template <class F>
void rope_forward(F* x, const int32_t* positions, int64_t T, int64_t H, int64_t D,
                  const RopeTable& table);
// dx (T, H, D) in place: the transposed (inverse) rotation.
template <class F>
void rope_backward(F* dx, const int32_t* positions, int64_t T, int64_t H, int64_t D,
                   const RopeTable& table);

// ---- causal grouped-query attention ---------------------------------------------------------
// Scale 1/sqrt(D); query head h reads kv head h / (Hq / Hkv).
// q (B, S, Hq, D), k and v (B, S, Hkv, D), out (B, S, Hq, D); probs (B, Hq, S, S) saved for
// backward, entries above the diagonal written as 0. Every query row is computed by the same
// routine as attention_query_row (below), so KV-cached decoding reproduces it bit for bit.
// Dot products and weighted sums accumulate in F (as a GEMM would), softmax sums in double.
template <class F>
void attention_forward(F* out, F* probs, const F* q, const F* k, const F* v, int64_t B, int64_t S,
                       int64_t Hq, int64_t Hkv, int64_t D);
// dq (B, S, Hq, D), dk and dv (B, S, Hkv, D), all overwritten:
//   dP = dout·vᵀ, dS = P ⊙ (dP − rowsum(dP ⊙ P)), dq = dS·k·scale, dk = dSᵀ·q·scale, dv = Pᵀ·dout,
// dk and dv summed over the query heads of a group and the query rows in ascending order.
template <class F>
void attention_backward(F* dq, F* dk, F* dv, const F* dout, const F* probs, const F* q,
                        const F* k, const F* v, int64_t B, int64_t S, int64_t Hq, int64_t Hkv,
                        int64_t D);
// One query position against n_ctx cached keys/values (the engine's decode step): k, v hold
// n_ctx rows, row i at k + i*kv_stride holding (Hkv, D). q and out (Hq, D); probs (Hq, n_ctx)
// optional (nullptr). The single definition of one query's arithmetic: scores q·k in a fixed
// order over D, softmax over 0..n_ctx-1, weighted sum of v in order over context positions.
// `scores` (Hq * n_ctx floats) is the routine's scratch: given, it is used instead of a
// thread-local vector (the memory scheduler's executor places it in its arena); the bits are the
// same either way.
void attention_query_row(float* out, float* probs, const float* q, const float* k, const float* v,
                         int64_t n_ctx, int64_t kv_stride, int64_t Hq, int64_t Hkv, int64_t D,
                         float* scores = nullptr);
// The same for double (used by attention_forward<double>).
void attention_query_row(double* out, double* probs, const double* q, const double* k,
                         const double* v, int64_t n_ctx, int64_t kv_stride, int64_t Hq,
                         int64_t Hkv, int64_t D);

// ---- SwiGLU: out = silu(gate) ⊙ up, silu(x) = x / (1 + exp(-x)); all (T, Fdim) ----------------
template <class F>
void swiglu_forward(F* out, const F* gate, const F* up, int64_t T, int64_t Fdim);
// dgate, dup overwritten.
template <class F>
void swiglu_backward(F* dgate, F* dup, const F* dout, const F* gate, const F* up, int64_t T,
                     int64_t Fdim);

// ---- log-softmax and cross-entropy over rows of logits (T, V) --------------------------------
template <class F>
void log_softmax_forward(F* out, const F* logits, int64_t T, int64_t V);
// dlogits (T, V) overwritten: dlogits = dout − softmax · rowsum(dout), from the saved log-probs
// out (T, V) of log_softmax_forward.
template <class F>
void log_softmax_backward(F* dlogits, const F* dout, const F* out, int64_t T, int64_t V);
// Returns the SUM over rows with targets[t] >= 0 of -log softmax(logits[t])[targets[t]], computed
// and summed (in ascending t) in double; per-row losses (0 for ignored rows) into losses unless
// nullptr. targets[t] >= V: InputError.
template <class F>
double cross_entropy_forward(F* losses, const F* logits, const int32_t* targets, int64_t T,
                             int64_t V);
// dlogits (T, V) overwritten: scale · (softmax(logits) − onehot(target)), 0 for ignored rows.
template <class F>
void cross_entropy_backward(F* dlogits, const F* logits, const int32_t* targets, int64_t T,
                            int64_t V, double scale);

// dlogits (T, V) overwritten: row_scale[t] · (softmax(logits) − onehot(target)), 0 for ignored
// rows — cross_entropy_backward with a scale per row (the policy-gradient pass: row_scale[t] =
// −∂L/∂logp_t). The same arithmetic per row, so a constant row_scale reproduces it bit for bit.
template <class F>
void cross_entropy_backward_rows(F* dlogits, const F* logits, const int32_t* targets, int64_t T,
                                 int64_t V, const double* row_scale);

// ---- explicit instantiations, defined in ops_*.cpp for float and double ----------------------
#define CONCORD_MODEL_OPS_EXTERN(F)                                                                \
  extern template void embedding_forward<F>(F*, const int32_t*, const F*, int64_t, int64_t,       \
                                            int64_t);                                             \
  extern template void embedding_backward<F>(F*, const F*, const int32_t*, int64_t, int64_t,      \
                                             int64_t);                                            \
  extern template void rmsnorm_forward<F>(F*, F*, const F*, const F*, int64_t, int64_t, double);  \
  extern template void rmsnorm_backward<F>(F*, F*, const F*, const F*, const F*, const F*,        \
                                           int64_t, int64_t);                                     \
  extern template void rope_forward<F>(F*, const int32_t*, int64_t, int64_t, int64_t,             \
                                       const RopeTable&);                                         \
  extern template void rope_backward<F>(F*, const int32_t*, int64_t, int64_t, int64_t,            \
                                        const RopeTable&);                                        \
  extern template void attention_forward<F>(F*, F*, const F*, const F*, const F*, int64_t,        \
                                            int64_t, int64_t, int64_t, int64_t);                  \
  extern template void attention_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*,  \
                                             const F*, int64_t, int64_t, int64_t, int64_t,        \
                                             int64_t);                                            \
  extern template void swiglu_forward<F>(F*, const F*, const F*, int64_t, int64_t);               \
  extern template void swiglu_backward<F>(F*, F*, const F*, const F*, const F*, int64_t,          \
                                          int64_t);                                               \
  extern template void log_softmax_forward<F>(F*, const F*, int64_t, int64_t);                    \
  extern template void log_softmax_backward<F>(F*, const F*, const F*, int64_t, int64_t);         \
  extern template double cross_entropy_forward<F>(F*, const F*, const int32_t*, int64_t,          \
                                                  int64_t);                                       \
  extern template void cross_entropy_backward<F>(F*, const F*, const int32_t*, int64_t, int64_t,  \
                                                 double);                                         \
  extern template void cross_entropy_backward_rows<F>(F*, const F*, const int32_t*, int64_t,      \
                                                      int64_t, const double*);

CONCORD_MODEL_OPS_EXTERN(float)
CONCORD_MODEL_OPS_EXTERN(double)
#undef CONCORD_MODEL_OPS_EXTERN

}  // namespace concord::model
